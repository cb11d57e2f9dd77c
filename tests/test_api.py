"""The Python API (localspec/api/) used as a script uses it, on the tiny test pair: open
as a context manager, complete and chat, streamed or not, typed errors for bad options and
prompts, nothing kept of the user's unless asked. The scripts of docs/python-api.md run
here too, the tiny pair in place of the default one."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import localspec
from localspec.core.events import Finished, PrefillDone, RoundCompleted, TokenEmitted
from localspec.errors import ContextOverflowError, InputError, LocalspecError, UsageError
from tests.test_tools import write_tools_pair

DOCS = Path(__file__).resolve().parent.parent / "docs" / "python-api.md"
REPEATING = "the cat and the dog and the cat and the dog and the cat and the"


@pytest.fixture(scope="module")
def pair(tiny_pair):
    """One pair for the tests that only generate (not measured: calibrate=False)."""
    target, draft, _ = tiny_pair
    with localspec.load(target, draft, ctx=512, threads=1, calibrate=False) as speculator:
        yield speculator


def load_tiny(tiny_pair, **options):
    target, draft, _ = tiny_pair
    return localspec.load(target, draft, ctx=512, threads=1, **options)


def test_import_localspec_loads_no_model_library():
    code = (
        "import sys, localspec\n"
        "print(sorted(m for m in ('llama_cpp', 'localspec.api', 'pydantic') if m in sys.modules))\n"
        "assert 'load' in dir(localspec)\n"
        "assert sorted(localspec.__all__) == sorted(localspec._EXPORTS)\n"
        "assert localspec.TokenEmitted.__module__ == 'localspec.core.events'\n"
        "print(callable(localspec.load))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "True"]
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        localspec.nothing  # noqa: B018


def test_a_script_completes_with_the_pair_as_a_context_manager(tiny_pair):
    with load_tiny(tiny_pair, calibrate=False) as pair:
        assert not pair.closed and pair.drafter == "auto" and pair.draft is not None
        result = pair.complete("def fib(n):", max_tokens=12)
    assert pair.closed
    assert isinstance(result, localspec.Completion)
    assert result.text and len(result.token_ids) == 12
    assert result.finish_reason == localspec.FinishReason.LENGTH
    assert isinstance(result.stats, localspec.GenerationStats)
    assert result.stats.generated_tokens == 12 and result.stats.prompt_tokens > 0
    assert result.message == {"role": "assistant", "content": result.text}


def test_the_streamed_events_make_the_final_answer(pair):
    stream = pair.stream_complete(REPEATING, max_tokens=20, raw=True)
    assert stream.result is None  # nothing runs before it is read
    events = list(stream)
    assert isinstance(events[0], PrefillDone) and isinstance(events[-1], Finished)
    assert any(isinstance(e, RoundCompleted) for e in events)
    emitted = [e for e in events if isinstance(e, TokenEmitted)]
    finished = events[-1]
    result = stream.result
    assert result is not None and result.text == finished.text
    assert "".join(e.text for e in emitted) + finished.tail == result.text
    assert tuple(e.token_id for e in emitted) == result.token_ids
    assert stream.text == result.text
    assert result.stats.generated_tokens == len(emitted) == 20
    again = pair.stream_complete(REPEATING, max_tokens=20, raw=True)
    assert "".join(again.pieces()) == result.text == again.result.text


def test_a_stop_string_ends_the_text_and_the_pieces_hold_back_nothing(pair):
    full = pair.complete("the dog", max_tokens=24).text
    stop = full[8:11]  # the answer's own text, so that it stops there
    stream = pair.stream_complete("the dog", max_tokens=24, stop=stop)
    pieces = list(stream.pieces())
    result = stream.result
    assert result.finish_reason == localspec.FinishReason.STOP
    assert result.text == full[: full.index(stop)]
    assert "".join(pieces) == result.text


def test_chat_takes_openai_style_messages(pair):
    question = [{"role": "user", "content": "the cat"}]
    answer = pair.chat(question, max_tokens=10)
    assert answer.token_ids == pair.complete("the cat", max_tokens=10).token_ids
    with_system = [{"role": "system", "content": "Be brief."}, *question]
    streamed = pair.stream_chat(with_system, max_tokens=10)
    assert "".join(streamed.pieces()) == streamed.result.text
    assert (
        streamed.result.token_ids
        == pair.complete("the cat", system="Be brief.", max_tokens=10).token_ids
    )
    follow_up = [*question, answer.message, {"role": "user", "content": "and the dog"}]
    assert pair.chat(follow_up, max_tokens=5).stats.generated_tokens == 5


def test_greedy_output_is_the_same_whatever_the_drafter(tiny_pair):
    outputs = {}
    for drafter in ("none", "ngram", "model", "auto"):
        with load_tiny(tiny_pair, drafter=drafter) as pair:
            result = pair.complete(REPEATING, max_tokens=32, raw=True)
            outputs[drafter] = result.token_ids
            if drafter in ("ngram", "model"):  # auto may find that drafting does not pay
                assert result.stats.drafted > 0, drafter
            # The pair's default can be overridden per call.
            plain = pair.complete(REPEATING, max_tokens=32, raw=True, drafter="none")
            assert plain.token_ids == result.token_ids
    assert outputs["none"] == outputs["ngram"] == outputs["model"] == outputs["auto"]


def test_a_prediction_given_as_text_reaches_the_engine_as_tokens(pair, monkeypatch):
    plain = pair.complete("the cat", max_tokens=20, drafter="none")
    decoder = pair._session.decoder
    given = []
    generate = decoder.generate

    def spy(tokens, params, cancel=None, restored=None, **kw):
        given.append(params)
        return generate(tokens, params, cancel, restored, **kw)

    monkeypatch.setattr(decoder, "generate", spy)
    predicted = pair.complete("the cat", max_tokens=20, prediction=plain.text)
    assert given[0].prediction == tuple(pair._session.plain_tokens(plain.text))
    assert predicted.token_ids == plain.token_ids  # still the target's own


@pytest.mark.parametrize(
    "call, message, hint",
    [
        (dict(max_tokens=0), "invalid max_tokens: ", "help(localspec.Speculator.complete)"),
        (dict(temperatur=0.5), "unknown option 'temperatur'", "did you mean temperature?"),
        (dict(drafter="magic"), "invalid drafter 'magic'", "use auto, model, ngram"),
        (dict(top_p=2.0), "invalid top_p: ", "help(localspec.Speculator.complete)"),
        (dict(stop=3), "invalid stop: ", "help(localspec.Speculator.complete)"),
        (dict(drafter="self"), "drafter='self' drafts with a draft derived", "drafter='self'"),
        (dict(drafter="ngram", prediction="x"), "prediction is drafted from by", "drop"),
        (dict(raw=True, system="Be brief."), "a system prompt needs the chat template", "raw"),
    ],  # fmt: skip
)
def test_a_bad_generation_option_is_a_usage_error_with_a_hint(pair, call, message, hint):
    with pytest.raises(UsageError) as caught:
        pair.complete("the cat", **call)
    assert caught.value.message.startswith(message)
    assert hint in caught.value.hint


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(ctx=10), "invalid ctx: "),
        (dict(threads=0), "invalid threads: "),
        (dict(drafter="fast"), "invalid drafter 'fast'"),
        (dict(gpu_layers="most"), "invalid gpu_layers 'most'"),
        (dict(rpc_split="a,b"), "invalid rpc_split 'a,b'"),
        (dict(drafter="self", draft="other.gguf"), "drafter='self' drafts with the target's"),
    ],  # fmt: skip
)
def test_a_bad_load_option_is_a_usage_error_with_a_hint(tiny_pair, options, message):
    target, draft, _ = tiny_pair
    options = {"target": target, "draft": draft, **options}
    with pytest.raises(UsageError) as caught:
        localspec.load(**options)
    assert caught.value.message.startswith(message)
    assert caught.value.hint


def test_a_drafter_the_pair_cannot_run_is_a_usage_error(tiny_pair):
    with load_tiny(tiny_pair, drafter="ngram") as pair:
        assert pair.draft is None  # ngram loads no draft model
        with pytest.raises(UsageError, match="needs a draft model") as caught:
            pair.complete("the cat", drafter="model")
        assert "drafter='auto'" in caught.value.hint


@pytest.mark.parametrize(
    "method, argument",
    [
        ("complete", ""),
        ("complete", "  \n "),
        ("chat", []),
        ("chat", [{"role": "user", "content": "   "}]),
    ],  # fmt: skip
)
def test_an_empty_prompt_is_an_input_error(pair, method, argument):
    with pytest.raises(InputError) as caught:
        getattr(pair, method)(argument)
    assert caught.value.hint


def test_a_prompt_that_is_not_text_is_a_usage_error(pair):
    with pytest.raises(UsageError, match="must be text"):
        pair.complete(None)
    with pytest.raises(UsageError, match="a list of"):
        pair.chat("the cat")
    with pytest.raises(UsageError, match=r"messages\[0\] needs a role of system, user"):
        pair.chat([{"role": "robot", "content": "the cat"}])
    with pytest.raises(InputError, match="prediction is empty"):
        pair.complete("the cat", prediction=" ")


def test_a_prompt_the_context_cannot_hold_fails_at_the_call(pair):
    with pytest.raises(ContextOverflowError) as caught:
        pair.stream_complete("the cat " * 400, raw=True)  # raised before any event is read
    assert caught.value.n_ctx == 512 and "larger ctx" in caught.value.hint
    long_chat = [{"role": "user", "content": "the cat " * 400}]
    with pytest.raises(ContextOverflowError, match="the context holds 512"):
        pair.stream_chat(long_chat)


def test_a_stream_can_be_cancelled_and_a_new_call_ends_an_open_one(pair):
    reference = pair.complete(REPEATING, max_tokens=24, raw=True)
    stream = pair.stream_complete(REPEATING, max_tokens=24, raw=True)
    for event in stream:
        if isinstance(event, TokenEmitted):
            stream.cancel()
    assert stream.result.finish_reason == localspec.FinishReason.CANCELLED
    assert 0 < len(stream.result.token_ids) < 24
    left_open = pair.stream_complete(REPEATING, max_tokens=24, raw=True)
    next(left_open)
    next(left_open)  # the script stops reading it
    again = pair.complete(REPEATING, max_tokens=24, raw=True)
    assert left_open.result.finish_reason == localspec.FinishReason.CANCELLED
    assert again.token_ids == reference.token_ids  # the models were left consistent


def test_closing_twice_is_harmless_and_a_closed_pair_says_so(tiny_pair):
    pair = load_tiny(tiny_pair, calibrate=False)
    stream = pair.stream_complete("the cat", max_tokens=8)
    next(stream)
    pair.close()
    pair.close()
    assert pair.closed and "closed" in repr(pair)
    assert stream.result.finish_reason == localspec.FinishReason.CANCELLED
    with pytest.raises(UsageError, match="closed") as caught:
        pair.complete("the cat")
    assert "localspec.load" in caught.value.hint
    with load_tiny(tiny_pair, calibrate=False) as pair:
        pair.close()  # closed inside the with block, and again as it ends


def files_under(path: Path) -> list[Path]:
    return [p for p in path.rglob("*") if p.is_file()] if path.exists() else []


def test_a_script_keeps_nothing_of_the_users_unless_asked(tiny_pair, isolated_home, monkeypatch):
    monkeypatch.delenv("LOCALSPEC_HISTORY", raising=False)
    history = isolated_home / "datastores" / "history"
    learning = isolated_home / "learning"
    with load_tiny(tiny_pair) as pair:  # auto, measured: the history and learning are in play
        for _ in range(2):
            assert pair.complete(REPEATING, max_tokens=24, raw=True).stats.generated_tokens == 24
    assert files_under(history) == [] and files_under(learning) == []
    with load_tiny(tiny_pair, history=True, learn=True) as pair:
        pair.complete(REPEATING, max_tokens=24, raw=True)
    assert files_under(history) and files_under(learning)  # asked for: kept


def test_nothing_is_printed(tiny_pair, capfd):
    seen = []
    with load_tiny(tiny_pair, on_progress=seen.append) as pair:
        pair.complete("the cat", max_tokens=8)
        list(pair.stream_chat([{"role": "user", "content": "the dog"}], max_tokens=8))
    out, err = capfd.readouterr()
    assert (out, err) == ("", "")
    assert any("loading target" in progress.text for progress in seen)


def docs_scripts() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOCS.read_text(), re.S)


def test_the_scripts_of_the_docs_run_as_written(tiny_pair, tmp_path, capsys):
    target, draft, _ = tiny_pair
    tools_pair = write_tools_pair(tmp_path)  # the tool-call script's: a template with tools
    scripts = docs_scripts()
    assert len(scripts) == 4
    for script in scripts:
        assert script.count("localspec.load()") == 1
        t, d = tools_pair if "tools=" in script else (target, draft)
        tiny = f"localspec.load({str(t)!r}, {str(d)!r}, ctx=512, threads=1)"
        exec(compile(script.replace("localspec.load()", tiny), str(DOCS), "exec"), {})
    out = capsys.readouterr().out
    assert re.search(r"^30 tokens at [\d.]+ tok/s$", out, re.M)
    assert re.search(r"^round 0: \d+ of \d+ accepted$", out, re.M)
    assert "the prompt is empty / give the text to complete" in out


def test_every_error_the_api_raises_for_bad_input_is_typed(pair):
    """No traceback from deep inside: odd values of every kind come back as typed errors."""
    for call in (
        dict(max_tokens="many"),
        dict(seed=-5),
        dict(temperature=None, top_k="x"),
        dict(stop=["\n", 3]),
        dict(prediction=42),
        dict(system=7),
    ):
        with pytest.raises(LocalspecError):
            pair.complete("the cat", **call)


# A script whose second thread closes the pair, or starts a generation, while the first
# reads a stream: run as a process of its own, so that a crash is an exit status.
THREADS_SCRIPT = """
import sys, threading, localspec
from localspec.errors import UsageError

