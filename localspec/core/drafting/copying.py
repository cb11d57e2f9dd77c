"""The copying drafter: drafts read from earlier text, priced as copies.

Prompt lookup, a predicted answer and the datastores draft what followed an earlier
occurrence of the text's suffix: free to run, with a one-hot q. They are one drafter,
``CopyDrafter``, composed of three parts:

- a ``CopySource`` finds the copy, reads it and follows the answer (``follow.Follower`` over
  the prompt and the answer, ``prediction.PredictionSource`` over a prediction,
  ``store.StoreSource`` over the user's corpora). Each round it says what it could draft
  and on what evidence (``evidence.CopyOffer``);
- a ``pricing.CopyPricing`` prices that evidence and learns from grades;
- a ``grades.Grades`` queue holds what the drafter would have drafted and the answer has
  not graded yet: the draft a round passed over (``PASSED``), and the rest of a copy under
  way past a draft of it accepted whole and shorter than the limit (``BEYOND``). Its own
  drafts are graded by the target at once (``DRAFTED``).

Also shared by the sources: ``vote``, the continuation most occurrences agree on, and
``Streak``, drafted tokens accepted whole in a row from one copy (a copy under way).

One copy, one offer (``one_copy``). Where two copying drafters would draft the same tokens
this round, as far as both can draft (a prediction of the file the prompt also holds, a
datastore holding the prompt's text), they read one copy, and only one of their offers is
weighed: the controller takes the best of its candidates, so two estimates of one copy would
bet on whichever is the more optimistic (and their drafts, split between them, would build
neither's streak). The one weighed is the first drafter's in registry order (prompt lookup),
which is then what it is without the other, unless the other's evidence is what only it
knows, a prediction's start (``Evidence.START``), or the other reads further (the first's
source ends sooner), or this text's copies of its source have borne out their odds better
(``CopyDrafter.proven``). A prediction ends with the file it predicts; the prompt holding
that file goes on with what closes it, so near the file's end prompt lookup's offer, the
longer, is weighed. The one left out follows the round as it would have alone: where its
own offer would have been chosen in the other's place (the controller asked again without
the other's), a draft of the copy is its draft too, and it follows it as its own (its
place in the source, its streak, its grades), so that the rounds after fall as they would
without the other drafter; where its offer would not have been chosen, it learns from the
round as from any that passed it over. So a prediction whose text is in the prompt is never
worth less than prompt lookup reading it there. Drafts that part somewhere (a repeat of an
earlier answer, which the prompt holds only up to the answer's edits) are two copies, both
weighed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from localspec.core.cached_model import common_prefix_length
from localspec.core.drafting.base import NOT_CHOSEN, Branching, Draft, Drafter, Offer, Outcome
from localspec.core.drafting.evidence import CopyOffer, Evidence
from localspec.core.drafting.grades import Grade, Grades, Pending
from localspec.core.drafting.pricing import CopyPricing
from localspec.core.drafting.tunables import COPY_DEPTH, STREAK_MIN
from localspec.core.params import GenerationParams


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


class CopySource(Protocol):
    """Where a copying drafter's drafts come from: it finds the copy, reads it and follows
    the answer; what a draft on its evidence is worth is the pricing's."""

    def begin(self, prompt: Sequence[int], params: GenerationParams | None) -> None:
        """A new answer after ``prompt``."""

    def end(self) -> None:
        """The answer is over: free what only it needed."""

    def find(self, committed: Sequence[int], limit: int) -> CopyOffer | None:
        """What it could draft after ``committed`` (1..``limit`` tokens), on what
        evidence; None: nothing."""

    def preview(self, k: int) -> list[int]:
        """Up to ``k`` tokens ``draft`` would draft after the last ``find``, undrafted."""

    def draft(self, committed: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens after ``committed``, which ``advance`` then follows."""

    def continuation(self, k: int) -> list[int]:
        """Up to ``k`` tokens the copy goes on with past the draft just made (none when
        it cannot say)."""

    def alternatives(self, k: int, m: int) -> list[list[int]]:
        """As ``Branching.alternatives``, in the order of the offer's ``shares``."""

    def take(self, i: int) -> None:
        """After ``alternatives``: branch ``i`` is the draft ``advance`` follows."""

    def advance(self, committed: Sequence[int], outcome: Outcome) -> None:
        """Follow the answer to ``committed`` after a round (``outcome``: the drafter's
        part in it)."""


class CopyDrafter:
    """The drafter protocol over a copy source, its pricing and its pending grades
    (module docstring). ``limit``: the longest draft it may propose in a round."""

    def __init__(self, name: str, source: CopySource, pricing: CopyPricing, limit: int) -> None:
        self.name = name
        self.source = source
        self.pricing = pricing
        self.limit = limit
        self.branching: Branching | None = self
        self.grades: Grades[CopyOffer] = Grades()
        self._offered: tuple[CopyOffer, int] | None = None  # this round's, and where
        self._drafted: list[int] | None = None  # this round's draft (the branch taken)
        self._branches: list[list[int]] = []  # this round's tree's, for ``take``
        # The drafter whose offer of this drafter's copy was weighed instead (``one_copy``).
        self._weighed_for: CopyDrafter | None = None

    @property
    def warnings(self) -> list[str]:
        """The source's lines for the engine to yield (``base.Warns``), if it has any."""
        found: list[str] = getattr(self.source, "warnings", [])
        return found

    def begin(self, prompt: Sequence[int], params: GenerationParams | None = None) -> None:
        """A new answer: what the pricing keeps of the last one's evidence, and nothing
        pending from it."""
        self.pricing.new_text()
        self.grades.clear()
        self._offered = None
        self.source.begin(prompt, params)

    def end(self) -> None:
        self.source.end()

    def copy_offer(self, committed: Sequence[int], limit: int) -> CopyOffer | None:
        """What the source could draft after ``committed``, on what evidence."""
        return self.source.find(committed, limit) if limit > 0 else None

    @property
    def proven(self) -> float:
        """How far this text's copies of the source have borne out its odds: the odds
        learned over those it started from (1 before any grade)."""
        return self.pricing.copies.odds / self.pricing.start

    @property
    def offered(self) -> CopyOffer | None:
        """This round's copy offer (after ``offer``), until the round is observed."""
        return self._offered[0] if self._offered is not None else None

    def offer(self, committed: Sequence[int], limit: int) -> Offer | None:
        self._drafted, self._weighed_for = None, None
        copy = self.copy_offer(committed, limit)
        self._offered = (copy, len(committed)) if copy is not None else None
        return self.pricing.offer(self.name, copy) if copy is not None else None

    def propose(
        self,
        committed: Sequence[int],
        k: int,
        params: GenerationParams,
        rng: np.random.Generator,
    ) -> Draft:
        self._drafted = self.source.draft(committed, k)
        return Draft(self.name, self._drafted)

    def preview(self, k: int) -> list[int]:
        return self.source.preview(k)

    def alternatives(self, k: int, m: int) -> list[list[int]]:
        self._branches = self.source.alternatives(k, m)
        self._drafted = self._branches[0] if self._branches else None
        return self._branches

    def take(self, i: int) -> None:
        self._drafted = self._branches[i]
        self.source.take(i)

    def observe(self, committed: Sequence[int], outcome: Outcome = NOT_CHOSEN) -> None:
        if not outcome.chosen:
            outcome = self._drafted_for_it(committed) or outcome
        offered, self._offered = self._offered, None
        if offered is not None:  # read before the source follows the answer on
            self._queue(*offered, outcome)
        self.source.advance(committed, outcome)
        if offered is not None and outcome.chosen and outcome.drafted > 0:
            self.pricing.grade(Grade.DRAFTED, offered[0], outcome.drafted, outcome.accepted)
        for pending, drafted, accepted in self.grades.due(committed):
            self.pricing.grade(pending.kind, pending.subject, drafted, accepted, pending.offset)

    def _drafted_for_it(self, committed: Sequence[int]) -> Outcome | None:
        """Where ``one_copy`` weighed another drafter's offer of this one's copy and the
        round drafted it, the draft this drafter would have drafted of the same tokens, and
        its outcome: it follows the round as its own (its place, streak and grades), as if
        the copy had been offered by it alone."""
        other, self._weighed_for = self._weighed_for, None
        if other is None or other._drafted is None or self._offered is None:
            return None
        at = self._offered[1]
        tokens = self.source.draft(committed[:at], len(other._drafted))
        if not tokens or tokens != other._drafted[: len(tokens)]:
            return None
        return Outcome(True, len(tokens), common_prefix_length(tokens, committed[at:]))

    def _queue(self, copy: CopyOffer, at: int, outcome: Outcome) -> None:
        """Queue what the round's offer leaves to the answer to grade: the draft a round
        passed over, or the rest of a copy under way past a draft accepted whole that was
        kept shorter than the limit."""
        if not outcome.chosen:
            if not self.grades.covered(Grade.PASSED, at):
                tokens = tuple(self.source.preview(COPY_DEPTH))
                self.grades.add(Pending(Grade.PASSED, copy, tokens, at))
            return
        drafted = outcome.drafted
        if copy.under_way and 0 < drafted == outcome.accepted < self.limit:
            start = at + drafted
            if not self.grades.covered(Grade.BEYOND, start):
                tail = tuple(self.source.continuation(self.limit - drafted))
                self.grades.add(Pending(Grade.BEYOND, copy, tail, start, drafted))

    def learned(self) -> dict[str, Any]:
        return self.pricing.learned()

    def restore(self, data: Any, keep: float) -> None:
        self.pricing.restore(data, keep)


def _weighs_second(a: CopyDrafter, a_copy: CopyOffer, b: CopyDrafter, b_copy: CopyOffer) -> bool:
    """Of two offers of one copy, whether the second's is the one weighed: a prediction's
    start, which only it knows; else the one that reads further (the other's source ends
    first: a prediction ends with the file, the prompt goes on with what closes it); else
    the one whose copies have borne out their odds better."""
    a_start, b_start = a_copy.evidence is Evidence.START, b_copy.evidence is Evidence.START
    if a_start != b_start:
        return b_start
    if a_copy.available != b_copy.available:
        return b_copy.available > a_copy.available
    return b.proven > a.proven


def one_copy(
    offers: dict[str, Offer],
    drafters: dict[str, Drafter],
    chooses: Callable[[list[Offer]], str | None] | None = None,
) -> dict[str, Offer]:
    """``offers`` (by drafter, in registry order) with one offer per copy: of two copying
    drafters whose drafts agree as far as both can draft, the first's, unless the second's
    evidence is a prediction's start, it reads further, or its copies have borne out their
    odds better (module docstring). The one left out learns from the round as from any round
    that passed it over, unless ``chooses`` (the drafter a round would draft from, given
    offers) would have drafted from its offer, weighed in place of the other's: then it
    follows a draft of its copy as its own."""
    copies = []
    for name in offers:
        drafter = drafters.get(name)
        if isinstance(drafter, CopyDrafter) and drafter.offered is not None:
            copies.append((name, drafter, drafter.offered))
    if len(copies) < 2:
        return offers
    kept = dict(offers)
    for i, (first, a, a_copy) in enumerate(copies):
        for second, b, b_copy in copies[i + 1 :]:
            if first not in kept or second not in kept:
                continue
            k = min(a_copy.available, b_copy.available)
            if a.preview(k) != b.preview(k):
                continue
            weighed, left = (
                (second, first) if _weighs_second(a, a_copy, b, b_copy) else (first, second)
            )
            instead = [o for n, o in kept.items() if n != weighed]  # ``left``'s in its place
            if chooses is not None and chooses(instead) == left:
                left_out, other = (a, b) if left == first else (b, a)
                left_out._weighed_for = other
            del kept[left]
    return kept
