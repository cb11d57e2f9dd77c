"""``/edit PATH [instruction]``: ask for an edit of a file, the file as the prediction.

Typed in the chat's message box, ``/edit src/app.py rename load to read`` sends a message
with the instruction and the file's text in a code block, and gives the file's text as the
answer's prediction (OpenAI's predicted outputs): an answer that rewrites the file is then
drafted from it from its first token. ``parse_edit`` reads the command (a path with spaces
is quoted), ``read_edited`` the file (a regular file, UTF-8, bounded), ``edit_message`` the
message sent.
Errors are ``InputError`` with a hint, shown by the app as a notification.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from localspec.errors import InputError
from localspec.storage.textfile import decode_utf8, read_bounded

COMMAND = "/edit"
MAX_BYTES = 256 * 1024  # a file larger than this is not an edit a local chat answers whole


@dataclass(frozen=True)
class EditRequest:
    path: Path
    instruction: str


def names_command(text: str, command: str) -> bool:
    """Whether ``text`` is ``command`` (``/edit``, ``/schema``) and what follows it."""
    return text == command or text.startswith(command + " ")


def file_command(text: str, command: str, example: str, usage: str) -> tuple[Path, str]:
    """``COMMAND PATH [words...]``: the path, and the words after it with the lines that
    follow (``example``: a file name to quote in the hint; ``usage``: how to type it)."""
    first, _, more = text.partition("\n")
    try:
        words = shlex.split(first[len(command) :])
    except ValueError as err:
        hint = f'quote the path: {command} "{example}" ...'
        raise InputError(f"cannot read the {command} command: {err}", hint) from None
    if not words:
        raise InputError(f"{command} needs a file", usage)
    rest = "\n".join(part for part in (" ".join(words[1:]), more.strip()) if part)
    return Path(words[0]).expanduser(), rest


def parse_edit(text: str) -> EditRequest:
    """``/edit PATH [instruction...]``; the instruction may go on over more lines."""
    path, instruction = file_command(
        text, COMMAND, "my file.py", "type /edit PATH and what to change"
    )
    return EditRequest(path, instruction or "Edit this file.")


def read_edited(path: Path, limit: int = MAX_BYTES) -> str:
    """The file's text; it is read on the UI's thread, so only a regular file is."""
    data = read_bounded(path, limit, "edited", regular=True)
    if len(data) > limit:
        raise InputError(f"{path} is larger than {limit // 1024} KiB", "edit a smaller file")
    return decode_utf8(data, str(path))


def edit_message(request: EditRequest, text: str) -> str:
    """The message sent: the instruction, then the whole file, asked back whole."""
    fence = "````" if "```" in text else "```"
    return (
        f"{request.instruction}\n\nReply with the whole new file in one code block.\n\n"
        f"{request.path.name}:\n{fence}\n{text.rstrip()}\n{fence}"
    )
