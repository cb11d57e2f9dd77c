"""What the chat controller decides in words, and the ``ChatView`` it reports to.

``Phase`` is the generation's state (idle, generating, cancelling); ``Refusal`` says why a
turn cannot start now (not loaded, lost workers, busy). ``ChatView`` is the protocol a UI
implements to show a ``tui.controller.ChatController``: it is told what to mount, stream,
remove, notify and which status line to show, and decides nothing. The texts of the status
lines and of the refusals live here so that every UI words them alike.
"""

from __future__ import annotations

from enum import Enum
from typing import Literal, Protocol

from localspec.progress import Progress
from localspec.tui.conversation import Turn

# How loud a notice is (the levels of Textual's notifications).
Severity = Literal["information", "warning", "error"]

LOST_HINT = "Ctrl+S saves the conversation; start the chat again once the workers run."
READY_STATUS = "Enter sends · Shift+Enter or Ctrl+J new line · F1 help"
BUSY_MESSAGE = "An answer is being written: Escape stops it."


class Phase(Enum):
    IDLE = "idle"
    GENERATING = "generating"
    CANCELLING = "cancelling"  # stop was asked; the answer ends after its round


class Refusal(Enum):
    """Why a turn cannot start now."""

    NOT_LOADED = "not loaded"
    LOST = "lost"
    BUSY = "busy"


class ChatView(Protocol):
    """What the controller asks of the UI that shows it; it decides nothing."""

    def notify(self, message: str, *, title: str = "", severity: Severity = "information") -> None:
        """Text from files and errors: shown as it is, never as markup."""

    def show_status(self, text: str) -> None: ...

    def load_progress(self, progress: Progress) -> None: ...

    def session_ready(self) -> None:
        """The models are loaded: the controller's session and conversation are set."""

    def load_failed(self, message: str, hint: str) -> None: ...

    def turn_started(self, turn: Turn) -> None:
        """Show the message and an empty answer that the next tokens fill."""

    def token(self, text: str, origin: str) -> None: ...

    def progressed(self) -> None:
        """The statistics changed (an engine event other than a token)."""

    def answer_finished(self, text: str | None) -> None:
        """The answer ended; ``text`` is its final text when the engine gave one."""

    def turn_removed(self, turn: Turn) -> None: ...

    def turns_dropped(self, turns: list[Turn]) -> None: ...

    def overflow(self, text: str, n_tokens: int, n_ctx: int, alone: bool) -> None:
        """Ask what to do with ``text``, which does not fit; answer ``overflow_choice``."""

    def restore_input(self, text: str) -> None: ...

    def stats_changed(self) -> None: ...

    def state_changed(self) -> None:
        """The phase changed: what the keys may do now."""

    def cleared(self) -> None:
        """A new conversation started: empty the transcript."""
