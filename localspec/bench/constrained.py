"""Bench prompts whose answers must match a grammar: a JSON schema, or a call of the tools
offered.

A prompt line (shipped or a user's) may carry ``"json_schema"`` (a JSON schema object) or
``"tools"`` (OpenAI's ``tools`` list): ``read_constraint`` turns either into a ``Constraint``,
the GBNF every mode of the run must match (converted as ``complete --json-schema`` and the
server convert it) and, for tools, the functions shown to the model through the target's
chat template. Tools are answered as with ``tool_choice: "required"``: the answer is one or
more calls of the offered functions, constrained from its first token, so that plain
decoding, every drafter and llama.cpp's own runs (``--grammar-file``) answer under the same
grammar. A schema or tool list the converter cannot take is an ``InputError`` naming its
line and field.

``answer_valid(constraint, text)`` says whether an answer's text is what the constraint asks
for: JSON that parses, or at least one call of an offered function with arguments that
parse. The grammar makes it so for a finished answer; one cut short by the token limit is not.

The shipped sets (``CONSTRAINED_CATEGORIES``, run when named): extraction to JSON from a
text whose values the answer copies, tool calls whose arguments come from the request, and
schema-bound answers whose fields are mostly prose.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from localspec.errors import InputError, UsageError
from localspec.session.constraints import Names, constraint
from localspec.session.tools import REQUIRED, call_grammar, read_tools, split_calls

CONSTRAINED_CATEGORIES = ("extraction", "tool_calls", "schema_prose")
SCHEMA_FIELD, TOOLS_FIELD = "json_schema", "tools"
HINT = 'give "json_schema" a JSON schema object, or "tools" a list of OpenAI tools'


@dataclass(frozen=True)
class Constraint:
    """The GBNF an answer must match, and the functions shown to the model (tools only)."""

    grammar: str
    tools: tuple[dict[str, Any], ...] = ()

    @property
    def tool_names(self) -> list[str]:
        return [t["function"]["name"] for t in self.tools]


def read_constraint(row: dict[str, Any], where: str) -> Constraint | None:
    """The constraint of a prompt line, or None for a free answer."""
    schema, tools = row.get(SCHEMA_FIELD), row.get(TOOLS_FIELD)
    if schema is None and tools is None:
        return None
    if schema is not None and tools is not None:
        raise InputError(f'{where}: give "{SCHEMA_FIELD}" or "{TOOLS_FIELD}", not both', HINT)
    try:
        if schema is not None:
            if not isinstance(schema, dict):
                raise UsageError(f"{SCHEMA_FIELD}: must be a JSON schema object")
            names = Names(json_schema=SCHEMA_FIELD)
            grammar = constraint(json_schema=schema, names=names)
            assert grammar is not None  # a schema was given
            return Constraint(grammar)
        if not isinstance(tools, list) or not tools:
            raise UsageError(f"{TOOLS_FIELD}: must be a list of at least one function")
        offered = read_tools(tools, REQUIRED, (TOOLS_FIELD, "tool_choice"))
        assert offered is not None  # a list of functions was given
        return Constraint(call_grammar(offered, TOOLS_FIELD), tuple(offered.shown))
    except UsageError as err:
        raise InputError(f"{where}: {err.message}", HINT) from None


def answer_valid(constrained: Constraint, text: str) -> bool:
    """Whether ``text`` is what ``constrained`` asks for (see the module docstring)."""
    if constrained.tools:
        _, calls = split_calls(text, constrained.tool_names)
        return bool(calls) and all(c["function"]["name"] in constrained.tool_names for c in calls)
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