pair = localspec.load(sys.argv[1], sys.argv[2], ctx=2048, threads=1, calibrate=False)
stream = pair.stream_complete("the cat", max_tokens=1500, drafter="none")
read, events = threading.Event(), []

def reader():
    for event in stream:
        events.append(event)
        if len(events) == 5:
            read.set()

thread = threading.Thread(target=reader)
thread.start()
assert read.wait(30)
if sys.argv[3] == "start":
    try:
        pair.complete("the dog", max_tokens=4)
    except UsageError as err:
        print("refused:", err.message)
pair.close()  # from this thread, while the other reads
thread.join(30)
print("closed:", pair.closed, stream.result.finish_reason.value, len(events) < 1500)
"""


@pytest.mark.parametrize("then", ["close", "start"])
def test_a_pair_closed_from_another_thread_while_a_stream_is_read(tiny_pair, then):
    target, draft, _ = tiny_pair
    proc = subprocess.run(
        [sys.executable, "-c", THREADS_SCRIPT, str(target), str(draft), then],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    if then == "start":
        assert "refused: a generation is running in another thread" in proc.stdout
    assert "closed: True cancelled True" in proc.stdout, proc.stdout


def test_a_script_drafts_from_none_of_the_users_stores_unless_asked(tiny_pair, isolated_home):
    from typer.testing import CliRunner

    from localspec.cli.app import app

    target, draft, _ = tiny_pair
    source = isolated_home.parent / "notes.txt"
    source.write_text(REPEATING * 4)
    args = ["datastore", "add", str(source), "--name", "notes", "--target", str(target)]
    built = CliRunner().invoke(app, args)
    assert built.exit_code == 0, built.output
    with load_tiny(tiny_pair) as pair:  # a service's default: an oracle of nothing
        assert pair._session.store_corpora == [] and pair._session.answers == []
    with load_tiny(tiny_pair, stores=None) as pair:  # every store, as the command line
        assert [name for name, _ in pair._session.store_corpora] == ["notes"]
    with load_tiny(tiny_pair, stores=("notes",)) as pair:
        assert [name for name, _ in pair._session.store_corpora] == ["notes"]


CLOSE_WHILE_READING_SCRIPT = """
import sys, threading, time
import localspec
from localspec.errors import UsageError

