"""Copy pricing: what a copy is expected to keep, and what its grades teach.

A ``CopyPricing`` prices a ``CopyOffer`` by its evidence (``evidence.Evidence``):

- a copy under way (``UNDER_WAY``) by its own estimate of acceptance along copies, one per
  match-length bucket, which may lengthen its drafts as far as they hold
  (``AcceptanceEstimate`` with ``extrapolate``);
- anything else as a mixture: with this text's odds of long copies times the prior's chance
  of one (``tunables.Prior``) it runs on at ``COPY_ALPHA`` a token, otherwise it parts at
  the prior's rate. Where the copy's occurrences disagree, the chance is scaled by the share
  of them behind the draft, and a draft tree of ``m`` branches by the ``m`` shares over the
  drafted one's.

Grades (``grades.Grade``) teach it: a graded draft not of a copy under way is a copy when it
held ``COPY_DEPTH`` tokens and not one when it parted before (a shorter draft accepted whole
says nothing), which moves the text's odds (``CopyOdds``); a grade of a copy under way goes
to its estimate, and so does how far the copy went on past a draft accepted whole
(``BEYOND``), since a draft kept short never tries the depths it might reach again.

``learned()`` is the estimates along copies (a property of the model pair); the odds belong
to the text that earned them and start afresh in every process.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any

from localspec.core.acceptance import AcceptanceEstimate, TextCount
from localspec.core.drafting.base import Offer
from localspec.core.drafting.evidence import CopyOffer, match_bucket
from localspec.core.drafting.grades import Grade
from localspec.core.drafting.tunables import (
    COPY_ALPHA,
    COPY_DECAY,
    COPY_DEPTH,
    COPY_MAX,
    COPY_PSEUDO,
    MATCH_PRIORS,
    STREAK_MIN,
    STREAK_PRIOR,
)


def streak_estimate() -> AcceptanceEstimate:
    """A copy under way, proven by drafts accepted whole: what held at the depths tried
    holds deeper too."""
    return AcceptanceEstimate(prior=STREAK_PRIOR, extrapolate=True)


class CopyOdds:
    """A text's graded drafts that held ``COPY_DEPTH`` tokens (``copies``) against how many
    of them the priors' chances expected, both decayed per graded draft; before any, the
    odds are ``start``, worth ``COPY_PSEUDO`` graded drafts."""

    def __init__(self, start: float) -> None:
        self.start = start
        self.copies = 0.0
        self.expected = 0.0

    @property
    def odds(self) -> float:
        return (self.copies + COPY_PSEUDO * self.start) / (self.expected + COPY_PSEUDO)

    def grade(self, copied: float, expected: float) -> None:
        self.copies = self.copies * COPY_DECAY + copied
        self.expected = self.expected * COPY_DECAY + expected

    def shrink(self, keep: float) -> None:
        self.copies *= keep
        self.expected *= keep

    def to_list(self) -> list[float]:
        return [round(self.copies, 4), round(self.expected, 4)]

    def load(self, data: Any, keep: float) -> None:
        """Take ``keep`` of saved evidence; ``ValueError`` unless it is well formed."""
        copies, expected = (float(x) for x in data)
        if not (copies >= 0 and expected >= 0 and math.isfinite(copies + expected)):
            raise ValueError("copy evidence must be two non-negative numbers")
        self.copies, self.expected = copies * keep, expected * keep


def load_streaks(data: Any, keep: float) -> dict[int, AcceptanceEstimate]:
    streaks: dict[int, AcceptanceEstimate] = {}
    for key, value in data.items():
        bucket = int(key)
        if bucket not in {lo for lo, _ in MATCH_PRIORS}:
            raise ValueError(f"unknown match-length bucket {key!r}")
        est = streak_estimate()
        est.load(value, keep)
        streaks[bucket] = est
    return streaks


class CopyPricing:
    """A copying drafter's prices and what it learns (module docstring): this text's odds
    of long copies, from ``start``, and per match-length bucket the estimates along copies
    under way. ``parting``: the most a draft that parts keeps per token (a datastore's
    drafts part sooner than the prompt's)."""

    def __init__(self, start: float, parting: float = 1.0) -> None:
        self.start, self.parting = start, parting
        self.streaks: dict[int, AcceptanceEstimate] = {}
        self.copies = CopyOdds(start)
        self._texts = TextCount()

    def new_text(self) -> None:
        keep = self._texts.begin()
        if keep is not None:
            for est in self.streaks.values():
                est.shrink(keep)
            self.copies.shrink(keep)

    def estimate(self, copy: CopyOffer) -> AcceptanceEstimate | None:
        """The estimate a copy under way is priced with, per match-length bucket; None for
        other evidence (priced by ``curve``)."""
        if not copy.under_way:
            return None
        bucket = match_bucket(copy.match)
        if bucket not in self.streaks:
            self.streaks[bucket] = streak_estimate()
        return self.streaks[bucket]

    def expected_accepted(self, copy: CopyOffer, k: int) -> list[float]:
        """Cumulative expected accepted tokens for drafts of 1..k from ``copy``."""
        est = self.estimate(copy)
        return est.expected_accepted(k) if est is not None else self.curve(copy, k)

    def curve(self, copy: CopyOffer, k: int, scale: float = 1.0) -> list[float]:
        """Expected accepted tokens for drafts of 1..k on evidence other than a copy under
        way: a long copy with this text's chance of one on it (times the share of the
        occurrences behind the draft, and times ``scale``: a tree's branches' shares over
        the drafted one's), else a draft that parts at the prior's rate."""
        prior = copy.prior
        w = min(COPY_MAX, prior.copy_chance * self.copies.odds * copy.support * scale)
        parting = min(prior.parting, self.parting)
        out, along, part, total = [], 1.0, 1.0, 0.0
        for _ in range(k):
            along *= COPY_ALPHA
            part *= parting
            total += w * along + (1.0 - w) * part
            out.append(total)
        return out

    def tree(self, copy: CopyOffer, m: int, k: int) -> list[float]:
        """The copy curve of a tree of ``m`` branches of 1..k tokens."""
        return self.curve(copy, k, sum(copy.shares[:m]) / copy.shares[0])

    def offer(self, name: str, copy: CopyOffer) -> Offer:
        """The offer of ``copy``; a copy under way keeps to its own source (no tree)."""
        trees = not copy.under_way and len(copy.shares) >= 2 and copy.shares[0] > 0
        return Offer(
            name,
            copy.available,
            partial(self.expected_accepted, copy),
            tree=partial(self.tree, copy) if trees else None,
            branches=len(copy.shares) if trees else 1,
            label=copy.label,
            match=copy.match,
        )

    def grade(
        self, kind: Grade, copy: CopyOffer, drafted: int, accepted: int, offset: int = 0
    ) -> None:
        """What a grade of ``kind`` of a draft on ``copy`` teaches: ``accepted`` of its
        ``drafted`` tokens held (for ``BEYOND``, those past the ``offset`` tokens of a draft
        accepted whole)."""
        if kind is Grade.PASSED and drafted == 0:
            return  # nothing was there to pass over
        est = self.estimate(copy)
        if kind is Grade.BEYOND:
            if est is not None and drafted > 0:
                est.observe_beyond(offset, drafted, accepted)
        elif est is not None:
            est.observe(drafted, accepted)
        else:
            if kind is Grade.PASSED and accepted == drafted >= STREAK_MIN:
                # It held as far as the text went (a source a few tokens back, e.g. a
                # repeated line): a copy.
                drafted = accepted = COPY_DEPTH
            self._grade_odds(copy, drafted, accepted)

    def _grade_odds(self, copy: CopyOffer, drafted: int, accepted: int) -> None:
        """A draft held ``COPY_DEPTH`` tokens (a copy) or parted before; a shorter draft
        accepted whole says nothing either way."""
        if accepted < min(drafted, COPY_DEPTH):
            copied = 0.0
        elif accepted >= COPY_DEPTH:
            copied = 1.0
        else:
            return
        self.copies.grade(copied, copy.prior.copy_chance * copy.support)

    def learned(self) -> dict[str, Any]:
        return {
            "copies": self.copies.to_list(),
            "streaks": {str(b): est.to_dict() for b, est in sorted(self.streaks.items())},
        }

    def restore(self, data: Any, keep: float) -> None:
        """The estimates along copies under way come back, discounted to ``keep``: they
        are a property of the model pair. The odds of copies are checked but start afresh:
        they belong to the text that earned them (code that copies its prompt, or prose),
        and a new process's prompt is a new text (see docs/how-it-works.md, "What auto
        learns")."""
        streaks = load_streaks(data["streaks"], keep)
        copies = CopyOdds(self.start)
        copies.load(data["copies"], 0.0)
        self.streaks, self.copies = streaks, copies
