"""``localspec serve`` as a server left running: who can reach it (``Host``, ``Origin``,
body type, keys), what each client can learn of the others (its own cache, history and
drafts; ``--no-timings``), the bounds of a request, and errors that never show the server's
insides. Driven with the real HTTP client against the real server over the tiny pair."""

from __future__ import annotations

import contextlib
import json
import signal
import threading
import time
import types
from dataclasses import replace

import httpx
import pytest

from localspec.core.params import GenerationParams
from localspec.serve.access import Access, host_name
from localspec.session.open import open_session
from localspec.storage.library import Library
from tests.serving import serve_options, serve_process, serving, slowed

CHAT = "/v1/chat/completions"
LONG_CTX = 8192  # an answer long enough to be under way when the server is stopped
PROMPT = "the cat sat on the mat and the dog sat on the log"


@pytest.fixture(scope="module")
def session(tiny_pair):
    session = open_session(serve_options(tiny_pair))
    # Verifying priced as nearly free (as on a GPU), so that auto drafts whatever a store
    # offers and what a client could learn through timings shows in every answer.
    plain = session.costs.plain_s
    verify = {k: plain * (1 + 0.04 * k) for k in session.costs.verify_s}
    session.decoder.costs = replace(session.costs, verify_s=verify)
    yield session
    session.close()


def ask(text: str = PROMPT, **extra) -> dict:
    return {"messages": [{"role": "user", "content": text}], **extra}


def post(url: str, body: dict | None = None, key: str | None = None, **kw) -> httpx.Response:
    headers = kw.pop("headers", {})
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.post(url + CHAT, json=body if body is not None else ask(), headers=headers,
                      timeout=30, **kw)  # fmt: skip


def assert_error(r: httpx.Response, status: int, code: str | None = None, param=None) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if code is not None:
        assert error["code"] == code, error
    if param is not None:
        assert error["param"] == param, error
    return error


# -- who can reach it ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "header, name",
    [("127.0.0.1:8080", "127.0.0.1"), ("LOCALHOST", "localhost"), ("[::1]:80", "::1"),
     ("example.com.", "example.com"), ("a:b", None), ("[::1", None), ("::1", None), ("", None)],
)  # fmt: skip
def test_host_names_are_read_as_browsers_send_them(header, name):
    assert host_name(header) == name


def test_which_hosts_a_server_answers_to():
    local = Access(bound="127.0.0.1")
    for ok in ("127.0.0.1:8080", "localhost:8080", "app.localhost", "[::1]:8080", "127.0.0.2"):
        assert local.host_allowed(ok), ok
    for refused in ("evil.example", "evil.example:8080", "192.168.1.5:8080", "127.0.0.1.nip.io"):
        assert not local.host_allowed(refused), refused
    assert Access(bound="127.0.0.1", allowed_hosts=("Box.Lan",)).host_allowed("box.lan:8080")
    everywhere = Access(bound="0.0.0.0")
    assert everywhere.host_allowed("192.168.1.5:8080") and not everywhere.host_allowed("evil.io")
    assert Access(bound="myhost.lan").host_allowed("myhost.lan:8080")
    assert Access(allowed_hosts=("*",)).host_allowed("anything.example")


def test_a_foreign_host_is_refused_before_anything_runs(session):
    # DNS rebinding: a page's own domain, now resolving to 127.0.0.1, arrives as Host.
    with serving(session) as served:
        for path in (CHAT, "/v1/models", "/health"):
            r = httpx.request("POST" if path == CHAT else "GET", served.url + path, json=ask(),
                              headers={"Host": "evil.example:8080"})  # fmt: skip
            assert_error(r, 403, "host_not_allowed")
        assert served.worker.submitted == 0
        assert post(served.url, headers={"Host": f"localhost:{served.port}"}).status_code == 200
    access = Access(allowed_hosts=("box.lan",))
    with serving(session, access=access) as served:
        assert post(served.url, headers={"Host": "box.lan"}).status_code == 200


