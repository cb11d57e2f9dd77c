"""Drafts the grammar admits alone: a schema's keys and punctuation, drafted without a model.

Under a grammar (``core.grammar``), where it admits one continuation only, that continuation
(``core.grammar.forced``) is a draft that costs no model evaluation. The engine gives this
drafter the answer's grammar as each answer begins (``bind``); without one it offers
nothing. It spells the forced text as the target's tokenizer does after the answer's last
tokens (``tokenize``), and where the text ends at a token the model could run past, drafts
the longer token this answer wrote last (its habit: the ``":`` after each key of a compact
JSON answer). Where a draft ends at a choice the grammar leaves open (the whitespace
between a value and the next key), it bridges to the next forced text with the token the
answer wrote after the same token last time, when the grammar allows it and forces at
least ``BRIDGED_BYTES`` after it: a value's closing ``",`` is followed by `` "`` and the
next key, drafted together. It prices its offers as every drafter does: its acceptance
per draft position is learned from its own verdicts (``AcceptanceEstimate``). Finding the
forced tokens (two small passes of the grammar per token, about a millisecond) is done when
offering, so drafting them costs nothing more: the offer's drafting seconds are none. Its q
is one-hot.

It reads the grammar at the committed answer's state, which the engine keeps in step; the
forced tokens found for an offer are kept for the ``propose`` that follows it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from localspec.core.acceptance import AcceptanceEstimate
from localspec.core.drafting.base import Draft, Offer, Outcome
from localspec.core.grammar import (
    Grammar,
    TokenIndex,
    forced,
    forced_text,
    spelled_after,
    token_index,
)
from localspec.core.params import GenerationParams

NAME = "grammar"
LIMIT = 8  # forced tokens looked for in a round: each may cost a pass over the vocabulary
PRIOR = 0.8  # a forced token's acceptance before any verdict: the target mostly agrees
BEFORE = 6  # the answer's last tokens the forced text is tokenized after
# Forced bytes a bridge must lead to: a key and its closing quote, not a string's opening
# quote alone (after which the answer's habits belong to another context).
BRIDGED_BYTES = 2


class GrammarDrafter:
    name = NAME
    branching = None

    def __init__(
        self,
        n_vocab: int,
        token_bytes: Callable[[int], bytes],
        is_eog: Callable[[int], bool],
        tokenize: Callable[[str], list[int]] | None = None,
        limit: int = LIMIT,
    ) -> None:
        self.n_vocab, self.token_bytes, self.is_eog = n_vocab, token_bytes, is_eog
        self.tokenize = tokenize
        self.limit = limit
        self.grammar: Grammar | None = None
        self._index: TokenIndex | None = None  # the vocabulary's, made when first needed
        self.estimate = AcceptanceEstimate(PRIOR, extrapolate=True)
        self._found: list[int] = []
        self._found_at = -1  # the committed length ``_found`` follows
        self._answer_from = 0  # where the answer begins in ``committed``
        self._last_seen: dict[int, int] = {}  # each token the answer wrote: where, last
        self._followed: dict[int, int] = {}  # each token the answer wrote: what came next, last
        self._scanned = 0  # ``committed`` read into ``_last_seen`` and ``_followed`` so far

    def bind(self, grammar: Grammar | None) -> None:
        """The answer's grammar, at the committed answer's state (None: no grammar)."""
        self.grammar = grammar
        if grammar is not None and self._index is None:
            self._index = token_index(self.n_vocab, self.token_bytes, self.is_eog)
        self._found, self._found_at = [], -1

    def begin(self, prompt: Sequence[int], params: GenerationParams) -> None:
        self._found, self._found_at = [], -1
        self._answer_from, self._scanned = len(prompt), len(prompt)
        self._last_seen, self._followed = {}, {}

    def offer(self, committed: Sequence[int], limit: int) -> Offer | None:
        if self.grammar is None or self._index is None or limit < 1:
            return None
        self._read(committed)
        self._found = self._bridged(committed, self._forced(self.grammar, committed, limit), limit)
        self._found_at = len(committed)
        if not self._found:
            return None
        # The tokens are found already: drafting them costs nothing more this round.
        return Offer(NAME, len(self._found), self.estimate.expected_accepted)

    def _read(self, committed: Sequence[int]) -> None:
        """What the answer wrote since the last offer, into its habits."""
        for at in range(max(self._scanned, self._answer_from), len(committed)):
            self._last_seen[committed[at]] = at
            if at > self._answer_from:
                self._followed[committed[at - 1]] = committed[at]
        self._scanned = len(committed)

    def _forced(self, state: Grammar, before: Sequence[int], limit: int) -> list[int]:
        """The forced tokens at ``state``, spelled after ``before``."""
        assert self._index is not None
        return forced(state, limit, self._index, self._speller(before), self._habit)

    def _bridged(self, committed: Sequence[int], found: list[int], limit: int) -> list[int]:
        """``found`` and, while the answer's habit after its last token leads to forced
        text again, that token and the forced text after it."""
        assert self.grammar is not None and self._index is not None
        state = self.grammar.clone()
        for token in found:
            state.accept(token)
        out = list(found)
        while len(out) < limit - 1:
            step = self._followed.get(out[-1] if out else committed[-1])
            if step is None or not state.allows(step):
                break
            after = state.clone()
            after.accept(step)
            if len(forced_text(after, self._index, BRIDGED_BYTES)) < BRIDGED_BYTES:
                break
            before = [*committed[-BEFORE:], *out, step]  # all the spelling reads of it
            more = self._forced(after, before, limit - len(out) - 1)
            if not more:
                break
            for token in more:
                after.accept(token)
            out += [step, *more]
            state = after
        return out

    def _speller(self, before: Sequence[int]) -> Callable[[bytes], list[int] | None] | None:
        tokenize = self.tokenize
        if tokenize is None:
            return None
        head = b"".join(self.token_bytes(t) for t in before[-BEFORE:])
        return lambda text: spelled_after(tokenize, self.token_bytes, head, text)

    def _habit(self, tokens: list[int]) -> int | None:
        """Of ``tokens``, the one the answer wrote last (None: none of them)."""
        written = [t for t in tokens if t in self._last_seen]
        return max(written, key=self._last_seen.__getitem__) if written else None

    def propose(
        self,
        committed: Sequence[int],
        k: int,
        params: GenerationParams,
        rng: np.random.Generator,
    ) -> Draft:
        if self._found_at != len(committed):
            return Draft(NAME, [])
        return Draft(NAME, self._found[:k])

    def observe(self, committed: Sequence[int], outcome: Outcome) -> None:
        if outcome.chosen and outcome.drafted:
            self.estimate.observe(outcome.drafted, outcome.accepted)
        self._found, self._found_at = [], -1

    def learned(self) -> dict[str, Any]:
        return {"acceptance": self.estimate.to_dict()}

    def restore(self, data: Any, keep: float) -> None:
        self.estimate.load(data["acceptance"], keep)
