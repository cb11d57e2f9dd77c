"""The chat controller without Textual: a recording view, a queue for the workers' news.

The worker threads post into the queue; ``pump`` hands that news to the controller on the
test's thread, as the app does on its own, until the state asked for is reached.
"""

from __future__ import annotations

import queue
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from localspec.core.params import GenerationParams
from localspec.errors import ModelNotFoundError
from localspec.storage.conversations import read_conversation
from localspec.tui.chat_view import LOST_HINT, Phase, Refusal
from localspec.tui.controller import ChatController
from tests.fake_session import FakeSession, ScriptedAnswer, fake_factory

PARAMS = GenerationParams(max_tokens=64)
NOW = datetime(2025, 1, 2, 3, 4, 5)
BUSY = ("An answer is being written: Escape stops it.", "", "warning")


class RecordingView:
    """A ``ChatView`` that records every call as (name, args, kwargs)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args, **kwargs: self.calls.append((name, args, kwargs))

    def named(self, name: str) -> list[tuple[Any, ...]]:
        return [args for called, args, _ in self.calls if called == name]

    def notes(self) -> list[tuple[str, str, str]]:
        return [
            (args[0], kw.get("title", ""), kw.get("severity", "information"))
            for called, args, kw in self.calls
            if called == "notify"
        ]


class Chat:
    """A controller over a ``FakeSession``, with its view and its news queue."""

    def __init__(
        self,
        session: FakeSession,
        error: Exception | None = None,
        params: GenerationParams = PARAMS,
        **kw: Any,
    ) -> None:
        self.session = session
        self.news: queue.Queue[Any] = queue.Queue()
        self.view = RecordingView()
        kw.setdefault("clock", lambda: NOW)
        self.chat = ChatController(
            fake_factory(session, error=error), params, self.view, self.news.put, **kw
        )

    def pump(self, done: Callable[[], bool], timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            left = deadline - time.monotonic()
            assert left > 0, "state not reached in time"
            try:
                self.chat.handle(self.news.get(timeout=min(left, 0.05)))
            except queue.Empty:
                continue

    def loaded(self) -> ChatController:
        self.chat.load()
        self.pump(lambda: self.chat.session is not None or self.chat.load_error is not None)
        return self.chat

    def answered(self, text: str) -> None:
        assert self.chat.submit(text)
        self.pump(lambda: not self.chat.generating)


def test_a_turn_streams_and_finishes() -> None:
    chat = Chat(FakeSession([ScriptedAnswer.plain("Hello there.")]))
    controller = chat.loaded()
    assert controller.refusal() is None and controller.phase is Phase.IDLE
    assert controller.submit("  hi  ")
    assert controller.phase is Phase.GENERATING and controller.refusal() is Refusal.BUSY
    assert [t.user for (t,) in chat.view.named("turn_started")] == ["hi"]
    chat.pump(lambda: not controller.generating)
    assert chat.view.named("token") == [("Hello", "target"), (" there.", "target")]
    assert chat.view.named("answer_finished") == [("Hello there.",)]
    [turn] = controller.conversation.turns
    assert (turn.answer, turn.finish) == ("Hello there.", "eos")
    assert controller.live.answer.generated_tokens == 2
    assert chat.session.calls == [[{"role": "user", "content": "hi"}]]
    assert not controller.submit("   ")  # nothing to send


def test_stop_mid_answer_keeps_the_partial_answer() -> None:
    session = FakeSession([ScriptedAnswer.plain("one two three four five")], hold_after=2)
    chat = Chat(session)
    controller = chat.loaded()
    controller.submit("count")
    chat.pump(lambda: session.held.is_set() and len(chat.view.named("token")) == 2)
    controller.stop()
    assert controller.phase is Phase.CANCELLING and controller.generating
    chat.pump(lambda: not controller.generating)
    [turn] = controller.conversation.turns
    assert (turn.answer, turn.finish) == ("one two", "cancelled")
    assert ("Stopped; the partial answer is kept.", "", "information") in chat.view.notes()
    assert controller.phase is Phase.IDLE and controller.refusal() is None


def test_regenerate_answers_the_last_message_again_with_a_new_seed() -> None:
    session = FakeSession([ScriptedAnswer.plain("First."), ScriptedAnswer.plain("Second.")])
    sampling = GenerationParams(max_tokens=64, temperature=0.8, seed=7)
    chat = Chat(session, params=sampling)
    controller = chat.loaded()
    chat.answered("question")
    first = controller.conversation.turns[0]
    controller.regenerate()
    assert chat.view.named("turn_removed") == [(first,)]
    chat.pump(lambda: not controller.generating)
    assert [t.answer for t in controller.conversation.turns] == ["Second."]
    assert session.calls[0] == session.calls[1]  # the same prompt, answered again
    assert session.params[0].seed == 7
    seed = session.params[1].seed
    assert seed is not None and seed != 7
    assert (f"Answering again with seed {seed}.", "", "information") in chat.view.notes()


def test_greedy_regenerate_says_the_answer_will_be_the_same() -> None:
    chat = Chat(FakeSession([ScriptedAnswer.plain("Same."), ScriptedAnswer.plain("Same.")]))
    controller = chat.loaded()
    chat.answered("question")
    controller.regenerate()
    chat.pump(lambda: not controller.generating)
    note = "Greedy decoding (temperature 0) writes the same answer again."
    assert chat.view.notes() == [(note, "", "information")]
    assert chat.session.params[1] == PARAMS and len(controller.conversation.turns) == 1


def test_regenerate_with_nothing_answered_says_so() -> None:
    chat = Chat(FakeSession())
    controller = chat.loaded()
    controller.regenerate()
    assert chat.view.notes() == [("No answer to regenerate.", "", "warning")]
    assert not controller.generating


def test_the_guard_refuses_while_loading_and_after_a_failed_load() -> None:
    loading = Chat(FakeSession())
    assert loading.chat.refusal() is Refusal.NOT_LOADED
    assert not loading.chat.submit("hello")
    loading.chat.regenerate()
    assert loading.view.notes() == [
        ("Cannot send yet: the models are loading.", "", "warning"),
        ("Nothing to regenerate: the models are not loaded.", "", "warning"),
    ]
    failed = Chat(FakeSession(), error=ModelNotFoundError("no model named 'x'", "list them"))
    controller = failed.loaded()
    assert controller.refusal() is Refusal.NOT_LOADED and controller.exit_code == 1
    assert not controller.submit("hello")
    assert failed.view.notes()[-1] == ("Cannot send yet: the models did not load.", "", "warning")
    assert failed.session.calls == []


def test_the_guard_refuses_a_second_turn_while_one_is_written() -> None:
    session = FakeSession([ScriptedAnswer.plain("a b c d")], hold_after=1)
    chat = Chat(session)
    controller = chat.loaded()
    controller.submit("first")
    assert controller.refusal() is Refusal.BUSY
    assert not controller.submit("second")
    controller.regenerate()
    assert chat.view.notes() == [BUSY, BUSY]
    session.release.set()
    chat.pump(lambda: not controller.generating)
    assert [t.user for t in controller.conversation.turns] == ["first"]


def test_lost_workers_end_the_answer_and_refuse_new_turns() -> None:
    session = FakeSession([ScriptedAnswer.plain("one two three four")], hold_after=2)
    chat = Chat(session)
    controller = chat.loaded()
    controller.submit("go")
    chat.pump(lambda: session.held.is_set() and len(chat.view.named("token")) == 2)
    assert session.on_lost is not None
    session.on_lost("the RPC worker at 10.0.0.2:50052 went away")
    chat.pump(lambda: controller.workers_lost is not None)
    assert not controller.generating and controller.refusal() is Refusal.LOST
    [turn] = controller.conversation.turns
    assert (turn.answer, turn.finish) == ("one two", "error")
    lost = (LOST_HINT, "the RPC worker at 10.0.0.2:50052 went away", "error")
    assert chat.view.notes()[-1] == lost
    assert chat.view.named("show_status")[-1] == (
        "The target's RPC workers are lost · Ctrl+S saves · Ctrl+Q quits",
    )
    assert not controller.submit("more")
    assert chat.view.notes()[-1] == lost
    session.release.set()  # the stopped generation's late news is ignored
    time.sleep(0.1)
    while not chat.news.empty():
        controller.handle(chat.news.get())
    assert [t.answer for t in controller.conversation.turns] == ["one two"]
    controller.close()
    assert not session.closed  # the target cannot be freed while a generation holds it


def test_autosave_then_resume_goes_on_in_the_same_file(isolated_home: Path) -> None:
    first = Chat(FakeSession([ScriptedAnswer.plain("Paris.")]))
    controller = first.loaded()
    first.answered("capital of France?")
    path = controller.autosave_file
    assert path is not None and path.parent == isolated_home / "conversations"
    saved = read_conversation(path)
    assert [m.content for m in saved.messages] == ["capital of France?", "Paris."]

    session = FakeSession([ScriptedAnswer.plain("Rome.")])
    resumed = Chat(session, resume=saved, resume_path=path)
    controller = resumed.loaded()
    assert controller.resume_mismatch() == ""
    resumed.answered("and of Italy?")
    assert session.calls[0][:2] == [
        {"role": "user", "content": "capital of France?"},
        {"role": "assistant", "content": "Paris."},
    ]
    assert controller.autosave_file == path
    again = read_conversation(path)
    assert [m.content for m in again.messages][2:] == ["and of Italy?", "Rome."]


def test_save_writes_the_transcript_beside_the_conversation(tmp_path: Path) -> None:
    chat = Chat(FakeSession([ScriptedAnswer.plain("Hi.")]), save_dir=tmp_path, autosave=False)
    controller = chat.loaded()
    controller.save()
    assert chat.view.notes() == [("Nothing to save yet.", "", "warning")]
    chat.answered("hello")
    controller.save()
    assert (tmp_path / "localspec-chat-20250102-030405.md").exists()
    assert (tmp_path / "localspec-chat-20250102-030405.json").exists()
    assert chat.view.notes()[-1][1] == "Transcript saved"
    assert controller.autosave_file is None  # autosave off


def test_an_overflow_withdraws_the_message_and_a_fresh_start_sends_it() -> None:
    words = " ".join(["word"] * 30)
    session = FakeSession([ScriptedAnswer.plain(words) for _ in range(3)], n_ctx=160)
    chat = Chat(session)
    controller = chat.loaded()
    chat.answered("one two three")
    chat.answered("four five six")
    long = ("seven " * 20).strip()
    controller.submit(long)
    chat.pump(lambda: bool(chat.view.named("overflow")))
    chat.pump(lambda: not controller.generating)
    [(text, n_tokens, n_ctx, alone)] = chat.view.named("overflow")
    assert (text, n_tokens, n_ctx, alone) == (long, 108, 160, False)
    assert len(controller.conversation.turns) == 2 and len(session.calls) == 2
    controller.overflow_choice(text, "fresh")
    chat.pump(lambda: not controller.generating)
    assert session.calls[2] == [{"role": "user", "content": long}]
    assert [t.user for t in controller.conversation.turns] == [long]


def test_the_controller_loads_neither_textual_nor_rich() -> None:
    code = (
        "import sys\n"
        "import localspec.tui.controller\n"
        "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'textual', 'rich'})\n"
        "print(','.join(loaded))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parent.parent,
        timeout=120,
    )
    assert result.stdout.strip() == ""


def test_edit_refuses_a_pipe_or_a_device_without_waiting_on_it(tmp_path: Path) -> None:
    import os
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    session = FakeSession([ScriptedAnswer.plain("Done.")])
    chat = Chat(session)
    controller = chat.loaded()
    for path in (fifo, Path("/dev/zero")):
        sent: list[bool] = []
        worker = threading.Thread(
            target=lambda sent=sent, path=path: sent.append(controller.submit(f"/edit {path}")),
            daemon=True,
        )
        worker.start()
        worker.join(5)  # a FIFO with no writer held the read, and the UI with it
        if worker.is_alive():  # let it go, so that the failure is this test's alone
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        assert not worker.is_alive() and sent == [False]
        assert "not a regular file" in chat.view.notes()[-1][1]
    assert session.calls == []


def test_an_edit_sent_again_after_an_overflow_keeps_its_prediction(tmp_path: Path) -> None:
    words = " ".join(["word"] * 30)
    session = FakeSession([ScriptedAnswer.plain(words) for _ in range(3)], n_ctx=160)
    chat = Chat(session)
    controller = chat.loaded()
    chat.answered("one two three")
    source = tmp_path / "app.py"
    source.write_text(" ".join(["load"] * 40))
    controller.submit(f"/edit {source} rename load")
    chat.pump(lambda: bool(chat.view.named("overflow")))
    chat.pump(lambda: not controller.generating)
    [(text, *_)] = chat.view.named("overflow")
    controller.overflow_choice(text, "fresh")
    chat.pump(lambda: not controller.generating)
    assert session.params[-1].prediction == tuple(session.plain_tokens(source.read_text()))
    assert session.calls[-1] == [{"role": "user", "content": text}]
