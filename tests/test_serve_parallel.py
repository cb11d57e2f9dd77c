"""``localspec serve`` with several generations at once (lanes, backend/lanes.py): two
clients' streams advance side by side, a client that leaves frees its lane for the next
request at once, a short request does not wait behind a long one, a client holding two
lanes streams no faster than one holding one, and the clients stay apart (cache figures,
drafts, history). The real server over the tiny pair, loaded with two lanes (three for
the clients' shares), driven with the real HTTP client."""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import replace

import httpx
import pytest

from localspec.core.events import Finished
from localspec.core.params import GenerationParams
from localspec.serve.access import Access
from localspec.session.open import open_session
from localspec.session.session import Session
from localspec.storage.library import Library
from tests.serving import serve_options, serving

CHAT = "/v1/chat/completions"
PROMPT = "the cat sat on the mat and the dog sat on the log"
FROM_EARLIER = ("store", "prediction")  # drafters that read earlier answers


@pytest.fixture(scope="module")
def session(tiny_pair):
    options = serve_options(tiny_pair).model_copy(update={"lanes": 2, "n_ctx": 1024})
    session = open_session(options)
    # Verifying priced as nearly free (as on a GPU), so that auto drafts whatever it is
    # offered and what a client could learn shows in its figures.
    plain = session.costs.plain_s
    verify = {k: plain * (1 + 0.04 * k) for k in session.costs.verify_s}
    session.costs = replace(session.costs, verify_s=verify)
    session.decoder.costs = session.costs
    yield session
    session.close()


@pytest.fixture
def slow(monkeypatch):
    """Every event of every lane's generations takes ``seconds`` more; the ``Finished``
    events are appended to the list returned as they pass."""
    finished: list[Finished] = []

    def slow(seconds: float) -> list[Finished]:
        plain = Session.generate

        def generate(self, tokens, params, cancel=None, **kw):
            for event in plain(self, tokens, params, cancel, **kw):
                time.sleep(seconds)
                if isinstance(event, Finished):
                    finished.append(event)
                yield event

        monkeypatch.setattr(Session, "generate", generate)
        return finished

    return slow


def ask(text: str = PROMPT, **extra) -> dict:
    return {"messages": [{"role": "user", "content": text}], **extra}


def headers(key: str | None) -> dict:
    return {"Authorization": f"Bearer {key}"} if key else {}


class Stream(threading.Thread):
    """A streamed chat answer read in a thread: when each piece of text came, and what."""

    def __init__(self, url: str, body: dict, key: str | None = None, stop_after: int = 0):
        super().__init__(daemon=True)
        self.url, self.body, self.key, self.stop_after = url, body, key, stop_after
        self.stamps: list[float] = []
        self.text = ""
        self.status = 0
        self.timings: dict = {}
        self.errors: list[str] = []  # the codes of error events
        self.lines: list[str] = []

    def run(self) -> None:
        body = {**self.body, "stream": True}
        with httpx.stream("POST", self.url + CHAT, json=body, headers=headers(self.key),
                          timeout=60) as r:  # fmt: skip
            self.status = r.status_code
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                self.lines.append(line)
                data = json.loads(line[len("data: ") :])
                if "error" in data:
                    self.errors.append(data["error"]["code"])
                self.timings = data.get("timings", self.timings)
                for choice in data.get("choices", []):
                    if choice["delta"].get("content"):
                        self.stamps.append(time.monotonic())
                        self.text += choice["delta"]["content"]
                if self.stop_after and len(self.stamps) >= self.stop_after:
                    return  # the client goes away mid-answer

    def done(self, timeout: float = 60) -> Stream:
        self.join(timeout)
        assert not self.is_alive()
        return self


