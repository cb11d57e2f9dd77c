"""What a typed message sends: itself, or what its chat command makes of it.

``outgoing(text, params, plain_tokens)`` turns the message box's text into an ``Outgoing``:
the message sent, its generation parameters and the grammar its answer must match.
``/edit PATH [instruction]`` (``tui.edit``) sends the file with the instruction and gives it
as the prediction; ``/schema FILE message`` (``tui.schema``) sends the message and makes its
answer JSON that matches FILE's schema; anything else is sent as typed. A command that
cannot be carried out raises ``InputError`` with a hint, and nothing is sent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from localspec.core.params import GenerationParams
from localspec.tui import edit, schema
from localspec.tui.edit import edit_message, names_command, parse_edit, read_edited
from localspec.tui.schema import parse_schema, schema_grammar_of


@dataclass(frozen=True)
class Outgoing:
    text: str
    params: GenerationParams
    grammar: str | None = None  # GBNF the answer must match


def outgoing(
    text: str, params: GenerationParams, plain_tokens: Callable[[str], list[int]]
) -> Outgoing:
    """What ``text`` sends with ``params`` (``plain_tokens``: a text's tokens, for a
    prediction)."""
    if names_command(text, edit.COMMAND):
        request = parse_edit(text)
        content = read_edited(request.path)
        prediction = tuple(plain_tokens(content))
        predicted = params.model_copy(update={"prediction": prediction})
        return Outgoing(edit_message(request, content), predicted)
    if names_command(text, schema.COMMAND):
        asked = parse_schema(text)
        return Outgoing(asked.message, params, schema_grammar_of(asked.path))
    return Outgoing(text, params)
