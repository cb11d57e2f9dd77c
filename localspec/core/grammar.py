"""A grammar that constrains what the target may say: the contract the engine drives.

A ``Grammar`` is a matcher at one state: the tokens accepted so far of an answer. The
engine keeps one at the state of the committed answer, and, to verify a draft, clones it
and advances the clone by each drafted token, so a rejection leaves the committed state as
it was. The constrained target is the target's distribution with the tokens the grammar
forbids removed and the rest renormalized: greedy decoding takes the allowed token with the
highest logit; sampling warps the masked logits (``masked``).

Cost. Masking a row asks the grammar about every token of the vocabulary (151,936 for
Qwen2.5; tens of milliseconds), far more than a greedy step needs: ``best_allowed`` asks
about the row's argmax alone, as llama.cpp's common sampler does, then where the grammar
forbids it about the row's few best tokens, and masks the whole row only when it forbids
them all; a sampler that keeps the best ``top_k`` tokens reads a row masked among the row's
best few when they hold that many (``masked_for_top``).

``forced(grammar, k, index)`` is the continuation the grammar admits alone
(a schema's keys and punctuation): at each step, the longest allowed token when every other
allowed token is a prefix of it. It is a draft, verified as any other, so a tokenization
the target would not choose costs a rejection, never a wrong answer.

Implementations: ``backend.grammar.LlamaGrammar`` (llama.cpp's grammar sampler); the tests
have a pure-Python one. The core layer never parses grammars itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

MAX_TOKEN_BYTES = 128  # longer than any token of the vocabularies in use
SHORTLIST = 64  # a row's best tokens asked about before the whole vocabulary


class Grammar(Protocol):
    def clone(self) -> Grammar:
        """An independent matcher at the same state."""

    def accept(self, token: int) -> None:
        """Advance by ``token``, which the grammar allows here (``allows``)."""

    def allows(self, token: int) -> bool:
        """Whether ``token`` may come next."""

    def allowed(self, n_vocab: int) -> np.ndarray:
        """A boolean mask over ``n_vocab`` ids: the tokens that may come next."""

    def allowed_among(self, ids: np.ndarray) -> np.ndarray:
        """A boolean mask over ``ids``: which of them may come next (a pass over these
        only)."""


def masked(logits: np.ndarray, grammar: Grammar) -> np.ndarray:
    """``logits`` (a copy) with every token the grammar forbids at ``-inf``."""
    keep = grammar.allowed(len(logits))
    out = np.full(len(logits), -np.inf, dtype=np.float64)
    out[keep] = logits[keep]
    return out


def masked_for_top(logits: np.ndarray, grammar: Grammar, top_k: int) -> np.ndarray:
    """``masked`` as a sampler that keeps the ``top_k`` best tokens reads it (0: every
    token): where the row's best few hold ``top_k`` allowed tokens, those are its best
    allowed ones (every token outside them has a lower logit), and only the few are asked
    about; the tokens left at ``-inf`` besides the forbidden ones are those the sampler
    drops anyway. Equal logits at the ``top_k``-th place are an arbitrary choice either
    way."""
    for size in (SHORTLIST, SHORTLIST * 32):
        if top_k <= 0 or size >= len(logits):
            break
        if size < top_k:
            continue
        floor = np.partition(logits, -size)[-size]
        ids = np.flatnonzero(logits >= floor)
        allowed = ids[grammar.allowed_among(ids.astype(np.int32))]
        if len(allowed) >= top_k:
            out = np.full(len(logits), -np.inf, dtype=np.float64)
            out[allowed] = logits[allowed]
            return out
    return masked(logits, grammar)


def best_allowed(row: np.ndarray, grammar: Grammar) -> int:
    """The allowed token with the highest logit (the lowest id among equal ones): the
    argmax when the grammar allows it, else the best allowed of the row's ``SHORTLIST``
    best tokens (and every token tied with the last of them), else the argmax of the
    masked row. Where the model would write what the grammar forbids (a pretty-printed
    JSON's newlines, under a grammar of compact JSON), its choice is among its next few."""
    top = int(np.argmax(row))
    if grammar.allows(top):
        return top
    if len(row) > SHORTLIST:
        floor = np.partition(row, -SHORTLIST)[-SHORTLIST]
        ids = np.flatnonzero(row >= floor)  # ascending: the first maximum is the lowest id
        allowed = ids[grammar.allowed_among(ids.astype(np.int32))]
        if len(allowed):
            # Every token outside ``ids`` has a lower logit than all of them.
            return int(allowed[np.argmax(row[allowed])])
    keep = grammar.allowed(len(row))
    if not keep.any():
        raise ValueError("the grammar allows no token here")
    return int(np.argmax(np.where(keep, row, -np.inf)))


def cut(grammar: Grammar, tokens: list[int]) -> tuple[list[int], int | None]:
    """The longest prefix of ``tokens`` the grammar allows, and the first token it forbids
    (None when it allows them all). ``grammar`` is left as it was."""
    state = grammar.clone()
    for i, token in enumerate(tokens):
        if not state.allows(token):
            return tokens[:i], token
        state.accept(token)
    return tokens, None


@dataclass(frozen=True)
class TokenIndex:
    """A vocabulary's tokens by their first byte, for ``forced``: the one-byte tokens (and
    their bytes), and for each first byte the tokens that begin with it."""

    pieces: list[bytes]
    singles: np.ndarray
    single_bytes: np.ndarray
    by_first: dict[int, np.ndarray]
    ends: np.ndarray  # the end-of-generation tokens


def token_index(
    n_vocab: int, token_bytes: Callable[[int], bytes], is_eog: Callable[[int], bool]
) -> TokenIndex:
    """The index of a vocabulary (one pass over it; an end-of-generation token is in none)."""
    pieces = [b"" if is_eog(t) else token_bytes(t) for t in range(n_vocab)]
    groups: dict[int, list[int]] = {}
    for t, piece in enumerate(pieces):
        if piece:
            groups.setdefault(piece[0], []).append(t)
    singles = [t for t, piece in enumerate(pieces) if len(piece) == 1]
    return TokenIndex(
        pieces,
        np.array(singles, dtype=np.int32),
        np.array([pieces[t][0] for t in singles], dtype=np.int32),
        {b: np.array(ids, dtype=np.int32) for b, ids in groups.items()},
        np.array([t for t in range(n_vocab) if is_eog(t)], dtype=np.int32),
    )


def forced(grammar: Grammar, k: int, index: TokenIndex) -> list[int]:
    """Up to ``k`` tokens the grammar admits alone from its state (see the module
    docstring); ``grammar`` is left as it was.

    A pass of the grammar over the whole vocabulary takes about as long as a target step,
    so each token is found in two small ones: over the one-byte tokens, which tell the
    bytes the next token may begin with (a grammar allows a token only where it allows its
    first byte), then, when that is one byte only, over the tokens that begin with it."""
    state = grammar.clone()
    out: list[int] = []
    while len(out) < k:
        if len(index.ends) and state.allowed_among(index.ends).any():
            break  # the answer may end here: nothing is forced
        firsts = np.unique(index.single_bytes[state.allowed_among(index.singles)])
        if len(firsts) != 1:
            break
        candidates = index.by_first[int(firsts[0])]
        ids = candidates[state.allowed_among(candidates)]
        # Tokens that are all prefixes of one are at most as many as its bytes.
        if not 0 < len(ids) <= MAX_TOKEN_BYTES:
            break
        pieces = [index.pieces[int(t)] for t in ids]
        longest = max(range(len(ids)), key=lambda i: len(pieces[i]))
        if any(not pieces[longest].startswith(piece) for piece in pieces):
            break
        out.append(int(ids[longest]))
        state.accept(out[-1])
    return out
