"""``localspec serve`` end to end: a real server (uvicorn in a thread, a free loopback port)
over the tiny GGUF pair, driven by the official ``openai`` client and by raw HTTP."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest
import uvicorn
from fastapi.testclient import TestClient

from localspec.core.events import TARGET, Finished, PrefillDone, RoundCompleted, TokenEmitted
from localspec.core.params import GenerationParams
from localspec.core.stats import GenerationStats
from localspec.serve.access import Access
from localspec.serve.app import ServerState, create_app
from localspec.serve.openai_shapes import timings, usage
from localspec.serve.worker import GenerationWorker, Job
from localspec.session.open import open_session
from localspec.session.pair import ModelOptions

PROMPTS = [f"the cat {i} sat on the mat" for i in range(8)]
MAX = 24
FIM_PREFIX = "def add(a, b):\n    return "
FIM_SUFFIX = "\n\nprint(add(1, 2))\n"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tiny_pair):
    target, draft, _ = tiny_pair
    options = ModelOptions(target=str(target), draft=str(draft), n_ctx=256, threads=1,
                           calibrate=False)  # fmt: skip
    session = open_session(options)
    params = GenerationParams(max_tokens=MAX, drafter="model")
    # What the engine answers for each prompt before any serving (greedy).
    expected = {}
    for p in PROMPTS:
        events = list(session.chat([{"role": "user", "content": p}], params))
        expected[p] = events[-1].text
    reasons: list[str] = []
    plain_generate = session.generate

    def recording(tokens, params, cancel=None, **kw):
        for event in plain_generate(tokens, params, cancel, **kw):
            if isinstance(event, Finished):
                reasons.append(event.reason.value)
            yield event

    session.generate = recording
    worker = GenerationWorker(session, max_queue=16)
    worker.start()
    state = ServerState(defaults=params)
    state.serve_with(worker)  # as the loader does: the session's facts copied, then the worker
    port = _free_port()
    srv = uvicorn.Server(uvicorn.Config(create_app(state), host="127.0.0.1", port=port,
                                        log_level="warning"))  # fmt: skip
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.time() + 10
    while not srv.started and time.time() < deadline:
        time.sleep(0.02)
    url = f"http://127.0.0.1:{port}"
    yield {"url": url, "state": state, "expected": expected, "reasons": reasons,
           "session": session, "options": options}  # fmt: skip
    srv.should_exit = True
    thread.join(5)
    worker.stop()
    session.close()


@pytest.fixture(scope="module")
def fim_worker(fim_pair):
    target, draft = fim_pair
    options = ModelOptions(target=str(target), draft=str(draft), n_ctx=256, threads=1,
                           calibrate=False)  # fmt: skip
    session = open_session(options)
    worker = GenerationWorker(session, max_queue=16)
    worker.start()
    yield worker
    worker.stop()
    session.close()


@pytest.fixture
def fim_server(server, fim_worker, monkeypatch):
    """The shared server, answering from the pair with FIM tokens for one test."""
    state = server["state"]
    for name in ("worker", "model_id", "draft_id", "placement", "n_vocab",
                 "infill"):  # fmt: skip
        monkeypatch.setattr(state, name, getattr(state, name))  # restored after the test
    state.serve_with(fim_worker)
    return {**server, "worker": fim_worker}


def client(server, key="none"):
    return openai.OpenAI(base_url=server["url"] + "/v1", api_key=key, max_retries=0, timeout=30)


def ask(p):
    return [{"role": "user", "content": p}]


def test_chat_non_streamed_matches_the_engine(server):
    answer = client(server).chat.completions.create(model="x", messages=ask(PROMPTS[0]))
    assert answer.choices[0].message.content == server["expected"][PROMPTS[0]]
    assert answer.choices[0].finish_reason in ("length", "stop")
    assert answer.usage.completion_tokens > 0
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens
    timings = answer.model_extra["timings"]
    assert timings["predicted_n"] == answer.usage.completion_tokens
    for key in ("prompt_n", "prompt_ms", "predicted_ms", "predicted_per_second", "draft_n",
                "draft_n_accepted", "tokens_per_target_pass", "by_drafter"):  # fmt: skip
        assert key in timings
    assert timings["draft_n_accepted"] <= timings["draft_n"]


def _stats(prompt: int, evaluated: int, rounds: list[tuple[str | None, int, int, int]]):
    """A generation's stats from hand-built events: (drafter, drafted, accepted, emitted)."""
    stats = GenerationStats()
    stats.observe(PrefillDone(prompt, evaluated, 0.2))
    n = 0
    for i, (drafter, drafted, accepted, emitted) in enumerate(rounds):
        for j in range(emitted):
            stats.observe(TokenEmitted(n, "x", TARGET if j >= accepted else drafter, n))
            n += 1
        stats.observe(RoundCompleted(i, drafter, drafted, accepted, emitted, 0.1))
    return stats


