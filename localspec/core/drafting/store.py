"""Retrieval drafting: what followed the text's longest suffix in the user's own corpora.

As REST drafts from a datastore, ``StoreSource`` looks the last ``n_max`` committed tokens
up in token corpora (the user's indexed files, earlier answers) and drafts the continuation
most occurrences of the longest match share (``copying.vote``). A ``Corpus`` is anything
with ``longest_match(context, n_max, n_min)`` and ``continuations(match, k, limit)``, as
``storage.datastore.TokenIndex`` has; this module does no I/O of its own.

Among corpora the longest match wins, then the one with more occurrences. The draft is read
token by token: at each position the token most still-agreeing occurrences continue with.
Its offer carries the match length and ``support``, the share of the examined occurrences
that go on as the first drafted token, which its price folds in. It is priced as prompt
lookup is (``pricing.CopyPricing``), with odds of long copies of its own that start lower
and drafts that part sooner (``tunables.STORE_COPY_ODDS``, ``STORE_PARTING``): a store is
the user's own corpus, which may have nothing to do with the text at hand. One lookup per
committed text, shared by the round's offer, preview and draft. Its q is one-hot, so
``Draft.probs`` is None, and a continuation ends after an end-of-generation token.

When the examined occurrences go on with different next tokens, the offer's ``shares`` give
each next token's share of them (the drafted one first), and ``alternatives(k, m)`` drafts
one continuation per next token, voted among its own runs, for the engine to verify as a
draft tree (greedy decoding only); ``take(i)`` says which branch the target took.

A corpus is the user's files, read from disk: any error a lookup in it raises, or a draft
of ids outside the target's vocabulary, leaves that corpus out for the rest of the answer
and adds a line to ``warnings``, which the engine yields as ``EngineWarning`` events after
the round (``base.Warns``); drafting goes on from the others, and answering never fails
because of a store.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from localspec.core.drafting.base import Corpus, Outcome, Resources
from localspec.core.drafting.copying import CopyDrafter, Streak, vote
from localspec.core.drafting.evidence import CopyOffer, Evidence
from localspec.core.drafting.pricing import CopyPricing
from localspec.core.drafting.tunables import EXAMINED, STORE_COPY_ODDS, STORE_PARTING
from localspec.core.params import GenerationParams

NAME = "store"


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


Runs = list[tuple[tuple[int, ...], int]]  # continuations and how many occurrences share each


def _vote(runs: Runs, k: int, ends: Callable[[int], bool] | None) -> tuple[list[int], float]:
    tokens, _, share = vote([run for run, _ in runs], k, [count for _, count in runs], ends)
    return tokens, share


Corpora = Sequence[tuple[str, Corpus]] | Callable[[], Sequence[tuple[str, Corpus]]]


class StoreSource:
    """Drafts from named corpora (a ``copying.CopySource``); see the module docstring.
    ``corpora`` may be a callable that gives them: they are read again as every answer
    begins."""

    def __init__(
        self,
        corpora: Corpora,
        n_min: int = 4,
        n_max: int = 32,
        k_max: int = 64,
        ends: Callable[[int], bool] | None = None,
        *,
        n_vocab: int | None = None,
    ) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError("need 1 <= n_min <= n_max")
        self._corpora = corpora
        self.corpora = list(corpora() if callable(corpora) else corpora)
        self.n_min, self.n_max, self.k_max = n_min, n_max, k_max
        self.ends = ends
        self.n_vocab = n_vocab  # a draft of other ids would fail the target's evaluation
        self.warnings: list[str] = []  # taken by the engine after each round
        self._found: Retrieved | None = None
        self._found_at: tuple | None = None  # the text ``_found`` was looked up after
        self.streak = Streak()
        self._taken = 0  # the branch of the last ``alternatives`` the target took

    def begin(self, prompt: Sequence[int], params: GenerationParams | None = None) -> None:
        """A new answer after ``prompt``: the corpora as they are now, matched up to
        ``params``' n-gram length."""
        if callable(self._corpora):
            self.corpora = list(self._corpora())
        if params is not None:
            self.n_max = params.ngram_max
        self._found, self._found_at, self.streak = None, None, Streak()

    def end(self) -> None:
        self._found, self._found_at = None, None

    def lookup(self, committed: Sequence[int]) -> Retrieved | None:
        """The best continuation after ``committed`` (computed once per committed text)."""
        key = (len(committed), tuple(committed[-4:]))
        if self._found_at != key:
            self._found = self._lookup(committed)
            self._found_at = key
        return self._found

    def _lookup(self, committed: Sequence[int]) -> Retrieved | None:
        """The best draft among the corpora; a corpus that fails is left out and the
        lookup made again among the others."""
        while True:
            try:
                return self._lookup_in(committed[-self.n_max :])
            except _CorpusFailed as failed:
                self._leave_out(failed.corpus, failed.why)

    def _lookup_in(self, context: Sequence[int]) -> Retrieved | None:
        best: tuple[str, Any, Corpus] | None = None
        for name, corpus in self.corpora:
            try:
                match = corpus.longest_match(context, self.n_max, self.n_min)
            except Exception as err:  # the user's files on disk: anything may be wrong
                raise _CorpusFailed(corpus, f"{type(err).__name__}: {err}") from err
            if match is not None and (
                best is None or (match.n, match.count) > (best[1].n, best[1].count)
            ):
                best = (name, match, corpus)
        if best is None:
            return None
        name, match, corpus = best
        try:
            runs = corpus.continuations(match, self.k_max, EXAMINED)
            tokens, support = _vote(runs, self.k_max, self.ends)
            branches, shares = self._branches(runs, tokens) if tokens else ((), ())
        except Exception as err:
            raise _CorpusFailed(corpus, f"{type(err).__name__}: {err}") from err
        if self.n_vocab is not None and any(
            not 0 <= t < self.n_vocab for branch in branches for t in branch
        ):
            raise _CorpusFailed(corpus, "it holds token ids outside the model's vocabulary")
        if not tokens:
            return None
        return Retrieved(name, match.n, match.count, tuple(tokens), support, branches, shares)

    def _leave_out(self, corpus: Corpus, why: str) -> None:
        names = [n for n, c in self.corpora if c is corpus]
        self.corpora = [(n, c) for n, c in self.corpora if c is not corpus]
        self.warnings.append(
            f"datastore {names[0] if names else '?'!r} was left out of this answer: {why}"
        )

    def _branches(
        self, runs: Runs, drafted: list[int]
    ) -> tuple[tuple[tuple[int, ...], ...], tuple[float, ...]]:
        """One continuation per distinct next token of ``runs``, each voted among its own
        runs: ``drafted`` first, then the others by how many runs share them; and each
        one's share of the runs."""
        total = sum(count for _, count in runs)
        by_first: dict[int, Runs] = {}
        for run, count in runs:
            if run:
                by_first.setdefault(run[0], []).append((run, count))
        weight = {t: sum(c for _, c in group) for t, group in by_first.items()}
        others = sorted((t for t in by_first if t != drafted[0]), key=lambda t: -weight[t])
        branches = [tuple(drafted)]
        branches += [tuple(_vote(by_first[t], self.k_max, self.ends)[0]) for t in others]
        shares = [weight.get(drafted[0], 0) / total] + [weight[t] / total for t in others]
        return tuple(branches), tuple(shares)

    def find(self, committed: Sequence[int], limit: int) -> CopyOffer | None:
        if not self.corpora:
            return None
        found = self.lookup(committed)
        if found is None:
            return None
        available = min(limit, len(found.tokens))
        shares = found.shares if len(found.shares) > 1 else ()
        kind = Evidence.UNDER_WAY if self.streak.under_way else Evidence.MATCH
        return CopyOffer(available, found.n, kind, support=found.support, shares=shares)

    def preview(self, k: int) -> list[int]:
        """Up to ``k`` tokens ``propose`` would draft after the text of the last ``offer``."""
        found = self._found
        return list(found.tokens[:k]) if found is not None else []

    def draft(self, committed: Sequence[int], k: int) -> list[int]:
        found = self.lookup(committed)
        self._taken = 0
        return list(found.tokens[:k]) if found is not None and k > 0 else []

    def continuation(self, k: int) -> list[int]:
        return []  # a copy of the corpora is not followed past its draft

    def alternatives(self, k: int, m: int) -> list[list[int]]:
        """Up to ``m`` continuations of up to ``k`` tokens with distinct first tokens after
        the text of the last ``offer``, in the order of ``CopyOffer.shares``: first what
        ``propose(k)`` would draft now."""
        self._taken = 0
        found = self._found
        if found is None or k <= 0:
            return []
        return [list(branch[:k]) for branch in found.branches[:m]]

    def take(self, i: int) -> None:
        """After ``alternatives``: the target took branch ``i``."""
        self._taken = i

    def advance(self, committed: Sequence[int], outcome: Outcome) -> None:
        # As for prompt lookup: drafts accepted whole in a row add up to a copy under way;
        # another branch than the one most occurrences share starts a copy of its own.
        if outcome.chosen and outcome.drafted > 0:
            self.streak.add(outcome.drafted, outcome.accepted, self._taken == 0)
        self._taken = 0


class _CorpusFailed(Exception):
    def __init__(self, corpus: Corpus, why: str) -> None:
        super().__init__(why)
        self.corpus = corpus
        self.why = why


def store_drafter(corpora: Corpora, *, limit: int = 64, **source: Any) -> CopyDrafter:
    """The datastores' drafter: ``StoreSource(corpora, **source)`` priced as a corpus
    that may have nothing to do with the text."""
    pricing = CopyPricing(STORE_COPY_ODDS, STORE_PARTING)
    return CopyDrafter(NAME, StoreSource(corpora, **source), pricing, limit)


def build(params: GenerationParams, resources: Resources) -> CopyDrafter:
    fixed = resources.policy.fixed
    return store_drafter(
        resources.corpora,
        limit=params.draft_max if fixed else params.ngram_draft_max,
        n_max=params.ngram_max,
        ends=resources.target.is_eog,
        n_vocab=resources.target.n_vocab,
    )
