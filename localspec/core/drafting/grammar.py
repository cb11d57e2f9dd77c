"""Drafts the grammar admits alone: a schema's keys and punctuation, drafted without a model.

Under a grammar (``core.grammar``), where it admits one continuation only, that continuation
(``core.grammar.forced``) is a draft that costs no model evaluation. The engine gives this
drafter the answer's grammar as each answer begins (``bind``); without one it offers
nothing. It prices its offers as every drafter does: its acceptance per draft position is
learned from its own verdicts (``AcceptanceEstimate``). Finding the forced tokens (two small
passes of the grammar per token, about a millisecond) is done when offering, so drafting
them costs nothing more: the offer's drafting seconds are none. Its q is one-hot.

It reads the grammar at the committed answer's state, which the engine keeps in step; the
forced tokens found for an offer are kept for the ``propose`` that follows it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from localspec.core.acceptance import AcceptanceEstimate
from localspec.core.drafting.base import Draft, Offer, Outcome
from localspec.core.grammar import Grammar, TokenIndex, forced, token_index
from localspec.core.params import GenerationParams

NAME = "grammar"
LIMIT = 8  # forced tokens looked for in a round: each may cost a pass over the vocabulary
PRIOR = 0.8  # a forced token's acceptance before any verdict: the target mostly agrees


class GrammarDrafter:
    name = NAME
    branching = None

    def __init__(
        self,
        n_vocab: int,
        token_bytes: Callable[[int], bytes],
        is_eog: Callable[[int], bool],
        limit: int = LIMIT,
    ) -> None:
        self.n_vocab, self.token_bytes, self.is_eog = n_vocab, token_bytes, is_eog
        self.limit = limit
        self.grammar: Grammar | None = None
        self._index: TokenIndex | None = None  # the vocabulary's, made when first needed
        self.estimate = AcceptanceEstimate(PRIOR, extrapolate=True)
        self._found: list[int] = []
        self._found_at = -1  # the committed length ``_found`` follows

    def bind(self, grammar: Grammar | None) -> None:
        """The answer's grammar, at the committed answer's state (None: no grammar)."""
        self.grammar = grammar
        if grammar is not None and self._index is None:
            self._index = token_index(self.n_vocab, self.token_bytes, self.is_eog)
        self._found, self._found_at = [], -1

    def begin(self, prompt: Sequence[int], params: GenerationParams) -> None:
        self._found, self._found_at = [], -1

    def offer(self, committed: Sequence[int], limit: int) -> Offer | None:
        if self.grammar is None or self._index is None or limit < 1:
            return None
        self._found = forced(self.grammar, limit, self._index)
        self._found_at = len(committed)
        if not self._found:
            return None
        # The tokens are found already: drafting them costs nothing more this round.
        return Offer(NAME, len(self._found), self.estimate.expected_accepted)

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
