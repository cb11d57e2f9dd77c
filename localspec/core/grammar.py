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

``forced(grammar, k, index)`` is the continuation the grammar admits alone (a schema's keys
and punctuation), spelled in tokens as the model would write it: as the tokenizer splits
that text after the answer's last words (``spelled_after``), the model having learned its
text in those tokens, or else with the longest token at each place; and none that the model
could run past the text's end, unless the answer has written that longer token already
(the ``":`` that ends each key of a compact JSON answer), which is then drafted in its
place. It is a draft, verified as any other, so a tokenization the target would not choose
costs a rejection, never a wrong answer.

Implementations: ``backend.grammar.LlamaGrammar`` (llama.cpp's grammar sampler); the tests
have a pure-Python one. The core layer never parses grammars itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

MAX_FORCED_BYTES = 64  # forced text looked for in a round: a pass over the one-byte tokens a byte
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


def allowed_among_best(row: np.ndarray, grammar: Grammar, size: int) -> np.ndarray:
    """The ids (ascending) the grammar allows among the row's ``size`` best tokens and every
    token tied with the last of them: every token outside these has a lower logit than all
    of them, so the best allowed ones, where these hold them, are the row's."""
    floor = np.partition(row, -size)[-size]
    ids = np.flatnonzero(row >= floor)
    return ids[grammar.allowed_among(ids.astype(np.int32))]


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
        allowed = allowed_among_best(logits, grammar, size)
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
        allowed = allowed_among_best(row, grammar, SHORTLIST)
        if len(allowed):
            # Ascending ids: the first maximum is the lowest id among equal logits.
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


def forced_text(grammar: Grammar, index: TokenIndex, limit: int = MAX_FORCED_BYTES) -> bytes:
    """The bytes the grammar admits alone from its state, up to ``limit``: at each step
    the one byte its allowed one-byte tokens begin with (a grammar allows a token only
    where it allows its first byte), until it allows two, or the answer may end there.
    ``grammar`` is left as it was."""
    state = grammar.clone()
    out = bytearray()
    while len(out) < limit:
        if len(index.ends) and state.allowed_among(index.ends).any():
            break
        allowed = state.allowed_among(index.singles)
        firsts = np.unique(index.single_bytes[allowed])
        if len(firsts) != 1:
            break
        out.append(int(firsts[0]))
        state.accept(int(index.singles[allowed][0]))
    return bytes(out)


def spelled_after(
    tokenize: Callable[[str], list[int]], piece: Callable[[int], bytes], before: bytes, text: bytes
) -> list[int] | None:
    """The tokens the tokenizer writes ``text`` as where it follows ``before`` (the answer's
    last few tokens: how a word began changes how its rest is split), or as text of its own
    where no token boundary falls where ``before`` ends; None where ``text`` is not whole
    UTF-8 (a character cut by the forced text's end)."""
    for head in (before, b""):
        try:
            joined = (head + text).decode("utf-8")
        except UnicodeDecodeError:
            continue
        tokens = tokenize(joined)
        at = i = 0
        while i < len(tokens) and at < len(head):
            at += len(piece(tokens[i]))
            i += 1
        if at == len(head):
            return tokens[i:]
    return None


def _spells(tokens: list[int], text: bytes, index: TokenIndex) -> bool:
    """Whether ``tokens`` (ids of the index's vocabulary) spell ``text`` exactly."""
    if any(not 0 <= t < len(index.pieces) for t in tokens):
        return False
    return b"".join(index.pieces[t] for t in tokens) == text


def forced(
    grammar: Grammar,
    k: int,
    index: TokenIndex,
    spell: Callable[[bytes], list[int] | None] | None = None,
    habit: Callable[[list[int]], int | None] | None = None,
) -> list[int]:
    """Up to ``k`` tokens that spell the text the grammar admits alone (``forced_text``),
    as the model writes it: ``spell(text)``'s tokens where they spell exactly that text,
    else at each place the longest token within it. A token that could run past the
    text's end (the grammar allows a longer one there, e.g. a key's closing quote where
    ``":`` may follow) ends the draft, since the model may take the longer one; where
    ``habit`` names one of those longer tokens (the one the answer wrote last), that one
    is drafted in its place. ``grammar`` is left as it was."""
    text = forced_text(grammar, index)
    if not text:
        return []
    tokens = spell(text) if spell is not None else None
    if tokens is not None and not _spells(tokens, text, index):
        tokens = None
    state = grammar.clone()
    out: list[int] = []
    at = 0
    while at < len(text) and len(out) < k:
        rest = text[at:]
        within: list[int] = []  # tokens that spell a prefix of the rest
        beyond: list[int] = []  # tokens that spell the rest and more
        for t in index.by_first.get(rest[0], ()):
            piece = index.pieces[int(t)]
            if rest.startswith(piece):
                within.append(int(t))
            elif piece.startswith(rest):
                beyond.append(int(t))
        if beyond:
            ids = np.array(beyond, np.int32)
            allowed = ids[state.allowed_among(ids)].tolist()
            if allowed:
                taken = habit(allowed) if habit is not None else None
                if taken is not None:
                    out.append(taken)
                break
        if tokens is not None:
            token = tokens[len(out)]
        elif within:
            # The longest (the lowest id among equal ones); every token within the text
            # is allowed, the text being the only one the grammar admits.
            token = max(within, key=lambda t: (len(index.pieces[t]), -t))
        else:
            break
        out.append(token)
        state.accept(token)
        at += len(index.pieces[token])
    return out
