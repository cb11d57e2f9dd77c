"""What an answer must match: a GBNF grammar or a JSON schema, as a front end's field names it.

``constraint(grammar=..., json_schema=..., names=...)`` turns a request's grammar text or
JSON schema (a dict, or JSON text) into GBNF that parses, or raises ``UsageError`` whose
message begins with the field's name as that front end spells it (``--json-schema``,
``json_schema``, ``response_format.json_schema.schema``). Schemas convert with
llama-cpp-python's own converter (``backend.grammar.schema_grammar``); both are bounded in
size and checked without a model, so a bad one is refused before anything loads or
evaluates. ``JSON_OBJECT`` is the grammar of any JSON object (OpenAI's ``json_object``).
The session compiles the text for its target's vocabulary as an answer begins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from localspec.backend.grammar import GrammarError, check_grammar, schema_grammar
from localspec.errors import UsageError

JSON_OBJECT_SCHEMA: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class Names:
    """How a front end spells the two fields."""

    grammar: str = "grammar"
    json_schema: str = "json_schema"


def constraint(
    *, grammar: str | None = None, json_schema: Any = None, names: Names = Names()
) -> str | None:
    """GBNF for the answer, or None when neither is given (both: a ``UsageError``)."""
    if grammar is not None and json_schema is not None:
        raise UsageError(
            f"{names.grammar} and {names.json_schema} are both given",
            "give one: a schema is converted to a grammar",
        )
    if json_schema is not None:
        try:
            text = schema_grammar(json_schema)
            check_grammar(text)
        except GrammarError as e:
            raise UsageError(f"{names.json_schema}: {e}", "give a JSON schema object") from None
        return text
    if grammar is not None:
        if not isinstance(grammar, str):
            raise UsageError(
                f"{names.grammar}: must be GBNF text, not {type(grammar).__name__}",
                "give a grammar whose rule root matches the whole answer",
            )
        try:
            check_grammar(grammar)
        except GrammarError as e:
            raise UsageError(
                f"{names.grammar}: {e}", "give a grammar whose rule root matches the whole answer"
            ) from None
        return grammar
    return None


def json_object_grammar() -> str:
    """Any JSON object."""
    return schema_grammar(JSON_OBJECT_SCHEMA)
