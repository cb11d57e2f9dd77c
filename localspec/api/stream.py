"""A generation's events as a script reads them: ``Stream`` and its ``Completion``.

Contract: a ``Stream`` passes the engine's events on as they come (read once), keeps the
text so far, and holds the ``Completion`` once ``Finished`` has passed; ``cancel()`` stops
the generation after its current round, from any thread; ``close()`` ends it (cancelled, or
never begun if nothing was read), from any thread too: it waits for the event another
thread is reading (the models are never used by two threads), then reads the rest itself.
One lock is held while an event is read, so two threads never run the generation at once;
``reader`` is the thread that reads it. A chat's stream that offered tools reads the calls out
of the answer at its end (``session.tools``): the ``Completion`` has them in OpenAI's shape,
its text is what came before them, and ``pieces()`` holds a call's text back. See the
package's docstring for the whole API.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Generator, Iterator
from dataclasses import dataclass
from typing import Any

from localspec.core.events import EngineWarning, Event, Finished, FinishReason, TokenEmitted
from localspec.core.stats import GenerationStats
from localspec.errors import UsageError
from localspec.session.tools import HeldCalls, split_calls


@dataclass(frozen=True)
class Completion:
    """One finished generation. ``text`` is the answer (a stop string cut off; the text
    before its tool calls when it made any); ``token_ids`` are the tokens generated;
    ``stats`` the generation's own totals; ``tool_calls`` the calls of a chat that offered
    tools, in OpenAI's shape (``id``, ``type: "function"``, ``function: {name, arguments}``
    with the arguments as JSON text)."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason  # eos, length, stop, cancelled or tool_calls
    stats: GenerationStats
    warnings: tuple[str, ...] = ()
    tool_calls: tuple[dict[str, Any], ...] = ()

    @property
    def message(self) -> dict[str, Any]:
        """The answer as a chat message, to append to the conversation (OpenAI's shape:
        with its ``tool_calls``, and no content when it is only calls)."""
        if not self.tool_calls:
            return {"role": "assistant", "content": self.text}
        calls = [dict(call) for call in self.tool_calls]
        return {"role": "assistant", "content": self.text or None, "tool_calls": calls}


class Stream:
    """The events of one generation, as the engine yields them: one ``PrefillDone``; per
    round one or more ``TokenEmitted`` and a ``RoundCompleted``; maybe ``EngineWarning``;
    one ``Finished``. Read it once, event by event (iterate it) or as text (``pieces()``).

    The answer's text is every ``TokenEmitted.text`` followed by ``Finished.tail`` (text
    held back while it might have begun a stop string); ``pieces()`` yields both, and
    ``result`` is the ``Completion`` once ``Finished`` has passed (None before).

    With tools offered, the events still carry the answer's whole text, while ``pieces()``
    holds back a tool call's text (from its tag on, or an answer that begins as a bare call
    would) and yields it at the end only if it was no call after all; once finished,
    ``text`` is the result's (the text before the calls)."""

    def __init__(
        self,
        events: Iterator[Event],
        cancel: threading.Event,
        on_warning: Callable[[str], None] | None = None,
        tools: Collection[str] = (),
    ) -> None:
        """``on_warning``: told each ``EngineWarning``'s message as it passes. ``tools``: the
        names of the functions offered (none: the answer is text)."""
        self._events = events
        self._cancel = cancel
        self._on_warning = on_warning
        self._tools = tools
        self._held = HeldCalls(tools) if tools else None
        self._seen = self._observe()
        self._lock = threading.Lock()  # held while an event is read (the models in use)
        self.reader: threading.Thread | None = None  # the thread that reads the events
        self._started = False
        self._ended = False
        self._pieces: list[str] = []
        self._warnings: list[str] = []
        self.result: Completion | None = None

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> Event:
        return self._advance()[0]

    def _advance(self) -> tuple[Event, str]:
        """The next event, and the text ``pieces()`` yields for it."""
        with self._lock:
            if self._ended:  # closed, from this thread or another
                raise StopIteration
            self._started = True
            self.reader = self.reader or threading.current_thread()
            return next(self._seen)

    @property
    def running(self) -> bool:
        """Begun and not over: ``Finished`` has not passed, nor was it closed."""
        return self._started and not self._ended and self.result is None

    def _observe(self) -> Generator[tuple[Event, str], None, None]:
        for event in self._events:
            piece = ""
            if isinstance(event, TokenEmitted):
                self._pieces.append(event.text)
                piece = self._held.piece(event.text) if self._held else event.text
            elif isinstance(event, EngineWarning):
                self._warnings.append(event.message)
                if self._on_warning is not None:
                    self._on_warning(event.message)
            elif isinstance(event, Finished):
                self._pieces.append(event.tail)
                piece = event.tail
                if self._held:  # the held text, unless it was calls
                    piece = self._held.piece(event.tail) + self._held.end()[0]
                self.result = self._completion(event)
            yield event, piece

    def _completion(self, finished: Finished) -> Completion:
        warnings = tuple(dict.fromkeys(self._warnings))
        text, reason = finished.text, finished.reason
        content, calls = split_calls(text, self._tools) if self._tools else (text, [])
        if not calls:
            return Completion(text, finished.token_ids, reason, finished.stats, warnings)
        if reason != FinishReason.CANCELLED:  # a cancelled answer still says it was
            reason = FinishReason.TOOL_CALLS
        return Completion(
            content, finished.token_ids, reason, finished.stats, warnings, tuple(calls)
        )

    def pieces(self) -> Iterator[str]:
        """The answer's text as it comes (the rest of it, if some events were read); with
        tools offered, without its calls."""
        while True:
            try:
                _, piece = self._advance()
            except StopIteration:
                return
            if piece:
                yield piece

    @property
    def text(self) -> str:
        """The text so far; the whole answer once finished."""
        return self.result.text if self.result else "".join(self._pieces)

    def cancel(self) -> None:
        """Stop after the current round (from any thread); the stream still ends with
        ``Finished``, its reason ``cancelled``."""
        self._cancel.set()

    def finish(self) -> Completion:
        """Read the rest of the events; the ``Completion``."""
        for _ in self:
            pass
        if self.result is None:  # closed before it began (the engine always ends with Finished)
            raise UsageError(
                "the generation was closed before it began (its pair was closed, or another "
                "generation started)",
                "read a stream before closing its pair",
            )
        return self.result

    def close(self) -> None:
        """End the generation: cancelled after its current round (so that the models'
        caches stay consistent), or never begun if nothing was read. From any thread: it
        first waits for the event another thread is reading. Harmless when done."""
        self.cancel()
        with self._lock:
            if self._ended:
                return
            if self._started:
                for _ in self._seen:  # the rounds to the cancelled end, Finished included
                    pass
            else:
                self._seen.close()
            self._started = self._ended = True

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
