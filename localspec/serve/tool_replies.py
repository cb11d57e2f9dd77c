"""Tool calls in a chat answer, in OpenAI's shapes: ``message.tool_calls`` with
``finish_reason: "tool_calls"``, and in a stream ``delta.tool_calls``.

``tool_message(text, names)`` is a whole answer's message and, when it holds calls, the
finish reason that says so. A stream's text goes through ``session.tools.HeldCalls``, which
streams an answer's text until its first tool-call tag and holds the rest (and holds an
answer whole that begins as a bare call would): at the end, the calls it held become one
chunk's ``delta.tool_calls``, or (when they do not parse, an answer cut short) the held text
is streamed as it was.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from localspec.session.tools import split_calls

TOOL_CALLS = "tool_calls"


def tool_message(text: str, names: Collection[str]) -> tuple[dict[str, Any], str | None]:
    """The assistant message of a whole answer, and ``"tool_calls"`` when it makes any (of
    the functions ``names`` offered, for an answer that is one bare call)."""
    content, calls = split_calls(text, names)
    if not calls:
        return {"role": "assistant", "content": text}, None
    return {"role": "assistant", "content": content or None, "tool_calls": calls}, TOOL_CALLS
