"""A saved prompt state: one model's sequence (``Saved``) and an entry of the prompt cache
(``Entry``: the target's, the draft model's, the keys that bind them, the owner), and the
common-prefix length of two token arrays.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Saved:
    """One model's sequence: its tokens, and llama.cpp's bytes of its state after them."""

    tokens: np.ndarray  # int32
    state: bytes | memoryview  # a view where it was just read from a model

    @property
    def nbytes(self) -> int:
        return len(self.state) + self.tokens.nbytes


@dataclass(frozen=True)
class Entry:
    key: str
    target: Saved
    draft: Saved | None = None
    draft_key: str = ""
    owner: str = ""
    # Seconds a token of this prompt took to evaluate where it was made: what restoring
    # one saves (``PromptState`` weighs it against a read).
    prefill_s: float = 0.0

    @property
    def nbytes(self) -> int:
        return self.target.nbytes + (self.draft.nbytes if self.draft is not None else 0)

    def digest(self) -> str:
        """The entry's name among its key's: its tokens, owner and draft model's part."""
        h = hashlib.sha256(self.target.tokens.astype("<i4").tobytes())
        h.update(f"\0{self.owner}\0{self.draft_key}\0{self.draft is not None}".encode())
        return h.hexdigest()[:32]


def common_length(a: np.ndarray, b: np.ndarray) -> int:
    """The length of the common prefix of two int32 arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def as_tokens(tokens: object) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int32)
