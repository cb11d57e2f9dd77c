"""Following a copy: the copy source of prompt lookup, which a prediction's shares.

``Follower`` (a ``copying.CopySource``) reads a growing token list: for prompt lookup
(``core.drafting.ngram``) the prompt and the answer so far; for a prediction
(``core.drafting.prediction``) the predicted text and the answer. It finds earlier
occurrences of the longest suffix of the text (measured up to ``n_max`` tokens back) and
drafts what followed them. When several occurrences match equally far back, it follows the
one the copy under way reads from, else the continuation most of them share
(``copying.vote``), so one odd recent copy does not outvote the rest. A continuation ends
after an end-of-generation token (given as ``ends``): past the end of a turn the source
goes on with the chat template, which an answer never copies. ``preview`` shows what it
would draft without drafting, for the answer to grade the drafts a round passed over.

Disagreeing sources. When the occurrences that match equally far go on with different next
tokens, the offer says so (``CopyOffer.shares``: the share of them behind each distinct next
token, the drafted one first), and ``alternatives(k, m)`` drafts one continuation per next
token, each read by the same vote among its own occurrences, for the engine to verify as a
draft tree (greedy decoding only). ``take(i)`` then makes branch ``i`` the draft that
``advance`` follows. A copy followed through edits or resuming a parted one reads from one
place only, so it has no alternatives.

The copy under way is followed through the answer's edits (``place.CopyPlace``): a parted
copy is offered again where the answer comes back to it (``Evidence.RESUMED``) before the
suffix could match again, and while a copy is followed through edits the offer's ``match``
is how many tokens the answer has followed it (the suffix itself, changed by the edits,
matches only a few).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from localspec.core.drafting.base import Outcome
from localspec.core.drafting.copying import vote
from localspec.core.drafting.evidence import CopyOffer, Evidence
from localspec.core.drafting.place import CopyPlace, Cursor, Drafted
from localspec.core.drafting.tunables import LONG_KEY, MAX_CANDIDATES, RESYNC_BELOW
from localspec.core.params import GenerationParams


@dataclass(frozen=True)
class NgramMatch:
    n: int  # matched suffix length (capped at ``n_max``)
    starts: tuple[int, ...]  # continuation starts of the occurrences a draft reads from
    available: int  # continuation tokens available from the best of them
    # every occurrence matching that far (``starts`` keeps to the copy under way among them)
    tied: tuple[int, ...] = ()


@dataclass(frozen=True)
class _Reading:
    """Where this round's draft reads from (``start``), the run it continues, its offer,
    and ``rivals``: the occurrences of each other next token, most shared first."""

    start: Cursor
    run: int
    copy: CopyOffer
    rivals: tuple[tuple[int, ...], ...] = ()


class Follower:
    """Copies from a growing token list, longest suffix match first, following the copy
    under way (module docstring). ``min_match``: the shortest match that may draft, whatever
    ``n_min`` says (a fixed policy's floor). ``sealed``: the text's first tokens (what
    ``start`` is given) are a source only, never the answer's context: a suffix is measured
    back no further than the tokens after them, and a copy read from them ends where they
    end."""

    def __init__(
        self,
        n_min: int = 2,
        n_max: int = 32,
        ends: Callable[[int], bool] | None = None,
        *,
        min_match: int = 1,
        sealed: bool = False,
    ) -> None:
        self.ends = ends
        self.min_match = min_match
        self.sealed = sealed
        self._configure(n_min, n_max)
        self.start([], 0)

    def _configure(self, n_min: int, n_max: int) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError("need 1 <= n_min <= n_max")
        self.n_min, self.n_max = min(max(n_min, self.min_match), n_max), n_max
        n_min = self.n_min
        self._keys = sorted({k for k in (LONG_KEY, n_min) if n_min <= k <= n_max}, reverse=True)

    def begin(self, prompt: Sequence[int], params: GenerationParams | None = None) -> None:
        """A new answer after ``prompt``, which is the text copied from."""
        self.start(prompt, len(prompt), params)

    def start(
        self, source: Sequence[int], answer_at: int, params: GenerationParams | None = None
    ) -> None:
        """A new text: ``source``, then the committed tokens from ``answer_at`` on as the
        answer writes them, matched with ``params``' n-gram lengths."""
        if params is not None:
            self._configure(params.ngram_min, params.ngram_max)
        self._tokens: list[int] = []
        self._answer_at, self._source = answer_at, len(source)
        # key length -> key -> continuation starts (index after the key), oldest first
        self._index: dict[int, dict[tuple[int, ...], list[int]]] = {k: {} for k in self._keys}
        self.place = CopyPlace(self._tokens, self.ends, self._source if self.sealed else None)
        self._match: NgramMatch | None = None
        self._match_at = -1  # len(tokens) when ``_match`` was computed
        self._draft: Drafted | None = None  # what ``advance`` follows
        self._branches: list[Drafted] = []  # the last ``alternatives``, for ``take``
        self._extend(source)

    def end(self) -> None:
        """The answer is over: its text and index go (``start`` builds them again)."""
        self.start([], 0)

    @property
    def tokens(self) -> Sequence[int]:
        """The text read: the source, then the answer so far."""
        return self._tokens

    def _extend(self, tokens: Sequence[int]) -> None:
        """Index ``tokens``, appended to the text."""
        old = len(self._tokens)
        self._tokens.extend(tokens)
        toks = self._tokens
        # A key ending at e (exclusive) is indexed once toks[e] exists: it has a continuation.
        # In a sealed text no key or continuation spans the seal: the answer's first tokens
        # do not follow the source's last ones.
        seal = self.place.seal
        for e in range(max(old, 1), len(toks)):
            for k, table in self._index.items():
                if e >= k and (seal is None or e < seal or e - k >= seal):
                    table.setdefault(tuple(toks[e - k : e]), []).append(e)

    # -- the longest suffix match -----------------------------------------------------------

    def match(self) -> NgramMatch | None:
        """The longest suffix match (computed once per committed length)."""
        if self._match_at != len(self._tokens):
            self._match = self._find_match()
            self._match_at = len(self._tokens)
        return self._match

    def _find_match(self) -> NgramMatch | None:
        toks = self._tokens
        n = len(toks)
        longest = min(self.n_max, n - self._source) if self.sealed else self.n_max
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
                cursor = self.place.cursor
                if cursor is not None and not cursor.pending and cursor.at in chosen:
                    chosen = [cursor.at]  # the copy under way goes on: keep to its source
                return NgramMatch(best, tuple(chosen), n - max(chosen), tied)
        return None

    def _source_of(self, starts: Sequence[int], k: int) -> int:
        """Where a draft from the occurrences ``starts`` reads: the one whose next ``k``
        tokens take, at each step, the token most of the still-agreeing occurrences continue
        with (ties: the most recent)."""
        toks = self._tokens
        k = min(k, len(toks) - max(starts))  # as far as the most recent one goes
        alive = sorted(starts, reverse=True)  # most recent first
        _, agreeing, _ = vote([toks[p : p + k] for p in alive], k, ends=self.ends)
        return alive[agreeing[0]]

    # -- the copy source --------------------------------------------------------------------

    def _reading(self, limit: int) -> _Reading | None:
        """Where this round's draft would read from, the run it continues, and the offer."""
        found, place = self.match(), self.place
        if place.live() and (found is None or found.n < max(RESYNC_BELOW, place.run + 1)):
            assert place.cursor is not None
            n = len(place.read(place.cursor, limit)[0])
            if place.run >= RESYNC_BELOW:  # a copy followed through edits
                copy = CopyOffer(n, min(place.run, self.n_max), self._kind(True))
            else:
                copy = CopyOffer(n, evidence=Evidence.RESUMED)
            return _Reading(place.cursor, place.run, copy)
        if found is None:
            return None
        start = Cursor(self._source_of(found.starts, limit))
        n = len(place.read(start, limit)[0])
        groups = self._groups(found.tied, start)
        shares = tuple(len(g) / len(found.tied) for g in groups) if len(groups) > 1 else ()
        kind = self._kind(start == place.cursor)  # the copy under way, not another source
        return _Reading(start, found.n, CopyOffer(n, found.n, kind, shares=shares), groups[1:])

    def _kind(self, same_copy: bool) -> Evidence:
        under_way = same_copy and self.place.streak.under_way
        return Evidence.UNDER_WAY if under_way else Evidence.MATCH

    def _groups(self, starts: Sequence[int], start: Cursor) -> tuple[tuple[int, ...], ...]:
        """``starts`` grouped by the token a copy from each writes first (edits applied):
        the group ``start`` reads from first, then the larger ones (ties: most recent)."""
        groups = self.place.first_tokens(starts)
        first = self.place.step(start, len(self._tokens))
        drafted = first[0] if first is not None else None
        order = sorted(groups, key=lambda t: (t != drafted, -len(groups[t])))  # stable
        return tuple(tuple(groups[t]) for t in order)

    def find(self, committed: Sequence[int], limit: int) -> CopyOffer | None:
        reading = self._reading(limit)
        return reading.copy if reading is not None and reading.copy.available > 0 else None

    def preview(self, k: int) -> list[int]:
        reading = self._reading(k) if k > 0 else None
        return self.place.read(reading.start, k)[0] if reading is not None else []

    def draft(self, committed: Sequence[int], k: int) -> list[int]:
        reading = self._reading(k) if k > 0 else None
        if reading is None:
            return []
        tokens, cursors = self.place.read(reading.start, k)
        self._draft = (reading.start, cursors, reading.run)
        return tokens

    def continuation(self, k: int) -> list[int]:
        """Up to ``k`` tokens the copy goes on with past the draft just made."""
        if self._draft is None or not self._draft[1]:
            return []
        return self.place.read(self._draft[1][-1], k)[0]

    def alternatives(self, k: int, m: int) -> list[list[int]]:
        """Up to ``m`` continuations of up to ``k`` tokens with distinct first tokens, in the
        order of ``CopyOffer.shares``: first what ``draft(k)`` would draft now, then one per
        other next token of the occurrences that match as far. Drafts them all (``take``
        says which one the target took; until then, the first)."""
        reading = self._reading(k) if k > 0 and m > 0 else None
        self._branches = []
        if reading is None:
            return []
        starts = [reading.start]
        starts += [Cursor(self._source_of(group, k)) for group in reading.rivals[: m - 1]]
        branches = []
        for start in starts:
            tokens, cursors = self.place.read(start, k)
            branches.append(tokens)
            self._branches.append((start, cursors, reading.run))
        self._draft = self._branches[0]
        return branches

    def take(self, i: int) -> None:
        """After ``alternatives``: the target took branch ``i``; ``advance`` follows it (its
        copy's place, its run, and whether it continues the copy under way)."""
        self._draft = self._branches[i]

    def take_in(self, committed: Sequence[int], outcome: Outcome) -> tuple[int, int]:
        """Append what ``committed`` adds to the text and follow the round's draft as far as
        it was accepted. Returns the first answer token still to follow, and the text's
        length before (the source its place may be read from)."""
        old = len(self._tokens)
        read = self._answer_at + old - self._source  # committed tokens in the text
        self._extend(committed[read:])
        first = old
        if outcome.chosen and outcome.drafted > 0 and self._draft is not None:
            self.place.took(self._draft, outcome.drafted, outcome.accepted)
            first += outcome.accepted
        self._draft, self._branches = None, []
        return first, old

    def advance(self, committed: Sequence[int], outcome: Outcome) -> None:
        first, end = self.take_in(committed, outcome)
        for i in range(first, len(self._tokens)):
            self.place.follow(i, end)
