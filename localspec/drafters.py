"""Drafters: who proposes the tokens the target verifies.

- ``NgramDrafter`` (prompt lookup): finds the most recent earlier occurrence of the longest
  suffix n-gram (``n_max`` down to ``n_min``) of prompt + generated text and proposes the
  tokens that followed it. Free to run; its q is one-hot, so ``Draft.probs`` is None.
- ``ModelDrafter``: runs the draft model autoregressively on its own KV cache (only tokens it
  does not hold yet are evaluated), greedy when decoding is greedy, otherwise sampling from
  its warped distribution q (returned, for exact verification). It stops early when its
  confidence (top probability) falls below ``p_min``, or after an end-of-generation token.

Which drafter runs each round, and for how many tokens, is the controller's decision.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from localspec.cached_model import CachedModel
from localspec.params import GenerationParams
from localspec.sampling import sample, top_probability, warp

MODEL = "model"
NGRAM = "ngram"


@dataclass(frozen=True)
class Draft:
    source: str  # MODEL or NGRAM
    tokens: list[int]
    probs: list[np.ndarray] | None  # q for each token; None means one-hot (deterministic)
    seconds: float = 0.0
    steps: int = 0  # draft-model forward passes it took


@dataclass(frozen=True)
class NgramMatch:
    n: int  # length of the matched suffix n-gram
    start: int  # index of the first continuation token in the token list
    available: int  # continuation tokens available from ``start``


class NgramDrafter:
    """Prompt-lookup index over a growing token list."""

    def __init__(self, n_min: int = 2, n_max: int = 4) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError("need 1 <= n_min <= n_max")
        self.n_min, self.n_max = n_min, n_max
        self._tokens: list[int] = []
        # n -> n-gram -> end index of its latest occurrence that has a following token
        self._index: dict[int, dict[tuple[int, ...], int]] = {}

    def begin(self, tokens: Sequence[int]) -> None:
        self._tokens = []
        self._index = {n: {} for n in range(self.n_min, self.n_max + 1)}
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        """Index newly committed tokens; ``tokens`` is the whole list, an extension."""
        old = len(self._tokens)
        self._tokens.extend(tokens[old:])
        toks = self._tokens
        # An n-gram ending at e (exclusive) is indexed once toks[e] exists.
        for e in range(max(old, 1), len(toks)):
            for n, table in self._index.items():
                if e >= n:
                    table[tuple(toks[e - n : e])] = e

    def match(self) -> NgramMatch | None:
        toks = self._tokens
        for n in range(self.n_max, self.n_min - 1, -1):
            if len(toks) <= n:
                continue
            start = self._index[n].get(tuple(toks[-n:]))
            if start is not None:
                return NgramMatch(n, start, len(toks) - start)
        return None

    def propose(self, k: int, found: NgramMatch | None = None) -> Draft | None:
        found = found or self.match()
        if found is None or k <= 0:
            return None
        return Draft(NGRAM, self._tokens[found.start : found.start + k], None)


class ModelDrafter:
    """Autoregressive drafting with a small model that shares the target's vocabulary."""

    def __init__(self, model: CachedModel, is_eog: Callable[[int], bool]) -> None:
        self.model = model
        self.is_eog = is_eog

    def propose(
        self,
        tokens: Sequence[int],
        k: int,
        params: GenerationParams,
        rng: np.random.Generator,
        p_min: float = 0.0,
    ) -> Draft:
        drafted: list[int] = []
        probs: list[np.ndarray] = []
        context = list(tokens)
        steps = 0
        for i in range(k):
            logits = self.model.forward(context, 1)[0]
            steps += 1
            if params.greedy:
                if i > 0 and p_min > 0.0 and top_probability(logits) < p_min:
                    break
                tok = int(np.argmax(logits))
            else:
                q = warp(logits, params)
                if i > 0 and p_min > 0.0 and float(q.max()) < p_min:
                    break
                tok = sample(q, rng)
                probs.append(q)
            drafted.append(tok)
            context.append(tok)
            if self.is_eog(tok):
                break
        return Draft(MODEL, drafted, None if params.greedy else probs, steps=steps)
