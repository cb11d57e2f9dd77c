"""What the copying drafters share: drafts read from earlier text, priced as copies.

A copying drafter (prompt lookup, the datastore, a predicted answer) drafts what followed
an earlier occurrence of the text's suffix. Free to run; its q is one-hot. This module holds
what they have in common:

- ``vote``: the continuation most occurrences agree on, token by token.
- ``Streak``: drafts accepted whole in a row from one copy: a copy under way.
- ``CopyOffer``: what a copying drafter could draft this round, on what evidence (the
  matched length, a streak, a resumed copy, the share of occurrences behind it, and where
  they disagree, the share behind each next token).
- ``CopyPricing``: the offer's price and what the drafter learns. A copy under way (a
  streak) is priced by its own estimate per match-length bucket; any other match as a
  mixture: with this text's odds of a long copy it runs on at ``COPY_ALPHA`` a token,
  otherwise it parts at its bucket's rate. The odds are graded from the drafter's drafts
  and from the drafts rounds passed over (``PassedDraft``), as the answer goes on; the
  estimates along a copy under way also from how far the copy went on past a draft
  accepted whole (``CopyPricing.beyond``), since a draft kept short never tries the
  depths it might reach again.
- ``CopyingDrafter``: the protocol's lifecycle around those (offer, observe, learned state),
  for a subclass that finds the copy (``copy_offer``), reads it (``propose``, ``preview``)
  and follows the answer (``advance``).

Draft trees: where a copy's occurrences disagree (``CopyOffer.shares``), a tree of m
branches is priced as the chain's copy curve with its long-copy chance times the m
branches' shares over the drafted one's; a copy under way keeps to its own source.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from localspec.core.acceptance import AcceptanceEstimate, TextCount
from localspec.core.cached_model import common_prefix_length
from localspec.core.drafting.base import NOT_CHOSEN, Branching, Offer, Outcome

# Match-length buckets: (smallest length, chance that a match this long starts a long copy
# in a text that copies, acceptance per token of a match that parts). Measured over greedy
# answers of the default pair at every answer position: in code a 16+ token match runs on
# for 16 more tokens 92% of the time and a 2-token match 16%; in prose almost never (2% at
# most, at any length), while a match that parts keeps a few tokens in both (mean 1.2 tokens
# after a 2-token match, 4-5 after 12). The parting rates below sit under those means: at the
# measured ones, first drafts in prose cost more than they returned in replays of the
# bench's answers (localspec bench replay). Which kind of text this is is learned per text
# (``CopyPricing.copies``).
BUCKETS = (
    (-1, 0.73, 0.78),  # HEAD: the answer has come to the prediction's first tokens
    (0, 0.3, 0.25),  # RESYNC: resuming a parted copy
    (1, 0.1, 0.0),
    (2, 0.16, 0.1),
    (3, 0.27, 0.25),
    (4, 0.41, 0.48),
    (6, 0.5, 0.62),
    (8, 0.59, 0.7),
    (12, 0.73, 0.78),
    (16, 0.92, 0.92),
)
RESYNC = 0  # the bucket of drafts that resume a parted copy (``CopyOffer.resync``)
# The bucket of drafts from a prediction's first tokens, once the answer has come to them
# (``CopyOffer.head``): as sure as a 12-token match, since the caller said the answer copies
# the prediction. Replays of the shipped rewrites and file edits drafted best from there.
HEAD = -1
COPY_ALPHA = 0.99  # per token along a copy of code (measured)
STREAK_PRIOR = 0.97  # the previous draft was accepted whole: the copy likely goes on
# A new text's odds of long copies against the buckets' chances, worth COPY_PSEUDO drafts of
# evidence: unknown text starts at half, so prose pays for at most a draft or two before
# its drafts and passed-over drafts show that it does not copy. A draft or passed-over draft
# is graded a copy when it held for COPY_DEPTH tokens.
COPY_ODDS = 0.5
COPY_PSEUDO = 1.0
COPY_DEPTH = 12
COPY_DECAY = 0.9  # per graded draft: a text that copied may go on to write anew
COPY_MAX = 0.97  # never certain: a copy can always end
# Drafted tokens accepted in a row (drafts accepted whole, from one copy) that make the copy
# one under way: short drafts count together, so that a copy drafted in cheap short batches
# earns the estimates that may lengthen them.
STREAK_MIN = 8


def bucket_of(n: int) -> int:
    """The smallest length of the bucket that a match of ``n`` tokens falls in."""
    return max(lo for lo, _, _ in BUCKETS if lo <= max(n, 1))


def copy_chance(bucket: int) -> float:
    return next(w for lo, w, _ in BUCKETS if lo == bucket)


def parting_alpha(bucket: int) -> float:
    return next(a for lo, _, a in BUCKETS if lo == bucket)


def vote(
    runs: Sequence[Sequence[int]],
    k: int,
    weights: Sequence[int] | None = None,
    ends: Callable[[int], bool] | None = None,
) -> tuple[list[int], list[int], float]:
    """The continuation most ``runs`` (each weighted, default 1) agree on, token by token,
    for at most ``k`` tokens and ending after an end-of-generation token: at each position
    the token most still-agreeing runs go on with (ties: the earlier run). Returns the
    tokens, the indices of the runs that agree with all of them, and the share of the
    weight behind the first token."""
    weights = weights if weights is not None else [1] * len(runs)
    total = sum(weights)
    alive = list(range(len(runs)))
    out: list[int] = []
    first = 0
    for i in range(k):
        votes: dict[int, int] = {}
        for r in alive:
            run = runs[r]
            if i < len(run):
                votes[run[i]] = votes.get(run[i], 0) + weights[r]
        if not votes:
            break
        token = max(votes, key=votes.__getitem__)  # first maximum: the earliest run
        if i == 0:
            first = votes[token]
        out.append(token)
        alive = [r for r in alive if i < len(runs[r]) and runs[r][i] == token]
        if ends is not None and ends(token):
            break
    return out, alive, (first / total if total else 0.0)


@dataclass
class Streak:
    """Drafted tokens accepted in a row, drafts accepted whole, from one copy."""

    copied: int = 0

    def add(self, drafted: int, accepted: int, same_copy: bool) -> None:
        """A draft of ``drafted`` tokens had ``accepted`` accepted; ``same_copy``: it read
        on from the copy the streak counts (else a new copy starts)."""
        run = self.copied if same_copy else 0
        self.copied = run + accepted if accepted == drafted else 0

    @property
    def under_way(self) -> bool:
        return self.copied >= STREAK_MIN


@dataclass(frozen=True)
class CopyOffer:
    """What a copying drafter could draft this round, and on what evidence."""

    available: int  # most tokens it can draft now
    match: int = 0  # how many tokens of the suffix matched (the evidence)
    streak: bool = False  # its previous drafts of this copy were accepted whole: it goes on
    resync: bool = False  # resumes a copy that parted a few tokens ago
    head: bool = False  # reads on from a prediction's first tokens, which the answer has begun
    support: float = 1.0  # share of the match's occurrences that go on as drafted
    # When the occurrences disagree, the share of them that goes on with each distinct next
    # token, the one drafted first (empty: no alternatives).
    shares: tuple[float, ...] = ()

    @property
    def bucket(self) -> int:
        """The bucket a match not yet shown to be a copy is priced and graded in."""
        if self.head:
            return HEAD
        return RESYNC if self.resync else bucket_of(self.match)

    @property
    def evidence(self) -> str:
        if self.head:
            return " (the prediction's start)"
        if self.resync:
            return " (resuming a parted copy)"
        if self.match:
            return f" (match {self.match}{', streak' if self.streak else ''})"
        return ""


def streak_estimate() -> AcceptanceEstimate:
    """A copy under way, proven by a long draft accepted whole: what held at the depths
    tried holds deeper too (measured: 0.99 a token all along copies of code)."""
    return AcceptanceEstimate(prior=STREAK_PRIOR, extrapolate=True)


@dataclass
class CopyEvidence:
    """A copying drafter's graded drafts that held ``COPY_DEPTH`` tokens (``copies``) and
    how many of them the buckets' chances expected, both decayed per graded draft."""

    start: float  # the odds before any evidence, worth ``COPY_PSEUDO`` drafts
    copies: float = 0.0
    expected: float = 0.0

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
        if bucket not in {lo for lo, _, _ in BUCKETS}:
            raise ValueError(f"unknown match-length bucket {key!r}")
        est = streak_estimate()
        est.load(value, keep)
        streaks[bucket] = est
    return streaks