def test_usage_and_timings_of_a_request_with_two_prompts():
    first = _stats(10, 4, [("model", 4, 3, 4), (None, 0, 0, 1)])
    second = _stats(6, 6, [("ngram", 8, 8, 9)])
    both = GenerationStats.merged([first, second])
    # Each prompt's last token is evaluated by its first round, never taken from the cache.
    assert usage(both, n_prompts=2) == {
        "prompt_tokens": 16, "completion_tokens": 14, "total_tokens": 30,
        "prompt_tokens_details": {"cached_tokens": 4},
    }  # fmt: skip
    assert timings(both, n_prompts=2) == {
        "cache_n": 4,
        "prompt_n": 12,
        "prompt_ms": 400.0,
        "prompt_per_second": 30.0,
        "predicted_n": 14,
        "predicted_ms": 300.0,
        "predicted_per_second": 46.667,
        "draft_n": 12,
        "draft_n_accepted": 11,
        "acceptance_rate": 0.9167,
        "tokens_per_target_pass": 4.6667,
        "target_passes": 3,
        "by_drafter": {
            "model": {
                "rounds": 1,
                "drafted": 4,
                "accepted": 3,
                "acceptance_rate": 0.75,
                "drafted_at": [1, 1, 1, 1],
                "accepted_at": [1, 1, 1, 0],
            },
            "ngram": {
                "rounds": 1,
                "drafted": 8,
                "accepted": 8,
                "acceptance_rate": 1.0,
                "drafted_at": [1] * 8,
                "accepted_at": [1] * 8,
            },
            "none": {
                "rounds": 1,
                "drafted": 0,
                "accepted": 0,
                "acceptance_rate": 0.0,
                "drafted_at": [],
                "accepted_at": [],
            },
        },
    }
    assert timings(first)["by_drafter"]["model"]["acceptance_rate"] == 0.75


def test_chat_streamed_with_usage_in_the_final_chunk(server):
    stream = client(server).chat.completions.create(
        model="x", messages=ask(PROMPTS[1]), stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == server["expected"][PROMPTS[1]]
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens > 0
    assert last.model_extra["timings"]["predicted_n"] == last.usage.completion_tokens
    assert [c for c in chunks if c.choices][-1].choices[0].finish_reason in ("length", "stop")


def test_follow_up_turn_reuses_the_cache(server):
    c = client(server)
    first = c.chat.completions.create(model="x", messages=ask("the dog ran"), max_tokens=8)
    history = ask("the dog ran") + [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "and then"},
    ]
    second = c.chat.completions.create(model="x", messages=history, max_tokens=8)
    t = second.model_extra["timings"]
    assert t["cache_n"] > 0 and t["prompt_n"] < second.usage.prompt_tokens


def test_completions_raw_prompt_streamed_and_not(server):
    c = client(server)
    whole = c.completions.create(model="x", prompt="the cat the cat", max_tokens=12)
    streamed = c.completions.create(model="x", prompt="the cat the cat", max_tokens=12,
                                    stream=True)  # fmt: skip
    assert "".join(ch.choices[0].text for ch in streamed) == whole.choices[0].text
    assert whole.usage.completion_tokens > 0 and whole.object == "text_completion"


