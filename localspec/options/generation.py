"""The option groups of how tokens are chosen and drafted, and their checks.

- ``SamplingChoice`` and ``DraftingChoice``: how tokens are sampled and drafted;
  ``SamplingChoice.params(drafting)`` checks them and returns the ``GenerationParams``.
- ``drafter_mode(value)``: a drafter's name as a ``DrafterMode``;
- ``build_params(**fields)``: ``GenerationParams``, the fields given as None left at their
  defaults.

A bad value is a ``UsageError`` worded for the front end's ``Spelling``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import ValidationError

from localspec.core.params import DrafterMode, GenerationParams
from localspec.errors import UsageError
from localspec.options.model import COMMAND_LINE, Option, Spelling, invalid_value, settings

Temperature = Annotated[float, Option(help="0 is greedy")]


def negated(value: Any, name: str) -> bool:
    """A ``--no-X`` flag as the field ``X`` it turns off."""
    return not value


def drafter_mode(value: Any, spelling: Spelling = COMMAND_LINE) -> DrafterMode:
    """A drafter's name as a mode; a ``UsageError`` that lists the modes otherwise. (The
    Python API takes the name as text; the command line's parser checks ``--drafter``
    itself, as a choice of the modes.)"""
    try:
        return DrafterMode(value)
    except ValueError:
        *first, last = (mode.value for mode in DrafterMode)
        raise UsageError(
            f"invalid {spelling.option('drafter')} {value!r}", f"use {', '.join(first)} or {last}"
        ) from None


def build_params(*, spelling: Spelling = COMMAND_LINE, **fields: Any) -> GenerationParams:
    try:
        return GenerationParams(**{k: v for k, v in fields.items() if v is not None})
    except ValidationError as err:
        raise invalid_value(err, spelling) from None


@dataclass(frozen=True)
class DraftingChoice:
    """Which drafter, and how long and how branched its drafts may be."""

    drafter: Annotated[
        DrafterMode,
        Option(
            help="auto (cost model), model, ngram, self (a draft of the target's own layers), "
            "lookahead (the target's own guesses; exact when sampling), or none (plain decoding)"
        ),
    ] = DrafterMode.AUTO
    draft_max: Annotated[int, Option(help="longest draft per round")] = 16
    no_trees: Annotated[
        bool,
        Option(
            "--no-trees",
            help="verify single draft chains only (auto otherwise verifies competing drafts "
            "as one draft tree when that is expected to pay; greedy decoding only)",
            to="trees",
            read=negated,
        ),
    ] = False


@dataclass(frozen=True)
class SamplingChoice:
    """How the next token is chosen (greedy unless ``temperature`` is above 0)."""

    temperature: Temperature = 0.0
    top_k: Annotated[int, Option(help="sampling: keep the k most likely (0: off)")] = 40
    top_p: Annotated[float, Option(help="sampling: nucleus mass (1: off)")] = 0.95
    min_p: Annotated[float, Option(help="sampling: drop below min-p x top (0: off)")] = 0.05
    seed: Annotated[int | None, Option(help="sampling seed")] = None

    def params(
        self, drafting: DraftingChoice, *, spelling: Spelling = COMMAND_LINE, **fields: Any
    ) -> GenerationParams:
        """The checked ``GenerationParams`` of these and ``drafting``'s values, with
        ``fields`` (``max_tokens``, ``trace``...)."""
        return build_params(
            spelling=spelling,
            **settings(self, spelling),
            **settings(drafting, spelling),
            **fields,
        )
