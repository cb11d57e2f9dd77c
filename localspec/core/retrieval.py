"""Retrieval drafting: what followed the text's longest suffix in the user's own corpora.

As REST drafts from a datastore, ``StoreDrafter`` looks the last ``n_max`` committed tokens
up in token corpora (the user's indexed files, earlier answers) and drafts the continuation
most occurrences of the longest match share. A ``Corpus`` is anything with
``longest_match(context, n_max, n_min)`` and ``continuations(match, k, limit)``, as
``session.datastore.TokenIndex`` has; this module does no I/O of its own.

Among corpora the longest match wins, then the one with more occurrences. The draft is read
token by token: at each position the token most still-agreeing occurrences continue with.
Its offer carries the match length and ``support``, the share of the examined occurrences
that go on as the first drafted token, which the controller folds into its price. One lookup
per committed text, shared by the round's offer, preview and draft. Its q is one-hot, so
``Draft.probs`` is None, and a continuation ends after an end-of-generation token.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from localspec.core.drafters import Draft, Offer
from localspec.core.ngram import STREAK_MIN
from localspec.core.params import DrafterKind, GenerationParams

EXAMINED = 32  # occurrences of a match whose continuations are read (spread over all)


class Corpus(Protocol):
    def longest_match(self, context: Sequence[int], n_max: int = 32, n_min: int = 2) -> Any: ...

    def continuations(
        self, match: Any, k: int, limit: int = 64
    ) -> list[tuple[tuple[int, ...], int]]: ...


@dataclass(frozen=True)
class Retrieved:
    """The draft a lookup found: ``tokens`` after a match of ``n`` tokens in ``source``."""

    source: str
    n: int
    occurrences: int  # of the match in its corpus
    tokens: tuple[int, ...]
    support: float  # share of the examined occurrences that continue with tokens[0]


def vote(runs: list[tuple[tuple[int, ...], int]], k: int) -> tuple[list[int], float]:
    """The continuation most runs agree on, token by token, and the first token's share."""
    alive = runs
    total = sum(count for _, count in runs)
    out: list[int] = []
    first = 0
    while len(out) < k and alive:
        i = len(out)
        votes: dict[int, int] = {}
        for run, count in alive:
            if i < len(run):
                votes[run[i]] = votes.get(run[i], 0) + count
        if not votes:
            break
        token = max(votes, key=votes.__getitem__)
        if i == 0:
            first = votes[token]
        out.append(token)
        alive = [(run, count) for run, count in alive if i < len(run) and run[i] == token]
    return out, (first / total if total else 0.0)


class StoreDrafter:
    """Drafts from named corpora; see the module docstring."""

    kind = DrafterKind.STORE

    def __init__(
        self,
        corpora: Sequence[tuple[str, Corpus]],
        n_min: int = 4,
        n_max: int = 32,
        k_max: int = 64,
        ends: Callable[[int], bool] | None = None,
    ) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError("need 1 <= n_min <= n_max")
        self.corpora = list(corpora)
        self.n_min, self.n_max, self.k_max = n_min, n_max, k_max
        self.ends = ends
        self._found: Retrieved | None = None
        self._found_at: tuple | None = None  # the text ``_found`` was looked up after
        self._copied = 0  # drafted tokens accepted in a row, drafts accepted whole

    def begin(self, tokens: Sequence[int]) -> None:
        self._found, self._found_at, self._copied = None, None, 0

    def lookup(self, committed: Sequence[int]) -> Retrieved | None:
        """The best continuation after ``committed`` (computed once per committed text)."""
        key = (len(committed), tuple(committed[-4:]))
        if self._found_at != key:
            self._found = self._lookup(committed)
            self._found_at = key
        return self._found

    def _lookup(self, committed: Sequence[int]) -> Retrieved | None:
        context = committed[-self.n_max :]
        best: tuple[str, Any, Corpus] | None = None
        for name, corpus in self.corpora:
            match = corpus.longest_match(context, self.n_max, self.n_min)
            if match is not None and (
                best is None or (match.n, match.count) > (best[1].n, best[1].count)
            ):
                best = (name, match, corpus)
        if best is None:
            return None
        name, match, corpus = best
        runs = corpus.continuations(match, self.k_max, EXAMINED)
        tokens, support = vote(runs, self.k_max)
        if self.ends is not None:
            for i, token in enumerate(tokens):
                if self.ends(token):
                    tokens = tokens[: i + 1]
                    break
        if not tokens:
            return None
        return Retrieved(name, match.n, match.count, tuple(tokens), support)

    def offer(self, committed: Sequence[int], limit: int) -> Offer | None:
        if limit <= 0:
            return None
        found = self.lookup(committed)
        if found is None:
            return None
        available = min(limit, len(found.tokens))
        streak = self._copied >= STREAK_MIN
        return Offer(self.kind, available, found.n, streak, support=found.support)

    def preview(self, k: int) -> list[int]:
        """Up to ``k`` tokens ``propose`` would draft after the text of the last ``offer``."""
        found = self._found
        return list(found.tokens[:k]) if found is not None else []

    def propose(
        self,
        committed: Sequence[int],
        k: int,
        params: GenerationParams,
        rng: np.random.Generator,
        p_min: float,
    ) -> Draft:
        found = self.lookup(committed)
        return Draft(self.kind, list(found.tokens[:k]) if found is not None and k > 0 else [])

    def observe(self, committed: Sequence[int], drafted: int, accepted: int) -> None:
        # As for prompt lookup: drafts accepted whole in a row add up to a copy under way.
        if drafted > 0:
            self._copied = self._copied + accepted if accepted == drafted else 0