def test_pages_of_other_origins_and_bodies_other_than_json_are_refused(session):
    with serving(session) as served:
        # What fetch(url, {mode: "no-cors", body}) sends: a simple request, no preflight.
        page = {"Origin": "http://127.0.0.1:3000", "Content-Type": "text/plain"}
        r = httpx.post(served.url + CHAT, content=json.dumps(ask()), headers=page)
        assert_error(r, 403, "origin_not_allowed")
        r = httpx.post(served.url + CHAT, content=json.dumps(ask()),
                       headers={"Content-Type": "text/plain"})  # fmt: skip
        assert_error(r, 415, "unsupported_media_type")
        r = httpx.post(served.url + CHAT, content=json.dumps(ask()),
                       headers={"Content-Type": "application/x-www-form-urlencoded"})  # fmt: skip
        assert_error(r, 415)
        # A no-cors GET carries no Origin, but the browser says another site made it.
        r = httpx.get(served.url + "/v1/models", headers={"Sec-Fetch-Site": "cross-site"})
        assert_error(r, 403, "origin_not_allowed")
        preflight = {"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"}
        r = httpx.options(served.url + CHAT, headers=preflight)
        assert_error(r, 403, "origin_not_allowed")
        assert "access-control-allow-origin" not in r.headers
        assert served.worker.submitted == 0
        ok = post(served.url, headers={"Content-Type": "application/json; charset=utf-8"})
        assert ok.status_code == 200
    access = Access(cors_origins=("http://127.0.0.1:3000",))
    with serving(session, access=access) as served:
        r = post(served.url, headers={"Origin": "http://127.0.0.1:3000"})
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "http://127.0.0.1:3000"


def test_keys_any_scheme_case_several_clients(session):
    access = Access(keys=("key-a", "key-b"))
    with serving(session, access=access) as served:
        assert_error(post(served.url), 401, "invalid_api_key")
        assert_error(post(served.url, key="key-c"), 401)
        r = post(served.url, headers={"Authorization": "Basic a2V5LWE6"})
        assert_error(r, 401)
        for scheme in ("Bearer", "bearer", "BEARER"):
            r = post(served.url, headers={"Authorization": f"{scheme} key-b"})
            assert r.status_code == 200, (scheme, r.text)
        assert httpx.get(served.url + "/health").json()["status"] == "ok"


def test_api_keys_from_a_file_and_the_options(tmp_path):
    from localspec.cli.serve import read_keys
    from localspec.errors import UsageError

    keys = tmp_path / "keys"
    keys.write_text("# the editor\nkey-a\n\n  key-b  \nkey-a\n")
    assert read_keys(["key-c"], keys) == ("key-c", "key-a", "key-b")
    keys.write_text("# nothing\n\n")
    with pytest.raises(UsageError, match="holds no key"):
        read_keys([], keys)
    with pytest.raises(UsageError, match="cannot read"):
        read_keys([], tmp_path / "missing")


# -- what each client can learn of the others ------------------------------------------------


def timings_of(r: httpx.Response) -> dict:
    assert r.status_code == 200, r.text
    return r.json()["timings"]


# A kept answer is drafted from by the history's store, or, asked again word for word, as
# the prediction of the session (storage.answers.earlier_answer): either tells of earlier text.
FROM_EARLIER = ("store", "prediction")


def drafted_from_earlier(timings: dict) -> int:
    """How many tokens the drafters that read kept answers had accepted (-1: none drafted)."""
    counts = [timings["by_drafter"][name]["accepted"] for name in FROM_EARLIER
              if name in timings["by_drafter"]]  # fmt: skip
    return sum(counts) if counts else -1


def test_two_keys_never_share_cache_history_or_drafts(session):
    access = Access(keys=("key-a", "key-b"))
    params = GenerationParams(max_tokens=48, drafter="auto")
    with serving(session, access=access, defaults=params, history=True) as served:
        first = timings_of(post(served.url, key="key-a"))
        assert drafted_from_earlier(first) == -1  # nothing kept yet
        again = timings_of(post(served.url, key="key-a"))
        # Its own repeat: the prompt's prefix cached, the earlier answer drafted from.
        assert again["cache_n"] > 0
        assert drafted_from_earlier(again) > 0, again
        other = timings_of(post(served.url, key="key-b"))
        assert other["cache_n"] == 0 and other["prompt_n"] == first["prompt_n"]
        assert drafted_from_earlier(other) == -1, other
        back = timings_of(post(served.url, key="key-a"))
        assert back["cache_n"] == 0  # the cache held key-b's prompt: not reused for key-a
    histories = {client for _, client, _ in Library().histories()}
    assert len(histories) == 2 and "" not in histories  # one each, none the user's own


