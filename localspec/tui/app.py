"""The ``localspec chat`` Textual app and its entry point ``run_chat``.

``run_chat(session_factory, params)`` runs the app and returns an exit code (1 when the
models could not be loaded). At start the app calls ``session_factory(on_progress, on_lost)``
in a worker thread, showing its progress reports; a load error shows as a message with its
hint.

The app holds widgets, keys and layout; every decision is its ``ChatController``'s
(``chat``, in ``tui.controller``), which it shows as that controller's ``ChatView``. The
worker threads' news reaches the controller through the app's message queue, on the UI
thread. Each answer runs ``Session.chat`` in a worker thread (``worker.run_generation``),
which posts the engine's events; the app renders them (tokens coloured by origin, the
stats panel, the context budget). Escape/Ctrl+C set the generation's ``threading.Event``;
the engine stops between rounds and its ``Finished`` carries the partial answer, which stays
in the transcript and the history. Generations are numbered so that the late events of a
stopped one are ignored once a new conversation has started.

A finished answer shows as Markdown (parsed once, when it finishes); Ctrl+T switches every
answer between that and its origin-coloured tokens. After each finished answer the
conversation is saved as JSON in the conversations folder (``storage.conversations``)
unless autosave is off; Ctrl+S writes the Markdown transcript and the JSON file to the
current directory. A conversation given to ``resume`` is shown and continued: its first new
turn evaluates the earlier prefix, later turns only their new tokens (the session's KV
cache). Ctrl+R answers the last message again (a new seed when sampling), Ctrl+O copies the
last code block of the last answer, Up in the empty box recalls the last message.
``/edit PATH [instruction]`` and ``/schema FILE message`` are the chat's commands
(``tui.commands``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text
from textual import events, on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.notifications import SeverityLevel
from textual.widgets import Footer, Header, Static

from localspec.core.params import GenerationParams
from localspec.errors import WorkersLostError, exit_with
from localspec.progress import Progress
from localspec.storage.conversations import SavedConversation
from localspec.tui.controller import ChatController
from localspec.tui.conversation import Turn, describe_params
from localspec.tui.screens import HelpScreen, OverflowScreen
from localspec.tui.stats_panel import StatsPanel, summary_line
from localspec.tui.widgets import (
    AssistantMessage,
    ChatInput,
    LoadingPanel,
    Notice,
    Transcript,
    UserMessage,
    turn_class,
)
from localspec.tui.worker import SessionFactory, WorkerNews

if TYPE_CHECKING:
    from localspec.machine.placement import Placement

# During an answer the screen is redrawn at most this often, the streamed tokens and (when
# due) the stats panel in one pass of Textual's compositor. Each pass lays out and renders
# in Python, on the cores decoding runs on: on 2 cores the UI's CPU time is taken from
# decoding almost one for one. The panel's numbers need no more than one redraw a second.
FRAME_INTERVAL_S = 0.2
STATS_INTERVAL_S = 1.0
# Below this width the 40-column panel would leave the conversation a narrow strip.
NARROW_COLUMNS = 100


class News(Message):
    """What a worker thread posted, carried to the app's thread for the controller."""

    def __init__(self, news: WorkerNews) -> None:
        super().__init__()
        self.news = news


