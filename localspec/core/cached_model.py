"""A model whose KV cache mirrors a token list: the contract the engine drives.

``CachedModel.forward(tokens, n_logits)`` makes the cache hold exactly ``tokens`` and
returns the logits rows of the last ``n_logits`` positions. It keeps the longest common
prefix of what is cached, rolls back the rest, and evaluates only the missing suffix in
one batch, so a draft model never re-evaluates what it holds, a rejected draft costs a
rollback rather than a re-evaluation, and a new chat turn evaluates only its new tokens.

Subclasses implement ``_evaluate`` (append tokens at the cache's end, logits for the last
``n_logits`` of them) and ``_remove_from`` (drop cached positions >= n). ``FakeModel``
in the tests and ``LlamaModel`` in ``backend.py`` are the two implementations.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):  # the usual case: one extends the other
        return n
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class CachedModel(ABC):
    n_ctx: int
    n_vocab: int

    def __init__(self) -> None:
        self.cached: list[int] = []  # tokens whose keys/values are in the cache, in order
        self.evaluated_tokens = 0  # running count of tokens evaluated, for tests and stats

    def forward(self, tokens: Sequence[int], n_logits: int) -> np.ndarray:
        """Cache exactly ``tokens``; return float32 logits of shape (n_logits, n_vocab)."""
        if len(tokens) > self.n_ctx:
            raise ValueError(f"{len(tokens)} tokens exceed the context of {self.n_ctx}")
        if n_logits > len(tokens):
            raise ValueError("cannot return logits for more positions than tokens")
        keep = min(common_prefix_length(self.cached, tokens), len(tokens) - n_logits)
        if n_logits == 0 and keep == len(tokens):
            self.truncate(keep)
            return np.empty((0, self.n_vocab), dtype=np.float32)
        self.truncate(keep)
        new = list(tokens[keep:])
        rows = self._evaluate(new, n_logits)
        self.cached.extend(new)
        self.evaluated_tokens += len(new)
        return rows

    def truncate(self, n: int) -> None:
        """Roll the cache back to its first ``n`` tokens."""
        if n < len(self.cached):
            self._remove_from(n)
            del self.cached[n:]

    def reset(self) -> None:
        self.truncate(0)

    @abstractmethod
    def _evaluate(self, tokens: list[int], n_logits: int) -> np.ndarray:
        """Append ``tokens`` at position ``len(self.cached)``; logits of the last n_logits."""

    @abstractmethod
    def _remove_from(self, n: int) -> None:
        """Drop cached positions ``>= n``."""
