"""``--grammar FILE`` and ``--json-schema FILE``: what an answer must match, read from files.

``read_constraint(grammar, json_schema)`` reads the file given (bounded in size, UTF-8) and
returns GBNF that parses, or raises a typed error naming the option, before any model
loads (``session.constraints``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from localspec.backend.grammar import MAX_GRAMMAR_CHARS, MAX_SCHEMA_CHARS
from localspec.errors import UsageError
from localspec.session.constraints import Names, constraint
from localspec.storage.textfile import decode_utf8, read_bounded

GRAMMAR, JSON_SCHEMA = "--grammar", "--json-schema"
NAMES = Names(grammar=GRAMMAR, json_schema=JSON_SCHEMA)

GrammarOpt = Annotated[
    str | None,
    typer.Option(
        "--grammar",
        metavar="FILE",
        help="a GBNF grammar (llama.cpp's) the answer must match, its rule root the whole",
    ),
]
JsonSchemaOpt = Annotated[
    str | None,
    typer.Option(
        "--json-schema",
        metavar="FILE",
        help="a JSON schema the answer must match (converted to a grammar)",
    ),
]


def _read(file: str, limit: int, option: str) -> str:
    # A character is at most four bytes: a file past that is over the limit whatever it is.
    data = read_bounded(Path(file), 4 * limit, option)
    if len(data) > 4 * limit:
        raise UsageError(f"{option}: {file} is over {limit:,} characters", "give a smaller one")
    return decode_utf8(data, file)


def read_constraint(grammar: str | None, json_schema: str | None) -> str | None:
    """GBNF from the files of the options given, or None for neither."""
    grammar_text = _read(grammar, MAX_GRAMMAR_CHARS, GRAMMAR) if grammar else None
    schema_text = _read(json_schema, MAX_SCHEMA_CHARS, JSON_SCHEMA) if json_schema else None
    return constraint(grammar=grammar_text, json_schema=schema_text, names=NAMES)