def test_by_default_a_client_drafts_from_no_history(session):
    with serving(session) as served:
        post(served.url)
        again = timings_of(post(served.url))
        assert drafted_from_earlier(again) == -1, again
    assert Library().histories() == []


def test_no_timings_leaves_the_figures_out(session):
    with serving(session, timings=False) as served:
        r = post(served.url)
        assert r.status_code == 200 and "timings" not in r.json()
        assert r.json()["usage"]["completion_tokens"] > 0
        with httpx.stream("POST", served.url + CHAT, json=ask(stream=True)) as streamed:
            lines = [line for line in streamed.iter_lines() if line.startswith("data: {")]
        assert lines and not any("timings" in json.loads(line[6:]) for line in lines)


# -- bounds, and malformed bodies answered before any job ---------------------------------


@pytest.mark.parametrize(
    "body, param",
    [(ask(stream_options="yes", stream=True), "stream_options"),
     (ask(stream="yes"), "stream"),
     (ask(stream=True, stream_options={"include_usage": "yes"}), "stream_options"),
     (ask(stop=["a", "b", "c", "d", "e"]), "stop"),
     (ask(stop="x" * 257), "stop"),
     (ask(max_tokens=100_000), "max_tokens"),
     (ask(max_completion_tokens=100_000), "max_completion_tokens")],
)  # fmt: skip
def test_requests_out_of_bounds_get_a_400_and_run_nothing(session, body, param):
    with serving(session, max_tokens_limit=512) as served:
        assert_error(post(served.url, body), 400, param=param)
        assert served.worker.submitted == 0


@pytest.mark.parametrize(
    "raw",
    [b"[" * 100_000 + b"]" * 100_000,
     b'{"messages": [], "max_tokens": ' + b"9" * 5000 + b"}",
     b'{"messages": "\xff\xfe"}'],
)  # fmt: skip
def test_crafted_json_gets_a_400_in_openais_shape(session, raw):
    with serving(session) as served:
        r = httpx.post(served.url + CHAT, content=raw,
                       headers={"Content-Type": "application/json"})  # fmt: skip
        assert_error(r, 400, "bad_json")
        assert served.worker.submitted == 0


def test_four_stop_strings_are_enough(session):
    with serving(session) as served:
        r = post(served.url, ask(stop=["zzzz", "yyyy", "xxxx", "w" * 256]))
        assert r.status_code == 200, r.text