def test_suffix_on_a_model_without_fim_tokens_is_a_400_naming_it(server):
    r = httpx.post(server["url"] + "/v1/completions",
                   json={"prompt": "def f(", "suffix": "):\n", "max_tokens": 4})  # fmt: skip
    assert r.status_code == 400
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == "suffix" and "FIM tokens" in error["message"]
    # An empty suffix is no suffix: a plain completion.
    plain = client(server).completions.create(model="x", prompt="def f(", suffix="", max_tokens=4)
    assert plain.choices[0].text


def test_fim_completion_is_what_the_engine_writes_from_the_fim_tokens(fim_server):
    session, params = fim_server["worker"].session, fim_server["state"].defaults
    tokens = session.infill_tokens(FIM_PREFIX, FIM_SUFFIX)
    expected = list(session.generate(tokens, params))[-1]  # the worker is idle meanwhile
    c = client(fim_server)
    answer = c.completions.create(model="x", prompt=FIM_PREFIX, suffix=FIM_SUFFIX)
    assert answer.choices[0].text == expected.text and expected.text
    assert answer.choices[0].finish_reason in ("length", "stop")
    assert answer.usage.prompt_tokens == len(tokens)
    assert answer.usage.completion_tokens == len(expected.token_ids)
    assert answer.model_extra["timings"]["predicted_n"] == len(expected.token_ids)
    streamed = c.completions.create(model="x", prompt=FIM_PREFIX, suffix=FIM_SUFFIX, stream=True)
    assert "".join(ch.choices[0].text for ch in streamed) == expected.text


def test_fim_prompt_and_suffix_longer_than_the_context(fim_server):
    with pytest.raises(openai.BadRequestError) as err:
        client(fim_server).completions.create(model="x", prompt="def f(", suffix="the cat " * 200)
    assert err.value.body["code"] == "context_length_exceeded"
    assert err.value.body["param"] == "prompt"
    with pytest.raises(openai.BadRequestError) as err:
        client(fim_server).completions.create(model="x", prompt=[1, 2, 3], suffix="x")
    assert err.value.body["param"] == "prompt"


def test_parse_special_lets_a_prompt_carry_its_own_fim_tokens(fim_server, monkeypatch):
    # What an editor that renders the model's FIM template itself sends (Continue).
    prompt = f"<|fim_prefix|>{FIM_PREFIX}<|fim_suffix|>{FIM_SUFFIX}<|fim_middle|>"
    session, params = fim_server["worker"].session, fim_server["state"].defaults
    c = client(fim_server)
    as_text = c.completions.create(model="x", prompt=prompt, max_tokens=2)
    monkeypatch.setattr(fim_server["state"], "parse_special", True)
    tokens = session.text_tokens(prompt, raw=True, parse_special=True)
    fim = session.fim
    assert [t for t in tokens if t in (fim.pre, fim.suf, fim.mid)] == [fim.pre, fim.suf, fim.mid]
    expected = list(session.generate(tokens, params))[-1]
    answer = c.completions.create(model="x", prompt=prompt)
    assert answer.choices[0].text == expected.text
    assert answer.usage.prompt_tokens == len(tokens) < as_text.usage.prompt_tokens
    # Chat messages keep control-token text as text whatever the option says.
    chat = c.chat.completions.create(model="x", messages=ask("<|fim_prefix|>"), max_tokens=2)
    assert chat.usage.prompt_tokens == len(session.chat_tokens(ask("<|fim_prefix|>")))