pair = localspec.load(sys.argv[1], sys.argv[2], ctx=512, threads=1, calibrate=False)
session = pair._session
plain = session.text_tokens
began = threading.Event()

def slow(*args, **kwargs):  # a prompt that takes a while to tokenize
    began.set()
    time.sleep(0.5)
    return plain(*args, **kwargs)

session.text_tokens = slow
said = []

def call():
    try:
        said.append(pair.complete("the cat sat on the mat", max_tokens=4).finish_reason.value)
    except UsageError as err:
        said.append("refused")

thread = threading.Thread(target=call)
thread.start()
began.wait(10)
pair.close()  # while the other thread is still reading its prompt
thread.join(30)
try:
    pair.complete("the dog")
except UsageError as err:
    said.append(err.message)
print("said:", said)
"""


def test_a_pair_closed_while_another_thread_reads_its_prompt(tiny_pair):
    """``close`` waits for the prompt being read (the models are never freed under the
    tokenizer), the call ends cleanly, and the next call is refused."""
    target, draft, _ = tiny_pair
    proc = subprocess.run(
        [sys.executable, "-c", CLOSE_WHILE_READING_SCRIPT, str(target), str(draft)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    said = proc.stdout.split("said: ", 1)[1]
    assert said.startswith(("['refused',", "['cancelled',", "['length',")), said
    assert "this pair is closed" in said


def test_a_prompt_larger_than_a_context_can_hold_is_refused_before_tokenizing(pair, monkeypatch):
    def no_tokenizing(*args, **kwargs):
        raise AssertionError("tokenized")

    for method in ("text_tokens", "chat_tokens", "plain_tokens"):
        monkeypatch.setattr(pair._session, method, no_tokenizing)
    huge = "the cat " * (1 << 18)  # 2 MiB, past a 512-token context's 1 MiB
    with pytest.raises(InputError, match="larger than 1,048,576 bytes"):
        pair.complete(huge)
    with pytest.raises(InputError, match="the conversation is larger"):
        pair.chat([{"role": "user", "content": huge}])
    with pytest.raises(InputError, match="the prediction is larger"):
        pair.complete("the cat", prediction=huge)
    with pytest.raises(InputError, match="the prompt is larger"):
        pair.complete("the cat", raw=False, system=huge)