def wait_for(condition, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_every_lane_evaluates_both_models_on_the_lanes_thread(session):
    """The target's lanes and the draft model's (loaded now or later) evaluate under the
    worker's turns: on its one evaluating thread (backend/lanes.py)."""
    from localspec.serve.worker import GenerationWorker

    if session.slot is not None and session.slot.model is None:
        session.slot.wait()  # a draft model left for later, loaded now
    worker = GenerationWorker(session)
    sessions = [lane.session for lane in worker._lanes]
    scheduler = session.target.shared.scheduler
    assert len(sessions) == 2 and scheduler is not None
    assert all(lane.target.shared.scheduler is scheduler for lane in sessions)
    # What the engines draft with: a lane made after the load holds the model from the start.
    drafts = [lane.decoder.draft for lane in sessions if lane.decoder.draft is not None]
    assert drafts and all(draft.shared.scheduler is scheduler for draft in drafts)


def test_a_session_of_several_lanes_is_built_with_a_session_for_each(session):
    """The lanes' sessions are made with the pair's session, once: each over its own lane of
    the one context, with its own copies of the histories."""
    lanes = session.lanes()
    assert len(lanes) == 2 and lanes[0] is session and session.lanes()[1] is lanes[1]
    assert lanes[1].target is session.target.lane(1) and lanes[1].lane_of is session
    assert lanes[1].answers == session.answers and lanes[1].answers is not session.answers


def test_two_streams_advance_side_by_side_and_answer_as_alone(session, slow):
    params = GenerationParams(max_tokens=30, drafter="auto")
    with serving(session, defaults=params) as served:
        assert served.worker.lanes == 2
        slow(0.02)
        a = Stream(served.url, ask(PROMPT))
        b = Stream(served.url, ask("one two three four five six"))
        a.start()
        wait_for(lambda: len(a.stamps) >= 2)
        b.start()
        a.done(), b.done()
        assert a.status == b.status == 200
        # Each advanced while the other was under way: neither waited for the other's end.
        assert sum(t < a.stamps[-1] for t in b.stamps) >= 3
        assert sum(t > b.stamps[0] for t in a.stamps) >= 3
        # And each answered what it answers alone (greedy), one request at a time.
        for stream in (a, b):
            alone = httpx.post(served.url + CHAT, json=stream.body, timeout=60)
            assert alone.json()["choices"][0]["message"]["content"] == stream.text


def test_a_client_that_leaves_frees_its_lane_for_the_next_request(session, slow):
    params = GenerationParams(max_tokens=200, drafter="auto")
    with serving(session, defaults=params) as served:
        slow(0.03)
        leaving = Stream(served.url, ask(PROMPT), stop_after=5)
        staying = Stream(served.url, ask("one two three four five six"))
        leaving.start(), staying.start()
        wait_for(lambda: served.worker.running == 2)
        third = Stream(served.url, ask("a b c d e f g"))
        third.start()
        wait_for(lambda: served.worker.waiting == 1 or len(third.stamps) > 0)
        leaving.done()
        wait_for(lambda: len(third.stamps) >= 1)
        assert staying.is_alive(), "the lane was freed only when the other answer ended"
        staying.done(), third.done()
        assert staying.status == third.status == 200


def test_a_short_request_goes_before_a_long_one_waiting(session, slow):
    """Both lanes busy: a short request (an editor's) that arrives after a long one gets the
    next free lane first."""
    params = GenerationParams(max_tokens=200, drafter="auto")
    with serving(session, defaults=params) as served:
        slow(0.03)
        busy = [Stream(served.url, ask(PROMPT), stop_after=4 + 4 * i) for i in range(2)]
        for stream in busy:
            stream.start()
        wait_for(lambda: served.worker.running == 2)
        long = Stream(served.url, ask("one two three", max_tokens=300))
        long.start()
        wait_for(lambda: served.worker.waiting == 1)
        short = Stream(served.url, ask("a b c", max_tokens=8))
        short.start()
        wait_for(lambda: served.worker.waiting == 2)
        busy[0].done()  # the first lane frees: the short request takes it
        wait_for(lambda: len(short.stamps) >= 1)
        assert not long.stamps
        for stream in (busy[1], long, short):
            stream.done()


def test_clients_side_by_side_never_share_cache_history_or_drafts(session, slow):
    access = Access(keys=("key-a", "key-b"))
    params = GenerationParams(max_tokens=40, drafter="auto")
    with serving(session, access=access, defaults=params, history=True) as served:
        slow(0.01)
        a = Stream(served.url, ask(PROMPT), key="key-a")
        b = Stream(served.url, ask(PROMPT), key="key-b")
        a.start()
        wait_for(lambda: len(a.stamps) >= 2)
        b.start()
        a.done(), b.done()
        for first in (a, b):  # the same prompt at once: neither reads the other's
            assert first.timings["cache_n"] == 0, first.timings
            assert drafted_from_earlier(first.timings) == -1, first.timings
        # A client's next turn finds its own prefix and its own history on its lane.
        again = Stream(served.url, ask(PROMPT), key="key-b")
        other = Stream(served.url, ask("one two three four five six"), key="key-a")
        again.start(), other.start()
        again.done(), other.done()
        assert again.timings["cache_n"] > 0
        assert drafted_from_earlier(again.timings) > 0, again.timings
    histories = {client for _, client, _ in Library().histories()}
    assert len(histories) == 2


def drafted_from_earlier(timings: dict) -> int:
    """How many tokens the drafters that read kept answers had accepted (-1: none drafted)."""
    counts = [timings["by_drafter"][name]["accepted"] for name in FROM_EARLIER
              if name in timings["by_drafter"]]  # fmt: skip
    return sum(counts) if counts else -1


def test_a_stopped_server_cuts_every_running_answer_short(tiny_pair, tmp_path):
    """``localspec serve --parallel 2`` itself, told to stop (SIGTERM) while two answers
    stream: each ends with an error no client takes for a whole answer's end, and the
    process exits cleanly and soon."""
    import signal

    from tests.serving import serve_process

    target, draft, _ = tiny_pair
    args = ["--target", str(target), "--draft", str(draft), "--drafter", "none", "--ctx",
            "4096", "--threads", "1", "--parallel", "2"]  # fmt: skip
    with serve_process(args, tmp_path / "home") as (proc, url):
        body = ask(max_tokens=4000)
        streams = [Stream(url, body), Stream(url, {**body, "messages": ask("a b c")["messages"]})]
        for stream in streams:
            stream.start()
        wait_for(lambda: all(len(s.stamps) >= 3 for s in streams))
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
        for stream in streams:
            stream.done()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr and "did not stop" not in stderr, stderr
    assert "2 generations at once" in stderr
    for stream in streams:
        assert stream.errors == ["server_stopping"], [line[-200:] for line in stream.lines[-2:]]
        assert len(stream.stamps) < 4000


@pytest.mark.parametrize(
    "args, env, said",
    [
        (["--parallel", "x"], {}, "--parallel 'x' is neither auto nor a number"),
        (["--parallel", "0"], {}, "from 1 to 64"),
        (["--parallel", "2"], {"LOCALSPEC_GATHER": "maybe"}, "LOCALSPEC_GATHER='maybe'"),
        (["--body-timeout", "0"], {}, "--body-timeout '0' is not a number of seconds"),
        (["--body-timeout", "nan"], {}, "--body-timeout 'nan' is not a number"),
        (["--body-timeout", "inf"], {}, "at most 3600"),
        (["--body-timeout", "soon"], {}, "--body-timeout 'soon'"),
    ],
)
def test_bad_parallel_settings_are_said_before_anything_loads(tiny_pair, tmp_path, args, env, said):
    """A clear message and exit code 2, no traceback, and no model loaded first."""
    import os
    import subprocess
    import sys

    target, draft, _ = tiny_pair
    proc = subprocess.run(
        [sys.executable, "-m", "localspec.cli.app", "serve", "--target", str(target),
         "--draft", str(draft), "--port", "0", *args],
        env={**os.environ, "LOCALSPEC_HOME": str(tmp_path), **env},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert said in proc.stderr and "Traceback" not in proc.stderr
    assert "loading target" not in proc.stderr


def test_a_long_request_is_not_starved_by_short_ones(session, slow):
    """Four clients loop short requests on two lanes, so some always wait: a long request
    sent meanwhile still gets a lane (its wait ages, serve/worker.py) while they go on."""
    with serving(session, defaults=GenerationParams(max_tokens=8, drafter="auto")) as served:
        slow(0.01)
        stop = threading.Event()

        def loop() -> None:
            while not stop.is_set():
                httpx.post(served.url + CHAT, json=ask("a b c", max_tokens=8), timeout=60)

        loops = [threading.Thread(target=loop, daemon=True) for _ in range(4)]
        for thread in loops:
            thread.start()
        try:
            wait_for(lambda: served.worker.waiting >= 1 and served.worker.running == 2)
            long = Stream(served.url, ask("one two three", max_tokens=200), stop_after=1)
            long.start()
            long.join(30)
            assert long.stamps, "the long request got no token while short ones kept coming"
        finally:
            stop.set()
            for thread in loops:
                thread.join(60)


def test_a_request_that_leaves_while_waiting_frees_its_queue_slot(session, slow):
    params = GenerationParams(max_tokens=400, drafter="auto")
    with serving(session, defaults=params) as served:
        slow(0.03)
        busy = [Stream(served.url, ask(PROMPT)) for _ in range(2)]  # until the server stops
        for stream in busy:
            stream.start()
        wait_for(lambda: served.worker.running == 2)
        with pytest.raises(httpx.ReadTimeout):  # the client gives up while it waits
            httpx.post(served.url + CHAT, json=ask("a b c"), timeout=0.5)
        wait_for(lambda: served.worker.waiting == 0, timeout=2)
        assert served.worker.running == 2  # the lanes are still busy: it left the queue
        assert httpx.get(served.url + "/health").json()["waiting"] == 0
    for stream in busy:
        assert stream.done().errors == ["server_stopping"]


def raw_post(port: int, body: bytes, declared: int) -> socket.socket:
    """A connection that sends the headers of a JSON POST of ``declared`` bytes, then only
    ``body``."""
    conn = socket.create_connection(("127.0.0.1", port))
    head = (f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json"
            f"\r\nContent-Length: {declared}\r\n\r\n")  # fmt: skip
    conn.sendall(head.encode() + body)
    return conn


def test_a_body_that_does_not_arrive_in_time_is_a_408(session):
    with serving(session, body_timeout_s=0.5) as served:
        with raw_post(served.port, b'{"messages": [', declared=100) as conn:
            conn.settimeout(10)
            status = conn.recv(4096).split(b"\r\n")[0]
        assert b" 408 " in status, status
        assert served.worker.submitted == 0


def test_serve_takes_its_body_timeout_from_the_command_line(tiny_pair, tmp_path):
    """``localspec serve --body-timeout 0.5``: a half-sent body is a 408 saying so, long
    before the default 30 s."""
    from tests.serving import serve_process

    target, draft, _ = tiny_pair
    args = ["--target", str(target), "--draft", str(draft), "--drafter", "none", "--ctx",
            "4096", "--threads", "1", "--parallel", "1", "--body-timeout", "0.5"]  # fmt: skip
    with serve_process(args, tmp_path / "home") as (_, url):
        with raw_post(int(url.rsplit(":", 1)[1]), b'{"messages": [', declared=100) as conn:
            conn.settimeout(10)  # the default's 30 s would end the read with an error
            head, body = read_answer(conn)
        assert b" 408 " in head.split(b"\r\n")[0], head
        assert b"within 0.5 s" in body, body


def read_answer(conn: socket.socket) -> tuple[bytes, bytes]:
    """An HTTP answer's head and its body (of its Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data and (chunk := conn.recv(4096)):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    while len(body) < length and (chunk := conn.recv(4096)):
        body += chunk
    return head, body


def test_a_client_that_leaves_mid_body_is_one_line_in_the_log(session):
    import logging

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = records.append
    loggers = [logging.getLogger(name) for name in ("localspec", "uvicorn")]
    for logger in loggers:
        logger.addHandler(handler)
    try:
        with serving(session) as served:
            for _ in range(3):
                raw_post(served.port, b'{"messages": [', declared=100).close()
            wait_for(lambda: len(records) >= 3, timeout=10)
            time.sleep(0.3)  # anything more it would log
            assert httpx.post(served.url + CHAT, json=ask("a b c")).status_code == 200
    finally:
        for logger in loggers:
            logger.removeHandler(handler)
    assert [r.getMessage() for r in records] == [
        "a client left while sending its request body (499)"
    ] * 3
    assert not any(r.exc_info for r in records)


def test_a_client_holding_two_lanes_streams_no_faster_than_one_holding_one(tiny_pair, slow):
    """Three lanes and two keys: client a's two streams took two lanes while nobody else
    waited; client b's one stream, on the third, has about as many rounds as a's two
    together (by lane, it would have half as many). Verifying priced as on a CPU, where the
    lanes' rounds are evaluated one after another, not gathered."""
    options = serve_options(tiny_pair).model_copy(update={"lanes": 3, "n_ctx": 1024})
    three = open_session(options)
    plain = three.costs.plain_s
    three.costs = replace(three.costs, verify_s={k: plain * (k + 1) for k in range(1, 9)})
    params = GenerationParams(max_tokens=400, drafter="none")
    try:
        with serving(three, access=Access(keys=("key-a", "key-b")), defaults=params) as served:
            slow(0.01)
            a = [Stream(served.url, ask(PROMPT), key="key-a") for _ in range(2)]
            for stream in a:
                stream.start()
            wait_for(lambda: all(len(stream.stamps) >= 2 for stream in a))
            b = Stream(served.url, ask("a b c"), key="key-b")
            b.start()
            wait_for(lambda: len(b.stamps) >= 2)
            time.sleep(1.5)
            start, end = b.stamps[0], time.monotonic()
        in_window = [sum(start <= t <= end for t in s.stamps) for s in (*a, b)]
    finally:
        three.close()
    assert in_window[2] >= 0.75 * (in_window[0] + in_window[1]), in_window
