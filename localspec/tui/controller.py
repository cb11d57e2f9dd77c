"""The chat's logic without a UI: ``ChatController`` decides, a ``ChatView`` shows.

The controller owns the session (loading, the lost-worker state, closing), the
``Conversation``, the live statistics, autosave and resume, and the generation: its number,
its cancel event and its ``Phase`` (idle, generating, cancelling). ``refusal()`` is the one
guard for starting a turn: ``Refusal.NOT_LOADED``, ``LOST`` or ``BUSY``, or None when a turn
may start now.

Worker threads (``tui.worker``) report through ``post``, which must be safe to call from any
thread; whoever receives that news hands it back, on the thread the controller runs on, to
``handle``. The controller then changes its state and calls its ``ChatView``: what to mount,
stream, remove, notify and which status line to show. It never imports Textual or rich, so
it runs headless (the tests drive it with a recording view and a queue for ``post``).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from datetime import datetime
from functools import partial
from pathlib import Path

from localspec.core.events import EngineWarning, Finished, TokenEmitted
from localspec.core.params import GenerationParams
from localspec.core.stats import GenerationStats
from localspec.errors import InputError
from localspec.models.paths import conversations_dir
from localspec.storage.conversations import SavedConversation
from localspec.tui.chat_view import BUSY_MESSAGE, LOST_HINT, READY_STATUS, ChatView, Phase, Refusal
from localspec.tui.commands import outgoing
from localspec.tui.conversation import Conversation, last_code_block
from localspec.tui.generation import Generation
from localspec.tui.live import LiveStats
from localspec.tui.saving import ChatFiles, model_mismatch
from localspec.tui.worker import (
    ChatSession,
    ContextOverflow,
    EngineEvent,
    GenerationEnded,
    GenerationFailed,
    GenerationRequest,
    LoadFailed,
    LoadProgress,
    Post,
    SessionFactory,
    SessionReady,
    TurnsDropped,
    WorkerNews,
    WorkersLost,
    load_session,
    run_generation,
)

CLOSE_TIMEOUT_S = 30.0  # how long quitting waits for a stopped answer to release the session
# (work, thread name) -> runs the work in a thread
RunInThread = Callable[[Callable[[], None], str], object]


def _thread(work: Callable[[], None], name: str) -> threading.Thread:
    thread = threading.Thread(target=work, name=name, daemon=True)
    thread.start()
    return thread


class ChatController:
    """One chat: its session, conversation and generation, shown through a ``ChatView``."""

    def __init__(
        self,
        session_factory: SessionFactory,
        params: GenerationParams,
        view: ChatView,
        post: Post,
        *,
        run_in_thread: RunInThread = _thread,
        system_prompt: str | None = None,
        save_dir: Path | None = None,
        clock: Callable[[], datetime] = datetime.now,
        resume: SavedConversation | None = None,
        resume_path: Path | None = None,
        autosave: bool = True,
    ) -> None:
        self.session_factory = session_factory
        self.params = params
        self.view = view
        self.post = post
        self.run_in_thread = run_in_thread
        self.clock = clock
        self.session: ChatSession | None = None
        self.load_error: tuple[str, str] | None = None
        self.workers_lost: str | None = None  # why the target's RPC workers are gone
        self.resumed = resume
        self.resume_path = resume_path
        if resume is not None:
            self.conversation = Conversation.from_saved(resume, system_prompt)
        else:
            self.conversation = Conversation(system_prompt)
        created = resume.created if resume is not None else clock()
        self.files = ChatFiles(
            params, clock, created, autosave=autosave, resume_path=resume_path,
            folder=conversations_dir(), save_dir=save_dir,
        )  # fmt: skip
        self.live = LiveStats()
        self.plain_tokens_per_s: float | None = None
        self.generation = Generation()
        self._closing = threading.Event()
        self._last_seed: int | None = params.seed
        self._sent_params = params  # of the message sent last
        self._sent_grammar: str | None = None  # what its answer must match (``/schema``)
        # A message that did not fit, its parameters and grammar, until the user chooses.
        self._overflowed: tuple[str, GenerationParams, str | None] | None = None

    # -- state --------------------------------------------------------------------------

    @property
    def generating(self) -> bool:
        return self.generation.active

    @property
    def phase(self) -> Phase:
        return self.generation.phase

    @property
    def autosave_file(self) -> Path | None:
        return self.files.file

    @property
    def exit_code(self) -> int:
        return 1 if self.load_error else 0

    def refusal(self) -> Refusal | None:
        """Why a turn cannot start now, or None when it can."""
        if self.session is None:
            return Refusal.NOT_LOADED
        if self.workers_lost:
            return Refusal.LOST
        if self.generating:
            return Refusal.BUSY
        return None

    def _refused(self, not_loaded: str) -> bool:
        """Tell why a turn cannot start (``not_loaded`` words the first reason); False when
        it can."""
        refusal = self.refusal()
        if refusal is Refusal.NOT_LOADED:
            self.view.notify(not_loaded, severity="warning")
        elif refusal is Refusal.LOST:
            self.view.notify(LOST_HINT, title=self.workers_lost or "", severity="error")
        elif refusal is Refusal.BUSY:
            self.view.notify(BUSY_MESSAGE, severity="warning")
        return refusal is not None

    def resume_mismatch(self) -> str:
        """A warning when the resumed conversation was held with other models, else ""."""
        if self.resumed is None or self.session is None:
            return ""
        return model_mismatch(self.session, self.resumed.settings)

    # -- loading ------------------------------------------------------------------------

    def load(self) -> None:
        # A daemon thread, not a UI worker: a download cannot be interrupted, and quitting
        # must not wait for it.
        _thread(
            partial(load_session, self.session_factory, self.post, self._closing), "localspec-load"
        )

    def handle(self, news: WorkerNews) -> None:
        """Act on what a worker thread posted; call on the controller's own thread."""
        if isinstance(news, LoadProgress):
            self.view.load_progress(news.progress)
        elif isinstance(news, SessionReady):
            self.session, self.plain_tokens_per_s = news.session, news.plain_tokens_per_s
            self.view.session_ready()
            self.view.show_status(READY_STATUS)
        elif isinstance(news, LoadFailed):
            self.load_error = (news.message, news.hint)
            self.view.load_failed(news.message, news.hint)
            self.view.show_status("The models did not load · Ctrl+Q quits")
        elif isinstance(news, WorkersLost):
            self._workers_lost(news.message)
        elif isinstance(news, EngineEvent):
            self._engine_event(news)
        elif not self.generation.current(news.gen):
            return  # a stopped generation's late news, for a conversation now gone
        elif isinstance(news, TurnsDropped):
            self._turns_dropped(news.count)
        elif isinstance(news, ContextOverflow):
            text = self._withdraw_pending()
            # An /edit's prediction and a /schema's grammar go with it.
            self._overflowed = (text, self._sent_params, self._sent_grammar)
            self.view.overflow(text, news.n_tokens, news.n_ctx, news.alone)
        elif isinstance(news, GenerationFailed):
            self._failed(news.message, news.hint)
        elif isinstance(news, GenerationEnded):
            self._ended()

    # -- sending ------------------------------------------------------------------------

    def submit(self, text: str) -> bool:
        """Send what was typed (``/edit`` and ``/schema`` included); True when it was sent,
        so the box can be emptied."""
        text = text.strip()
        if not text:
            return False
        hint = "the models did not load" if self.load_error else "the models are loading"
        if self._refused(f"Cannot send yet: {hint}."):
            return False
        assert self.session is not None
        try:
            message = outgoing(text, self.params, self.session.plain_tokens)
        except InputError as err:
            self.view.notify(err.hint or "", title=err.message, severity="error")
            return False
        self.send(message.text, params=message.params, grammar=message.grammar)
        return True

    def send(
        self,
        text: str,
        allow_drop: bool = False,
        params: GenerationParams | None = None,
        grammar: str | None = None,
    ) -> None:
        """Start answering ``text`` (the guard has been passed), the answer matching
        ``grammar`` where one is given."""
        assert self.session is not None
        turns = self.conversation.context_turns()
        turn = self.conversation.start(text)
        self.view.turn_started(turn)
        cancel = self.generation.start(turn)
        self.live.begin_answer()
        self.view.show_status("Writing… Escape stops")
        self.view.state_changed()
        self._sent_params = params or self.params
        self._sent_grammar = grammar
        request = GenerationRequest(
            gen=self.generation.number,
            system=self.conversation.system,
            turns=turns,
            user=text,
            params=self._sent_params,
            cancel=cancel,
            allow_drop=allow_drop,
            grammar=grammar,
        )
        work = partial(run_generation, self.session, self.generation.lock, request, self.post)
        self.run_in_thread(work, f"answer-{request.gen}")

    def overflow_choice(self, text: str, choice: str | None) -> None:
        """What the user chose for a message that did not fit: ``fresh`` (a new
        conversation), ``drop`` (the oldest turns), else back into the box. Sent again, it
        keeps the parameters and grammar it had (an ``/edit``'s prediction, a ``/schema``'s
        grammar)."""
        overflowed, self._overflowed = self._overflowed, None
        kept = overflowed is not None and overflowed[0] == text
        params, grammar = (overflowed[1], overflowed[2]) if overflowed and kept else (None, None)
        if choice == "fresh":
            self.new_chat()
            self.send(text, params=params, grammar=grammar)
        elif choice == "drop":
            self.send(text, allow_drop=True, params=params, grammar=grammar)
        else:
            self.view.restore_input(text)

    def recall(self) -> None:
        if not self.conversation.turns:
            self.view.notify("No earlier message to recall.")
            return
        self.view.restore_input(self.conversation.turns[-1].user)

    def stop(self) -> None:
        self.generation.stop()
        self.view.show_status("Stopping…")

    def regenerate(self) -> None:
        """Answer the last message again, with a new seed when sampling."""
        # With lost workers the old answer would go and the new one could not be written.
        if self._refused("Nothing to regenerate: the models are not loaded."):
            return
        turn = self.conversation.last_done()
        if turn is None:
            self.view.notify("No answer to regenerate.", severity="warning")
            return
        params = self.params
        if params.greedy:
            self.view.notify("Greedy decoding (temperature 0) writes the same answer again.")
        else:
            params = params.model_copy(update={"seed": self._new_seed()})
            self.view.notify(f"Answering again with seed {params.seed}.")
        self.conversation.remove_last()
        self.view.turn_removed(turn)
        # The prompt is the one the removed answer had: the KV cache holds it already, so
        # the session rolls back to it and evaluates almost nothing before sampling again.
        self.send(turn.user, params=params)

    def _new_seed(self) -> int:
        seed = random.randrange(2**31)
        while seed == self._last_seed:
            seed = random.randrange(2**31)
        self._last_seed = seed
        return seed

    def new_chat(self) -> None:
        if self.session is None:
            return  # nothing to clear while the models load (or after they failed)
        self.generation.abandon()  # its late events are for a conversation now gone
        self.conversation.clear()
        self.files.restart()
        self.resumed = None
        self.live.reset()
        self.view.cleared()
        self.view.show_status(READY_STATUS)
        self.view.stats_changed()
        self.view.state_changed()

    # -- generation news ----------------------------------------------------------------

    def _engine_event(self, news: EngineEvent) -> None:
        if not self.generation.current(news.gen) or self.generation.turn is None:
            return
        event = news.event
        self.live.observe(event)
        if isinstance(event, TokenEmitted):
            self.generation.add(event.text)
            self.view.token(event.text, event.origin)
            return
        if news.plain_tokens_per_s is not None:
            self.plain_tokens_per_s = news.plain_tokens_per_s
        if isinstance(event, EngineWarning):
            self.view.notify(event.message, severity="warning")
        elif isinstance(event, Finished):
            self._finish_turn(event.text, event.reason.value, event.stats)
            self.view.answer_finished(event.text)
            if event.reason.value == "cancelled":
                self.view.notify("Stopped; the partial answer is kept.")
            self.view.stats_changed()
            return
        self.view.progressed()

    def _turns_dropped(self, count: int) -> None:
        self.view.turns_dropped(self.conversation.drop_oldest(count))
        plural = "s" if count > 1 else ""
        self.view.notify(f"Dropped the oldest {count} turn{plural} from the context.")

    def _failed(self, message: str, hint: str) -> None:
        self.view.notify(hint or message, title=message, severity="error")
        written = self.generation.written
        if written and self.conversation.pending:
            self._finish_turn(written, "error", self.live.answer)
            self.view.answer_finished(None)
        else:
            self.view.restore_input(self._withdraw_pending())

    def _ended(self) -> None:
        if self.conversation.pending is not None:
            # The stream ended without Finished: keep what arrived, as for a stop.
            self._finish_turn(self.generation.written, "cancelled", self.live.answer)
            if self.generation.turn is not None:
                self.view.answer_finished(None)
        self.generation.end()
        self.view.show_status(READY_STATUS)
        self.view.stats_changed()
        self.view.state_changed()

    def _workers_lost(self, message: str) -> None:
        """The target's RPC workers are gone. The generation waiting on them never returns:
        its answer ends here with the error (what it wrote is kept), and nothing more can be
        generated in this process; the conversation can still be read and saved."""
        if self.workers_lost:
            return
        self.workers_lost = message
        if self.generating:
            self._failed(message, LOST_HINT)
            self._ended()
            self.generation.number += 1  # the blocked one never posts again; ignore it if so
        else:
            self.view.notify(LOST_HINT, title=message, severity="error")
        self.view.show_status("The target's RPC workers are lost · Ctrl+S saves · Ctrl+Q quits")

    def _finish_turn(self, answer: str, reason: str, stats: GenerationStats) -> None:
        """Record the answer in the history, then save the conversation so that no finished
        turn is lost whatever happens next."""
        self.conversation.finish(answer, reason, stats)
        problem = self.files.autosave(self.conversation, self.session)
        if problem:
            self.view.notify(
                problem, title="Could not autosave the conversation", severity="warning"
            )

    def _withdraw_pending(self) -> str:
        """Take back a message whose prompt never reached the model; returns its text."""
        turn = self.conversation.discard_pending()
        if turn is None:
            return ""
        self.view.turn_removed(turn)
        self.generation.turn = None
        return turn.user

    # -- saving and closing -------------------------------------------------------------

    def save(self) -> None:
        """Write the Markdown transcript and the conversation file (Ctrl+S)."""
        if not self.conversation.turns:
            self.view.notify("Nothing to save yet.", severity="warning")
            return
        try:
            markdown, data = self.files.save(self.conversation, self.session)
        except OSError as error:
            self.view.notify(f"{error}", title="Could not save the transcript", severity="error")
            return
        self.view.notify(f"Saved to {markdown} and {data.name}", title="Transcript saved")

    def last_code(self) -> str | None:
        """The last code block of the last finished answer (what Ctrl+O copies)."""
        turn = next((t for t in reversed(self.conversation.turns) if t.done), None)
        return last_code_block(turn.answer) if turn is not None else None

    def close(self) -> None:
        """Stop any answer and close the session once no generation holds it (a stopped
        one ends its round)."""
        self._closing.set()
        self.generation.cancel.set()
        session, self.session = self.session, None
        if session is None:
            return
        if self.workers_lost:
            return  # a generation holds the lock for good, and the target cannot be freed
        lock = self.generation.lock
        if lock.acquire(timeout=CLOSE_TIMEOUT_S):
            try:
                session.close()
            finally:
                lock.release()
