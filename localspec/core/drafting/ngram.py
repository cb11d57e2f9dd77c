"""Prompt lookup: drafts copied from the prompt and the answer so far.

Its source is a ``follow.Follower`` over the committed text itself: the prompt, then the
answer as it grows. It finds earlier occurrences of the text's longest suffix and drafts
what followed them, following a copy through the edits the answer makes; its offers are
priced and its drafts graded as copies (``copying.CopyDrafter``). Free to run; its q is
one-hot, so ``Draft.probs`` is None.

A fixed policy (``--drafter ngram``) has no cost model to weigh a match: it drafts from
matches of at least ``tunables.FIXED_MIN_MATCH`` tokens, as far as a draft model would
(llama.cpp's ``--draft-max``); see docs/measurements.md for what that gives beside
llama.cpp's n-gram modes.
"""

from __future__ import annotations

from collections.abc import Callable

from localspec.core.drafting.base import Resources
from localspec.core.drafting.copying import CopyDrafter
from localspec.core.drafting.follow import Follower
from localspec.core.drafting.pricing import CopyPricing
from localspec.core.drafting.tunables import COPY_ODDS, FIXED_MIN_MATCH
from localspec.core.params import GenerationParams

NAME = "ngram"


def ngram_drafter(
    n_min: int = 2,
    n_max: int = 32,
    ends: Callable[[int], bool] | None = None,
    *,
    limit: int = 64,
    min_match: int = 1,
) -> CopyDrafter:
    """Prompt lookup over the prompt and the answer so far, matching suffixes of
    ``n_min``..``n_max`` tokens (at least ``min_match``); ``ends`` tells
    end-of-generation tokens, after which a draft stops."""
    source = Follower(n_min, n_max, ends, min_match=min_match)
    return CopyDrafter(NAME, source, CopyPricing(COPY_ODDS), limit)


def build(params: GenerationParams, resources: Resources) -> CopyDrafter:
    # A fixed policy drafts as far as a draft model would (llama.cpp's --draft-max), on long
    # matches only; the cost model weighs every match and length itself.
    fixed = resources.policy.fixed
    return ngram_drafter(
        params.ngram_min,
        params.ngram_max,
        resources.target.is_eog,
        limit=params.draft_max if fixed else params.ngram_draft_max,
        min_match=FIXED_MIN_MATCH if fixed else 1,
    )