class CopyPricing:
    """A copying drafter's prices and what it learns: this text's odds of long copies (from
    ``start``), and per match-length bucket its estimates along copies under way.
    ``parting``: the most a match that parts keeps per token (a datastore's matches part
    sooner than the prompt's)."""

    def __init__(self, start: float, parting: float = 1.0) -> None:
        self.start, self.parting = start, parting
        self.streaks: dict[int, AcceptanceEstimate] = {}
        self.copies = CopyEvidence(start)
        self._texts = TextCount()

    def new_text(self) -> None:
        keep = self._texts.begin()
        if keep is not None:
            for est in self.streaks.values():
                est.shrink(keep)
            self.copies.shrink(keep)

    def estimate(self, found: CopyOffer) -> AcceptanceEstimate | None:
        """The estimate a copy under way is priced with, per match-length bucket; None for
        a match not yet shown to be a copy (priced by ``curve``)."""
        if not found.streak:
            return None
        bucket = bucket_of(found.match)
        if bucket not in self.streaks:
            self.streaks[bucket] = streak_estimate()
        return self.streaks[bucket]

    def accepted(self, found: CopyOffer, k: int) -> list[float]:
        """Cumulative expected accepted tokens for drafts of 1..k from ``found``."""
        est = self.estimate(found)
        return est.expected_accepted(k) if est is not None else self.curve(found, k)

    def curve(self, found: CopyOffer, k: int, scale: float = 1.0) -> list[float]:
        """Expected accepted tokens for drafts of 1..k from a match not yet shown to be a
        copy: a long copy (``COPY_ALPHA`` a token) with this text's chance of one at this
        match length (times the share of the match's occurrences that go on as drafted,
        and times ``scale``: a tree's branches' shares over the drafted one's), else a
        match that parts at its bucket's rate."""
        bucket = found.bucket
        w = min(COPY_MAX, copy_chance(bucket) * self.copies.odds * found.support * scale)
        parting = min(parting_alpha(bucket), self.parting)
        out, copy, part, total = [], 1.0, 1.0, 0.0
        for _ in range(k):
            copy *= COPY_ALPHA
            part *= parting
            total += w * copy + (1.0 - w) * part
            out.append(total)
        return out

    def tree(self, found: CopyOffer, m: int, k: int) -> list[float]:
        """The copy curve of a tree of ``m`` branches of 1..k tokens."""
        return self.curve(found, k, sum(found.shares[:m]) / found.shares[0])

    def offer(self, name: str, found: CopyOffer) -> Offer:
        trees = not found.streak and len(found.shares) >= 2 and found.shares[0] > 0
        return Offer(
            name,
            found.available,
            partial(self.accepted, found),
            tree=partial(self.tree, found) if trees else None,
            branches=len(found.shares) if trees else 1,
            evidence=found.evidence,
            match=found.match,
        )

    def drafted(self, found: CopyOffer, drafted: int, accepted: int) -> None:
        """A draft from ``found`` had ``accepted`` of its ``drafted`` tokens accepted."""
        est = self.estimate(found)
        if est is None:
            self._grade(found, drafted, accepted)
        else:
            est.observe(drafted, accepted)

    def beyond(self, found: CopyOffer, offset: int, drafted: int, accepted: int) -> None:
        """A draft from a copy under way was accepted whole at ``offset`` tokens; the answer
        has since shown that ``drafted`` more tokens of the copy would have had
        ``accepted`` accepted. Without this, a copy whose draft once parted deep would be
        drafted shorter from then on and never show that its deeper tokens hold again."""
        est = self.estimate(found)
        if est is not None and drafted > 0:
            est.observe_beyond(offset, drafted, accepted)

    def passed(self, found: CopyOffer, drafted: int, accepted: int) -> None:
        """A round passed over ``found``; the answer has since shown that ``drafted``
        tokens of its continuation would have had ``accepted`` accepted. Free evidence of
        whether this text copies from there; for a copy under way, of how far its copies
        go on, so that estimate recovers too while rounds pass it over."""
        if drafted == 0:
            return
        est = self.estimate(found)
        if est is not None:
            est.observe(drafted, accepted)
            return
        if accepted == drafted >= STREAK_MIN:  # it held as far as the text went: a copy
            drafted = accepted = COPY_DEPTH  # (a source a few tokens back, e.g. a repeated line)
        self._grade(found, drafted, accepted)

    def _grade(self, found: CopyOffer, drafted: int, accepted: int) -> None:
        """A draft held ``COPY_DEPTH`` tokens (a copy) or parted before; a shorter draft
        accepted whole says nothing either way."""
        if accepted < min(drafted, COPY_DEPTH):
            copied = 0.0
        elif accepted >= COPY_DEPTH:
            copied = 1.0
        else:
            return
        self.copies.grade(copied, copy_chance(found.bucket) * found.support)

    def learned(self) -> dict[str, Any]:
        return {
            "copies": self.copies.to_list(),
            "streaks": {str(b): est.to_dict() for b, est in sorted(self.streaks.items())},
        }

    def restore(self, data: Any, keep: float) -> None:
        """The estimates along copies under way come back, discounted to ``keep``: they
        are a property of the model pair. The odds of copies are checked but start afresh:
        they belong to the text that earned them (code that copies its prompt, or prose),
        and a new process's prompt is a new text (replays of the bench's answers in a
        shuffled order lost up to 10% on summaries after code when they were carried
        over)."""
        streaks = load_streaks(data["streaks"], keep)
        copies = CopyEvidence(self.start)
        copies.load(data["copies"], 0.0)
        self.streaks, self.copies = streaks, copies


