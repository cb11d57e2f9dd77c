"""Lookahead: the target drafts for itself from what its own passes already computed.

No second model. Every target pass computes a logits row after each token it evaluates;
``LookaheadDrafter`` is shown the target's greedy token after each (``watch``, the
``Watching`` capability: token ids, which greedy decoding reads without copying a row) and
keeps three things from them:

- **Recycled successors** (Token Recycling, arXiv 2408.08696): for each token, the last few
  distinct tokens the target chose after it, in any context. Free to collect: the rows were
  computed anyway.
- **The Jacobi window** (lookahead decoding, arXiv 2402.02057; Jacobi decoding): every draft
  the target verified is also a lookahead branch. The target's tokens after the drafted
  tokens past the accepted point are its guesses for the positions after the new last
  token, conditioned on imperfect guesses before them; fed back as the next round's draft
  they are one Jacobi iteration, and they converge where the text is predictable.
- **The n-gram pool**: each guess with the tokens before it on its branch is an n-gram of
  ``NGRAM`` tokens, kept under its first token (at most ``POOL_PER_KEY``, newest first), as
  lookahead decoding collects the n-grams of its trajectories for its verification branch.

A draft after the last token ``t`` is built from those candidates: the pool's n-grams after
``t``, the Jacobi window, and the chain of recycled successors, each extended by recycled
successors to the length asked. The first candidate is the chain; the others, with distinct
first tokens, are the branches of a draft tree (verified in the same pass as the chain, with
the sequence masks of ``core.tree``), so a tree round is the verification branch and the
lookahead branch of lookahead decoding in one batch.

Sizes are not fixed: the cost model picks, each round, the draft length and the number of
branches from this machine's verify costs (``auto``); the fixed policy (``--drafter
lookahead``) drafts the chain length that its acceptance so far pays best at those costs.
Its acceptance per position is learned from its own drafts and from grading, every round it
was passed over, what it would have drafted against what the target emitted (a pending
grade, ``grades.Grade.PASSED``, settled at once on the tokens the round emitted).

Exact like every drafter: drafts are functions of tokens already committed and rows already
computed, never of the round's own randomness, so greedy output is the target's and
sampling with a one-hot q stays exact. Where no draft could pay at this machine's costs
even at ``HOPED_ALPHA`` a token (``could_pay``), ``auto`` leaves it idle: it neither watches
nor offers, and costs nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from localspec.core.acceptance import AcceptanceEstimate, TextCount
from localspec.core.costs import LiveCosts, could_pay
from localspec.core.drafting.base import Draft, Offer, Outcome, Resources
from localspec.core.drafting.grades import Grade, Grades, Pending
from localspec.core.params import GenerationParams
from localspec.core.tree import MAX_BRANCHES, ROOT

NAME = "lookahead"
PRIOR = 0.3  # acceptance per position before any evidence: the target guessing blind
NGRAM = 4  # tokens of a pooled n-gram: its key and three guesses after it
POOL_PER_KEY = 4  # n-grams kept per first token, newest first
SUCCESSORS = 4  # recycled successors kept per token, newest first
# The most it is hoped to reach per drafted token: the target guessing its own next tokens
# is right far less often than a copy or a draft model (docs/measurements.md, "Drafting
# without a second model"), so where even this could not pay it stays idle and costs
# nothing; a draft model is hoped to reach OPTIMISTIC_ALPHA.
HOPED_ALPHA = 0.6


class LookaheadDrafter:
    """Drafts from the target's own rows: recycled successors, Jacobi guesses, n-grams."""

    name = NAME

    def __init__(
        self,
        is_eog: Any,
        vocab: int,
        *,
        costs: LiveCosts,
        limit: int = 16,
        fixed: bool = False,
    ) -> None:
        self.is_eog = is_eog
        self.vocab = vocab
        self.costs = costs
        self.limit = limit
        self.fixed = fixed
        self.estimate = AcceptanceEstimate(prior=PRIOR)
        self.successors: dict[int, list[int]] = {}
        self.pool: dict[int, list[tuple[int, ...]]] = {}
        self.window: list[int] = []  # guesses for the tokens after ``_window_at``
        self._window_at = -1  # len(committed) the window's first guess follows
        self._texts = TextCount()
        self._active = False
        self._seen: _Pass | None = None  # the last pass's nodes and the target's tokens
        self._before = 0  # len(committed) when the round began
        self._previewed: list[int] = []  # what it would have drafted this round
        self.grades: Grades[None] = Grades()  # what it was passed over for, to grade
        self._last_candidates: list[list[int]] = []  # the round's, for ``alternatives``

    # -- capabilities ---------------------------------------------------------------------

    @property
    def branching(self) -> LookaheadDrafter | None:
        return None if self.fixed else self

    @property
    def watching(self) -> LookaheadDrafter | None:
        return self if self._active else None

    # -- the drafter protocol -------------------------------------------------------------

    def begin(self, prompt: Sequence[int], params: GenerationParams) -> None:
        keep = self._texts.begin()
        if keep is not None:
            self.estimate.shrink(keep)
        self.window, self._window_at, self._seen = [], -1, None
        # The fixed policy was asked for by name: it drafts whatever the costs say.
        self._active = self.fixed or self.could_pay()

    def could_pay(self) -> bool:
        """Whether a draft of some length could beat a plain step here if each of its
        tokens were accepted at ``HOPED_ALPHA`` (drafting itself costs nothing)."""
        return could_pay(self.costs, self.limit, HOPED_ALPHA)

    def offer(self, committed: Sequence[int], limit: int) -> Offer | None:
        self._before = len(committed)
        self._previewed, self._last_candidates = [], []
        if not self._active or limit <= 0:
            return None
        candidates = self._candidates(committed, limit)
        if not candidates:
            return None
        self._previewed = candidates[0]
        available = len(candidates[0])
        if self.fixed:
            available = min(available, self._paying_length(available))
        branches = min(len(candidates), MAX_BRANCHES)
        tree = self._tree_accepted if branches > 1 else None
        label = f" ({len(candidates)} candidates)"
        return Offer(NAME, available, self.estimate.expected_accepted, tree=tree,
                     branches=branches, label=label)  # fmt: skip

    def propose(
        self,
        committed: Sequence[int],
        k: int,
        params: GenerationParams,
        rng: np.random.Generator,
    ) -> Draft:
        # The round's offer found the candidates after this same text, up to its limit (at
        # least k); their first k tokens are what a search up to k would give.
        if len(committed) == self._before and self._last_candidates:
            candidates = self._last_candidates
        else:
            candidates = self._candidates(committed, k)
        return Draft(NAME, list(candidates[0][:k]) if candidates else [])

    def alternatives(self, k: int, m: int) -> list[list[int]]:
        """Up to ``m`` candidates of up to ``k`` tokens with distinct first tokens, the chain
        ``propose`` drafts first (computed for the round's ``offer``)."""
        return [list(c[:k]) for c in self._last_candidates[:m]]

    def take(self, i: int) -> None:
        """The tree's branch ``i`` was taken: ``watch`` saw the whole tree, and ``observe``
        follows the committed tokens through it, so nothing is left to do."""

    def watch(self, tokens: Sequence[int], parents: Sequence[int], chosen: Sequence[int]) -> None:
        """A target pass: ``chosen[0]`` is the target's greedy token after the last committed
        token, ``chosen[1 + i]`` after node ``i`` (``tokens[i]``, child of node
        ``parents[i]``, ``ROOT`` the last committed token)."""
        chosen = [int(t) for t in chosen[: len(tokens) + 1]]
        self._seen = _Pass(tuple(tokens), tuple(parents), tuple(chosen))

    def observe(self, committed: Sequence[int], outcome: Outcome) -> None:
        if not self._active:
            return
        if outcome.chosen and outcome.drafted > 0:
            self.estimate.observe(outcome.drafted, outcome.accepted)
        else:
            # Passed over: grade what it would have drafted against what the target emitted.
            # Past the emitted tokens nothing is known, so only those positions count.
            self.grades.add(Pending(Grade.PASSED, None, tuple(self._previewed), self._before))
            for _, drafted, accepted in self.grades.settle(committed):
                self.estimate.observe(drafted, accepted)
        seen, self._seen = self._seen, None
        if seen is not None:
            self._learn(committed, seen, len(committed) - self._before)

    def learned(self) -> dict[str, Any]:
        return self.estimate.to_dict()

    def restore(self, data: Any, keep: float) -> None:
        estimate = AcceptanceEstimate(prior=PRIOR)
        estimate.load(data, keep)
        self.estimate = estimate

    # -- what it learns of the target's passes ---------------------------------------------

    def _learn(self, committed: Sequence[int], seen: _Pass, emitted: int) -> None:
        """Recycle the pass's successors, pool its n-grams, and advance the Jacobi window
        along the branch the target took."""
        before = len(committed) - emitted
        last = int(committed[before - 1])
        context = [int(t) for t in committed[max(0, before - (NGRAM - 1)) : before]]
        self._recycle(last, seen.chosen[0])
        for node, token in enumerate(seen.tokens):
            self._recycle(token, seen.chosen[node + 1])
            path = [*context, *seen.path_tokens(node)]
            ngram = (*path[-(NGRAM - 1) :], seen.chosen[node + 1])
            if len(ngram) == NGRAM:
                self._pool(ngram)
        # The accepted nodes are the committed tokens but the last (the target's own).
        node = ROOT
        for token in committed[before : len(committed) - 1]:
            child = seen.child(node, int(token))
            if child is None:
                return  # a pass that is not this round's: no window to carry on
            node = child
        # Past the accepted path, the first branch of the tree: each of its nodes sits where
        # the next committed positions are, so the target's token after it is a guess for
        # the position after.
        follow = seen.first_child(node)
        guesses: list[int] = []
        while follow is not None:
            guesses.append(seen.chosen[follow + 1])
            follow = seen.first_child(follow)
        self.window, self._window_at = guesses, len(committed)

    def _recycle(self, token: int, successor: int) -> None:
        kept = self.successors.setdefault(int(token), [])
        if successor in kept:
            kept.remove(successor)
        kept.insert(0, successor)
        del kept[SUCCESSORS:]

    def _pool(self, ngram: tuple[int, ...]) -> None:
        key, rest = ngram[0], ngram[1:]
        kept = self.pool.setdefault(key, [])
        if rest in kept:
            kept.remove(rest)
        kept.insert(0, rest)
        del kept[POOL_PER_KEY:]

    # -- drafting ---------------------------------------------------------------------------

    def _candidates(self, committed: Sequence[int], k: int) -> list[list[int]]:
        """The drafts it could propose after ``committed``, each up to ``k`` tokens, with
        distinct first tokens: the chain of recycled successors first (the target's own
        latest choice after this token), then the pool's n-grams and the Jacobi window."""
        last = int(committed[-1])
        starts: list[list[int]] = []
        if last in self.successors:
            starts.append([self.successors[last][0]])
        starts.extend([list(rest) for rest in self.pool.get(last, [])])
        if self.window and self._window_at == len(committed):
            starts.append(list(self.window))
        candidates: list[list[int]] = []
        firsts: set[int] = set()
        for start in starts:
            if start[0] in firsts:
                continue
            firsts.add(start[0])
            candidates.append(self._extend(start[:k], k))
        self._last_candidates = candidates
        return candidates

    def _extend(self, draft: list[int], k: int) -> list[int]:
        """``draft`` followed by recycled successors up to ``k`` tokens, cut after an end of
        generation and before any id outside the target's vocabulary."""
        out: list[int] = []
        for token in draft:
            if not 0 <= token < self.vocab:
                return out
            out.append(token)
            if self.is_eog(token):
                return out
        while len(out) < k:
            following = self.successors.get(out[-1])
            if not following or not 0 <= following[0] < self.vocab:
                break
            out.append(following[0])
            if self.is_eog(following[0]):
                break
        return out

    def _tree_accepted(self, m: int, k: int) -> list[float]:
        """Expected accepted tokens of a tree of ``m`` candidates of 1..k tokens: the first
        position is passed if any branch's first token is the target's (taken as
        independent), deeper ones at the chain's acceptance."""
        alphas = self.estimate.alphas(k)
        out, reach, total = [], 1.0, 0.0
        for i, a in enumerate(alphas):
            reach *= 1.0 - (1.0 - a) ** m if i == 0 else a
            total += reach
            out.append(total)
        return out

    def _paying_length(self, available: int) -> int:
        """The fixed policy's length: the one its acceptance so far pays best at this
        machine's verify costs (at least one token)."""
        accepted = self.estimate.expected_accepted(available)
        rates = [(1.0 + accepted[k - 1]) / self.costs.verify(k) for k in range(1, available + 1)]
        return 1 + int(np.argmax(rates))


