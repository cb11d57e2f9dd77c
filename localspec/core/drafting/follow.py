"""Following a copy: drafts copied from earlier text, through the edits the answer makes.

``CopyFollower`` reads a growing token list (for prompt lookup, ``core.drafting.ngram``, the
prompt and the answer; for a prediction, ``core.drafting.prediction``, the predicted text
and the answer). It finds earlier occurrences of the longest suffix of the text (measured
up to ``n_max`` tokens back) and drafts what followed them. When several occurrences match
equally far back, it follows the one the copy under way reads from, else the continuation
most of them share (``copying.vote``), so one odd recent copy does not outvote the rest. A
continuation ends after an end-of-generation token (given as ``ends``): past the end of a
turn the source goes on with the chat template, which an answer never copies. Its offers are
priced and its drafts graded as copies (``copying.CopyingDrafter``); ``preview`` shows what
it would draft without drafting, for the answer to grade the drafts a round passed over.

Disagreeing sources. When the occurrences that match equally far go on with different next
tokens, the offer says so (``CopyOffer.shares``: the share of them behind each distinct next
token, the drafted one first), and ``alternatives(k, m)`` drafts one continuation per next
token, each read by the same vote among its own occurrences, for the engine to verify as a
draft tree (greedy decoding only). ``take(i)`` then makes branch ``i`` the draft that
``observe`` follows. A copy followed through edits or resuming a parted one reads from one
place only, so it has no alternatives.

Following a copy. Once a draft is accepted, a cursor (``Cursor``) keeps the copy's place in
the source and moves along as the answer goes on, so the copy is followed even where the
suffix no longer matches. When the answer parts from the source (a renamed variable, an
inserted type hint), the places where it may come back are kept: the parted token itself
(text was inserted before it), the token after it (it was replaced), or a few tokens further
once two tokens agree (a longer span was replaced). The drafter then offers to resume there
(``CopyOffer.resync``) before the suffix could match again.

Edits. What the answer wrote in place of a source span between parting and coming back is
an edit: a few source tokens (``key``) replaced by a few others (``value``). Rewrites repeat
their edits (every use of a renamed variable, every line of a re-indented block), so each
draft applies the edits learned so far to the source it copies; an edit the answer does not
make where it applied is forgotten. While a copy is followed through edits, the offer's
``match`` is how many tokens the answer has followed it (the suffix itself, changed by the
edits, matches only a few).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from localspec.core.drafting.base import Draft, Outcome
from localspec.core.drafting.copying import (
    COPY_ODDS,
    CopyingDrafter,
    CopyOffer,
    CopyPricing,
    Streak,
    vote,
)
from localspec.core.params import GenerationParams

# Occurrences of the suffix are found through an index of short keys, then measured back.
LONG_KEY = 4
MAX_CANDIDATES = 256  # most recent occurrences looked at per round
RESYNC_BELOW = 6  # a suffix match shorter than this defers to the copy's own place
RESYNC_MISSES = 8  # answer tokens a parted copy may wait for before its place is lost
EDIT_MAX = 8  # most tokens an edit's source span, and its replacement, may have
EDIT_REACH = 8  # source tokens past the parting point where a replaced span may end
MAX_EDITS = 64  # edits kept per text (the oldest go first)

Edit = tuple[tuple[int, ...], tuple[int, ...]]  # (key, value)


@dataclass(frozen=True)
class NgramMatch:
    n: int  # matched suffix length (capped at ``n_max``)
    starts: tuple[int, ...]  # continuation starts of the occurrences a draft reads from
    available: int  # continuation tokens available from the best of them
    # every occurrence matching that far (``starts`` keeps to the copy under way among them)
    tied: tuple[int, ...] = ()


@dataclass(frozen=True)
class Cursor:
    """A place in the source: the position read next, after the rest of an edit's value
    (``pending``, written in place of the source key ``edit``) when one is under way."""

    at: int
    pending: tuple[int, ...] = ()
    edit: tuple[int, ...] | None = None


@dataclass(frozen=True)
class _Plan:
    """This round's draft: it reads from ``start`` and continues a run of ``run`` followed
    tokens; ``rivals``: the occurrences of each other next token, most shared first."""

    start: Cursor
    run: int
    found: CopyOffer
    rivals: tuple[tuple[int, ...], ...] = ()


# A draft: where it read from, the cursor after each of its tokens, and the run it continues.
_Drafted = tuple[Cursor, list[Cursor], int]


@dataclass(frozen=True)
class _Parted:
    """A copy that parted: at source position ``at``, where answer token ``answer`` differed."""

    at: int
    answer: int
    misses: int = 0


class CopyFollower(CopyingDrafter):
    """Copies from a growing token list, longest suffix match first, following the copy
    under way; a subclass names itself and says what the list is (``_unread``)."""

    def __init__(
        self,
        n_min: int = 2,
        n_max: int = 32,
        ends: Callable[[int], bool] | None = None,
        *,
        limit: int = 64,
        pricing: CopyPricing | None = None,
        min_match: int = 1,
    ) -> None:
        """``min_match``: the shortest match that may draft, whatever ``n_min`` says (a
        fixed policy's floor)."""
        super().__init__(pricing or CopyPricing(COPY_ODDS), limit)
        self.branching = self
        self.ends = ends
        self.min_match = min_match
        self._configure(n_min, n_max)
        self._reset([])

    def _configure(self, n_min: int, n_max: int) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError("need 1 <= n_min <= n_max")
        self.n_min, self.n_max = min(max(n_min, self.min_match), n_max), n_max
        n_min = self.n_min
        self._keys = sorted({k for k in (LONG_KEY, n_min) if n_min <= k <= n_max}, reverse=True)

    def begin(self, tokens: Sequence[int], params: GenerationParams | None = None) -> None:
        """A new answer after ``tokens``, matched with ``params``' n-gram lengths."""
        if params is not None:
            self._configure(params.ngram_min, params.ngram_max)
        self.begin_text()
        self._reset(tokens)

    def end(self) -> None:
        """The answer is over: its text and index go (``begin`` builds them again)."""
        self._reset([])

    def _reset(self, tokens: Sequence[int]) -> None:
        self._tokens: list[int] = []
        # key length -> key -> continuation starts (index after the key), oldest first
        self._index: dict[int, dict[tuple[int, ...], list[int]]] = {k: {} for k in self._keys}
        self.streak = Streak()  # of the copy under way
        self._match: NgramMatch | None = None
        self._match_at = -1  # len(tokens) when ``_match`` was computed
        self._cursor: Cursor | None = None  # the copy under way
        self._run = 0  # answer tokens the cursor has followed since the copy (re)started
        self._parted: _Parted | None = None
        self.edits: dict[tuple[int, ...], tuple[int, ...]] = {}  # key -> value, oldest first
        self._by_first: dict[int, list[Edit]] = {}  # by the key's first token, longest first
        self._draft: _Drafted | None = None  # what ``observe`` follows
        self._branches: list[_Drafted] = []  # the last ``alternatives``, for ``take``
        self._extend(tokens)

    def _unread(self, committed: Sequence[int]) -> Sequence[int]:
        """What ``committed`` adds to the text this drafter reads (here, the text is the
        committed tokens themselves)."""
        return committed[len(self._tokens) :]

    def _extend(self, tokens: Sequence[int]) -> None:
        """Index ``tokens``, appended to the text."""
        old = len(self._tokens)
        self._tokens.extend(tokens)
        toks = self._tokens
        # A key ending at e (exclusive) is indexed once toks[e] exists: it has a continuation.
        for e in range(max(old, 1), len(toks)):
            for k, table in self._index.items():
                if e >= k:
                    table.setdefault(tuple(toks[e - k : e]), []).append(e)

    # -- the longest suffix match -----------------------------------------------------------

    def match(self) -> NgramMatch | None:
        """The longest suffix match (computed once per committed length)."""
        if self._match_at != len(self._tokens):
            self._match = self._find()
            self._match_at = len(self._tokens)
        return self._match

    def _longest(self) -> int:
        """The longest suffix worth measuring: ``n_max`` (a subclass whose text begins with
        what is not the answer's context stops there)."""
        return self.n_max

    def _find(self) -> NgramMatch | None:
        toks = self._tokens
        n = len(toks)
        longest = self._longest()
        for k in self._keys:
            if n <= k or k > longest:
                continue
            starts = self._index[k].get(tuple(toks[n - k :]))
            if not starts:
                continue
            best, chosen = 0, []
            for p in starts[-MAX_CANDIDATES:]:
                length = k
                while (
                    length < longest and length < p and toks[p - 1 - length] == toks[n - 1 - length]
                ):
                    length += 1
                if length > best:
                    best, chosen = length, [p]
                elif length == best:
                    chosen.append(p)
            if best >= self.n_min:
                tied = tuple(chosen)
                cursor = self._cursor
                if cursor is not None and not cursor.pending and cursor.at in chosen:
                    chosen = [cursor.at]  # the copy under way goes on: keep to its source
                return NgramMatch(best, tuple(chosen), n - max(chosen), tied)
        return None

    def _source(self, starts: Sequence[int], k: int) -> int:
        """Where a draft from the occurrences ``starts`` reads: the one whose next ``k``
        tokens take, at each step, the token most of the still-agreeing occurrences continue
        with (ties: the most recent)."""
        toks = self._tokens
        k = min(k, len(toks) - max(starts))  # as far as the most recent one goes
        alive = sorted(starts, reverse=True)  # most recent first
        _, agreeing, _ = vote([toks[p : p + k] for p in alive], k, ends=self.ends)
        return alive[agreeing[0]]

    # -- reading the source through the edits -------------------------------------------------

    def _step(self, cursor: Cursor, end: int) -> tuple[int, Cursor] | None:
        """The token the copy at ``cursor`` writes next, reading source before ``end``, and
        the cursor after it; None at the end of the source."""
        if cursor.pending:
            return cursor.pending[0], Cursor(cursor.at, cursor.pending[1:], cursor.edit)
        toks = self._tokens
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
        end = len(self._tokens)
        while len(tokens) < k:
            step = self._step(cursor, end)
            if step is None:
                break
            token, cursor = step
            tokens.append(token)
            cursors.append(cursor)
            if self.ends is not None and self.ends(token):
                break
        return tokens, cursors

    # -- the drafter protocol ---------------------------------------------------------------

    def _plan(self, limit: int) -> _Plan | None:
        """Where this round's draft would read from, the run it continues, and the offer."""
        found = self.match()
        cursor, toks = self._cursor, self._tokens
        live = cursor is not None and (cursor.pending or cursor.at < len(toks))
        streak = self.streak.under_way
        if live and (found is None or found.n < max(RESYNC_BELOW, self._run + 1)):
            assert cursor is not None
            n = len(self.read(cursor, limit)[0])
            if self._run >= RESYNC_BELOW:  # a copy followed through edits
                run = min(self._run, self.n_max)
                return _Plan(cursor, self._run, CopyOffer(n, run, streak))
            return _Plan(cursor, self._run, CopyOffer(n, resync=True))
        if found is None:
            return None
        start = Cursor(self._source(found.starts, limit))
        n = len(self.read(start, limit)[0])
        streak = streak and start == cursor  # the copy under way, not another source
        groups = self._groups(found.tied, start)
        shares = tuple(len(g) / len(found.tied) for g in groups) if len(groups) > 1 else ()
        copy = CopyOffer(n, found.n, streak, shares=shares)
        return _Plan(start, found.n, copy, tuple(groups[1:]))

    def _groups(self, starts: Sequence[int], start: Cursor) -> list[tuple[int, ...]]:
        """``starts`` grouped by the token a copy from each writes first (edits applied):
        the group ``start`` reads from first, then the larger ones (ties: most recent)."""
        end = len(self._tokens)
        groups: dict[int, list[int]] = {}
        for p in sorted(starts, reverse=True):  # most recent first
            step = self._step(Cursor(p), end)
            if step is not None:
                groups.setdefault(step[0], []).append(p)
        first = self._step(start, end)
        drafted = first[0] if first is not None else None
        order = sorted(groups, key=lambda t: (t != drafted, -len(groups[t])))  # stable
        return [tuple(groups[t]) for t in order]

    def copy_offer(self, committed: Sequence[int], limit: int) -> CopyOffer | None:
        planned = self._plan(limit)
        return planned.found if planned is not None and planned.found.available > 0 else None

    def preview(self, k: int) -> list[int]:
        """Up to ``k`` tokens ``propose`` would draft now, without drafting them."""
        planned = self._plan(k) if k > 0 else None
        return self.read(planned.start, k)[0] if planned is not None else []

    def propose(
        self,
        committed: Sequence[int],
        k: int,
        params: GenerationParams,
        rng: np.random.Generator,
    ) -> Draft:
        planned = self._plan(k) if k > 0 else None
        if planned is None:
            return Draft(self.name, [])
        tokens, cursors = self.read(planned.start, k)
        self._draft = (planned.start, cursors, planned.run)
        return Draft(self.name, tokens)

    def continuation(self, k: int) -> list[int]:
        """Up to ``k`` tokens the copy goes on with past the draft just proposed."""
        if self._draft is None or not self._draft[1]:
            return []
        return self.read(self._draft[1][-1], k)[0]

    def alternatives(self, k: int, m: int) -> list[list[int]]:
        """Up to ``m`` continuations of up to ``k`` tokens with distinct first tokens, in the
        order of ``CopyOffer.shares``: first what ``propose(k)`` would draft now, then one per
        other next token of the occurrences that match as far. Drafts them all (``take``
        says which one the target took; until then, the first)."""
        planned = self._plan(k) if k > 0 and m > 0 else None
        self._branches = []
        if planned is None:
            return []
        starts = [planned.start]
        starts += [Cursor(self._source(group, k)) for group in planned.rivals[: m - 1]]
        branches = []
        for start in starts:
            tokens, cursors = self.read(start, k)
            branches.append(tokens)
            self._branches.append((start, cursors, planned.run))
        self._draft = self._branches[0]
        return branches

    def take(self, i: int) -> None:
        """After ``alternatives``: the target took branch ``i``; ``observe`` follows it (its
        copy's place, its run, and whether it continues the copy under way)."""
        self._draft = self._branches[i]

    def advance(self, committed: Sequence[int], outcome: Outcome) -> None:
        old = len(self._tokens)
        self._extend(self._unread(committed))
        first = old  # the first answer token the cursor has not followed yet
        drafted, accepted = (outcome.drafted, outcome.accepted) if outcome.chosen else (0, 0)
        if drafted > 0 and self._draft is not None:
            start, cursors, run = self._draft
            # Drafts accepted whole in a row from one copy add up to a copy under way.
            self.streak.add(drafted, accepted, start == self._cursor)
            self._cursor = cursors[accepted - 1] if accepted else start
            self._run, self._parted = run + accepted, None
            first += accepted
        self._draft, self._branches = None, []
        for i in range(first, len(self._tokens)):
            self._follow(i, old)

    # -- following the copy -------------------------------------------------------------------

    def _follow(self, i: int, end: int) -> None:
        """Move the copy's place past answer token ``i``, reading source before ``end``."""
        token = self._tokens[i]
        cursor = self._cursor
        if cursor is not None:
            step = self._step(cursor, end)
            if step is not None and step[0] == token:
                self._cursor, self._run = step[1], self._run + 1
                return
            # Parted. An edit that applied here is not one this answer makes.
            wrong = cursor.edit if cursor.pending else (step[1].edit if step else None)
            if wrong is not None:
                self._forget(wrong)
            self._cursor, self._run, self.streak = None, 0, Streak()
            self._parted = _Parted(cursor.at, i)
            return
        if self._parted is not None:
            self._rejoin(i, end)

    def _rejoin(self, i: int, end: int) -> None:
        """Whether answer token ``i`` brings the parted copy back to its source."""
        parted, toks = self._parted, self._tokens
        assert parted is not None
        p, a = parted.at, parted.answer
        for q in (p, p + 1):  # one token agrees: text inserted before p, or p replaced
            if q < end and toks[q] == toks[i]:
                self._learn(tuple(toks[p:q]), tuple(toks[a:i]))
                self._resume(q + 1, 1)
                return
        for q in range(p + 2, min(p + 1 + EDIT_REACH, end)):  # two agree: a longer span
            if i - 1 > a and toks[q] == toks[i] and toks[q - 1] == toks[i - 1]:
                self._learn(tuple(toks[p : q - 1]), tuple(toks[a : i - 1]))
                self._resume(q + 1, 2)
                return
        misses = parted.misses + 1
        self._parted = _Parted(p, a, misses) if misses <= RESYNC_MISSES else None

    def _resume(self, at: int, run: int) -> None:
        self._cursor, self._run, self._parted = Cursor(at), run, None

    def _learn(self, key: tuple[int, ...], value: tuple[int, ...]) -> None:
        """Keep ``key -> value`` as an edit this text makes (insertions and deletions are
        not: they belong to one place)."""
        if not (1 <= len(key) <= EDIT_MAX and 1 <= len(value) <= EDIT_MAX) or key == value:
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
