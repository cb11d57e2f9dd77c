"""The chat TUI driven through Textual's Pilot over a scripted ``FakeSession``.

No model, no user config or cache: the app gets a factory returning the fake, and saving
goes to a temporary directory with a fixed clock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest
from rich.console import Console
from textual.pilot import Pilot

from localspec.core.drafting.registry import drafter_names
from localspec.core.events import TARGET, FinishReason
from localspec.core.params import GenerationParams
from localspec.core.stats import PLAIN
from localspec.errors import BackendError, ModelNotFoundError
from localspec.progress import Progress, ProgressKind
from localspec.session.pair import SELF_DRAFT
from localspec.tui.app import ChatApp
from localspec.tui.conversation import Conversation, Turn, turns_to_drop
from localspec.tui.screens import HelpScreen, OverflowScreen
from localspec.tui.stats_panel import (
    ORIGINS,
    StatsPanel,
    origin_label,
    origin_style,
    sparkline,
)
from localspec.tui.widgets import AssistantMessage, ChatInput, LoadingPanel, Notice, UserMessage
from tests.fake_session import FakeSession, ScriptedAnswer, count_tokens, fake_factory

PARAMS = GenerationParams(max_tokens=64)
FIXED_NOW = datetime(2025, 1, 2, 3, 4, 5)

# Four rounds, 12 tokens, 0.5 s of decoding: 24 tok/s, i.e. 2.40x a plain 10 tok/s.
# Drafted 4 + 3 + 0 + 3 = 10 (model 4+3, ngram 3), accepted 3 + 2 + 0 + 3 = 8 -> 80%;
# tokens per target pass = 1 + 8/4 = 3.00.
SPEC_TOKENS = [
    ("def", "model", 0), (" add", "model", 0), ("(a", "model", 0), (",", "target", 0),
    (" b", "model", 1), ("):", "model", 1), ("\n", "target", 1),
    ("   ", "target", 2),
    (" return", "ngram", 3), (" a", "ngram", 3), (" +", "ngram", 3), (" b", "target", 3),
]  # fmt: skip
SPEC_TEXT = "".join(t for t, _, _ in SPEC_TOKENS)


def spec_answer(**kwargs: object) -> ScriptedAnswer:
    return ScriptedAnswer.from_tokens(SPEC_TOKENS, drafted={0: 4, 1: 3}, seconds=0.125, **kwargs)


def make_app(session: FakeSession, tmp_path: Path | None = None, **factory_kw: object) -> ChatApp:
    return ChatApp(
        fake_factory(session, **factory_kw),  # type: ignore[arg-type]
        PARAMS,
        save_dir=tmp_path,
        clock=lambda: FIXED_NOW,
    )


async def wait_for(pilot: Pilot, condition: Callable[[], bool], timeout: float = 5.0) -> None:
    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        await pilot.pause(0.01)
    raise AssertionError("condition not reached in time")


async def ready(pilot: Pilot) -> ChatApp:
    app = pilot.app
    assert isinstance(app, ChatApp)
    await wait_for(pilot, lambda: app.chat.session is not None or app.chat.load_error is not None)
    await pilot.pause()
    return app


async def send(pilot: Pilot, text: str, wait: bool = True) -> None:
    app = pilot.app
    assert isinstance(app, ChatApp)
    gen = app.chat.generation.number
    app.query_one(ChatInput).load_text(text)
    await pilot.press("enter")
    if wait:
        await wait_for(pilot, lambda: app.chat.generation.number > gen and not app.chat.generating)
        await pilot.pause()


def record_notifications(app: ChatApp) -> list[tuple[str, str, str]]:
    seen: list[tuple[str, str, str]] = []
    original = app.notify

    def notify(message: str, *, title: str = "", severity: str = "information", **kw: object):
        seen.append((message, title, severity))
        return original(message, title=title, severity=severity, **kw)  # type: ignore[arg-type]

    app.notify = notify  # type: ignore[method-assign]
    return seen


def panel_text(app: ChatApp) -> str:
    console = Console(width=38, record=True, color_system=None)
    console.print(app.query_one(StatsPanel).group)
    return console.export_text()


def squash(text: str) -> str:
    return " ".join(text.split())


def style_at(answer: AssistantMessage, offset: int) -> str:
    body = answer.body()
    styles = [str(s.style) for s in body.spans if s.start <= offset < s.end]
    return styles[-1] if styles else ""


# -- loading ------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_loading_shows_progress_then_ready() -> None:
    gate = threading.Event()
    session = FakeSession()
    progress = [
        Progress(ProgressKind.DOWNLOAD, "downloading fake.gguf"),
        Progress(ProgressKind.DOWNLOAD, "downloading fake.gguf", 0.35),
        Progress(ProgressKind.DOWNLOAD, "downloading fake.gguf", 0.8),
        "loading target fake-target …",
        Progress(ProgressKind.WARNING, "the models need more memory than is free"),
    ]
    app = make_app(session, progress=progress, gate=gate)
    async with app.run_test() as pilot:
        panel = app.query_one(LoadingPanel)
        await wait_for(pilot, lambda: len(panel.lines) == 3)
        # each report on the download replaced the one before
        assert panel.lines == [
            "downloading fake.gguf 80%",
            "loading target fake-target …",
            "warning: the models need more memory than is free",
        ]
        assert app.chat.session is None
        gate.set()
        await ready(pilot)
        assert not app.query(LoadingPanel)
        assert "fake-target-1.5b (Q4_K_M)" in app.sub_title
        notices = [str(n.render()) for n in app.query(Notice)]
        assert any("Ready" in n and "context 4096" in n for n in notices)


@pytest.mark.asyncio
async def test_ready_says_why_the_draft_model_was_not_loaded() -> None:
    session = FakeSession()
    session.draft_summary = "draft model d.gguf: not loaded; no draft of it can pay here"
    app = make_app(session)
    async with app.run_test() as pilot:
        await ready(pilot)
        notices = [str(n.render()) for n in app.query(Notice)]
        assert "Draft model d.gguf: not loaded; no draft of it can pay here." in notices


@pytest.mark.asyncio
async def test_load_error_shows_message_and_hint_and_exits_1() -> None:
    error = ModelNotFoundError("no model named 'qwen9'", hint="`localspec models` lists them")
    app = make_app(FakeSession(), error=error)
    async with app.run_test() as pilot:
        seen = record_notifications(app)
        await ready(pilot)
        shown = str(app.query_one(".notice.error", Notice).render())
        assert "no model named 'qwen9'" in shown and "`localspec models` lists them" in shown
        await send(pilot, "hello", wait=False)
        assert any("did not load" in m for m, _, _ in seen)
        await pilot.press("ctrl+q")
    assert app.return_code == 1


# -- streaming, styles, stats -------------------------------------------------------------


@pytest.mark.asyncio
async def test_answer_streams_with_origin_styles_and_stats() -> None:
    session = FakeSession([spec_answer()], plain_tokens_per_s=10.0)
    app = make_app(session)
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "write add")
        assert session.calls == [[{"role": "user", "content": "write add"}]]
        assert app.query_one(ChatInput).text == ""
        answer = app.query_one(AssistantMessage)
        assert answer.text == SPEC_TEXT
        assert style_at(answer, 0) == origin_style("model")
        assert style_at(answer, SPEC_TEXT.index(" return")) == origin_style("ngram")
        assert style_at(answer, SPEC_TEXT.index(",")) == ""  # the target's own token
        turn = app.chat.conversation.turns[0]
        assert (turn.answer, turn.finish) == (SPEC_TEXT, "eos")

        text = squash(panel_text(app))
        assert "decode tok/s 24.0 24.0" in text
        assert "plain tok/s 10.0 speedup 2.40x 2.40x" in text
        assert "acceptance 80% 80% tokens/pass 3.00 3.00 tokens 12 12 target passes 4 4" in text
        assert "draft model 5/7 71% 5/7 71% n-gram 3/3 100% 3/3 100% plain 1 steps 1 steps" in text
        assert "draft length 3 (n-gram, 3 accepted)" in text
        assert sparkline([3 / 4, 2 / 3, 1.0]) in text
        prompt = count_tokens(session.calls[0])
        assert f"context {prompt + 12} / 4096 tokens" in text

        await pilot.press("f2")  # colours off: every token plain, the legend says so
        assert style_at(answer, 0) == ""
        assert "(off)" in panel_text(app)


@pytest.mark.asyncio
async def test_conversation_totals_and_history_across_turns() -> None:
    session = FakeSession([spec_answer(), ScriptedAnswer.plain("Sure thing.", seconds=0.1)])
    app = make_app(session)
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "first")
        await send(pilot, "second")
        assert session.calls[1] == [
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": SPEC_TEXT},
            {"role": "user", "content": "second"},
        ]
        text = squash(panel_text(app))
        # last answer: 2 tokens in 0.2 s; conversation: 14 tokens in 0.7 s
        assert "decode tok/s 10.0 20.0" in text
        assert "tokens 2 14" in text
        assert "draft length 0 (plain step)" in text


@pytest.mark.asyncio
async def test_newline_keys_do_not_send() -> None:
    session = FakeSession()
    app = make_app(session)
    async with app.run_test() as pilot:
        await ready(pilot)
        await pilot.press("a", "ctrl+j", "b", "shift+enter", "c")
        assert app.query_one(ChatInput).text == "a\nb\nc"
        assert session.calls == [] and not app.query(UserMessage)
        await pilot.press("enter")
        await wait_for(pilot, lambda: bool(session.calls) and not app.chat.generating)
        assert session.calls[0][-1]["content"] == "a\nb\nc"


# -- stopping -----------------------------------------------------------------------------


@pytest.mark.asyncio
@pytest.mark.parametrize("key", ["escape", "ctrl+c"])
async def test_stop_keeps_partial_answer_and_chat_goes_on(key: str) -> None:
    session = FakeSession([spec_answer(), ScriptedAnswer.plain("Next.")], hold_after=5)
    app = make_app(session)
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "write add", wait=False)
        await wait_for(pilot, session.held.is_set)
        await pilot.press(key)
        await wait_for(pilot, lambda: not app.chat.generating)
        partial = "".join(t for t, _, _ in SPEC_TOKENS[:5])
        assert app.query_one(AssistantMessage).text == partial
        assert "stopped" in str(app.query_one(AssistantMessage).body())
        assert (app.chat.conversation.turns[0].answer, app.chat.conversation.turns[0].finish) == (
            partial,
            "cancelled",
        )
        session.hold_after = None
        await send(pilot, "go on")
        assert session.calls[1][1] == {"role": "assistant", "content": partial}
        assert app.query(AssistantMessage).last().text == "Next."


@pytest.mark.asyncio
async def test_escape_does_nothing_harmful_when_idle() -> None:
    app = make_app(FakeSession())
    async with app.run_test() as pilot:
        await ready(pilot)
        await pilot.press("escape", "ctrl+c")
        assert app.is_running and not app.chat.generating


# -- new conversation ---------------------------------------------------------------------


@pytest.mark.asyncio
async def test_new_conversation_clears_transcript_history_and_stats() -> None:
    session = FakeSession([spec_answer(), ScriptedAnswer.plain("Hi.")])
    app = make_app(session)
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "first")
        await pilot.press("ctrl+n")
        assert not app.query(UserMessage) and not app.query(AssistantMessage)
        assert app.chat.conversation.turns == []
        assert "tokens 0 0" in squash(panel_text(app))
        await send(pilot, "again")
        assert session.calls[1] == [{"role": "user", "content": "again"}]


@pytest.mark.asyncio
async def test_new_conversation_while_answering_drops_late_events() -> None:
    session = FakeSession([spec_answer(), ScriptedAnswer.plain("Fresh.")], hold_after=3)
    app = make_app(session)
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "first", wait=False)
        await wait_for(pilot, session.held.is_set)
        await pilot.press("ctrl+n")
        session.hold_after = None
        await send(pilot, "second")
        await wait_for(pilot, lambda: len(session.calls) == 2)
        await wait_for(pilot, lambda: app.chat.conversation.turns[-1].done)
        await pilot.pause()
        assert [t.user for t in app.chat.conversation.turns] == ["second"]
        assert [a.text for a in app.query(AssistantMessage)] == ["Fresh."]
        assert session.calls[1] == [{"role": "user", "content": "second"}]


# -- errors -------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_error_before_any_token_notifies_and_restores_the_message() -> None:
    failing = ScriptedAnswer.plain("never", seconds=0.1)
    failing.error = BackendError("llama_decode failed (-3)", hint="lower --n-ctx")
    session = FakeSession([failing, ScriptedAnswer.plain("Works.")])
    app = make_app(session)
    async with app.run_test() as pilot:
        seen = record_notifications(app)
        await ready(pilot)
        await send(pilot, "hello")
        assert ("lower --n-ctx", "llama_decode failed (-3)", "error") in seen
        assert app.chat.conversation.turns == [] and not app.query(UserMessage)
        assert app.query_one(ChatInput).text == "hello"
        await pilot.press("enter")
        await wait_for(pilot, lambda: not app.chat.generating and bool(app.chat.conversation.turns))
        assert app.chat.conversation.turns[0].answer == "Works."


@pytest.mark.asyncio
async def test_unexpected_error_mid_answer_keeps_partial_and_shows_no_traceback() -> None:
    session = FakeSession([spec_answer(error=RuntimeError("boom"), error_after=4)])
    app = make_app(session)
    async with app.run_test() as pilot:
        seen = record_notifications(app)
        await ready(pilot)
        await send(pilot, "hello")
        message, title, severity = seen[-1]
        assert (title, severity) == (
            "internal error: RuntimeError: boom",
            "error",
        ) and "bug" in message
        turn = app.chat.conversation.turns[0]
        assert (turn.answer, turn.finish) == ("def add(a,", "error")
        assert app.is_running


@pytest.mark.asyncio
async def test_engine_warning_is_notified() -> None:
    session = FakeSession([spec_answer(warnings=["draft model disabled: vocab mismatch"])])
    app = make_app(session)
    async with app.run_test() as pilot:
        seen = record_notifications(app)
        await ready(pilot)
        await send(pilot, "hello")
        assert ("draft model disabled: vocab mismatch", "", "warning") in seen


# -- context overflow ---------------------------------------------------------------------


def long_chat_session(**kw: object) -> FakeSession:
    # The prompt may use n_ctx - max_tokens = 96 tokens. An exchange with a 30-word answer
    # costs 41; the third message (24) then needs 7 + 34 + 7 + 34 + 24 + 2 = 108 tokens,
    # and 67 without the first exchange.
    answers = [ScriptedAnswer.plain(" ".join(["word"] * 30)) for _ in range(3)]
    return FakeSession(answers, n_ctx=160, **kw)  # type: ignore[arg-type]


async def overflow(pilot: Pilot) -> OverflowScreen:
    await send(pilot, "one two three")
    await send(pilot, "four five six")
    await send(pilot, "seven " * 20)
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, OverflowScreen))
    screen = pilot.app.screen
    assert isinstance(screen, OverflowScreen)
    return screen


@pytest.mark.asyncio
async def test_overflow_drop_oldest_turns() -> None:
    session = long_chat_session()
    app = make_app(session)
    async with app.run_test() as pilot:
        await ready(pilot)
        await overflow(pilot)
        assert len(session.calls) == 2 and len(app.chat.conversation.turns) == 2
        await pilot.click("#drop")
        await wait_for(pilot, lambda: len(session.calls) == 3 and not app.chat.generating)
        assert session.calls[2][0] == {"role": "user", "content": "four five six"}
        first = app.chat.conversation.turns[0]
        assert first.dropped and not first.in_context
        assert all(w.has_class("dropped") for w in app.query(f".turn-{first.id}"))
        assert len(app.query(UserMessage)) == 3  # dropped turns stay in the transcript


@pytest.mark.asyncio
async def test_overflow_start_afresh_and_cancel() -> None:
    session = long_chat_session()
    app = make_app(session)
    async with app.run_test() as pilot:
        await ready(pilot)
        await overflow(pilot)
        await pilot.press("escape")  # cancel: the message goes back to the input box
        assert not isinstance(app.screen, OverflowScreen)
        assert app.query_one(ChatInput).text == ("seven " * 20).strip()
        await pilot.press("enter")
        await wait_for(pilot, lambda: isinstance(app.screen, OverflowScreen))
        await pilot.click("#fresh")
        await wait_for(pilot, lambda: len(session.calls) == 3 and not app.chat.generating)
        assert session.calls[2] == [{"role": "user", "content": ("seven " * 20).strip()}]
        assert len(app.query(UserMessage)) == 1


@pytest.mark.asyncio
async def test_message_too_long_alone_offers_only_cancel() -> None:
    app = make_app(FakeSession(n_ctx=100))
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "word " * 80)
        await wait_for(pilot, lambda: isinstance(app.screen, OverflowScreen))
        assert not app.screen.query("#fresh") and not app.screen.query("#drop")
        await pilot.click("#cancel")
        assert app.query_one(ChatInput).text.startswith("word word")


# -- save, help, quit ---------------------------------------------------------------------


@pytest.mark.asyncio
async def test_save_writes_markdown_with_timestamped_name(tmp_path: Path) -> None:
    app = make_app(FakeSession([spec_answer()]), tmp_path)
    async with app.run_test() as pilot:
        seen = record_notifications(app)
        await ready(pilot)
        await send(pilot, "write add")
        await pilot.press("ctrl+s")
        path = tmp_path / "localspec-chat-20250102-030405.md"
        assert any(str(path) in m for m, _, _ in seen)
        text = path.read_text(encoding="utf-8")
        assert text.startswith("# localspec chat, 2025-01-02 03:04:05")
        assert "- target: fake-target-1.5b (Q4_K_M)" in text
        assert f"## You\n\nwrite add\n\n## Assistant\n\n{SPEC_TEXT}\n" in text
        await pilot.press("ctrl+s")  # same second: a second file, not an overwrite
        assert (tmp_path / "localspec-chat-20250102-030405-1.md").exists()


@pytest.mark.asyncio
async def test_help_opens_and_closes() -> None:
    app = make_app(FakeSession())
    async with app.run_test() as pilot:
        await ready(pilot)
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)


@pytest.mark.asyncio
async def test_quit_closes_the_session() -> None:
    session = FakeSession()
    app = make_app(session)
    async with app.run_test() as pilot:
        await ready(pilot)
        await pilot.press("ctrl+q")
    assert session.closed and app.return_code == 0


# -- headless pieces ----------------------------------------------------------------------


def test_turns_to_drop_finds_fewest() -> None:
    turns = [Turn(user="a " * 10, answer="b " * 10, finish="eos") for _ in range(3)]
    full = turns_to_drop(None, turns, "q", count_tokens, 1000)
    assert full == (0, count_tokens([{"content": "a " * 10}] * 3 + [{"content": "b " * 10}] * 3
                                    + [{"content": "q"}]))  # fmt: skip
    assert turns_to_drop(None, turns, "q", count_tokens, 40)[0] == 2  # type: ignore[index]
    assert turns_to_drop(None, turns, "q " * 50, count_tokens, 40) is None


def test_empty_and_dropped_turns_leave_the_context() -> None:
    conv = Conversation(system="be brief")
    conv.start("hi")
    conv.finish("", FinishReason.CANCELLED.value)
    conv.start("again")
    conv.finish("hello", "eos")
    assert conv.messages("next") == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "next"},
    ]
    conv.drop_oldest(1)
    assert len(conv.messages("next")) == 2


def test_sparkline_uses_a_fixed_scale() -> None:
    assert sparkline([0.0, 0.5, 1.0]) == "▁▅█"
    assert sparkline([0.9, 1.0]) == "▇█"


# -- snapshot -----------------------------------------------------------------------------


async def answer_once(pilot: Pilot) -> None:
    """Ready, a steady cursor, one answered question: the state the snapshots show."""
    app = await ready(pilot)
    app.query_one(ChatInput).cursor_blink = False
    await send(pilot, "Write a Python function that adds two numbers.")
    await pilot.pause()


def test_snapshot_after_one_answer(snap_compare) -> None:  # type: ignore[no-untyped-def]
    app = make_app(FakeSession([spec_answer()], plain_tokens_per_s=10.0))
    assert snap_compare(app, terminal_size=(110, 36), run_before=answer_once)


@pytest.mark.parametrize("size", [(80, 24), (60, 20)])
def test_snapshot_narrow_terminal(snap_compare, size) -> None:  # type: ignore[no-untyped-def]
    """At 80x24 and 60x20 the conversation keeps the width; the figures fit on one line."""
    app = make_app(FakeSession([spec_answer()], plain_tokens_per_s=10.0))

    async def run_before(pilot: Pilot) -> None:
        await answer_once(pilot)
        assert not app.query_one(StatsPanel).display
        assert app.query_one("#transcript").size.width >= size[0] - 2

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.asyncio
async def test_f3_toggles_the_stats_panel_whatever_the_width() -> None:
    app = make_app(FakeSession([spec_answer()], plain_tokens_per_s=10.0))
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        panel, line = app.query_one(StatsPanel), app.query_one("#mini-stats")
        assert not panel.display and line.display
        await send(pilot, "hello")
        assert "accepted 80%" in str(line.render()) and "2.40x" in str(line.render())
        await pilot.press("f3")
        assert panel.display and not line.display
    app = make_app(FakeSession())
    async with app.run_test(size=(120, 30)) as pilot:
        await ready(pilot)
        assert app.query_one(StatsPanel).display
        await pilot.press("f3")
        assert not app.query_one(StatsPanel).display


@pytest.mark.asyncio
async def test_the_overflow_dialog_names_the_real_option() -> None:
    app = make_app(FakeSession())
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        app.push_screen(OverflowScreen(5000, 4096, alone=True))
        await pilot.pause()
        texts = " ".join(str(w.render()) for w in app.screen.query("Static"))
        assert "--ctx N" in texts and "--n-ctx" not in texts


# -- with a real Session over tiny GGUF models ---------------------------------------------


def real_factory(target: Path, draft: Path) -> Callable[..., object]:
    from localspec.session.open import open_session
    from localspec.session.pair import ModelOptions

    options = ModelOptions(target=str(target), draft=str(draft), n_ctx=256, calibrate=False)
    return lambda on_progress, on_lost: open_session(options, on_progress, on_lost)


@pytest.mark.asyncio
async def test_real_session_answers_and_counts(tiny_pair) -> None:  # type: ignore[no-untyped-def]
    target, draft, _ = tiny_pair
    app = ChatApp(real_factory(target, draft), GenerationParams(max_tokens=16))  # type: ignore[arg-type]
    async with app.run_test() as pilot:
        seen = record_notifications(app)
        await ready(pilot)
        assert app.chat.session is not None, app.chat.load_error
        await send(pilot, "the cat")
        await wait_for(pilot, lambda: not app.chat.generating, timeout=60)
        turn = app.chat.conversation.turns[0]
        assert turn.finish in ("eos", "length") and turn.stats.generated_tokens > 0
        assert app.query_one(AssistantMessage).text == turn.answer
        assert app.chat.live.answer.generated_tokens == turn.stats.generated_tokens
        assert not [s for s in seen if s[2] == "error"]
        await send(pilot, "and the dog")
        await wait_for(pilot, lambda: not app.chat.generating, timeout=60)
        assert app.chat.conversation.turns[1].done
        session = app.chat.session
    assert session is not None and app.chat.session is None
    assert session.closed and session.target.shared.ctx is None  # its models were freed on quit


@pytest.mark.asyncio
async def test_real_session_regenerates_and_resumes_from_the_kv_cache(tiny_pair) -> None:  # type: ignore[no-untyped-def]
    """With real models: Ctrl+R evaluates nothing before sampling again; a resumed
    conversation evaluates its earlier prefix once, then only new tokens."""
    from localspec.storage.conversations import read_conversation

    target, draft, _ = tiny_pair
    params = GenerationParams(max_tokens=8, temperature=0.8, seed=1)
    app = ChatApp(real_factory(target, draft), params)  # type: ignore[arg-type]
    async with app.run_test() as pilot:
        await ready(pilot)
        assert app.chat.session is not None, app.chat.load_error
        await send(pilot, "the cat")
        await wait_for(pilot, lambda: not app.chat.generating, timeout=60)
        prompt = app.chat.session.count_chat_tokens([{"role": "user", "content": "the cat"}])
        # the engine's prefill evaluates all but the last prompt token (its round does that)
        assert app.chat.conversation.turns[0].stats.prefill_evaluated == prompt - 1
        gen = app.chat.generation.number
        await pilot.press("ctrl+r")
        await wait_for(
            pilot, lambda: app.chat.generation.number > gen and not app.chat.generating, timeout=60
        )
        [turn] = app.chat.conversation.turns
        assert turn.stats.prefill_evaluated == 0  # all of it was in the cache
        path = app.chat.autosave_file
    assert path is not None
    saved = read_conversation(path)
    assert len(saved.messages) == 2
    app = ChatApp(real_factory(target, draft), params, resume=saved, resume_path=path)  # type: ignore[arg-type]
    async with app.run_test() as pilot:
        await ready(pilot)
        assert app.chat.session is not None, app.chat.load_error
        await send(pilot, "and the dog")
        await wait_for(pilot, lambda: not app.chat.generating, timeout=60)
        first = app.chat.conversation.turns[1].stats
        assert first.prefill_evaluated == first.prompt_tokens - 1
        await send(pilot, "and the bird")
        await wait_for(pilot, lambda: not app.chat.generating, timeout=60)
        second = app.chat.conversation.turns[2].stats
        assert 0 < second.prefill_evaluated < second.prompt_tokens - first.prompt_tokens


@pytest.mark.asyncio
async def test_real_incompatible_pair_shows_the_error_in_the_app(tiny_pair) -> None:  # type: ignore[no-untyped-def]
    target, _, alien = tiny_pair
    app = ChatApp(real_factory(target, alien), PARAMS)  # type: ignore[arg-type]
    async with app.run_test() as pilot:
        await ready(pilot)
        assert app.chat.session is None and app.chat.load_error is not None
        message, hint = app.chat.load_error
        assert "cannot draft for target" in message and "--drafter ngram" in hint
        shown = str(app.query_one(".notice.error", Notice).render())
        assert "cannot draft for target" in shown and "Traceback" not in shown


@pytest.mark.slow
@pytest.mark.asyncio
async def test_real_default_pair_answers_one_short_turn(real_pair_home) -> None:  # type: ignore[no-untyped-def]
    _, target, draft = real_pair_home
    app = ChatApp(real_factory(target, draft), GenerationParams(max_tokens=24))  # type: ignore[arg-type]
    async with app.run_test(size=(140, 45)) as pilot:
        await wait_for(
            pilot, lambda: app.chat.session is not None or app.chat.load_error is not None, 180
        )
        assert app.chat.session is not None, app.chat.load_error
        text = "Write a one-line Python expression that sums the squares of 1..10."
        await send(pilot, text, wait=False)  # a real answer takes longer than send waits
        await wait_for(pilot, lambda: not app.chat.generating, timeout=180)
        turn = app.chat.conversation.turns[0]
        assert turn.finish in ("eos", "length") and turn.stats.generated_tokens > 0
        assert app.query_one(AssistantMessage).text == turn.answer
        origins = turn.stats.by_origin
        assert sum(origins.values()) == turn.stats.generated_tokens


EVIL = "[/]evil[bold"


@pytest.mark.asyncio
async def test_untrusted_names_are_shown_as_text_not_markup(tmp_path) -> None:
    """A model's name comes from its GGUF file; a name with markup must neither crash the
    app nor style anything, in the title, the transcript and notifications alike."""
    session = FakeSession([spec_answer()], target_label=f"{EVIL} (Q4_K_M)", draft_label=EVIL)
    app = make_app(session, tmp_path)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        assert EVIL in app.sub_title
        assert any(EVIL in str(n.render()) for n in app.query(Notice))
        app.notify(f"loaded {EVIL}", title=EVIL)
        await send(pilot, "hello")
        await pilot.press("ctrl+s")
        await pilot.pause()
        assert app.is_running


@pytest.mark.asyncio
async def test_a_load_error_naming_a_strange_file_is_shown_as_text() -> None:
    error = ModelNotFoundError(f"unknown model {EVIL!r}", f"did you mean {EVIL}?")
    app = make_app(FakeSession(), error=error)
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        await pilot.pause()
        assert app.chat.load_error == (error.message, error.hint)
        assert any(EVIL in str(n.render()) for n in app.query(Notice))


@pytest.mark.asyncio
async def test_system_prompt_heads_the_conversation_and_survives_a_new_chat(tmp_path) -> None:
    session = FakeSession([spec_answer(), spec_answer()])
    app = ChatApp(
        fake_factory(session),  # type: ignore[arg-type]
        PARAMS,
        system_prompt="Answer in [bold] French.",
        save_dir=tmp_path,
        clock=lambda: FIXED_NOW,
    )
    async with app.run_test(size=(110, 36)) as pilot:
        await ready(pilot)
        shown = [str(n.render()) for n in app.query(Notice)]
        assert any("System: Answer in [bold] French." in text for text in shown)
        await send(pilot, "hello")
        assert session.calls[-1][0] == {"role": "system", "content": "Answer in [bold] French."}
        await pilot.press("ctrl+s")
        await pilot.pause()
        saved = next(tmp_path.glob("*.md")).read_text()
        assert "system prompt: Answer in [bold] French." in saved
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert any("System:" in str(n.render()) for n in app.query(Notice))
        await send(pilot, "again")
        assert session.calls[-1][0]["role"] == "system" and len(session.calls[-1]) == 2


@pytest.mark.asyncio
async def test_a_drafter_the_app_does_not_know_gets_a_colour_and_its_name() -> None:
    tokens = [("one", "echo", 0), (" two", "echo", 0), (" three", "target", 0)]
    session = FakeSession([ScriptedAnswer.from_tokens(tokens)])
    app = make_app(session)
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "count")
        style = style_at(app.query_one(AssistantMessage), 0)
        assert style and style not in {origin.style for origin in ORIGINS.values()}
        assert style_at(app.query_one(AssistantMessage), len("one two")) == ""
        text = squash(panel_text(app))
        assert "■ echo" in text and "echo 2/2 100%" in text
    assert origin_style("echo") == style  # the same colour every time
    assert origin_label("echo") == "echo"


def test_every_drafter_there_is_has_a_label_and_a_colour_of_its_own() -> None:
    """The table names every drafter of the registry, the draft model derived from the
    target, the target and plain steps; no two drafters share a colour."""
    names = {*drafter_names(), SELF_DRAFT, TARGET, PLAIN}
    assert names <= set(ORIGINS)
    drafters = [ORIGINS[name].style for name in names - {TARGET, PLAIN}]
    assert all(drafters) and len(set(drafters)) == len(drafters)
    assert origin_label("ngram") == "n-gram" and origin_label(SELF_DRAFT) == "self-draft"


@pytest.mark.asyncio
async def test_self_lookahead_and_prediction_show_their_labels() -> None:
    """Drafters the legend does not list from the start join it, labelled, once they
    drafted; the per-drafter counts use the same labels."""
    tokens = [
        ("a", "self", 0), (" b", "target", 0), (" c", "lookahead", 1), (" d", "target", 1),
        (" e", "prediction", 2), (" f", "target", 2),
    ]  # fmt: skip
    session = FakeSession([ScriptedAnswer.from_tokens(tokens)])
    app = make_app(session)
    async with app.run_test() as pilot:
        await ready(pilot)
        text = squash(panel_text(app))
        assert "■ draft model" in text and "self-draft" not in text
        await send(pilot, "letters")
        answer = app.query_one(AssistantMessage)
        assert style_at(answer, 0) == ORIGINS["self"].style
        assert style_at(answer, len("a b")) == ORIGINS["lookahead"].style
        assert style_at(answer, len("a b c d")) == ORIGINS["prediction"].style
        text = squash(panel_text(app))
        for label in ("self-draft", "lookahead", "prediction"):
            assert f"■ {label}" in text and f"{label} 1/1 100%" in text
        assert "■ self " not in text and "self 1/1" not in text


# -- Markdown answers ---------------------------------------------------------------------

MD_TEXT = (
    "## Adding numbers\n\n"
    "- takes `a` and `b`\n"
    "- returns their sum\n\n"
    "```python\n"
    "def add(a, b):\n"
    "    return a + b\n"
    "```\n"
    "Call it as `add(1, 2)`."
)
MD_CODE = "def add(a, b):\n    return a + b\n"


def markdown_answer() -> ScriptedAnswer:
    """MD_TEXT as tokens of every origin, three to a round."""
    pieces = ScriptedAnswer.plain(MD_TEXT).rounds
    origins = ["model", "model", "target", "ngram", "ngram", "target"]
    tokens = [(r.tokens[0][0], origins[i % len(origins)], i // 3) for i, r in enumerate(pieces)]
    return ScriptedAnswer.from_tokens(tokens, seconds=0.02)


@pytest.mark.asyncio
async def test_finished_answer_is_parsed_as_markdown_once_and_ctrl_t_shows_the_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from localspec.tui import widgets

    parsed: list[str] = []
    real_markdown = widgets.Markdown

    def counting_markdown(text: str, **kw: object) -> object:
        parsed.append(text)
        return real_markdown(text, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(widgets, "Markdown", counting_markdown)
    session = FakeSession([markdown_answer(), markdown_answer()], hold_after=8)
    app = make_app(session)
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "add?", wait=False)
        answer = app.query_one(AssistantMessage)
        await wait_for(pilot, session.held.is_set)
        await pilot.pause(0.2)
        assert len(answer.spans) == 8 and parsed == []
        assert not answer.shows_markdown  # streaming: the coloured tokens
        session.hold_after = None
        session.release.set()
        await wait_for(pilot, lambda: not app.chat.generating)
        await pilot.pause()
        assert parsed == [MD_TEXT]  # once per finished answer, not per token
        assert answer.shows_markdown and answer.markdown is not None
        assert answer.markdown.markup == MD_TEXT
        assert len(answer.spans) > 20  # the tokens and their origins are kept
        await pilot.press("ctrl+t")
        assert not answer.shows_markdown and app.rendered is False
        assert style_at(answer, 0) == origin_style("model")
        await send(pilot, "again")  # a new answer follows the chosen view
        second = app.query(AssistantMessage).last()
        assert not second.shows_markdown and second.markdown is not None
        await pilot.press("ctrl+t")
        assert all(a.shows_markdown for a in app.query(AssistantMessage))
        assert parsed == [MD_TEXT, MD_TEXT]  # toggling parses nothing again


async def answer_markdown(pilot: Pilot) -> None:
    app = await ready(pilot)
    app.query_one(ChatInput).cursor_blink = False
    await send(pilot, "Write add.")
    await pilot.pause()


def test_snapshot_markdown_answer_with_code(snap_compare) -> None:  # type: ignore[no-untyped-def]
    app = make_app(FakeSession([markdown_answer()], plain_tokens_per_s=10.0))
    assert snap_compare(app, terminal_size=(80, 24), run_before=answer_markdown)


def test_snapshot_markdown_toggled_to_origin_colours(snap_compare) -> None:  # type: ignore[no-untyped-def]
    app = make_app(FakeSession([markdown_answer()], plain_tokens_per_s=10.0))

    async def run_before(pilot: Pilot) -> None:
        await answer_markdown(pilot)
        await pilot.press("ctrl+t")
        app.clear_notifications()
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


# -- conversations as files ---------------------------------------------------------------


def saved_conversation(system: str | None = "Be brief.", **settings: object):  # type: ignore[no-untyped-def]
    from localspec.storage.conversations import ChatSettings, SavedConversation, SavedMessage

    messages = [
        SavedMessage(role="user", content="What is 2 + 2?"),
        SavedMessage(role="assistant", content="**4**", finish="eos"),
        SavedMessage(role="user", content="Show it in Python."),
        SavedMessage(role="assistant", content="```python\nprint(2 + 2)\n```", finish="eos"),
    ]
    base = {
        "target": "fake-target-1.5b (Q4_K_M)",
        "target_path": "/models/fake-target-1.5b.gguf",
        "draft": "fake-draft-0.5b (Q8_0)",
        "draft_path": "/models/fake-draft-0.5b.gguf",
    }
    return SavedConversation(
        created=FIXED_NOW,
        updated=FIXED_NOW,
        system=system,
        settings=ChatSettings(**{**base, **settings}),  # type: ignore[arg-type]
        messages=messages,
    )


def resumed_app(session: FakeSession, saved, path: Path, **kw: object) -> ChatApp:  # type: ignore[no-untyped-def]
    return ChatApp(
        fake_factory(session),  # type: ignore[arg-type]
        PARAMS,
        system_prompt=saved.system,
        clock=lambda: FIXED_NOW,
        resume=saved,
        resume_path=path,
        **kw,  # type: ignore[arg-type]
    )


def test_snapshot_resumed_conversation(snap_compare, tmp_path) -> None:  # type: ignore[no-untyped-def]
    saved = saved_conversation()
    app = resumed_app(FakeSession(), saved, tmp_path / "chat-20250102-030405.json")

    async def run_before(pilot: Pilot) -> None:
        await ready(pilot)
        app.query_one(ChatInput).cursor_blink = False
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


@pytest.mark.asyncio
async def test_save_then_resume_evaluates_the_prefix_once_then_only_new_tokens(
    tmp_path: Path, isolated_home: Path
) -> None:
    from localspec.storage.conversations import read_conversation
    from tests.fake_session import fake_tokens

    first = FakeSession([spec_answer(), ScriptedAnswer.plain("Four.")])
    app = ChatApp(
        fake_factory(first),  # type: ignore[arg-type]
        GenerationParams(max_tokens=64, temperature=0.5, seed=7, top_k=20),
        system_prompt="Be brief.",
        save_dir=tmp_path,
        clock=lambda: FIXED_NOW,
    )
    async with app.run_test() as pilot:
        seen = record_notifications(app)
        await ready(pilot)
        await send(pilot, "write add")
        await send(pilot, "and 2 + 2?")
        await pilot.press("ctrl+s")
        assert any("localspec-chat-20250102-030405.json" in m for m, _, _ in seen)
    path = tmp_path / "localspec-chat-20250102-030405.json"
    saved = read_conversation(path)
    assert saved.system == "Be brief."
    assert [(m.role, m.content) for m in saved.messages] == [
        ("user", "write add"),
        ("assistant", SPEC_TEXT),
        ("user", "and 2 + 2?"),
        ("assistant", "Four."),
    ]
    s = saved.settings
    assert (s.temperature, s.seed, s.top_k, s.top_p, s.max_tokens) == (0.5, 7, 20, 0.95, 64)
    assert s.target == "fake-target-1.5b (Q4_K_M)"
    assert s.target_path == "/models/fake-target-1.5b.gguf"
    assert saved.created == FIXED_NOW
    # the same conversation was autosaved after each answer
    autosaved = read_conversation(isolated_home / "conversations" / "chat-20250102-030405.json")
    assert autosaved.messages == saved.messages

    second = FakeSession([ScriptedAnswer.plain("Six."), ScriptedAnswer.plain("Eight.")])
    app = resumed_app(second, saved, path)
    async with app.run_test() as pilot:
        await ready(pilot)
        assert [m.text for m in app.query(AssistantMessage)] == [SPEC_TEXT, "Four."]
        assert len(app.query(UserMessage)) == 2
        await send(pilot, "and 3 + 3?")
        assert second.calls[0] == [
            {"role": "system", "content": "Be brief."},
            *[{"role": m.role, "content": m.content} for m in saved.messages],
            {"role": "user", "content": "and 3 + 3?"},
        ]
        # the first new turn evaluates the whole earlier prefix, once
        assert second.evaluated[0] == len(fake_tokens(second.calls[0]))
        await send(pilot, "and 4 + 4?")
        # the next one only the end of the last answer, the new message and the prompt
        assert second.evaluated[1] == 2 + (4 + 4) + 2
        assert len(app.chat.conversation.turns) == 4
    # resumed from outside the conversations folder: autosaved as a new file there
    again = read_conversation(isolated_home / "conversations" / "chat-20250102-030405-1.json")
    assert [m.content for m in again.messages][-2:] == ["and 4 + 4?", "Eight."]


@pytest.mark.asyncio
async def test_resumed_system_prompt_is_shown_sent_and_kept(isolated_home: Path) -> None:
    from localspec.storage.conversations import autosave_path, read_conversation

    saved = saved_conversation(system="Answer in [bold] French.")
    path = autosave_path(FIXED_NOW)
    session = FakeSession()
    app = resumed_app(session, saved, path)
    async with app.run_test() as pilot:
        await ready(pilot)
        shown = [str(n.render()) for n in app.query(Notice)]
        assert any("System: Answer in [bold] French." in text for text in shown)
        assert any("Resumed chat-20250102-030405.json: 2 turns" in text for text in shown)
        await send(pilot, "next")
        assert session.calls[0][0] == {"role": "system", "content": "Answer in [bold] French."}
    # a conversation from the conversations folder goes on in its own file
    kept = read_conversation(path)
    assert kept.system == "Answer in [bold] French." and len(kept.messages) == 6


@pytest.mark.asyncio
async def test_resuming_with_another_model_warns_and_goes_on(tmp_path: Path) -> None:
    saved = saved_conversation(target="other-7b (Q4_K_M)", target_path="/models/other-7b.gguf")
    session = FakeSession()
    app = resumed_app(session, saved, tmp_path / "c.json")
    async with app.run_test() as pilot:
        await ready(pilot)
        warnings = [str(n.render()) for n in app.query(".notice.warning").results(Notice)]
        assert len(warnings) == 1
        assert "other-7b (Q4_K_M)" in warnings[0] and "draft" not in warnings[0]
        await send(pilot, "go on")
        assert len(session.calls) == 1
    same = resumed_app(FakeSession(), saved_conversation(), tmp_path / "c.json")
    async with same.run_test() as pilot:
        await ready(pilot)
        assert not same.query(".notice.warning")
    no_draft = FakeSession(draft_label=None)
    no_draft.draft_path = None  # --drafter ngram: no draft model to differ from the saved one
    app = resumed_app(no_draft, saved_conversation(), tmp_path / "c.json")
    async with app.run_test() as pilot:
        await ready(pilot)
        assert not app.query(".notice.warning")


@pytest.mark.asyncio
async def test_stop_and_quit_keep_every_finished_turn_in_the_autosave(
    isolated_home: Path,
) -> None:
    from localspec.storage.conversations import read_conversation

    session = FakeSession([ScriptedAnswer.plain("One."), spec_answer()], hold_after=None)
    app = make_app(session)
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "first")
        session.hold_after = 3
        await send(pilot, "second", wait=False)
        await wait_for(pilot, session.held.is_set)
        await pilot.press("escape")
        await wait_for(pilot, lambda: not app.chat.generating)
        await pilot.press("ctrl+q")
    saved = read_conversation(isolated_home / "conversations" / "chat-20250102-030405.json")
    partial = "".join(t for t, _, _ in SPEC_TOKENS[:3])
    assert [(m.content, m.finish) for m in saved.messages[1::2]] == [
        ("One.", "eos"),
        (partial, "cancelled"),
    ]


@pytest.mark.asyncio
async def test_no_save_writes_no_conversation_file(isolated_home: Path) -> None:
    session = FakeSession()
    app = ChatApp(fake_factory(session), PARAMS, autosave=False)  # type: ignore[arg-type]
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "hello")
        assert app.chat.conversation.turns[0].done
    assert not (isolated_home / "conversations").exists()


def test_conversation_file_round_trip_and_refusals(tmp_path: Path) -> None:
    import json

    from localspec.errors import InputError
    from localspec.storage.conversations import read_conversation, write_conversation

    path = tmp_path / "c.json"
    assert write_conversation(path, saved_conversation()) == ""
    assert read_conversation(path) == saved_conversation()
    data = json.loads(path.read_text())
    assert (data["format"], data["version"]) == ("localspec-chat", 1)

    def refused(content: str) -> str:
        path.write_text(content)
        with pytest.raises(InputError) as err:
            read_conversation(path)
        return err.value.message

    assert "not JSON" in refused('{"format": "localspec-chat", ')
    assert "not a localspec conversation" in refused("[1, 2]")
    assert "format version 2" in refused(json.dumps({**data, "version": 2}))
    odd = {**data, "messages": data["messages"][1:]}
    assert "damaged" in refused(json.dumps(odd))
    assert "not a localspec conversation" in refused("{}")
    assert "damaged" in refused(json.dumps({**data, "created": "yesterday"}))
    path.unlink()
    with pytest.raises(InputError, match="no such file"):
        read_conversation(path)


# -- regenerate, copy, recall -------------------------------------------------------------


@pytest.mark.asyncio
async def test_regenerate_samples_again_with_a_new_seed_and_keeps_one_answer() -> None:
    session = FakeSession([ScriptedAnswer.plain("First try."), ScriptedAnswer.plain("Second.")])
    params = GenerationParams(max_tokens=64, temperature=0.8, seed=5)
    app = ChatApp(fake_factory(session), params, clock=lambda: FIXED_NOW)  # type: ignore[arg-type]
    async with app.run_test() as pilot:
        seen = record_notifications(app)
        await ready(pilot)
        await send(pilot, "say something")
        gen = app.chat.generation.number
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: app.chat.generation.number > gen and not app.chat.generating)
        await pilot.pause()
        assert session.calls[1] == session.calls[0]  # the same prompt
        assert session.params[0].seed == 5
        assert session.params[1].seed not in (None, 5)
        assert f"Answering again with seed {session.params[1].seed}." in [m for m, _, _ in seen]
        assert session.evaluated[1] == 1  # the prompt was in the cache: only the logits row
        assert [(t.user, t.answer) for t in app.chat.conversation.turns] == [
            ("say something", "Second.")
        ]
        assert [a.text for a in app.query(AssistantMessage)] == ["Second."]
        assert len(app.query(UserMessage)) == 1


@pytest.mark.asyncio
async def test_regenerate_greedy_says_so_and_refuses_while_writing_or_with_nothing() -> None:
    session = FakeSession(
        [ScriptedAnswer.plain("Same."), spec_answer(), ScriptedAnswer.plain("a b c d")]
    )
    app = make_app(session)
    async with app.run_test() as pilot:
        seen = record_notifications(app)
        await ready(pilot)
        await pilot.press("ctrl+r")
        assert seen[-1][0] == "No answer to regenerate." and session.calls == []
        await send(pilot, "hi")
        gen = app.chat.generation.number
        await pilot.press("ctrl+r")
        await wait_for(pilot, lambda: app.chat.generation.number > gen and not app.chat.generating)
        assert any("same answer again" in m for m, _, _ in seen)
        assert session.params[1].seed is None  # greedy: nothing to reseed
        session.hold_after = 2
        await send(pilot, "long", wait=False)
        await wait_for(pilot, session.held.is_set)
        await pilot.press("ctrl+r")
        assert "Escape stops it" in seen[-1][0] and len(session.calls) == 3
        session.release.set()
        await wait_for(pilot, lambda: not app.chat.generating)
        app.push_screen(OverflowScreen(5000, 4096, alone=False))
        await pilot.pause()
        await pilot.press("ctrl+r")  # behind a dialog: not acted on
        assert len(session.calls) == 3 and len(app.chat.conversation.turns) == 2


@pytest.mark.asyncio
async def test_copy_code_copies_the_last_block_of_the_last_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    two_blocks = "First:\n\n```\nold()\n```\n\nThen:\n\n" + MD_TEXT
    session = FakeSession([ScriptedAnswer.plain(two_blocks), ScriptedAnswer.plain("No code.")])
    app = make_app(session)
    copied: list[str] = []
    async with app.run_test() as pilot:
        monkeypatch.setattr(app, "copy_to_clipboard", copied.append)
        seen = record_notifications(app)
        await ready(pilot)
        await pilot.press("ctrl+o")
        assert seen[-1][0] == "No code block in the last answer." and copied == []
        await send(pilot, "add?")
        await pilot.press("ctrl+o")
        assert copied == [MD_CODE]
        assert seen[-1][0] == "Copied 2 lines."
        await send(pilot, "thanks")
        await pilot.press("ctrl+o")
        assert seen[-1][0] == "No code block in the last answer." and len(copied) == 1


@pytest.mark.asyncio
async def test_up_in_the_empty_box_recalls_the_last_message() -> None:
    app = make_app(FakeSession())
    async with app.run_test() as pilot:
        seen = record_notifications(app)
        await ready(pilot)
        await pilot.press("up")
        assert seen[-1][0] == "No earlier message to recall."
        await send(pilot, "first\nline two")
        await send(pilot, "second one")
        box = app.query_one(ChatInput)
        await pilot.press("up")
        assert box.text == "second one"
        assert box.cursor_location == box.document.end  # ready to edit at the end
        await pilot.press("up")  # in a box with text, Up moves the cursor as usual
        assert box.text == "second one"


@pytest.mark.asyncio
async def test_autosave_failure_warns_once_and_the_chat_goes_on(isolated_home: Path) -> None:
    isolated_home.mkdir(parents=True, exist_ok=True)
    (isolated_home / "conversations").write_text("a file where the folder should be")
    session = FakeSession()
    app = make_app(session)
    async with app.run_test() as pilot:
        seen = record_notifications(app)
        await ready(pilot)
        await send(pilot, "one")
        await send(pilot, "two")
        failures = [s for s in seen if s[1] == "Could not autosave the conversation"]
        assert len(failures) == 1 and failures[0][2] == "warning"
        assert "conversations" in failures[0][0]
        assert [t.answer for t in app.chat.conversation.turns] == ["OK.", "OK."]


@pytest.mark.asyncio
async def test_edit_sends_the_file_with_the_instruction_and_predicts_it(tmp_path: Path) -> None:
    source = tmp_path / "my app.py"
    source.write_text("def load(path):\n    return open(path).read()\n")
    session = FakeSession([ScriptedAnswer.plain("Done.")])
    app = make_app(session)
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, f'/edit "{source}" rename load to read\nand keep the rest')
        message = session.calls[0][-1]["content"]
        assert message.startswith("rename load to read\nand keep the rest")
        assert source.read_text().rstrip() in message
        assert session.params[0].prediction == tuple(ord(c) for c in source.read_text())


@pytest.mark.asyncio
async def test_edit_of_a_missing_file_sends_nothing_and_says_why(tmp_path: Path) -> None:
    session = FakeSession([ScriptedAnswer.plain("Done.")])
    app = make_app(session)
    async with app.run_test() as pilot:
        await ready(pilot)
        seen = record_notifications(app)
        await send(pilot, f"/edit {tmp_path / 'nope.py'} fix it", wait=False)
        await pilot.pause()
        assert session.calls == []
        assert any("file not found" in title for _, title, _ in seen), seen
        assert app.query_one(ChatInput).text.startswith("/edit")  # kept, to correct


PERSON_SCHEMA = (
    '{"type": "object", "properties": {"name": {"type": "string"}, "born": {"type": "integer"}},'
    ' "required": ["name", "born"]}'
)


@pytest.mark.asyncio
async def test_schema_sends_the_message_and_constrains_its_answer(tmp_path: Path) -> None:
    schema = tmp_path / "my person.json"
    schema.write_text(PERSON_SCHEMA)
    session = FakeSession([ScriptedAnswer.plain('{"name": "Frank Herbert", "born": 1920}')])
    app = make_app(session)
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, f'/schema "{schema}" Who wrote Dune?\nAnd when was he born?')
        assert session.calls[0][-1]["content"] == "Who wrote Dune?\nAnd when was he born?"
        grammar = session.grammars[0]
        assert grammar is not None and "root" in grammar and '\\"born\\"' in grammar
        await send(pilot, "and a plain question")
        assert session.grammars[1] is None  # the next message is free again


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("typed", "title"),
    [
        ("/schema", "/schema needs a file"),
        ("/schema {schema}", "/schema needs a message"),
        ("/schema {missing} who?", "schema file not found"),
        ("/schema {bad} who?", "/schema:"),
    ],
)
async def test_a_schema_command_that_cannot_be_carried_out_sends_nothing(
    tmp_path: Path, typed: str, title: str
) -> None:
    (tmp_path / "ok.json").write_text(PERSON_SCHEMA)
    (tmp_path / "bad.json").write_text('{"type": "object", "properties": ')
    paths = {"schema": tmp_path / "ok.json", "missing": tmp_path / "no.json",
             "bad": tmp_path / "bad.json"}  # fmt: skip
    session = FakeSession([ScriptedAnswer.plain("{}")])
    app = make_app(session)
    async with app.run_test() as pilot:
        await ready(pilot)
        seen = record_notifications(app)
        await send(pilot, typed.format(**paths), wait=False)
        await pilot.pause()
        assert session.calls == []
        assert any(t.startswith(title) for _, t, _ in seen), seen
        assert app.query_one(ChatInput).text.startswith("/schema")  # kept, to correct