class ChatApp(App[int]):
    """Chat with a local model through speculative decoding, watching what drafting buys.

    The app shows its ``ChatController`` (``chat``) and forwards keys to it; it is the
    controller's ``ChatView``."""

    CSS_PATH = Path(__file__).with_name("chat.tcss")
    TITLE = "localspec chat"
    BINDINGS = [
        Binding("escape", "stop", "Stop", priority=True),
        Binding("ctrl+c", "stop", "Stop", show=False, priority=True),
        Binding("ctrl+n", "new_chat", "New chat", priority=True),
        Binding("ctrl+s", "save", "Save", priority=True),
        Binding("ctrl+t", "toggle_markdown", "Markdown", priority=True),
        Binding("ctrl+r", "regenerate", "Retry", priority=True),
        Binding("ctrl+o", "copy_code", "Copy code", priority=True),
        Binding("f1", "help", "Help"),
        Binding("f2", "toggle_colour", "Colours"),
        Binding("f3", "toggle_stats", "Stats"),
        Binding("ctrl+q", "quit", "Quit", priority=True),
    ]

    def __init__(
        self,
        session_factory: SessionFactory,
        params: GenerationParams,
        *,
        system_prompt: str | None = None,
        save_dir: Path | None = None,
        clock: Callable[[], datetime] = datetime.now,
        resume: SavedConversation | None = None,
        resume_path: Path | None = None,
        autosave: bool = True,
    ) -> None:
        super().__init__()
        self.chat = ChatController(
            session_factory,
            params,
            self,
            lambda news: self.post_message(News(news)),  # thread-safe
            run_in_thread=self._run_in_thread,
            system_prompt=system_prompt,
            save_dir=save_dir,
            clock=clock,
            resume=resume,
            resume_path=resume_path,
            autosave=autosave,
        )
        self.colour = True
        self.rendered = True  # finished answers as Markdown (Ctrl+T: origin tokens)
        self._frame_due = False  # a redraw of the answer and the stats is scheduled
        self._stats_shown_at = 0.0  # monotonic time of the stats panel's last redraw
        self._answer: AssistantMessage | None = None
        self._stats_shown: bool | None = None  # F3's choice; None: by the terminal's width

    def _run_in_thread(self, work: Callable[[], None], name: str) -> None:
        # A thread worker: quitting waits for it, so the session closes after its round.
        self.run_worker(work, thread=True, name=name, exit_on_error=False)

    def on_news(self, message: News) -> None:
        self.chat.handle(message.news)

    # -- layout -------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="body"):
            with Vertical(id="main"):
                yield Transcript(id="transcript")
                yield ChatInput(id="input", placeholder="Message (Enter sends)")
                yield Static("", id="status")
                yield Static("", id="mini-stats")
            yield StatsPanel(id="stats")
        yield Footer()

    def on_resize(self, event: events.Resize) -> None:
        self._fit_stats(event.size.width)

    def _fit_stats(self, width: int) -> None:
        """The panel beside the conversation when there is room for both, else one line of
        figures under it; F3 overrides either way."""
        shown = self._stats_shown if self._stats_shown is not None else width >= NARROW_COLUMNS
        self.query_one(StatsPanel).display = shown
        self.query_one("#mini-stats", Static).display = not shown

    def action_toggle_stats(self) -> None:
        self._stats_shown = not self.query_one(StatsPanel).display
        self._fit_stats(self.size.width)

    def on_mount(self) -> None:
        self._fit_stats(self.size.width)
        self.sub_title = "loading models…"
        self.query_one(Transcript).mount(LoadingPanel())
        self.query_one(ChatInput).focus()
        self.show_status("Loading the models…")
        self._refresh_stats()
        self.chat.load()

    def show_status(self, text: str) -> None:
        self.query_one("#status", Static).update(Text(text))

    def _frame(self) -> None:
        self._frame_due = False
        if self._answer is not None:
            self._answer.flush()
        if time.monotonic() - self._stats_shown_at >= STATS_INTERVAL_S:
            self._refresh_stats()

    def _schedule_frame(self) -> None:
        if not self._frame_due:
            self._frame_due = True
            self.set_timer(FRAME_INTERVAL_S, self._frame)

    def _refresh_stats(self) -> None:
        self._stats_shown_at = time.monotonic()
        chat, session = self.chat, self.chat.session
        n_ctx = session.n_ctx if session else 0
        # A redraw scheduled during an answer may fire while the app is closing.
        placement = self._placement()
        where = placement.summary() if placement is not None else ""
        for panel in self.query(StatsPanel):
            panel.show(chat.live, chat.plain_tokens_per_s, n_ctx, self.colour, where)
        for line in self.query("#mini-stats").results(Static):
            line.update(summary_line(chat.live, chat.plain_tokens_per_s))

    def _placement(self) -> Placement | None:
        """Where the session's models run, when it says so (a session without models to
        place, as the tests' fakes, does not)."""
        return getattr(self.chat.session, "placement", None)

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = False,
    ) -> None:
        """Textual's toast, with markup off by default: the messages quote model names and
        error texts, which come from files and must show as they are."""
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=markup)

    def _show_system(self) -> None:
        """The system prompt heads every conversation it applies to."""
        system = self.chat.conversation.system
        if system:
            self._notice(Text.assemble(("System: ", "bold"), system), "system")

    def _notice(self, text: str | Text, kind: str = "info") -> None:
        self.query_one(Transcript).mount(Notice(text, kind))

    # -- loading ------------------------------------------------------------------------

    def load_progress(self, progress: Progress) -> None:
        for panel in self.query(LoadingPanel):
            panel.add(progress)

    def session_ready(self) -> None:
        session = self.chat.session
        assert session is not None
        self.query(LoadingPanel).remove()
        draft = session.draft_label or "none"
        self.sub_title = f"{session.target_label} · draft {draft}"
        placement = self._placement()
        where = f" ({placement.summary()})" if placement is not None else ""
        self._notice(
            f"Ready. Target {session.target_label}, draft {draft}{where}; "
            f"context {session.n_ctx} tokens; {describe_params(self.chat.params)}."
        )
        if session.draft_summary:
            self._notice(session.draft_summary[:1].upper() + session.draft_summary[1:] + ".")
        self._show_system()
        if self.chat.resumed is not None:
            self._show_resumed(self.chat.resumed)
        self._refresh_stats()

    def _show_resumed(self, saved: SavedConversation) -> None:
        """The earlier turns of a resumed conversation, and a warning when it was held with
        another model than the one loaded."""
        name = self.chat.resume_path.name if self.chat.resume_path else "conversation"
        turns = self.chat.conversation.turns
        self._notice(
            f"Resumed {name}: {len(turns)} turn{'s' if len(turns) != 1 else ''}, "
            f"started {saved.created:%Y-%m-%d %H:%M}."
        )
        transcript = self.query_one(Transcript)
        for turn in turns:
            answer = AssistantMessage(turn, self.colour, self.rendered)
            answer.spans = [(turn.answer, None)] if turn.answer else []
            answer.finalize()
            user = UserMessage(turn)
            for widget in (user, answer):
                widget.set_class(turn.dropped, "dropped")
                transcript.mount(widget)
        mismatch = self.chat.resume_mismatch()
        if mismatch:
            self._notice(mismatch, "warning")
            self.notify(mismatch, severity="warning")
        transcript.scroll_end(animate=False)

    def load_failed(self, message: str, hint: str) -> None:
        self.query(LoadingPanel).remove()
        self.sub_title = "models not loaded"
        text = Text.assemble(("Could not load the models: ", "bold"), message)
        if hint:
            text.append(f"\n{hint}")
        self._notice(text, "error")
        self.notify(hint or message, title=message, severity="error")

    # -- the conversation, as the controller reports it ----------------------------------

    @on(ChatInput.Submitted)
    def _submitted(self, message: ChatInput.Submitted) -> None:
        if self.chat.submit(message.text):
            self.query_one(ChatInput).clear()

    @on(ChatInput.Recall)
    def _recall(self) -> None:
        self.chat.recall()

    def turn_started(self, turn: Turn) -> None:
        transcript = self.query_one(Transcript)
        self._answer = AssistantMessage(turn, self.colour, self.rendered)
        transcript.mount(UserMessage(turn))
        transcript.mount(self._answer)
        transcript.scroll_end(animate=False)

    def token(self, text: str, origin: str) -> None:
        if self._answer is not None:
            self._answer.append(text, origin)
        self._schedule_frame()

    def progressed(self) -> None:
        self._schedule_frame()  # rounds come 15-30 times a second: one redraw per frame

    def answer_finished(self, text: str | None) -> None:
        if self._answer is not None:
            self._answer.finalize(text)

    def turn_removed(self, turn: Turn) -> None:
        self.query(f".{turn_class(turn)}").remove()
        if self._answer is not None and self._answer.turn is turn:
            self._answer = None

    def turns_dropped(self, turns: list[Turn]) -> None:
        for turn in turns:
            self.query(f".{turn_class(turn)}").add_class("dropped")

    def overflow(self, text: str, n_tokens: int, n_ctx: int, alone: bool) -> None:
        self.push_screen(
            OverflowScreen(n_tokens, n_ctx, alone), partial(self.chat.overflow_choice, text)
        )

    def restore_input(self, text: str) -> None:
        box = self.query_one(ChatInput)
        if text and not box.text.strip():
            box.load_text(text)
            box.move_cursor(box.document.end)
        box.focus()

    def stats_changed(self) -> None:
        self._refresh_stats()

    def state_changed(self) -> None:
        if not self.chat.generating:
            self._answer = None
        self.refresh_bindings()

    def cleared(self) -> None:
        self._answer = None
        self.query_one(Transcript).remove_children()
        self._notice("New conversation.")
        self._show_system()
        self.query_one(ChatInput).focus()

    # -- actions ------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "stop":
            # Only while an answer is written on the chat screen; otherwise the key falls
            # through (Escape closes dialogs, Ctrl+C copies a selection).
            return self.chat.generating and len(self.screen_stack) == 1
        if action in ("regenerate", "copy_code", "toggle_markdown"):
            # Not behind a dialog: the overflow dialog holds a message that is about to be
            # sent, and a regenerated answer must not start beside it.
            return len(self.screen_stack) == 1
        return True

    def action_stop(self) -> None:
        self.chat.stop()

    def action_new_chat(self) -> None:
        self.chat.new_chat()

    def action_save(self) -> None:
        self.chat.save()

    def action_regenerate(self) -> None:
        self.chat.regenerate()

    def action_toggle_markdown(self) -> None:
        self.rendered = not self.rendered
        for answer in self.query(AssistantMessage):
            answer.set_rendered(self.rendered)
        view = "as Markdown" if self.rendered else "as tokens coloured by origin"
        self.notify(f"Answers shown {view}.")

    def action_copy_code(self) -> None:
        code = self.chat.last_code()
        if code is None:
            self.notify("No code block in the last answer.", severity="warning")
            return
        self.copy_to_clipboard(code)
        lines = len(code.splitlines())
        self.notify(f"Copied {lines} line{'s' if lines != 1 else ''}.")

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen())

    def action_toggle_colour(self) -> None:
        self.colour = not self.colour
        for answer in self.query(AssistantMessage):
            answer.set_colour(self.colour)
        self._refresh_stats()

    async def action_quit(self) -> None:
        code = self.chat.exit_code
        self.exit(code, return_code=code)

    def on_unmount(self) -> None:
        self.chat.close()


def run_chat(
    session_factory: SessionFactory,
    params: GenerationParams,
    system_prompt: str | None = None,
    *,
    resume: SavedConversation | None = None,
    resume_path: Path | None = None,
    autosave: bool = True,
) -> int:
    """Run the chat app until the user quits; returns the process exit code."""
    app = ChatApp(
        session_factory,
        params,
        system_prompt=system_prompt,
        resume=resume,
        resume_path=resume_path,
        autosave=autosave,
    )
    result = app.run()
    lost = app.chat.workers_lost
    if lost:
        # A thread still waits on the lost workers, and the interpreter would wait for it
        # at exit: the terminal is restored, so end the process here, as the CLI does.
        exit_with(WorkersLostError(lost))
    if app.return_code:
        return app.return_code
    return result if isinstance(result, int) else 0