def test_a_list_of_prompts_gives_one_choice_each_in_order(server):
    c = client(server)
    prompts = ["the cat the cat", "a dog and", "to the"]
    alone = [c.completions.create(model="x", prompt=p, max_tokens=8) for p in prompts]
    together = c.completions.create(model="x", prompt=prompts, max_tokens=8)
    assert [ch.index for ch in together.choices] == [0, 1, 2]
    assert [ch.text for ch in together.choices] == [a.choices[0].text for a in alone]
    for field in ("prompt_tokens", "completion_tokens", "total_tokens"):
        assert getattr(together.usage, field) == sum(getattr(a.usage, field) for a in alone)
    timings = together.model_extra["timings"]
    assert timings["predicted_n"] == together.usage.completion_tokens
    assert timings["draft_n"] == sum(a.model_extra["timings"]["draft_n"] for a in alone)

    stream = c.completions.create(model="x", prompt=prompts, max_tokens=8, stream=True,
                                  stream_options={"include_usage": True})  # fmt: skip
    texts, reasons, chunks = ["", "", ""], [None, None, None], list(stream)
    for ch in chunks[:-1]:
        (choice,) = ch.choices
        texts[choice.index] += choice.text
        if choice.finish_reason:
            assert reasons[choice.index] is None  # one finish per choice
            reasons[choice.index] = choice.finish_reason
    assert texts == [ch.text for ch in together.choices] and None not in reasons
    assert chunks[-1].choices == [] and chunks[-1].usage == together.usage


def test_a_prompt_that_fails_ends_the_request_with_a_500(server, monkeypatch):
    session, calls = server["session"], []
    plain = session.generate

    def second_fails(tokens, params, cancel=None, **kw):
        calls.append(tokens)
        if len(calls) == 2:
            raise RuntimeError("the second prompt broke")
        return plain(tokens, params, cancel, **kw)

    monkeypatch.setattr(session, "generate", second_fails)
    r = httpx.post(server["url"] + "/v1/completions",
                   json={"prompt": ["the cat", "a dog", "to the"], "max_tokens": 4})  # fmt: skip
    assert r.status_code == 500 and r.json()["error"]["code"] == "internal_error"
    assert "second prompt broke" not in r.text  # logged on the server, never sent
    assert len(calls) == 2  # the third never ran


def test_token_id_prompts_are_taken_as_they_are(server):
    c = client(server)
    tokens = server["session"].text_tokens("the cat the cat", raw=True)
    text = c.completions.create(model="x", prompt="the cat the cat", max_tokens=8)
    by_ids = c.completions.create(model="x", prompt=tokens, max_tokens=8)
    assert by_ids.choices[0].text == text.choices[0].text
    assert by_ids.usage.prompt_tokens == len(tokens)
    several = c.completions.create(model="x", prompt=[tokens, tokens[:3]], max_tokens=8)
    assert [ch.index for ch in several.choices] == [0, 1]
    assert several.choices[0].text == text.choices[0].text


@pytest.mark.parametrize(
    "prompt, says",
    [(["the cat"] * 17, "at most 16"), ([1, 2, 10**6], "outside the vocabulary"),
     ([[1, 2], [-1]], "prompt[1] has token id -1"), ([True, False], "must be a string"),
     ([], "must be a string"), ("", "empty"), (["a", 3.5], "prompt[1] must be"),
     ({"text": "a"}, "must be a string")],
)  # fmt: skip
def test_bad_prompts_get_a_400_naming_prompt(server, prompt, says):
    r = httpx.post(server["url"] + "/v1/completions", json={"prompt": prompt, "max_tokens": 2})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "prompt" and says in error["message"], error


def test_one_prompt_over_the_context_refuses_the_whole_list_before_any_runs(server):
    before = len(server["reasons"])
    with pytest.raises(openai.BadRequestError) as err:
        client(server).completions.create(model="x", prompt=["the cat", "the cat " * 200])
    assert err.value.body["code"] == "context_length_exceeded"
    assert err.value.body["param"] == "prompt"
    assert len(server["reasons"]) == before  # nothing was generated


def test_stop_string_cuts_the_answer(server):
    full = server["expected"][PROMPTS[2]]
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    assert stop.strip(), full
    answer = client(server).chat.completions.create(
        model="x", messages=ask(PROMPTS[2]), stop=[stop]
    )
    text = answer.choices[0].message.content
    assert text == full[: full.index(stop)]
    assert answer.choices[0].finish_reason == "stop"


def test_seed_reproducibility_when_sampling(server):
    c = client(server)

    def sample(seed):
        answer = c.chat.completions.create(
            model="x", messages=ask("once upon"), temperature=1.5, seed=seed, max_tokens=16
        )
        return answer.choices[0].message.content

    assert sample(7) == sample(7)
    assert len({sample(s) for s in (1, 2, 3, 4)}) > 1


