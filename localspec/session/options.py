"""Option values as people give them, checked the same way for every front end.

The command line and the Python API (``localspec.api``) take the same options and refuse
the same bad values with the same ``UsageError``; only the spelling differs. A message names
the option as its front end writes it, and its hint says where that front end describes
its options (``Spelling``: ``--max-tokens`` and ``see localspec complete --help`` on the
command line, ``max_tokens`` and the API's own pointer in Python).

- ``drafter_mode(value)``: a drafter's name as a ``DrafterMode``;
- ``build_params(**fields)``: ``GenerationParams``, the fields given as None left at their
  defaults;
- ``pair_options(**fields)``: ``ModelOptions`` checked, a bad value a ``UsageError``;
- ``model_options(mode, **fields)``: the ``ModelOptions`` of a pair that runs ``mode``,
  which decides whether the draft is loaded (at once, or only where it may pay) and the
  machine's costs measured (``self``
  drafts with a draft derived from the target's own layers);
- ``parse_shares(value)``: the share of the target's layers per RPC worker;
- ``invalid_value(error)``: a pydantic ``ValidationError`` of option values as a
  ``UsageError``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from localspec.core.params import DrafterMode, GenerationParams
from localspec.errors import UsageError, validation_problem
from localspec.session.pair import SELF_DRAFT, ModelOptions

# Fields of ModelOptions whose option has another name.
OPTION_NAMES = {"n_ctx": "ctx", "n_gpu_layers": "gpu_layers"}


@dataclass(frozen=True)
class Spelling:
    """How a front end writes an option in a message, and where it describes its options."""

    prefix: str  # "--" on the command line
    joiner: str  # between an option's words: "-" on the command line, "_" in Python
    help: str  # the hint of an invalid value

    def option(self, name: str) -> str:
        """A field's name (or a dotted location, ``stop.0``) as this front end's option."""
        head, dot, rest = name.partition(".")
        head = OPTION_NAMES.get(head, head)
        return self.prefix + head.replace("_", self.joiner) + dot + rest

    def setting(self, name: str, value: Any) -> str:
        """The option given a value: ``--drafter self``, or ``drafter='self'`` in Python."""
        if self.prefix:
            return f"{self.option(name)} {value}"
        return f"{self.option(name)}={value!r}"


def command_line(command: str = "complete") -> Spelling:
    return Spelling("--", "-", f"see localspec {command} --help")


COMMAND_LINE = command_line()


def invalid_value(error: Any, spelling: Spelling = COMMAND_LINE) -> UsageError:
    """A pydantic ``ValidationError`` of option values as a ``UsageError``."""
    where, msg = validation_problem(error)
    return UsageError(f"invalid {spelling.option(where)}: {msg}", spelling.help)


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


def pair_options(*, spelling: Spelling = COMMAND_LINE, **fields: Any) -> ModelOptions:
    """``ModelOptions`` of ``fields``; a bad value is a ``UsageError`` worded for ``spelling``."""
    try:
        return ModelOptions(**fields)
    except ValidationError as err:
        raise invalid_value(err, spelling) from None


def model_options(
    drafter: DrafterMode, *, spelling: Spelling = COMMAND_LINE, **fields: Any
) -> ModelOptions:
    """The ``ModelOptions`` of a pair that runs ``drafter``; ``use_draft`` and ``calibrate``
    follow from the drafter unless ``fields`` set them."""
    if drafter.derives_draft:
        if fields.get("draft") not in (None, SELF_DRAFT):
            raise UsageError(
                f"{spelling.setting('drafter', 'self')} drafts with the target's own layers, "
                f"not {spelling.setting('draft', fields['draft'])}",
                f"leave out {spelling.option('draft')}, or use "
                f"{spelling.setting('drafter', 'model')} to draft with that model",
            )
        fields["draft"] = SELF_DRAFT
    implied = {
        "use_draft": drafter.loads_draft_model,
        "draft_on_demand": drafter.loads_draft_model and not drafter.needs_draft_model,
        "calibrate": drafter.calibrates,
    }
    return pair_options(spelling=spelling, **{**implied, **fields})


def parse_shares(
    value: str | Sequence[float] | None, spelling: Spelling = COMMAND_LINE
) -> tuple[float, ...]:
    """``"3,1"`` (or ``[3, 1]``) -> ``(3.0, 1.0)``; nothing -> ``()`` (by the workers' memory)."""
    if not value:
        return ()
    parts = value.split(",") if isinstance(value, str) else value
    try:
        return tuple(float(part) for part in parts)
    except (TypeError, ValueError):
        raise UsageError(
            f"invalid {spelling.option('rpc_split')} {value!r}", "write numbers, e.g. 3,1"
        ) from None