@dataclass
class PassedDraft:
    """A draft a round passed over, graded as the answer goes on: ``verdict`` is None
    until the answer has shown how many of its tokens would have been accepted."""

    found: CopyOffer
    tokens: list[int]
    start: int  # how many tokens were committed when it was passed over

    def verdict(self, committed: Sequence[int]) -> tuple[int, int] | None:
        """``(drafted, accepted)`` once known."""
        seen = committed[self.start : self.start + len(self.tokens)]
        accepted = common_prefix_length(self.tokens, seen)
        if accepted == len(self.tokens) or accepted < len(seen):
            return len(self.tokens), accepted
        return None


@dataclass
class _Offered:
    found: CopyOffer
    at: int  # tokens committed when it was offered


@dataclass
class _Beyond:
    """What a copy under way would have drafted past a draft accepted whole (``offset``
    tokens long), graded as the answer goes on (``PassedDraft.verdict``)."""

    offset: int
    tail: PassedDraft


class CopyingDrafter:
    """The drafter protocol around a copy: a subclass finds it (``copy_offer``), reads it
    (``propose``, ``preview``, and ``alternatives``/``take`` if it branches), and follows
    the answer (``advance``); this class prices its offers, grades its drafts and the
    drafts rounds passed over, and keeps what it learned."""

    name = "copy"
    branching: Branching | None = None

    def __init__(self, pricing: CopyPricing, limit: int) -> None:
        self.pricing = pricing
        self.limit = limit
        self._offered: _Offered | None = None
        self._passed: PassedDraft | None = None
        self._beyond: _Beyond | None = None

    def copy_offer(self, committed: Sequence[int], limit: int) -> CopyOffer | None:
        raise NotImplementedError

    def preview(self, k: int) -> list[int]:
        raise NotImplementedError

    def continuation(self, k: int) -> list[int]:
        """Up to ``k`` tokens the draft just proposed would have gone on with (none when
        the drafter cannot say)."""
        return []

    def advance(self, committed: Sequence[int], outcome: Outcome) -> None:
        """Follow the answer to ``committed`` after a round (``outcome``: this drafter's
        part in it)."""

    def begin_text(self) -> None:
        """A new answer begins: what the drafter keeps of the last one's evidence."""
        self.pricing.new_text()
        self._offered, self._passed, self._beyond = None, None, None

    def offer(self, committed: Sequence[int], limit: int) -> Offer | None:
        found = self.copy_offer(committed, limit) if limit > 0 else None
        self._offered = _Offered(found, len(committed)) if found is not None else None
        return self.pricing.offer(self.name, found) if found is not None else None

    def observe(self, committed: Sequence[int], outcome: Outcome = NOT_CHOSEN) -> None:
        offered, self._offered = self._offered, None
        if offered is not None and not outcome.chosen and self._passed is None:
            # What it would have drafted, read before it follows the answer on.
            self._passed = PassedDraft(offered.found, self.preview(COPY_DEPTH), offered.at)
        if offered is not None and outcome.chosen and self._beyond is None:
            self._beyond = self._past_draft(offered, outcome)  # read before the copy moves on
        self.advance(committed, outcome)
        if offered is not None and outcome.chosen and outcome.drafted > 0:
            self.pricing.drafted(offered.found, outcome.drafted, outcome.accepted)
        if self._passed is not None and (graded := self._passed.verdict(committed)):
            self.pricing.passed(self._passed.found, *graded)
            self._passed = None
        if self._beyond is not None and (graded := self._beyond.tail.verdict(committed)):
            self.pricing.beyond(self._beyond.tail.found, self._beyond.offset, *graded)
            self._beyond = None

    def _past_draft(self, offered: _Offered, outcome: Outcome) -> _Beyond | None:
        """For a draft from a copy under way accepted whole and shorter than the longest
        allowed, the rest of the copy up to that length, to grade once the answer shows it."""
        drafted = outcome.drafted
        if not 0 < drafted == outcome.accepted < self.limit:
            return None
        if self.pricing.estimate(offered.found) is None:
            return None
        tail = self.continuation(self.limit - drafted)
        if not tail:
            return None
        return _Beyond(drafted, PassedDraft(offered.found, tail, offered.at + drafted))

    def learned(self) -> dict[str, Any]:
        return self.pricing.learned()

    def restore(self, data: Any, keep: float) -> None:
        self.pricing.restore(data, keep)
