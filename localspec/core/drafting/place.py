"""Where a copy stands in its source as the answer goes on, through the edits it makes.

``CopyPlace`` follows a copy in a growing token list (a ``follow.Follower``'s text). Once a
draft from it is accepted, a cursor (``Cursor``) keeps the copy's place in the source and
moves along as the answer goes on, so the copy is followed even where the suffix no longer
matches; ``run`` counts the answer tokens it has followed since it (re)started, ``streak``
its drafts accepted whole in a row. When the answer parts from the source (a renamed
variable, an inserted type hint), the places where it may come back are kept (``Parted``):
the parted token itself (text was inserted before it), the token after it (it was
replaced), or a few tokens further once two tokens agree (a longer span was replaced).
Where several agree, the copy comes back where its source agrees with the most of what the
answer wrote since it parted: where " iter" "_values" " =" " iter(" is renamed to
" iterator" " =" " iter(", the answer's " iter" agrees with the parted place itself (as if
" iterator =" had been inserted before it) and " =" " iter" with the source two tokens
further on, and only the second reads on right.

Edits. What the answer wrote in place of a source span between parting and coming back is
an edit: a few source tokens (``key``) replaced by a few others (``value``). Rewrites repeat
their edits (every use of a renamed variable, every line of a re-indented block), so every
read (``read``) applies the edits learned so far to the source; an edit the answer does not
make where it applied is forgotten. Insertions and deletions are not edits: they belong to
one place. Nor is a passage the answer copied from elsewhere in the text (its tokens since
it parted, through those that agree again, found together earlier: a docstring line written
as another docstring of the file has it). Nor are two spans that traded places (each
learned as written in the other's place, as two lines swapped are): a swap is not repeated
further on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from localspec.core.drafting.copying import Streak
from localspec.core.drafting.tunables import (
    COPIED_SPAN,
    EDIT_MAX,
    EDIT_REACH,
    MAX_EDITS,
    RESYNC_MISSES,
)

Edit = tuple[tuple[int, ...], tuple[int, ...]]  # (key, value)


@dataclass(frozen=True)
class Cursor:
    """A place in the source: the position read next, after the rest of an edit's value
    (``pending``, written in place of the source key ``edit``) when one is under way."""

    at: int
    pending: tuple[int, ...] = ()
    edit: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Parted:
    """A copy that parted: at source position ``at``, where answer token ``answer`` differed;
    ``misses``: answer tokens since that did not bring it back."""

    at: int
    answer: int
    misses: int = 0


# A draft: where it read from, the cursor after each of its tokens, and the run it continues.
Drafted = tuple[Cursor, list[Cursor], int]


class CopyPlace:
    """The copy under way in ``tokens`` (shared with the text that grows), its parted copy
    and the edits of this text (module docstring); ``ends`` tells end-of-generation tokens,
    after which a read stops. ``seal``: where a source that is not the answer's context
    ends (a prediction's end, the answer after it): a copy read from the source stops
    there, as what the answer wrote first does not follow the source's last token."""

    def __init__(
        self,
        tokens: list[int],
        ends: Callable[[int], bool] | None = None,
        seal: int | None = None,
    ) -> None:
        self.tokens = tokens
        self.ends = ends
        self.seal = seal
        self.cursor: Cursor | None = None  # the copy under way
        self.run = 0  # answer tokens the cursor has followed since the copy (re)started
        self.parted: Parted | None = None
        self.streak = Streak()  # of the copy under way
        self.edits: dict[tuple[int, ...], tuple[int, ...]] = {}  # key -> value, oldest first
        self._by_first: dict[int, list[Edit]] = {}  # by the key's first token, longest first

    # -- reading the source through the edits ----------------------------------------------

    def bound(self, at: int, end: int) -> int:
        """Where a copy read from position ``at`` ends, reading source before ``end``: at
        the seal for a place in the source (the seal itself is its end, read no further)."""
        seal = self.seal
        return min(end, seal) if seal is not None and at <= seal else end

    def step(self, cursor: Cursor, end: int) -> tuple[int, Cursor] | None:
        """The token the copy at ``cursor`` writes next, reading source before ``end``, and
        the cursor after it; None at the end of the source."""
        if cursor.pending:
            return cursor.pending[0], Cursor(cursor.at, cursor.pending[1:], cursor.edit)
        toks = self.tokens
        end = self.bound(cursor.at, end)
        if cursor.at >= end:
            return None
        for key, value in self._by_first.get(toks[cursor.at], ()):
            if cursor.at + len(key) <= end and tuple(toks[cursor.at : cursor.at + len(key)]) == key:
                return value[0], Cursor(cursor.at + len(key), value[1:], key)
        return toks[cursor.at], Cursor(cursor.at + 1)

    def read(self, cursor: Cursor, k: int) -> tuple[list[int], list[Cursor]]:
        """Up to ``k`` tokens from ``cursor`` with the edits applied, ending after an
        end-of-generation token, and the cursor after each of them."""
        tokens: list[int] = []
        cursors: list[Cursor] = []
        end = len(self.tokens)
        while len(tokens) < k:
            step = self.step(cursor, end)
            if step is None:
                break
            token, cursor = step
            tokens.append(token)
            cursors.append(cursor)
            if self.ends is not None and self.ends(token):
                break
        return tokens, cursors

    def live(self) -> bool:
        """Whether the copy under way has anything left to read."""
        cursor = self.cursor
        if cursor is None:
            return False
        return bool(cursor.pending or cursor.at < self.bound(cursor.at, len(self.tokens)))

    # -- following the answer ----------------------------------------------------------------

    def start_at(self, at: int, run: int = 0) -> None:
        """The copy under way reads source position ``at`` next, having followed ``run``
        answer tokens; no parted copy."""
        self.cursor, self.run, self.parted = Cursor(at), run, None

    def lose(self) -> None:
        """No copy under way, and no parted one to come back to."""
        self.cursor, self.run, self.parted = None, 0, None

    def took(self, draft: Drafted, drafted: int, accepted: int) -> None:
        """The answer took ``accepted`` tokens of ``draft`` (of ``drafted``): the copy goes
        on from there, and drafts accepted whole in a row from one copy add up to a copy
        under way."""
        start, cursors, run = draft
        self.streak.add(drafted, accepted, start == self.cursor)
        self.cursor = cursors[accepted - 1] if accepted else start
        self.run, self.parted = run + accepted, None

    def follow(self, i: int, end: int) -> None:
        """Move the copy's place past answer token ``i``, reading source before ``end``."""
        token = self.tokens[i]
        cursor = self.cursor
        if cursor is not None:
            step = self.step(cursor, end)
            if step is not None and step[0] == token:
                self.cursor, self.run = step[1], self.run + 1
                return
            # Parted. An edit that applied here is not one this answer makes.
            wrong = cursor.edit if cursor.pending else (step[1].edit if step else None)
            if wrong is not None:
                self._forget(wrong)
            self.cursor, self.run, self.streak = None, 0, Streak()
            self.parted = Parted(cursor.at, i)
            return
        if self.parted is not None:
            self._rejoin(i, end)

    def _rejoin(self, i: int, end: int) -> None:
        """Whether answer token ``i`` brings the parted copy back to its source: at the
        source token that agrees with it over the most answer tokens since the parting
        (one is enough at the parted token or the one after it, two further on), the
        nearer of two that agree as far."""
        parted, toks = self.parted, self.tokens
        assert parted is not None
        p, a = parted.at, parted.answer
        best, agreed = None, 0
        for q in range(p, min(p + 1 + EDIT_REACH, self.bound(p, end))):
            n = self._agreement(q, i, p, a)
            if n > agreed and n >= (1 if q <= p + 1 else 2):
                best, agreed = q, n
        if best is not None:
            # text inserted before p, or source tokens p.. replaced by the answer's a..,
            # unless the answer copied them from elsewhere
            if not self._copied(a, i):
                self._learn(tuple(toks[p : best - agreed + 1]), tuple(toks[a : i - agreed + 1]))
            self.start_at(best + 1, agreed)
            return
        misses = parted.misses + 1
        self.parted = Parted(p, a, misses) if misses <= RESYNC_MISSES else None

    def _copied(self, a: int, i: int) -> bool:
        """Whether the answer's tokens ``a..i`` (what it wrote since it parted, through the
        tokens that agree again), ``COPIED_SPAN`` or more of them, occur together earlier in
        the text: the answer copied another passage (a docstring's other version of the same
        line), which is no edit to repeat where this one's tokens come again."""
        toks = self.tokens
        span = toks[a : i + 1]
        n = len(span)
        if n < COPIED_SPAN:
            return False
        first = span[0]
        return any(toks[s] == first and toks[s : s + n] == span for s in range(a - n + 1))

    def _agreement(self, q: int, i: int, p: int, a: int) -> int:
        """How many tokens up to source ``q`` agree with those up to answer ``i``, reading
        back no further than the parting (source ``p``, answer ``a``, whose differing token
        is its own)."""
        toks, n = self.tokens, 0
        while q - n >= p and i - n > a and toks[q - n] == toks[i - n]:
            n += 1
        return n

    # -- the edits ---------------------------------------------------------------------------

    def _learn(self, key: tuple[int, ...], value: tuple[int, ...]) -> None:
        """Keep ``key -> value`` as an edit this text makes (not an insertion or a
        deletion, nor a span longer than ``EDIT_MAX``)."""
        if not (1 <= len(key) <= EDIT_MAX and 1 <= len(value) <= EDIT_MAX) or key == value:
            return
        if self.edits.get(value) == key:  # each written in the other's place: a swap
            self._forget(value)
            return
        self.edits.pop(key, None)
        if len(self.edits) >= MAX_EDITS:
            del self.edits[next(iter(self.edits))]
        self.edits[key] = value
        self._index_edits()

    def _forget(self, key: tuple[int, ...]) -> None:
        if self.edits.pop(key, None) is not None:
            self._index_edits()

    def _index_edits(self) -> None:
        self._by_first = {}
        for key, value in sorted(self.edits.items(), key=lambda edit: -len(edit[0])):
            self._by_first.setdefault(key[0], []).append((key, value))

    def first_tokens(self, starts: Sequence[int]) -> dict[int, list[int]]:
        """``starts`` grouped by the token a copy from each writes first (edits applied),
        each group most recent first, in the order first met."""
        end = len(self.tokens)
        groups: dict[int, list[int]] = {}
        for p in sorted(starts, reverse=True):  # most recent first
            step = self.step(Cursor(p), end)
            if step is not None:
                groups.setdefault(step[0], []).append(p)
        return groups
