"""Option groups: options declared once, as the fields of a dataclass, shared by commands.

An option group is a frozen dataclass whose fields are options: each field's type is
``Annotated[T, Option(...)]`` (the shared set's ``options.model.Option``, or typer's own)
and its default is the option's default. A command decorated with ``@option_groups`` names
a group as the type of one of its parameters (``model: ModelChoice``); typer then sees the
group's fields in that parameter's place, one option each, and the command receives one
instance of the group built from their values. A parameter of the command typed with a
shared option alone (``threads: Threads``) is that option.

A shared option becomes typer's (``typer_annotation``), with its flags, help, metavar and
whether it is listed.

A field's name is the command's parameter name (``ctx.get_parameter_source("seed")`` keeps
working), so two groups of one command, or a group and the command, must not share a name:
``option_groups`` refuses that when the command is declared.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer

from localspec.options.model import declared

R = TypeVar("R")


def is_group(annotation: Any) -> bool:
    """Whether a parameter's type is an option group (a dataclass type)."""
    return isinstance(annotation, type) and dataclasses.is_dataclass(annotation)


def typer_annotation(annotation: Any) -> Any:
    """A parameter's annotation as typer reads it: a shared option's becomes typer's option
    of the same flags and help; any other is left as it is."""
    option = declared(annotation)
    if option is None:
        return annotation
    given = typer.Option(
        *option.flags, help=option.help, metavar=option.metavar, hidden=option.hidden
    )
    return Annotated[annotation.__origin__, given]  # type: ignore[name-defined]


def group_parameters(group: type) -> list[inspect.Parameter]:
    """The group's fields as keyword parameters, with their typer declarations; every field
    needs a default (``TypeError`` otherwise), as an option does."""
    hints = typing.get_type_hints(group, include_extras=True)
    for field in dataclasses.fields(group):
        if field.default is dataclasses.MISSING:
            raise TypeError(f"{group.__name__}.{field.name}: an option needs a default")
    return [
        inspect.Parameter(
            field.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=field.default,
            annotation=typer_annotation(hints[field.name]),
        )
        for field in dataclasses.fields(group)
    ]


def option_groups(command: Callable[..., R]) -> Callable[..., R]:
    """``command`` with each group-typed parameter replaced by the group's options (in its
    place, for ``--help``); called with keywords, as typer calls it, it gathers their values
    into one group instance each.
    ``TypeError`` when two options would share a name."""
    hints = typing.get_type_hints(command, include_extras=True)
    groups: dict[str, type] = {}
    parameters: list[inspect.Parameter] = []
    for parameter in inspect.signature(command).parameters.values():
        annotation = hints.get(parameter.name, parameter.annotation)
        if is_group(annotation):
            groups[parameter.name] = annotation
            parameters += group_parameters(annotation)
        else:
            parameters.append(parameter.replace(annotation=typer_annotation(annotation)))
    names = [parameter.name for parameter in parameters]
    if len(set(names)) != len(names):
        twice = sorted({name for name in names if names.count(name) > 1})
        raise TypeError(f"{command.__name__}: options named twice: {', '.join(twice)}")
    # Keyword-only parameters must follow the others; a stable sort keeps each kind's order.
    parameters.sort(key=lambda parameter: parameter.kind)

    @functools.wraps(command)
    def run(**values: Any) -> R:
        for name, group in groups.items():
            fields = {field.name: values.pop(field.name) for field in dataclasses.fields(group)}
            values[name] = group(**fields)
        return command(**values)

    del run.__wrapped__  # typer must read the signature below, not the command's own
    run.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
    run.__annotations__ = {parameter.name: parameter.annotation for parameter in parameters}
    return run
