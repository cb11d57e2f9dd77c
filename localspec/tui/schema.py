"""``/schema FILE message``: an answer that must be JSON matching the schema in FILE.

Typed in the chat's message box, ``/schema person.json Who wrote Dune?`` sends the message
and constrains the answer to the JSON schema in ``person.json``, converted to a grammar as
``complete --json-schema`` converts it (``session.constraints``): the answer parses and
matches the schema, and where the grammar allows one continuation (a key, its quotes and
colon) those tokens are drafted without a model. The schema is not added to the message:
say in it what the answer should hold, as with OpenAI's structured outputs.

``parse_schema`` reads the command (a path with spaces is quoted; the message may go on over
more lines), ``schema_grammar_of`` the file (a regular file, UTF-8, bounded) and returns the
grammar. Errors are ``InputError`` with a hint, shown by the app as a notification.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from localspec.backend.grammar import MAX_SCHEMA_CHARS
from localspec.errors import InputError, UsageError
from localspec.session.constraints import Names, constraint
from localspec.storage.textfile import decode_utf8, read_bounded
from localspec.tui.edit import file_command

COMMAND = "/schema"
NAMES = Names(json_schema=COMMAND)


@dataclass(frozen=True)
class SchemaRequest:
    path: Path
    message: str


def parse_schema(text: str) -> SchemaRequest:
    """``/schema FILE message...``; the message may go on over more lines."""
    usage = "type /schema FILE and your message"
    path, message = file_command(text, COMMAND, "my schema.json", usage)
    if not message:
        raise InputError("/schema needs a message", usage)
    return SchemaRequest(path, message)


def schema_grammar_of(path: Path) -> str:
    """The grammar of the schema in ``path``; it is read and converted on the UI's thread,
    so only a regular file within the schema size bound is."""
    # A character is at most four bytes: a file past that is over the limit whatever it is.
    data = read_bounded(path, 4 * MAX_SCHEMA_CHARS, "schema", regular=True)
    text = decode_utf8(data, str(path))
    if len(data) > 4 * MAX_SCHEMA_CHARS or len(text) > MAX_SCHEMA_CHARS:
        raise InputError(f"{path} is over {MAX_SCHEMA_CHARS:,} characters", "give a smaller schema")
    try:
        grammar = constraint(json_schema=text, names=NAMES)
    except UsageError as err:
        raise InputError(err.message, err.hint) from None
    assert grammar is not None  # a schema was given
    return grammar
