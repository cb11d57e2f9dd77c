"""The ``localspec chat`` Textual app and its entry point ``run_chat``.

``run_chat(session_factory, params)`` runs the app and returns an exit code (1 when the
models could not be loaded). At start the app calls ``session_factory(on_progress, on_lost)``
in a worker thread, showing its progress reports; a load error shows as a message with its
hint.

Each answer runs ``Session.chat`` in a worker thread (``worker.run_generation``), which posts
the engine's events as messages; the UI thread renders them (tokens coloured by origin, the
stats panel, the context budget). Escape/Ctrl+C set the generation's ``threading.Event``;
the engine stops between rounds and its ``Finished`` carries the partial answer, which stays
in the transcript and the history. Generations are numbered so that the late events of a
stopped one are ignored once a new conversation has started.

A finished answer shows as Markdown (parsed once, when it finishes); Ctrl+T switches every
answer between that and its origin-coloured tokens. After each finished answer the
conversation is saved as JSON in the conversations folder (``session.conversations``)
unless autosave is off; Ctrl+S writes the Markdown transcript and the JSON file to the
current directory. A conversation given to ``resume`` is shown and continued: its first new
turn evaluates the earlier prefix, later turns only their new tokens (the session's KV
cache). Ctrl+R answers the last message again (a new seed when sampling), Ctrl+O copies the
last code block of the last answer, Up in the empty box recalls the last message.
``/edit PATH [instruction]`` sends the file with the instruction and drafts the answer from
the file (``tui.edit``).
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from datetime import datetime
from functools import partial
from pathlib import Path

from rich.text import Text
from textual import events, on
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.notifications import SeverityLevel
from textual.widgets import Footer, Header, Static

from localspec.core.events import EngineWarning, Finished, TokenEmitted
from localspec.core.params import GenerationParams
from localspec.core.stats import GenerationStats
from localspec.errors import InputError, WorkersLostError, exit_with
from localspec.models.paths import conversations_dir
from localspec.storage.conversations import (
    SavedConversation,
    autosave_path,
    write_conversation,
)
from localspec.tui.conversation import (
    Conversation,
    Turn,
    describe_params,
    last_code_block,
    save_transcript,
)
from localspec.tui.edit import edit_message, is_edit, parse_edit, read_edited
from localspec.tui.saving import chat_settings, model_mismatch, same_file
from localspec.tui.screens import HelpScreen, OverflowScreen
from localspec.tui.stats_panel import LiveStats, StatsPanel, summary_line
from localspec.tui.widgets import (
    AssistantMessage,
    ChatInput,
    LoadingPanel,
    Notice,
    Transcript,
    UserMessage,
    turn_class,
)
from localspec.tui.worker import (
    ChatSession,
    ContextOverflow,
    EngineEvent,
    GenerationEnded,
    GenerationFailed,
    GenerationRequest,
    LoadFailed,
    LoadProgress,
    SessionFactory,
    SessionReady,
    TurnsDropped,
    WorkersLost,
    load_session,
    run_generation,
)

# During an answer the screen is redrawn at most this often, the streamed tokens and (when
# due) the stats panel in one pass of Textual's compositor. Each pass lays out and renders
# in Python, on the cores decoding runs on: on 2 cores the UI's CPU time is taken from
# decoding almost one for one. The panel's numbers need no more than one redraw a second.
FRAME_INTERVAL_S = 0.2
STATS_INTERVAL_S = 1.0
# Below this width the 40-column panel would leave the conversation a narrow strip.
NARROW_COLUMNS = 100
LOST_HINT = "Ctrl+S saves the conversation; start the chat again once the workers run."
CLOSE_TIMEOUT_S = 30.0  # how long quitting waits for a stopped answer to release the session


class ChatApp(App[int]):
    """Chat with a local model through speculative decoding, watching what drafting buys."""

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
        self.session_factory = session_factory
        self.params = params
        self.save_dir = save_dir  # None: the current directory at the time of saving
        self.clock = clock
        self.session: ChatSession | None = None
        self.load_error: tuple[str, str] | None = None
        self.workers_lost: str | None = None  # why the target's RPC workers are gone
        self.resumed = resume
        self.resume_path = resume_path
        if resume is not None:
            self.conversation = Conversation.from_saved(resume, system_prompt)
            self.created = resume.created
        else:
            self.conversation = Conversation(system_prompt)
            self.created = clock()
        self.autosave = autosave
        # One file per conversation; a resumed one goes on in its own file when it is one
        # of the autosaved ones, else in a new file there.
        self.autosave_file: Path | None = None
        if resume_path is not None and same_file(resume_path.parent, conversations_dir()):
            self.autosave_file = resume_path
        self._autosave_failed = False
        self.live = LiveStats()
        self.colour = True
        self.rendered = True  # finished answers as Markdown (Ctrl+T: origin tokens)
        self._last_seed: int | None = params.seed
        self.generating = False
        self.plain_tokens_per_s: float | None = None
        self._frame_due = False  # a redraw of the answer and the stats is scheduled
        self._stats_shown_at = 0.0  # monotonic time of the stats panel's last redraw
        self._gen = 0
        self._cancel = threading.Event()
        self._session_lock = threading.Lock()
        self._quitting = threading.Event()
        self._answer: AssistantMessage | None = None
        self._stats_shown: bool | None = None  # F3's choice; None: by the terminal's width

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
        self._set_status("Loading the models…")
        self._refresh_stats()
        # A daemon thread, not a Textual worker: a download cannot be interrupted, and quitting
        # must not wait for it (the executor that runs thread workers is joined at exit).
        threading.Thread(
            target=load_session,
            args=(self.session_factory, self.post_message, self._quitting),
            name="localspec-load",
            daemon=True,
        ).start()

    def _set_status(self, text: str) -> None:
        self.query_one("#status", Static).update(Text(text))

    def _ready_status(self) -> None:
        self._set_status("Enter sends · Shift+Enter or Ctrl+J new line · F1 help")

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
        n_ctx = self.session.n_ctx if self.session else 0
        # A redraw scheduled during an answer may fire while the app is closing.
        where = self.session.placement.summary() if self._placed() else ""
        for panel in self.query(StatsPanel):
            panel.show(self.live, self.plain_tokens_per_s, n_ctx, self.colour, where)
        for line in self.query("#mini-stats"):
            line.update(summary_line(self.live, self.plain_tokens_per_s))

    def _placed(self) -> bool:
        return getattr(self.session, "placement", None) is not None

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
        if self.conversation.system:
            self._notice(Text.assemble(("System: ", "bold"), self.conversation.system), "system")

    def _notice(self, text: str | Text, kind: str = "info") -> None:
        self.query_one(Transcript).mount(Notice(text, kind))

    # -- loading ------------------------------------------------------------------------

    def on_load_progress(self, message: LoadProgress) -> None:
        for panel in self.query(LoadingPanel):
            panel.add(message.progress)

    def on_session_ready(self, message: SessionReady) -> None:
        session = self.session = message.session
        self.plain_tokens_per_s = message.plain_tokens_per_s
        self.query(LoadingPanel).remove()
        draft = session.draft_label or "none"
        self.sub_title = f"{session.target_label} · draft {session.draft_label or 'none'}"
        where = f" ({session.placement.summary()})" if self._placed() else ""
        self._notice(
            f"Ready. Target {session.target_label}, draft {draft}{where}; "
            f"context {session.n_ctx} tokens; {describe_params(self.params)}."
        )
        self._show_system()
        if self.resumed is not None:
            self._show_resumed(self.resumed)
        self._ready_status()
        self._refresh_stats()

    def _show_resumed(self, saved: SavedConversation) -> None:
        """The earlier turns of a resumed conversation, and a warning when it was held with
        another model than the one loaded."""
        name = self.resume_path.name if self.resume_path else "conversation"
        turns = len(self.conversation.turns)
        self._notice(
            f"Resumed {name}: {turns} turn{'s' if turns != 1 else ''}, "
            f"started {saved.created:%Y-%m-%d %H:%M}."
        )
        transcript = self.query_one(Transcript)
        for turn in self.conversation.turns:
            answer = AssistantMessage(turn, self.colour, self.rendered)
            answer.spans = [(turn.answer, None)] if turn.answer else []
            answer.finalize()
            user = UserMessage(turn)
            for widget in (user, answer):
                widget.set_class(turn.dropped, "dropped")
                transcript.mount(widget)
        mismatch = model_mismatch(self.session, saved.settings) if self.session else ""
        if mismatch:
            self._notice(mismatch, "warning")
            self.notify(mismatch, severity="warning")
        transcript.scroll_end(animate=False)

    def on_load_failed(self, message: LoadFailed) -> None:
        self.load_error = (message.message, message.hint)
        self.query(LoadingPanel).remove()
        self.sub_title = "models not loaded"
        text = Text.assemble(("Could not load the models: ", "bold"), message.message)
        if message.hint:
            text.append(f"\n{message.hint}")
        self._notice(text, "error")
        self.notify(message.hint or message.message, title=message.message, severity="error")
        self._set_status("The models did not load · Ctrl+Q quits")

    # -- sending ------------------------------------------------------------------------

    @on(ChatInput.Submitted)
    def _submitted(self, message: ChatInput.Submitted) -> None:
        text = message.text.strip()
        if not text:
            return
        if self.session is None:
            hint = "the models did not load" if self.load_error else "the models are loading"
            self.notify(f"Cannot send yet: {hint}.", severity="warning")
            return
        if self.workers_lost:
            self.notify(LOST_HINT, title=self.workers_lost, severity="error")
            return
        if self.generating:
            self.notify("An answer is being written: Escape stops it.", severity="warning")
            return
        if is_edit(text):
            self._send_edit(text)
            return
        self.query_one(ChatInput).clear()
        self.send(text)

    def _send_edit(self, text: str) -> None:
        """``/edit PATH [instruction]``: the file in the message, and as the prediction."""
        assert self.session is not None
        try:
            request = parse_edit(text)
            content = read_edited(request.path)
        except InputError as err:
            self.notify(err.hint or "", title=err.message, severity="error")
            return
        prediction = tuple(self.session.plain_tokens(content))
        self.query_one(ChatInput).clear()
        self.send(
            edit_message(request, content),
            params=self.params.model_copy(update={"prediction": prediction}),
        )

    @on(ChatInput.Recall)
    def _recall(self) -> None:
        if not self.conversation.turns:
            self.notify("No earlier message to recall.")
            return
        self._restore_input(self.conversation.turns[-1].user)

    def send(
        self, text: str, allow_drop: bool = False, params: GenerationParams | None = None
    ) -> None:
        assert self.session is not None
        turns = self.conversation.context_turns()
        turn = self.conversation.start(text)
        transcript = self.query_one(Transcript)
        self._answer = AssistantMessage(turn, self.colour, self.rendered)
        transcript.mount(UserMessage(turn))
        transcript.mount(self._answer)
        transcript.scroll_end(animate=False)
        self._gen += 1
        self._cancel = threading.Event()
        self.generating = True
        self.live.begin_answer()
        self._set_status("Writing… Escape stops")
        self.refresh_bindings()
        request = GenerationRequest(
            gen=self._gen,
            system=self.conversation.system,
            turns=turns,
            user=text,
            params=params or self.params,
            cancel=self._cancel,
            allow_drop=allow_drop,
        )
        self.run_worker(
            partial(run_generation, self.session, self._session_lock, request, self.post_message),
            thread=True,
            name=f"answer-{self._gen}",
            exit_on_error=False,
        )

    # -- generation events --------------------------------------------------------------

    def on_engine_event(self, message: EngineEvent) -> None:
        if message.gen != self._gen or self._answer is None:
            return
        event = message.event
        self.live.observe(event)
        if isinstance(event, TokenEmitted):
            self._answer.append(event.text, event.origin)
            self._schedule_frame()
            return
        if message.plain_tokens_per_s is not None:
            self.plain_tokens_per_s = message.plain_tokens_per_s
        if isinstance(event, EngineWarning):
            self.notify(event.message, severity="warning")
        elif isinstance(event, Finished):
            self._finish_turn(event.text, event.reason.value, event.stats)
            self._answer.finalize(event.text)
            if event.reason.value == "cancelled":
                self.notify("Stopped; the partial answer is kept.")
            self._refresh_stats()
            return
        self._schedule_frame()  # rounds come 15-30 times a second: one redraw per frame

    def on_turns_dropped(self, message: TurnsDropped) -> None:
        if message.gen != self._gen:
            return
        for turn in self.conversation.drop_oldest(message.count):
            self.query(f".{turn_class(turn)}").add_class("dropped")
        plural = "s" if message.count > 1 else ""
        self.notify(f"Dropped the oldest {message.count} turn{plural} from the context.")

    def on_context_overflow(self, message: ContextOverflow) -> None:
        if message.gen != self._gen:
            return
        text = self._withdraw_pending()
        self.push_screen(
            OverflowScreen(message.n_tokens, message.n_ctx, message.alone),
            partial(self._overflow_choice, text),
        )

    def _overflow_choice(self, text: str, choice: str | None) -> None:
        if choice == "fresh":
            self.action_new_chat()
            self.send(text)
        elif choice == "drop":
            self.send(text, allow_drop=True)
        else:
            self._restore_input(text)

    def on_generation_failed(self, message: GenerationFailed) -> None:
        if message.gen != self._gen:
            return
        self.notify(message.hint or message.message, title=message.message, severity="error")
        answer = self._answer
        if answer is not None and answer.text and self.conversation.pending:
            self._finish_turn(answer.text, "error", self.live.answer)
            answer.finalize()
        else:
            self._restore_input(self._withdraw_pending())

    def on_workers_lost(self, message: WorkersLost) -> None:
        """The target's RPC workers are gone. The generation waiting on them never returns:
        its answer ends here with the error (what it wrote is kept), and nothing more can be
        generated in this process; the conversation can still be read and saved."""
        if self.workers_lost:
            return
        self.workers_lost = message.message
        if self.generating:
            self.on_generation_failed(GenerationFailed(self._gen, message.message, LOST_HINT))
            self.on_generation_ended(GenerationEnded(self._gen))
            self._gen += 1  # the blocked generation never posts again; ignore it if it does
        else:
            self.notify(LOST_HINT, title=message.message, severity="error")
        self._set_status("The target's RPC workers are lost · Ctrl+S saves · Ctrl+Q quits")

    def on_generation_ended(self, message: GenerationEnded) -> None:
        if message.gen != self._gen:
            return
        if self.conversation.pending is not None:
            # The stream ended without Finished: keep what arrived, as for a stop.
            answer = self._answer.text if self._answer else ""
            self._finish_turn(answer, "cancelled", self.live.answer)
            if self._answer:
                self._answer.finalize()
        self.generating = False
        self._answer = None
        self._ready_status()
        self._refresh_stats()
        self.refresh_bindings()

    def _finish_turn(self, answer: str, reason: str, stats: GenerationStats) -> None:
        """Record the answer in the history, then save the conversation so that no finished
        turn is lost whatever happens next."""
        self.conversation.finish(answer, reason, stats)
        self._autosave()

    def _autosave(self) -> None:
        if not self.autosave or not any(turn.done for turn in self.conversation.turns):
            return
        if self.autosave_file is None:
            self.autosave_file = autosave_path(self.created)
        problem = write_conversation(self.autosave_file, self._saved())
        if problem and not self._autosave_failed:  # said once, not after every answer
            self._autosave_failed = True
            self.notify(problem, title="Could not autosave the conversation", severity="warning")

    def _saved(self, now: datetime | None = None) -> SavedConversation:
        settings = chat_settings(self.session, self.params)
        return self.conversation.to_saved(settings, self.created, now or self.clock())

    def _withdraw_pending(self) -> str:
        """Take back a message whose prompt never reached the model; returns its text."""
        turn: Turn | None = self.conversation.discard_pending()
        if turn is None:
            return ""
        self.query(f".{turn_class(turn)}").remove()
        self._answer = None
        return turn.user

    def _restore_input(self, text: str) -> None:
        box = self.query_one(ChatInput)
        if text and not box.text.strip():
            box.load_text(text)
            box.move_cursor(box.document.end)
        box.focus()

    # -- actions ------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "stop":
            # Only while an answer is written on the chat screen; otherwise the key falls
            # through (Escape closes dialogs, Ctrl+C copies a selection).
            return self.generating and len(self.screen_stack) == 1
        if action in ("regenerate", "copy_code", "toggle_markdown"):
            # Not behind a dialog: the overflow dialog holds a message that is about to be
            # sent, and a regenerated answer must not start beside it.
            return len(self.screen_stack) == 1
        return True

    def action_stop(self) -> None:
        self._cancel.set()
        self._set_status("Stopping…")

    def action_new_chat(self) -> None:
        if self.session is None:
            return  # nothing to clear while the models load (or after they failed)
        self._cancel.set()
        self._gen += 1  # late events of the stopped answer are for a conversation now gone
        self.generating = False
        self._answer = None
        self.conversation.clear()
        self.created = self.clock()
        self.autosave_file = None  # the next answer starts the new conversation's file
        self.resumed = None
        self.live.reset()
        self.query_one(Transcript).remove_children()
        self._notice("New conversation.")
        self._show_system()
        self._ready_status()
        self._refresh_stats()
        self.refresh_bindings()
        self.query_one(ChatInput).focus()

    def action_save(self) -> None:
        if not self.conversation.turns:
            self.notify("Nothing to save yet.", severity="warning")
            return
        header = {"parameters": describe_params(self.params)}
        if self.conversation.system:
            header["system prompt"] = self.conversation.system
        if self.session is not None:
            header = {
                "target": self.session.target_label,
                "draft": self.session.draft_label or "none",
                **header,
            }
        folder = self.save_dir or Path.cwd()
        now = self.clock()
        saved = self._saved(now)
        try:
            markdown, data = save_transcript(self.conversation, folder, header, saved, now)
        except OSError as error:
            self.notify(f"{error}", title="Could not save the transcript", severity="error")
            return
        self.notify(f"Saved to {markdown} and {data.name}", title="Transcript saved")

    def action_toggle_markdown(self) -> None:
        self.rendered = not self.rendered
        for answer in self.query(AssistantMessage):
            answer.set_rendered(self.rendered)
        view = "as Markdown" if self.rendered else "as tokens coloured by origin"
        self.notify(f"Answers shown {view}.")

    def action_regenerate(self) -> None:
        if self.session is None:
            self.notify("Nothing to regenerate: the models are not loaded.", severity="warning")
            return
        if self.workers_lost:  # its answer would stay, the new one could not be written
            self.notify(LOST_HINT, title=self.workers_lost, severity="error")
            return
        if self.generating:
            self.notify("An answer is being written: Escape stops it.", severity="warning")
            return
        turn = self.conversation.last_done()
        if turn is None:
            self.notify("No answer to regenerate.", severity="warning")
            return
        params = self.params
        if params.greedy:
            self.notify("Greedy decoding (temperature 0) writes the same answer again.")
        else:
            params = params.model_copy(update={"seed": self._new_seed()})
            self.notify(f"Answering again with seed {params.seed}.")
        self.conversation.remove_last()
        self.query(f".{turn_class(turn)}").remove()
        # The prompt is the one the removed answer had: the KV cache holds it already, so
        # the session rolls back to it and evaluates almost nothing before sampling again.
        self.send(turn.user, params=params)

    def _new_seed(self) -> int:
        seed = self._last_seed
        while seed == self._last_seed:
            seed = random.randrange(2**31)
        self._last_seed = seed
        return seed

    def action_copy_code(self) -> None:
        turn = next((t for t in reversed(self.conversation.turns) if t.done), None)
        code = last_code_block(turn.answer) if turn is not None else None
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
        code = 1 if self.load_error else 0
        self.exit(code, return_code=code)

    def on_unmount(self) -> None:
        self._quitting.set()
        self._cancel.set()
        self.close_session()

    def close_session(self) -> None:
        """Close the session once no generation holds it (a stopped one ends its round)."""
        session, self.session = self.session, None
        if session is None:
            return
        if self.workers_lost:
            return  # a generation holds the lock for good, and the target cannot be freed
        if self._session_lock.acquire(timeout=CLOSE_TIMEOUT_S):
            try:
                session.close()
            finally:
                self._session_lock.release()


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
    if app.workers_lost:
        # A thread still waits on the lost workers, and the interpreter would wait for it
        # at exit: the terminal is restored, so end the process here, as the CLI does.
        exit_with(WorkersLostError(app.workers_lost))
    if app.return_code:
        return app.return_code
    return result if isinstance(result, int) else 0
