"""The options people give, declared once, and checked the same way for every front end.

The option set: each group is a frozen dataclass whose fields are options, typed
``Annotated[T, Option(...)]`` with the option's default as the field's. This module holds
what every group is made of, and the pair's groups:

- ``PairChoice``: which target and draft, and where their layers run (``doctor``);
- ``ModelChoice``: that, plus the RPC workers and ``--exact`` (every command that loads the
  pair, the Python API's ``load``); ``options(...)`` checks the values and returns the
  ``ModelOptions``, with ``LOCALSPEC_DEVICE_VERIFY`` read into them.

The other groups: the datastores and the prompt cache (``stores.py``), sampling and
drafting (``generation.py``), the bench's own (``bench.py``).

An ``Option`` holds what ``--help`` says of it and how the command line writes it (the CLI
turns it into typer's option: ``cli.groups``), and where its value goes: the field of
``ModelOptions`` or ``GenerationParams`` it sets (``to``, where not its own name) and how
the value as given becomes that field's (``read``). ``settings(group)`` applies them, so a
front end never maps an option itself: adding an option is one field of a group.

The checks: the command line and the Python API (``localspec.api``) take the same options
and refuse the same bad values with the same ``UsageError``; only the spelling differs. A
message names the option as its front end writes it, and its hint says where that front end
describes its options (``Spelling``: ``--max-tokens`` and ``see localspec complete --help``
on the command line, ``max_tokens`` and the API's own pointer in Python).

- ``pair_options(**fields)``: ``ModelOptions`` checked, a bad value a ``UsageError``;
- ``model_options(mode, **fields)``: the ``ModelOptions`` of a pair that runs ``mode``,
  which decides whether the draft is loaded (at once, or only where it may pay) and the
  machine's costs measured (``self``
  drafts with a draft derived from the target's own layers);
- ``parse_shares(value, name)``: the share of the target's layers per RPC worker;
- ``invalid_value(error)``: a pydantic ``ValidationError`` of option values as a
  ``UsageError``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Self

from pydantic import ValidationError

from localspec.backend.rpc import DEFAULT_TIMEOUT as DEFAULT_RPC_TIMEOUT
from localspec.backend.rpc import parse_endpoints
from localspec.core.params import DrafterMode
from localspec.environment import device_verification
from localspec.errors import UsageError, validation_problem
from localspec.machine.placement import parse_layers
from localspec.session.pair import SELF_DRAFT, ModelOptions


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
    value: str | Sequence[float] | None, name: str = "--rpc-split"
) -> tuple[float, ...]:
    """``"3,1"`` (or ``[3, 1]``) -> ``(3.0, 1.0)``; nothing -> ``()`` (by the workers' memory).
    ``name``: the option as its front end writes it, for the error."""
    if not value:
        return ()
    parts = value.split(",") if isinstance(value, str) else value
    try:
        return tuple(float(part) for part in parts)
    except (TypeError, ValueError):
        raise UsageError(f"invalid {name} {value!r}", "write numbers, e.g. 3,1") from None


# -- the option set ---------------------------------------------------------------------------

# How an option's value as given becomes its field's: ``read(value, name)``, where ``name``
# is the option as its front end writes it (``--gpu-layers``, ``gpu_layers``), for an error.
Reader = Callable[[Any, str], Any]


class Option:
    """One option as people see it, and where its value goes.

    ``flags``: its command-line names where they are not ``--NAME`` (a bool named
    ``"--exact"`` alone is a flag without a ``--no-`` form); ``help``: what ``--help`` says
    of it; ``metavar``: its value's placeholder there; ``hidden``: taken but not listed.
    ``to``: the ``ModelOptions`` or ``GenerationParams`` field it sets, where not its own
    name; ``read``: the ``Reader`` of its value, where the field takes another form.

    A group field's type is the value as the command line gives it (text for a number of
    layers or a list of workers); the Python API may give the forms its own signature
    names (a number, a list, a path), which each reader takes too."""

    def __init__(
        self,
        *flags: str,
        help: str | None = None,
        metavar: str | None = None,
        hidden: bool = False,
        to: str | None = None,
        read: Reader | None = None,
    ) -> None:
        self.flags = flags
        self.help = help
        self.metavar = metavar
        self.hidden = hidden
        self.to = to
        self.read = read

    def __repr__(self) -> str:
        return f"Option(flags={self.flags!r}, help={self.help!r}, to={self.to!r})"


def declared(annotation: Any) -> Option | None:
    """The ``Option`` an annotation carries (``Annotated[T, Option(...)]``), if any."""
    return next((m for m in getattr(annotation, "__metadata__", ()) if isinstance(m, Option)), None)


@functools.cache
def options_of(group: type) -> dict[str, Option]:
    """A group's options by field name, in the fields' order."""
    hints = typing.get_type_hints(group, include_extras=True)
    found = {field.name: declared(hints[field.name]) for field in dataclasses.fields(group)}
    missing = [name for name, option in found.items() if option is None]
    if missing:
        raise TypeError(f"{group.__name__}: fields without an Option: {', '.join(missing)}")
    return typing.cast(dict[str, Option], found)


def settings(choice: Any, spelling: Spelling = COMMAND_LINE) -> dict[str, Any]:
    """The ``ModelOptions`` or ``GenerationParams`` fields a group's values set: each under
    its option's ``to`` (else its own name), read by its ``read``; a value that cannot be
    read is a ``UsageError`` worded for ``spelling``."""
    fields: dict[str, Any] = {}
    group: type = type(choice)
    for name, option in options_of(group).items():
        value = getattr(choice, name)
        if option.read is not None:
            value = option.read(value, spelling.option(name))
        fields[option.to or name] = value
    return fields


def model_reference(value: Any, name: str) -> Any:
    """A model given as a ``pathlib.Path`` is its path's text; anything else is validated
    as the command line's text is."""
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def layers(value: Any, name: str) -> int | None:
    """A number of layers (``auto``, ``all`` or N) as ``ModelOptions`` holds it."""
    return parse_layers(value, name)


