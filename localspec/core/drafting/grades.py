"""Pending grades: what a drafter would have drafted, graded as the answer goes on.

A drafter learns from more than its own drafts, which the target grades at once: from the
drafts a round passed over, and from how far a copy went on past a draft of it accepted
whole (the depths a short draft left untried). Each is a ``Pending`` grade, the tokens it
would have drafted after a committed length, kept in one queue (``Grades``) until the
answer has shown how many of them hold: ``due`` gives those it has (the answer parted from
them, or reached their end); ``settle`` grades every pending one on what the answer has
shown so far, for a drafter that grades each round at once (lookahead).

Rules:

- one stretch of the answer is evidence once per kind: a grade whose first token a pending
  grade of the same kind covers is not queued (``add`` returns False), since it would read
  the same answer tokens again (the draft a round passes over while an earlier one is still
  being read is that earlier copy, one token on);
- the grades due in a round come out in the order of ``Grade``, then as they were queued.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Generic, TypeVar

from localspec.core.cached_model import common_prefix_length

T = TypeVar("T")


class Grade(Enum):
    """What a grade is of."""

    DRAFTED = 0  # the round's own draft: graded by the target at once, never queued
    PASSED = 1  # a draft the round passed over
    BEYOND = 2  # the rest of a copy past a draft of it accepted whole (``offset`` long)


@dataclass(frozen=True)
class Pending(Generic[T]):
    """``tokens`` a drafter would have drafted after ``start`` committed tokens, on
    ``subject`` (what it priced them with)."""

    kind: Grade
    subject: T
    tokens: tuple[int, ...]
    start: int
    offset: int = 0  # BEYOND: the tokens of the draft accepted whole before these

    def covers(self, at: int) -> bool:
        return self.start <= at < self.start + len(self.tokens)

    def verdict(self, committed: Sequence[int]) -> tuple[int, int] | None:
        """``(drafted, accepted)`` once the answer shows it, else None."""
        drafted, accepted = self.so_far(committed)
        if accepted == len(self.tokens) or accepted < drafted:
            return len(self.tokens), accepted
        return None

    def so_far(self, committed: Sequence[int]) -> tuple[int, int]:
        """``(tokens the answer has reached, of those accepted)``."""
        seen = committed[self.start : self.start + len(self.tokens)]
        return len(seen), common_prefix_length(self.tokens, seen)


Graded = tuple[Pending[T], int, int]  # a grade and its (drafted, accepted)


class Grades(Generic[T]):
    """The queue of a drafter's pending grades (module docstring)."""

    def __init__(self) -> None:
        self._pending: list[Pending[T]] = []

    def __len__(self) -> int:
        return len(self._pending)

    def covered(self, kind: Grade, at: int) -> bool:
        """Whether a pending grade of ``kind`` covers the answer's token ``at``: a grade of
        that kind from there would not be queued."""
        return any(p.kind is kind and p.covers(at) for p in self._pending)

    def add(self, pending: Pending[T]) -> bool:
        """Queue ``pending``, unless it is empty or a pending grade of its kind covers its
        first token (it would count those answer tokens twice)."""
        if not pending.tokens or self.covered(pending.kind, pending.start):
            return False
        self._pending.append(pending)
        return True

    def due(self, committed: Sequence[int]) -> list[Graded[T]]:
        """The grades the answer ``committed`` has settled, taken off the queue."""
        done: list[Graded[T]] = []
        kept: list[Pending[T]] = []
        for pending in self._pending:
            verdict = pending.verdict(committed)
            if verdict is None:
                kept.append(pending)
            else:
                done.append((pending, *verdict))
        self._pending = kept
        return sorted(done, key=lambda graded: graded[0].kind.value)  # stable

    def settle(self, committed: Sequence[int]) -> list[Graded[T]]:
        """Every pending grade on what ``committed`` has shown of it (those it has shown
        nothing of are dropped); the queue is left empty."""
        pending, self._pending = self._pending, []
        graded = [(p, *p.so_far(committed)) for p in pending]
        return [g for g in graded if g[1] > 0]

    def clear(self) -> None:
        self._pending = []
