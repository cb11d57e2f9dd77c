"""Prompt lookup: drafts copied from the prompt and the answer so far.

``NgramDrafter`` follows copies (``core.drafting.follow.CopyFollower``) in the committed
text itself: the prompt, then the answer as it grows. It finds earlier occurrences of the
text's longest suffix and drafts what followed them, following a copy through the edits the
answer makes; its offers are priced and its drafts graded as copies. Free to run; its q is
one-hot, so ``Draft.probs`` is None.
"""

from __future__ import annotations

from localspec.core.drafting.base import Resources
from localspec.core.drafting.follow import CopyFollower
from localspec.core.params import GenerationParams

NAME = "ngram"
# A fixed policy (``--drafter ngram``) drafts whenever it is offered a draft, with no cost
# model to weigh the evidence: it is offered drafts from matches of at least this many
# tokens (and copies it follows), as llama.cpp's n-gram modes look up long keys. Replays
# (core.replay) of 92 recorded greedy answers in four sets (SmolLM2-135M on three prompt
# files the bench does not ship, the default pair on the bench's), each at its pair's
# measured costs on a 2-core CPU, ran at 0.79-0.91x plain decoding (geometric means of the
# sets) drafting from 2-token matches, 1.04-1.21x from 8-token ones, beside 0.96-1.21x
# for llama.cpp's ngram-simple replayed over the same answers.
FIXED_MIN_MATCH = 8


class NgramDrafter(CopyFollower):
    """Prompt lookup over the prompt and the answer so far."""

    name = NAME


def build(params: GenerationParams, resources: Resources) -> NgramDrafter:
    # A fixed policy drafts as far as a draft model would (llama.cpp's --draft-max), on long
    # matches only; the cost model weighs every match and length itself.
    fixed = resources.policy.fixed
    return NgramDrafter(
        params.ngram_min,
        params.ngram_max,
        resources.target.is_eog,
        limit=params.draft_max if fixed else params.ngram_draft_max,
        min_match=FIXED_MIN_MATCH if fixed else 1,
    )