def test_an_internal_error_is_logged_not_sent(session, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("secret detail at /home/someone/.cache/x")

    with serving(session) as served:
        monkeypatch.setattr(session, "chat", broken)
        r = post(served.url)
        error = assert_error(r, 500, "internal_error")
        assert "secret" not in r.text and "/home" not in r.text
        assert "RuntimeError" not in r.text
    ref = error["message"].split()[2].rstrip(";")
    assert any(ref in rec.getMessage() and "secret detail" in rec.getMessage()
               for rec in caplog.records)  # fmt: skip


def test_option_values_are_checked(tiny_pair):
    from typer.testing import CliRunner

    from localspec.cli.app import app

    for option in ("--queue-size", "--max-body", "--max-tokens-limit"):
        result = CliRunner().invoke(app, ["serve", option, "0", "--target", str(tiny_pair[0])])
        assert result.exit_code == 2 and "Invalid value" in result.output, result.output


# -- disconnects -----------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_leaves_stops_its_generation_within_a_round(session, stream):
    params = GenerationParams(max_tokens=400, drafter="none")
    with serving(session, defaults=params) as served, slowed(session, 0.02) as finished:
        body = ask(max_tokens=400, stream=stream)

        def leave() -> None:
            # The client gives up after a few tokens, or half a second, and hangs up.
            if stream:
                with httpx.stream("POST", served.url + CHAT, json=body, timeout=10) as r:
                    for i, _ in enumerate(r.iter_lines()):
                        if i == 8:
                            break
                return
            with contextlib.suppress(httpx.TimeoutException):
                httpx.post(served.url + CHAT, json=body, timeout=0.5)

        thread = threading.Thread(target=leave)
        thread.start()
        thread.join(5)
        deadline = time.time() + 5
        while not finished and time.time() < deadline:
            time.sleep(0.02)
        assert finished and finished[0].reason.value == "cancelled"
        # 0.5 s of 20 ms tokens, and the round under way: far from the 400 asked for.
        assert len(finished[0].token_ids) < 60, len(finished[0].token_ids)


# -- shutdown --------------------------------------------------------------------------------


class Closing:
    """A session whose ``close`` is only recorded: the module's session stays loaded."""

    def __init__(self, session) -> None:
        self._session = session
        self.closed = False

    def __getattr__(self, name):
        return getattr(self._session, name)

    def close(self) -> None:
        self.closed = True


def test_stopping_the_server_cancels_the_running_generation(session):
    from localspec.serve.server import shutdown

    closing = Closing(session)
    params = GenerationParams(max_tokens=400, drafter="none")
    with (
        slowed(session, 0.02) as finished,
        serving(closing, defaults=params, on_client=lambda s, c: None) as served,
    ):
        started = threading.Event()

        def read() -> None:
            with httpx.stream("POST", served.url + CHAT, json=ask(stream=True), timeout=30) as r:
                for line in r.iter_lines():
                    if '"content": "' in line and '"content": ""' not in line:
                        started.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        assert started.wait(10)
        served.server.should_exit = True  # what Ctrl-C or SIGTERM does
        served.thread.join(5)
        assert not served.thread.is_alive(), "the server waited for the answer to end"
        assert shutdown(served.state) and closing.closed
        reader.join(5)
    assert finished[0].reason.value == "cancelled" and len(finished[0].token_ids) < 100


def test_the_models_are_not_freed_while_a_generation_may_still_use_them():
    from localspec.serve.app import ServerState
    from localspec.serve.server import shutdown
    from localspec.serve.worker import GenerationWorker, Job

    release, running = threading.Event(), threading.Event()

    def deaf(session, cancel):  # a round that does not end (llama.cpp cannot be interrupted)
        running.set()
        release.wait(10)
        yield from ()

    inner = types.SimpleNamespace()
    stuck = Closing(inner)
    inner.lanes = lambda: [stuck]  # one lane: the session itself
    worker = GenerationWorker(stuck)
    worker.start()
    job = worker.submit(Job(deaf, GenerationParams()))
    assert running.wait(5)
    state = ServerState(defaults=GenerationParams(), worker=worker)
    try:
        assert shutdown(state, timeout=0.2) is False
        assert not stuck.closed and job.cancel.is_set()
    finally:
        release.set()
    assert worker.stop(5) and shutdown(state) and stuck.closed


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_stops_a_real_server_in_the_middle_of_an_answer(tiny_pair, tmp_path, stop):
    """``localspec serve`` itself: SIGINT (or SIGTERM) while a long answer streams ends the
    answer with an error a client cannot take for a whole answer's end, and the process
    exits cleanly and soon (never a crash freeing models still in use)."""
    target, draft, _ = tiny_pair
    args = ["--target", str(target), "--draft", str(draft), "--drafter", "none",
            "--ctx", str(LONG_CTX), "--threads", "1"]  # fmt: skip
    with serve_process(args, tmp_path / "home") as (proc, url):
        body = ask(max_tokens=LONG_CTX - 64, stream=True)
        data: list[str] = []
        with httpx.stream("POST", url + CHAT, json=body, timeout=30) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    data.append(line.removeprefix("data: "))
                    if len(data) == 5:  # once
                        proc.send_signal(stop)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr and "did not stop" not in stderr, stderr
    chunks = len(data) - 2
    assert data[-1] == "[DONE]"
    assert json.loads(data[-2])["error"]["code"] == "server_stopping", data[-3:]
    assert all(json.loads(d)["choices"][0]["finish_reason"] is None for d in data[:-2])
    assert chunks < LONG_CTX - 64  # the answer was cut short, not written to its end