@pytest.mark.parametrize(
    "extra, param",
    [({"n": 2}, "n"), ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
     ({"logprobs": "yes"}, "logprobs"), ({"response_format": {"type": "xml"}},
     "response_format"), ({"temperature": -1}, "temperature")],
)  # fmt: skip
def test_unsupported_or_bad_fields_get_a_400_naming_them(server, extra, param):
    body = {"model": "x", "messages": ask("hi"), **extra}
    r = httpx.post(server["url"] + "/v1/chat/completions", json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == param and set(error) == {"message", "type", "param", "code"}


def test_bad_json_and_context_overflow(server):
    r = httpx.post(server["url"] + "/v1/chat/completions", content=b"{nope",
                   headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_json"
    with pytest.raises(openai.BadRequestError) as err:
        client(server).chat.completions.create(model="x", messages=ask("the cat " * 200))
    assert err.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as err:
        client(server).completions.create(model="x", prompt="the cat " * 200)
    assert err.value.body["code"] == "context_length_exceeded"
    r = httpx.post(server["url"] + "/v1/chat/completions", content=b"x" * (2 << 20),
                   headers={"content-type": "application/json"})  # fmt: skip
    assert r.status_code == 413


def test_api_key_required_except_on_health(server, monkeypatch):
    monkeypatch.setattr(server["state"], "access", Access(keys=("s3cret",)))
    with pytest.raises(openai.AuthenticationError):
        client(server, key="wrong").models.list()
    r = httpx.post(server["url"] + "/v1/chat/completions", json={"messages": ask("hi")})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(server["url"] + "/health").json()["status"] == "ok"
    models = client(server, key="s3cret").models.list()
    assert models.data[0].id == "target" and models.data[0].model_extra["draft"] == "draft"


def test_eight_concurrent_streams_complete_in_arrival_order(server):
    results: dict[int, tuple[str, float]] = {}

    def run(i):
        stream = client(server).chat.completions.create(model="x", messages=ask(PROMPTS[i]),
                                                        stream=True)  # fmt: skip
        text, first = "", None
        for chunk in stream:
            piece = chunk.choices[0].delta.content if chunk.choices else None
            if piece:
                first = first or time.monotonic()
                text += piece
        results[i] = (text, first)

    worker = server["state"].worker
    threads = []
    for i in range(8):
        before = worker.submitted
        threads.append(threading.Thread(target=run, args=(i,)))
        threads[-1].start()
        deadline = time.time() + 10
        while worker.submitted == before and time.time() < deadline:
            time.sleep(0.002)  # a definite arrival order: request i is queued before i+1
    for t in threads:
        t.join(30)
    assert len(results) == 8
    for i, p in enumerate(PROMPTS):
        assert results[i][0] == server["expected"][p]
    firsts = [results[i][1] for i in range(8)]
    assert firsts == sorted(firsts)


def test_a_disconnected_client_frees_the_engine(server):
    server["reasons"].clear()
    body = {"messages": ask("the cat sat"), "stream": True, "max_tokens": 200,
            "temperature": 0.0}  # fmt: skip
    with httpx.stream("POST", server["url"] + "/v1/chat/completions", json=body) as r:
        next(r.iter_lines())  # the role chunk: generation is under way
    deadline = time.time() + 10
    while server["reasons"] == [] and time.time() < deadline:
        time.sleep(0.01)
    assert server["reasons"] == ["cancelled"]
    answer = client(server).chat.completions.create(model="x", messages=ask(PROMPTS[3]))
    assert answer.choices[0].message.content == server["expected"][PROMPTS[3]]


def test_full_queue_answers_503_with_retry_after(server, monkeypatch):
    idle = GenerationWorker(server["session"], max_queue=1)  # not started: jobs just wait
    idle.submit(Job(lambda s, c: iter(()), GenerationParams()))
    monkeypatch.setattr(server["state"], "worker", idle)
    r = httpx.post(server["url"] + "/v1/chat/completions", json={"messages": ask("hi")})
    assert r.status_code == 503 and r.headers["retry-after"]
    assert r.json()["error"]["code"] == "queue_full"


def test_a_warning_among_a_jobs_events_reaches_the_servers_log(server):
    """A failed history or learning save is an ``EngineWarning`` in the answer's events: an
    answer has no place for it, so the operator reads it in the log."""
    import logging

    from localspec.core.events import EngineWarning

    logged: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: logged.append(record.getMessage())
    logging.getLogger("localspec.serve").addHandler(handler)
    worker = GenerationWorker(server["session"], max_queue=1)
    worker.start()
    try:
        warned = [EngineWarning("the history could not be written")]
        job = worker.submit(Job(lambda s, c: iter(warned), GenerationParams()))
        assert job.events.get(timeout=10) == warned[0]  # still handed on
        assert job.events.get(timeout=10) is None
    finally:
        worker.stop()
        logging.getLogger("localspec.serve").removeHandler(handler)
    assert logged == ["the history could not be written"]


def test_same_greedy_text_as_localspec_complete(server, tiny_pair):
    target, draft, _ = tiny_pair
    proc = subprocess.run(
        [sys.executable, "-m", "localspec.cli.app", "complete", "--json", "--max-tokens",
         str(MAX), "--drafter", "model", "--target", str(target), "--draft", str(draft),
         "--ctx", "256", "--threads", "1"],
        input=PROMPTS[4].encode(), capture_output=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    assert json.loads(proc.stdout)["text"] == server["expected"][PROMPTS[4]]


def test_loopback_detection_for_the_no_key_warning():
    from localspec.cli.common import is_loopback

    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.2")


def test_serve_with_a_missing_model_exits_with_the_clear_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "localspec.cli.app", "serve", "--port", str(_free_port()),
         "--target", str(tmp_path / "missing.gguf"), "--drafter", "none"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 1
    assert "error: model file not found" in proc.stderr and "Traceback" not in proc.stderr


def test_a_pair_that_cannot_be_loaded_stops_the_server_which_exits_with_its_error(
    monkeypatch,
):
    from typer.testing import CliRunner

    from localspec.cli import serve as serve_cli
    from localspec.cli.app import app
    from localspec.cli.serve import load_into
    from localspec.errors import UsageError
    from localspec.serve.server import run
    from localspec.session import open as open_module

    def broken(options, on_progress=None):
        raise UsageError("the pair is broken", "mend it")

    monkeypatch.setattr(open_module, "open_session", broken)
    state = ServerState(defaults=GenerationParams(), loading=True)
    state.loader = threading.Thread(target=load_into, args=(state, None, 4), daemon=True)
    state.loader.start()
    assert run(state, "127.0.0.1", _free_port()) is True  # stopped; nothing loaded to free
    assert isinstance(state.load_error, UsageError) and not state.loading
    assert state.worker is None and not state.loader.is_alive()
    # The server's log would keep a handler on the runner's stream, closed once it returns.
    monkeypatch.setattr(serve_cli, "_log_to_stderr", lambda: None)
    result = CliRunner().invoke(app, ["serve", "--port", str(_free_port()), "--drafter", "none"])
    assert result.exit_code == 2, result.output  # the error's own code, not the server's
    assert "error: the pair is broken\nhint: mend it\n" in result.output


PREFLIGHT = {"Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type"}  # fmt: skip


TESTSERVER = ("testserver",)  # the Host TestClient sends


def test_no_cors_headers_without_cors_origin():
    state = ServerState(defaults=GenerationParams(), access=Access(allowed_hosts=TESTSERVER))
    http = TestClient(create_app(state))
    origin = {"Origin": "http://127.0.0.1:3000"}
    r = http.options("/v1/chat/completions", headers={**origin, **PREFLIGHT})
    assert "access-control-allow-origin" not in r.headers
    assert r.status_code == 403 and set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert "access-control-allow-origin" not in http.get("/health", headers=origin).headers
    r = http.options("/v1/chat/completions", headers=PREFLIGHT)  # no page: no CORS either
    assert r.status_code == 405 and "access-control-allow-origin" not in r.headers


def test_cors_preflight_is_allowed_for_the_named_origin_only():
    allowed = "http://localhost:3000"
    access = Access(allowed_hosts=TESTSERVER, cors_origins=(allowed,), keys=("k",))
    state = ServerState(defaults=GenerationParams(), access=access)
    http = TestClient(create_app(state))
    # A preflight carries no key: the browser sends it before the request that does.
    r = http.options("/v1/chat/completions", headers={"Origin": allowed, **PREFLIGHT})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == allowed
    assert "POST" in r.headers["access-control-allow-methods"]
    assert "authorization" in r.headers["access-control-allow-headers"].lower()
    assert http.get("/health", headers={"Origin": allowed}).headers[
        "access-control-allow-origin"] == allowed  # fmt: skip
    other = {"Origin": "http://evil.example"}
    r = http.options("/v1/chat/completions", headers={**other, **PREFLIGHT})
    assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
    assert "access-control-allow-origin" not in http.get("/health", headers=other).headers


def test_loading_answers_503_until_the_pair_is_loaded(server, monkeypatch):
    from localspec.cli.serve import load_into
    from localspec.session import open as open_module

    loaded = threading.Event()  # the fake load finishes only when the test says so

    def slow_open(options, on_progress=None):
        assert loaded.wait(10)
        return server["session"]

    monkeypatch.setattr(open_module, "open_session", slow_open)
    state = ServerState(defaults=GenerationParams(max_tokens=4, drafter="model"),
                        access=Access(allowed_hosts=TESTSERVER))  # fmt: skip
    loader = threading.Thread(target=load_into, args=(state, server["options"], 4), daemon=True)
    loader.start()
    with TestClient(create_app(state)) as http:
        r = http.get("/health")
        assert r.status_code == 503 and r.json() == {"status": "loading"}
        for method, path in [("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
                             ("GET", "/v1/models")]:  # fmt: skip
            r = http.request(method, path, json={"prompt": "a", "messages": ask("a")})
            assert r.status_code == 503 and int(r.headers["retry-after"]) > 0, path
            assert r.json()["error"]["code"] == "loading"
        loaded.set()
        loader.join(10)
        try:
            assert http.get("/health").json()["status"] == "ok"
            assert http.get("/v1/models").json()["data"][0]["id"] == "target"
            r = http.post("/v1/completions", json={"prompt": "the cat"})
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        finally:
            state.worker.stop()


# -- predicted outputs and per-request speculation ------------------------------------------


def test_a_prediction_through_the_openai_client_is_counted_and_changes_nothing(server):
    auto = {"speculative": {"drafter": "auto"}}  # this server's default is model
    plain = client(server).chat.completions.create(
        model="x", messages=ask(PROMPTS[1]), max_tokens=40, extra_body=auto
    )
    text = plain.choices[0].message.content
    predicted = client(server).chat.completions.create(
        model="x",
        messages=ask(PROMPTS[1]),
        max_tokens=40,
        prediction={"type": "content", "content": text},
        extra_body=auto,
    )
    assert predicted.choices[0].message.content == text  # greedy: the target's own
    # Whether it was drafted from depends on the machine's costs (the engine's tests and the
    # bench show that); what the usage says of it does not.
    details = predicted.usage.completion_tokens_details
    completion = predicted.usage.completion_tokens
    assert details.accepted_prediction_tokens >= completion - 2  # the whole answer, bar joins
    assert details.rejected_prediction_tokens <= 2
    assert plain.usage.completion_tokens_details is None  # no prediction, no counts


def test_a_prediction_in_text_parts_and_when_streamed(server):
    parts = [{"type": "text", "text": "The cat "}, {"type": "text", "text": "sat down."}]
    stream = client(server).chat.completions.create(
        model="x", messages=ask("hi"), max_tokens=8, stream=True,
        stream_options={"include_usage": True},
        prediction={"type": "content", "content": parts},
        extra_body={"speculative": {"drafter": "auto"}},  # this server's default is model
    )  # fmt: skip
    chunks = list(stream)
    details = chunks[-1].usage.completion_tokens_details
    total = details.accepted_prediction_tokens + details.rejected_prediction_tokens
    assert total > 0  # every token of the prediction is one or the other


def test_speculation_can_be_turned_off_or_bounded_for_one_request(server):
    body = {"model": "x", "messages": ask(PROMPTS[0]), "max_tokens": 24}
    url = server["url"] + "/v1/chat/completions"
    off = httpx.post(url, json={**body, "speculative": {"drafter": "none"}}).json()
    assert off["timings"]["draft_n"] == 0
    assert off["choices"][0]["message"]["content"] == server["expected"][PROMPTS[0]]
    short = httpx.post(url, json={**body, "speculative.n_max": 1, "speculative.p_min": 0.9})
    timings = short.json()["timings"]
    assert timings["draft_n"] <= timings["target_passes"]  # at most one token a pass


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"prediction": "just text"}, "prediction"),
        ({"prediction": {"type": "content", "content": [{"type": "image"}]}},
         "prediction.content"),
        ({"speculative": {"n_maxx": 4}}, "speculative.n_maxx"),
        ({"speculative.drafter": "turbo"}, "speculative.drafter"),
        ({"speculative": {"n_max": 0}}, "speculative.n_max"),
        ({"speculative": {"n_max": 1000}}, "speculative.n_max"),
        ({"speculative.p_min": 2}, "speculative.p_min"),
        ({"speculative.n_min": 0}, "speculative.n_min"),
        ({"speculative": "fast"}, "speculative"),
    ],
)  # fmt: skip
def test_bad_prediction_or_speculation_gets_a_400_naming_the_field(server, extra, param):
    body = {"model": "x", "messages": ask("hi"), **extra}
    r = httpx.post(server["url"] + "/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_a_drafter_or_prediction_the_server_cannot_run_is_a_400_naming_its_field():
    """The session's preflight refuses them; the server words each for its JSON fields."""
    from localspec.errors import ConflictingOptionsError, ContextOverflowError, MissingDraftError
    from localspec.serve.openai_shapes import ApiError
    from localspec.serve.replies import raise_for

    with pytest.raises(ApiError, match="this server has no draft model") as err:
        raise_for(MissingDraftError("model"), chat=True)
    assert err.value.status == 400 and err.value.body["error"]["param"] == "speculative.drafter"
    with pytest.raises(ApiError, match="serve --draft self") as err:
        raise_for(MissingDraftError("self", derived=True), chat=True)
    assert err.value.body["error"]["param"] == "speculative.drafter"
    with pytest.raises(ApiError, match="speculative.drafter auto, not ngram") as err:
        raise_for(ConflictingOptionsError("prediction", "drafter", "ngram", "x"), chat=True)
    assert err.value.body["error"]["param"] == "prediction"
    with pytest.raises(ApiError) as err:
        raise_for(ContextOverflowError(n_tokens=600, n_ctx=512), chat=False)
    error = err.value.body["error"]
    assert error["param"] == "prompt" and error["code"] == "context_length_exceeded"
    assert "600 tokens" in error["message"] and "--ctx" not in error["message"]


def test_a_prediction_with_another_drafter_is_refused_before_the_job_is_queued():
    from localspec.serve.openai_shapes import ApiError
    from localspec.serve.requests import _check_options

    with pytest.raises(ApiError, match="drop one or the other") as err:
        _check_options(GenerationParams(drafter="model"), "the text")
    assert err.value.body["error"]["param"] == "prediction"
    _check_options(GenerationParams(drafter="auto"), "the text")
    _check_options(GenerationParams(drafter="model"), None)


def test_prediction_counts_match_the_two_token_lists_in_order():
    from localspec.core.drafting.prediction import prediction_counts

    assert prediction_counts([1, 2, 3, 4], [1, 2, 3, 4]) == (4, 0)
    assert prediction_counts([1, 2, 3, 4], [0, 1, 2, 9, 4]) == (3, 1)
    assert prediction_counts([1, 2, 3], []) == (0, 3)
