"""A request's checks, each made once, before anything of it runs: pure functions of the
request and of what the loaded pair is (``PairFacts``), so the session runs them as it is
asked and every front end before it asks.

Every front end sends its requests through these checks and no other; they raise the typed
errors of ``localspec.errors``, which carry their data and name no front end's options: the
front end that catches one words it in its own dialect (the command line writes ``--ctx``
and ``--drafter``, the Python API ``ctx`` and ``drafter=``, the server its JSON fields).

- ``check_options(params, raw=, system=, prediction=)``: what the options alone decide, so a
  front end checks them as it reads them, before any model loads: a system prompt needs the
  chat template (not ``raw``), and only ``auto`` drafts from a prediction
  (``ConflictingOptionsError``).
- ``check_request(pair, tokens, params)``: what needs the loaded pair (``PairFacts``), run by
  ``Session.generate`` as it is asked, so that a request that cannot run fails before its
  first event: a drafter whose draft model the pair does not have (``MissingDraftError``; a
  pair has its draft model even while it is not loaded, as it loads on demand), a prompt
  without tokens (``InputError``) or with more than the context holds
  (``ContextOverflowError``, leaving room for one new token).
- ``check_drafter(pair, drafter)``: that first part alone, for a front end that runs many
  requests with drafters known in advance (the bench's modes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from localspec.core.params import DrafterMode, GenerationParams
from localspec.errors import (
    ConflictingOptionsError,
    ContextOverflowError,
    MissingDraftError,
    empty_input,
)


@dataclass(frozen=True)
class PairFacts:
    """What the checks need to know of a loaded pair."""

    n_ctx: int  # tokens its context holds
    has_draft: bool  # it has a draft model, loaded or to load when a drafter needs it
    derived: bool  # that draft model was derived from the target's own layers


def check_options(
    params: GenerationParams,
    *,
    raw: bool = False,
    system: str | None = None,
    prediction: bool = False,
) -> None:
    """Refuse options that cannot go together: a system prompt (blank is none) with raw
    text, a ``prediction`` with a drafter other than ``auto``."""
    if raw and system is not None and system.strip():
        raise ConflictingOptionsError(
            "system", "raw", True, "a system prompt needs the chat template"
        )
    if prediction and params.drafter is not DrafterMode.AUTO:
        raise ConflictingOptionsError(
            "prediction",
            "drafter",
            params.drafter.value,
            f"a prediction is drafted from by the auto drafter, not {params.drafter.value}",
        )


def check_drafter(pair: PairFacts, drafter: DrafterMode) -> None:
    """Refuse a drafter whose draft model the pair does not have."""
    if drafter.needs_draft_model and not pair.has_draft:
        raise MissingDraftError(drafter.value)
    if drafter.derives_draft and not pair.derived:
        raise MissingDraftError(drafter.value, derived=True)


def check_request(pair: PairFacts, tokens: Sequence[int], params: GenerationParams) -> None:
    """Refuse a request the pair cannot run: see the module docstring."""
    check_drafter(pair, params.drafter)
    if not tokens:
        raise empty_input()
    if len(tokens) >= pair.n_ctx:
        raise ContextOverflowError(n_tokens=len(tokens), n_ctx=pair.n_ctx)