class _Pass:
    """A target pass as nodes (tokens, parents) and the target's greedy token after the
    last committed token (``chosen[0]``) and after each node (``chosen[1 + i]``)."""

    def __init__(
        self, tokens: tuple[int, ...], parents: tuple[int, ...], chosen: tuple[int, ...]
    ) -> None:
        self.tokens, self.parents, self.chosen = tokens, parents, chosen

    def child(self, node: int, token: int) -> int | None:
        for i, parent in enumerate(self.parents):
            if parent == node and self.tokens[i] == token:
                return i
        return None

    def first_child(self, node: int) -> int | None:
        for i, parent in enumerate(self.parents):
            if parent == node:
                return i
        return None

    def path_tokens(self, node: int) -> list[int]:
        out: list[int] = []
        while node != ROOT:
            out.append(self.tokens[node])
            node = self.parents[node]
        return out[::-1]


def build(params: GenerationParams, resources: Resources) -> LookaheadDrafter:
    # A fixed policy (``--drafter lookahead``) drafts whenever it has a candidate; the cost
    # model weighs each round's candidates, lengths and trees itself.
    return LookaheadDrafter(
        resources.target.is_eog,
        resources.target.n_vocab,
        costs=resources.costs,
        limit=params.draft_max,
        fixed=resources.policy.fixed,
    )
