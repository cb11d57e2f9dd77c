"""Structured output in a request: OpenAI's ``response_format`` and llama.cpp-server's
``json_schema`` and ``grammar`` fields, read into the GBNF the answer must match.

``response_grammar(body)`` reads them: ``{"type": "text"}`` or nothing is free text;
``{"type": "json_object"}`` is any JSON object; ``{"type": "json_schema", "json_schema":
{"name": ..., "schema": {...}, "strict": ...}}`` is the schema's grammar (every answer matches
it, so ``strict`` may be true or false, but must be a boolean). Each refusal is a 400 naming
the field: a shape that is not OpenAI's, a schema the converter cannot take, a grammar that
does not parse, either over its size limit (``session.constraints``). The conversion is
bounded work, but it is not free: the server reads a request's body off the event loop.
"""

from __future__ import annotations

from typing import Any

from localspec.errors import UsageError
from localspec.serve.errors import ApiError
from localspec.session.constraints import Names, constraint, json_object_grammar

SCHEMA_FIELD = "response_format.json_schema.schema"


def _refused(error: UsageError, field: str) -> ApiError:
    return ApiError(400, error.message, param=field)


def response_grammar(body: dict[str, Any]) -> str | None:
    """The GBNF the request's answer must match (None: free text)."""
    fmt = body.get("response_format")
    own = {name: body.get(name) for name in ("json_schema", "grammar")}
    given = [name for name, value in own.items() if value is not None]
    if fmt not in (None, {"type": "text"}) and given:
        raise ApiError(400, f"response_format and {given[0]} are both given: give one",
                       param=given[0])  # fmt: skip
    if given:
        try:
            return constraint(grammar=own["grammar"], json_schema=own["json_schema"])
        except UsageError as error:
            raise _refused(error, given[-1]) from None
    return _response_format(fmt)


def _response_format(fmt: Any) -> str | None:
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return json_object_grammar()
    if kind != "json_schema":
        raise ApiError(400, 'response_format must be {"type": "text"}, {"type": "json_object"} '
                       'or {"type": "json_schema", "json_schema": {...}}',
                       param="response_format")  # fmt: skip
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise ApiError(400, 'response_format.json_schema must be {"name": ..., "schema": {...}}',
                       param="response_format.json_schema")  # fmt: skip
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise ApiError(400, "response_format.json_schema.strict must be true or false",
                       param="response_format.json_schema.strict")  # fmt: skip
    name = spec.get("name")
    if name is not None and not isinstance(name, str):
        raise ApiError(400, "response_format.json_schema.name must be text",
                       param="response_format.json_schema.name")  # fmt: skip
    try:
        return constraint(json_schema=spec["schema"], names=Names(json_schema=SCHEMA_FIELD))
    except UsageError as error:
        raise _refused(error, SCHEMA_FIELD) from None
