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

When the examined occurrences go on with different next tokens, the offer's ``shares`` give
each next token's share of them (the drafted one first), and ``alternatives(k, m)`` drafts
one continuation per next token, voted among its own runs, for the engine to verify as a
draft tree (greedy decoding only); ``take(i)`` says which branch the target took.
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
    # one continuation per distinct next token, ``tokens`` first, then by how many runs
    # share it, and each one's share of the examined occurrences
    branches: tuple[tuple[int, ...], ...] = ()
    shares: tuple[float, ...] = ()


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
        self._taken = 0  # the branch of the last ``alternatives`` the target took

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
        tokens = self._until_end(tokens)
        if not tokens:
            return None
        branches, shares = self._branches(runs, tokens)
        return Retrieved(name, match.n, match.count, tuple(tokens), support, branches, shares)

    def _branches(
        self, runs: list[tuple[tuple[int, ...], int]], drafted: list[int]
    ) -> tuple[tuple[tuple[int, ...], ...], tuple[float, ...]]:
        """One continuation per distinct next token of ``runs``, each voted among its own
        runs: ``drafted`` first, then the others by how many runs share them; and each
        one's share of the runs."""
        total = sum(count for _, count in runs)
        by_first: dict[int, list[tuple[tuple[int, ...], int]]] = {}
        for run, count in runs:
            if run:
                by_first.setdefault(run[0], []).append((run, count))
        weight = {t: sum(c for _, c in group) for t, group in by_first.items()}
        others = sorted((t for t in by_first if t != drafted[0]), key=lambda t: -weight[t])
        branches = [tuple(drafted)]
        branches += [tuple(self._until_end(vote(by_first[t], self.k_max)[0])) for t in others]
        shares = [weight.get(drafted[0], 0) / total] + [weight[t] / total for t in others]
        return tuple(branches), tuple(shares)

    def _until_end(self, tokens: list[int]) -> list[int]:
        """``tokens`` up to and including the first end-of-generation token."""
        if self.ends is not None:
            for i, token in enumerate(tokens):
                if self.ends(token):
                    return tokens[: i + 1]
        return tokens

    def offer(self, committed: Sequence[int], limit: int) -> Offer | None:
        if limit <= 0:
            return None
        found = self.lookup(committed)
        if found is None:
            return None
        available = min(limit, len(found.tokens))
        streak = self._copied >= STREAK_MIN
        shares = found.shares if len(found.shares) > 1 else ()
        return Offer(self.kind, available, found.n, streak, support=found.support, shares=shares)

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
        self._taken = 0
        return Draft(self.kind, list(found.tokens[:k]) if found is not None and k > 0 else [])

    def alternatives(self, k: int, m: int) -> list[list[int]]:
        """Up to ``m`` continuations of up to ``k`` tokens with distinct first tokens after
        the text of the last ``offer``, in the order of ``Offer.shares``: first what
        ``propose(k)`` would draft now."""
        self._taken = 0
        found = self._found
        if found is None or k <= 0:
            return []
        return [list(branch[:k]) for branch in found.branches[:m]]

    def take(self, i: int) -> None:
        """After ``alternatives``: the target took branch ``i``."""
        self._taken = i

    def observe(self, committed: Sequence[int], drafted: int, accepted: int) -> None:
        # As for prompt lookup: drafts accepted whole in a row add up to a copy under way;
        # another branch than the one most occurrences share starts a copy of its own.
        if drafted > 0:
            run = self._copied if self._taken == 0 else 0
            self._copied = run + accepted if accepted == drafted else 0
        self._taken = 0
