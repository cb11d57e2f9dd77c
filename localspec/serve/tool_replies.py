"""Tool calls in a chat answer, in OpenAI's shapes: ``message.tool_calls`` with
``finish_reason: "tool_calls"``, and in a stream ``delta.tool_calls``.

``tool_message(text, names)`` is a whole answer's message and, when it holds calls, the
finish reason that says so. ``HeldCalls`` streams an answer's text until its first tool-call
tag and holds the rest (and holds an answer whole that begins as a bare call would): at the
end, the calls it held become one chunk's ``delta.tool_calls``, or (when they do not parse,
an answer cut short) the held text is streamed as it was.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from localspec.session.tools import OPEN, split_calls

TOOL_CALLS = "tool_calls"
BARE_STARTS = ("{", "```json")  # how an answer that is one bare call begins


def tool_message(text: str, names: Collection[str]) -> tuple[dict[str, Any], str | None]:
    """The assistant message of a whole answer, and ``"tool_calls"`` when it makes any (of
    the functions ``names`` offered, for an answer that is one bare call)."""
    content, calls = split_calls(text, names)
    if not calls:
        return {"role": "assistant", "content": text}, None
    return {"role": "assistant", "content": content or None, "tool_calls": calls}, TOOL_CALLS


class HeldCalls:
    """One streamed answer's text: what to send now, and what its end adds."""

    def __init__(self, names: Collection[str]) -> None:
        self.names = names
        self.sent = ""
        self.pending = ""  # the end of the text so far, which may begin a tag
        self.held = ""

    def piece(self, text: str) -> str:
        """The part of ``text`` to stream now ('' once a call has begun). A tag may come as
        several tokens: text that may begin one waits for the next piece. An answer that
        begins as a bare call would (``{`` or a json code block) is held whole."""
        if self.held:
            self.held += text
            return ""
        text = self.pending + text
        self.pending = ""
        if not self.sent:
            lead = text.lstrip()
            if lead.startswith(BARE_STARTS):
                self.held = text
                return ""
            if not lead or any(start.startswith(lead) for start in BARE_STARTS):
                self.pending = text
                return ""
        if OPEN in text:
            cut = text.index(OPEN)
            self.held, text = text[cut:], text[:cut]
        else:
            keep = next((n for n in range(len(OPEN) - 1, 0, -1) if text.endswith(OPEN[:n])), 0)
            if keep:
                self.pending, text = text[-keep:], text[:-keep]
        self.sent += text
        return text

    def end(self) -> tuple[str, list[dict[str, Any]]]:
        """Text still to stream, and the calls (with their ``index``) for ``delta.tool_calls``."""
        _, calls = split_calls(self.sent + self.pending + self.held, self.names)
        if not calls:
            return self.pending + self.held, []
        return "", [{"index": i, **call} for i, call in enumerate(calls)]