def endpoints(value: Any, name: str) -> tuple[str, ...]:
    """RPC workers (``"h:1,h:2"``, or a list in Python) as ``HOST:PORT`` texts."""
    return tuple(map(str, parse_endpoints(value))) if value else ()


LAYERS_METAVAR = "auto|all|N"
Target = Annotated[
    str | None, Option(help="target: path, catalog name or repo:file", read=model_reference)
]
Threads = Annotated[int | None, Option(help="CPU threads (default: all cores)")]


@dataclass(frozen=True)
class PairChoice:
    """Which target and draft, and where their layers run."""

    target: Target = None
    draft: Annotated[
        str | None,
        Option(
            help="draft: path, catalog name or repo:file; self: derived from the target's layers",
            read=model_reference,
        ),
    ] = None
    threads: Threads = None
    ctx: Annotated[int, Option(help="context size in tokens", to="n_ctx")] = 4096
    gpu_layers: Annotated[
        str | None,
        Option(
            metavar=LAYERS_METAVAR,
            help="target layers on the GPU (or on the --rpc workers): auto (default) puts all "
            "of them there when this build can offload and they fit, else runs on the CPU; "
            "all, 0 (the CPU) or a number of layers",
            to="n_gpu_layers",
            read=layers,
        ),
    ] = None
    draft_gpu_layers: Annotated[
        str | None,
        Option(
            metavar=LAYERS_METAVAR,
            help="draft layers on the GPU: auto (default) follows --gpu-layers in the memory "
            "the target leaves; 0 keeps the draft on the CPU",
            read=layers,
        ),
    ] = None

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> Self:
        """The group of those of ``values`` that are its options (a call's keywords)."""
        return cls(**{field.name: values[field.name] for field in dataclasses.fields(cls)})

    def options(
        self,
        drafter: DrafterMode | None = None,
        *,
        spelling: Spelling = COMMAND_LINE,
        **fields: Any,
    ) -> ModelOptions:
        """The checked ``ModelOptions``, ``fields`` (``stores``, ``recalibrate``...) added.
        With a ``drafter``, whether the draft is loaded and the costs measured follow from
        it (``model_options``) unless ``fields`` set them. A bad value is a ``UsageError``
        worded for ``spelling``."""
        values = {**settings(self, spelling), **fields}
        if drafter is not None:
            return model_options(drafter, spelling=spelling, **values)
        return pair_options(spelling=spelling, **values)


@dataclass(frozen=True)
class ModelChoice(PairChoice):
    """The pair and where it runs, on this machine or on RPC workers, and its kernels."""

    rpc: Annotated[
        str | None,
        Option(
            "--rpc",
            metavar="HOST:PORT[,...]",
            help="run the target's layers on llama.cpp RPC workers (localspec worker on each "
            "machine); the draft stays on this one",
            read=endpoints,
        ),
    ] = None
    rpc_timeout: Annotated[
        float,
        Option(
            "--rpc-timeout",
            help="seconds one target evaluation may wait on the RPC workers before the answer "
            "ends with an error",
        ),
    ] = DEFAULT_RPC_TIMEOUT
    rpc_split: Annotated[
        str | None,
        Option(
            "--rpc-split",
            metavar="N,N,...",
            help="share of the target's layers per --rpc worker, e.g. 3,1 (default: by each "
            "worker's free memory)",
            read=parse_shares,
        ),
    ] = None
    exact: Annotated[
        bool,
        Option(
            "--exact",
            help="greedy output identical to plain decoding's, token for token, whatever the "
            "drafter (batch-invariant kernels; slower)",
        ),
    ] = False

    def options(self, drafter: DrafterMode | None = None, **fields: Any) -> ModelOptions:
        """``PairChoice.options``, with where greedy choices are made: the environment's
        ``LOCALSPEC_DEVICE_VERIFY``, read here, into the options of every loading front end."""
        fields.setdefault("device_verify", device_verification())
        return super().options(drafter, **fields)


# Fields of ModelOptions whose option has another name, in every front end (``ctx``).
OPTION_NAMES = {option.to: name for name, option in options_of(ModelChoice).items() if option.to}
