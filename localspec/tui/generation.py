"""The state of the chat's answer being written: ``Generation``, with no UI in it.

Generations are numbered: ``start`` begins the next one, and news that carries another number
(``current``) belongs to a stopped generation, to be ignored. The ``Phase`` goes idle ->
generating (``start``) -> cancelling (``stop``: the cancel event is set, the engine stops
between rounds) -> idle (``end``); ``abandon`` stops the answer and makes the next news of it
old at once (a new conversation). ``turn`` is the turn whose answer is written, and
``written`` what arrived of it so far; ``lock`` is held by the thread that runs a generation,
so that only one uses the session at a time.
"""

from __future__ import annotations

import threading

from localspec.tui.chat_view import Phase
from localspec.tui.conversation import Turn


class Generation:
    def __init__(self) -> None:
        self.number = 0  # the latest generation's
        self.phase = Phase.IDLE
        self.cancel = threading.Event()
        self.lock = threading.Lock()
        self.turn: Turn | None = None
        self._tokens: list[str] = []

    @property
    def active(self) -> bool:
        return self.phase is not Phase.IDLE

    @property
    def written(self) -> str:
        return "".join(self._tokens) if self.turn is not None else ""

    def current(self, number: int) -> bool:
        return number == self.number

    def start(self, turn: Turn) -> threading.Event:
        """Begin the next generation, answering ``turn``; returns its cancel event."""
        self.turn, self._tokens = turn, []
        self.number += 1
        self.cancel = threading.Event()
        self.phase = Phase.GENERATING
        return self.cancel

    def add(self, text: str) -> None:
        self._tokens.append(text)

    def stop(self) -> None:
        self.cancel.set()
        if self.active:
            self.phase = Phase.CANCELLING

    def end(self) -> None:
        self.phase = Phase.IDLE
        self.turn = None

    def abandon(self) -> None:
        """Stop the answer, and ignore whatever it still posts."""
        self.cancel.set()
        self.number += 1
        self.end()
