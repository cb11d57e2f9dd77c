"""A target on llama.cpp RPC workers: endpoint parsing, the handshake check, the relay that
turns a lost worker into an error instead of an abort or a hang, and whole runs of
``localspec complete --rpc`` against ``localspec worker`` processes on 127.0.0.1 with the
tiny GGUF models (output equal to local decoding's; a killed or frozen worker ends the
answer with a clear error within the timeout)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from localspec.backend import rpc
from localspec.backend.rpc import Endpoint, parse_endpoints
from localspec.errors import BackendError, UsageError

PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n"
RUN_TIMEOUT = 120


# -- endpoints and handshake ------------------------------------------------------------


def test_endpoints_parse_in_order_without_repeats() -> None:
    assert parse_endpoints("10.0.0.2:50052, 10.0.0.3:50053,10.0.0.2:50052") == [
        Endpoint("10.0.0.2", 50052),
        Endpoint("10.0.0.3", 50053),
    ]
    assert parse_endpoints(["[::1]:7000"]) == [Endpoint("::1", 7000)]
    assert str(Endpoint("::1", 7000)) == "[::1]:7000"


@pytest.mark.parametrize("bad", ["host", "host:", ":50052", "host:0", "host:70000", "h:x", ","])
def test_bad_endpoints_are_usage_errors(bad: str) -> None:
    with pytest.raises(UsageError):
        parse_endpoints(bad)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_handshake_names_an_unreachable_worker() -> None:
    port = free_port()
    with pytest.raises(BackendError, match=f"cannot reach RPC worker 127.0.0.1:{port}"):
        rpc.handshake(Endpoint("127.0.0.1", port))


def serve_once(reply: bytes | None) -> tuple[socket.socket, threading.Thread]:
    """A TCP server that reads a hello and answers ``reply`` (None: says nothing)."""
    server = socket.create_server(("127.0.0.1", 0))

    def run() -> None:
        conn, _ = server.accept()
        with conn:
            conn.recv(64)
            if reply is not None:
                conn.sendall(reply)
            time.sleep(1.0)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return server, thread


def test_handshake_reports_a_silent_server_and_another_protocol() -> None:
    server, _ = serve_once(None)
    with server, pytest.raises(BackendError, match="did not answer within 0.3 s"):
        rpc.handshake(Endpoint("127.0.0.1", server.getsockname()[1]), timeout=0.3)
    reply = (28).to_bytes(8, "little") + bytes([6, 1, 0, 0]) + bytes(24)
    server, _ = serve_once(reply)
    with server, pytest.raises(BackendError, match="speaks protocol 6.1.0"):
        rpc.handshake(Endpoint("127.0.0.1", server.getsockname()[1]))


# -- the relay ----------------------------------------------------------------------------


def test_relay_forwards_and_a_closing_worker_is_a_loss_not_an_eof() -> None:
    """Bytes pass both ways; when the worker closes, the loss is reported once and
    llama.cpp's side stays open (its read waits instead of failing, which would abort)."""
    worker = socket.create_server(("127.0.0.1", 0))
    lost: list[str] = []
    relay = rpc._Relay(Endpoint("127.0.0.1", worker.getsockname()[1]), lost.append)
    client = socket.create_connection(("127.0.0.1", relay.local.port), timeout=5)
    client.sendall(b"ping")  # the worker is reached once llama.cpp has spoken
    upstream, _ = worker.accept()
    assert upstream.recv(16) == b"ping"
    upstream.sendall(b"pong")
    assert client.recv(16) == b"pong"
    upstream.close()
    worker.close()
    for _ in range(200):
        if lost:
            break
        time.sleep(0.01)
    assert lost == [f"lost RPC worker {relay.worker}: it closed the connection"]
    client.settimeout(0.3)
    with pytest.raises(TimeoutError):
        client.recv(16)  # still open: no EOF for llama.cpp
    client.close()


def test_relay_is_quiet_when_llama_cpp_closes_first() -> None:
    worker = socket.create_server(("127.0.0.1", 0))
    lost: list[str] = []
    relay = rpc._Relay(Endpoint("127.0.0.1", worker.getsockname()[1]), lost.append)
    client = socket.create_connection(("127.0.0.1", relay.local.port), timeout=5)
    client.sendall(b"hello")
    upstream, _ = worker.accept()
    assert upstream.recv(16) == b"hello"
    client.close()  # the model was freed
    upstream.settimeout(5)
    assert upstream.recv(16) == b""  # the relay closed the worker's side too
    time.sleep(0.2)
    assert lost == []
    upstream.close()
    worker.close()


STRAY = """
import socket, sys
sock = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=5)
sock.sendall(b"\\x0e" + bytes(40))  # a hello, as llama.cpp would start
print(repr(sock.recv(16)))  # b"" once the relay closed it
"""


def test_the_relay_closes_connections_of_other_programs_without_a_loss() -> None:
    worker = socket.create_server(("127.0.0.1", 0))
    worker.settimeout(0.5)
    lost: list[str] = []
    relay = rpc._Relay(Endpoint("127.0.0.1", worker.getsockname()[1]), lost.append)
    stray = subprocess.run([sys.executable, "-c", STRAY, str(relay.local.port)],
                           capture_output=True, text=True, timeout=30)  # fmt: skip
    assert stray.returncode == 0 and stray.stdout.strip() == "b''", stray
    with pytest.raises(TimeoutError):
        worker.accept()  # nothing of the stray connection reached the worker
    assert lost == [] and relay._held == []
    # This process's own connections are still relayed.
    client = socket.create_connection(("127.0.0.1", relay.local.port), timeout=5)
    client.sendall(b"ping")
    upstream, _ = worker.accept()
    assert upstream.recv(16) == b"ping"
    client.close()
    upstream.close()
    worker.close()


def test_a_connection_that_carried_nothing_is_no_loss() -> None:
    lost: list[str] = []
    relay = rpc._Relay(Endpoint("127.0.0.1", free_port()), lost.append)  # no worker there
    for _ in range(3):
        socket.create_connection(("127.0.0.1", relay.local.port), timeout=5).close()
    time.sleep(0.3)
    assert lost == []
    client = socket.create_connection(("127.0.0.1", relay.local.port), timeout=5)
    client.sendall(b"\x0e")  # llama.cpp's first bytes: now an unreachable worker is a loss
    for _ in range(200):
        if lost:
            break
        time.sleep(0.01)
    assert len(lost) == 1 and "cannot reach RPC worker" in lost[0]
    client.close()


class _Busy:
    def __init__(self) -> None:
        self.busy_since: float | None = None


def test_an_evaluation_past_the_timeout_is_a_loss(monkeypatch) -> None:
    workers = rpc._Workers()
    monkeypatch.setattr(rpc, "_WORKERS", workers)
    lost: list[str] = []
    link = rpc.RpcLink([Endpoint("10.0.0.9", 50052)], 0.2, lost.append)
    workers.link = link
    model = _Busy()
    link.watch(model)
    model.busy_since = time.monotonic()  # an evaluation starts and never ends
    for _ in range(300):
        if lost:
            break
        time.sleep(0.01)
    assert lost == ["the RPC workers (10.0.0.9:50052) did not answer for 0.2 s"]
    assert link.lost == lost[0]
    workers.report("another failure")  # reported once only
    assert len(lost) == 1
    link.close()


def test_short_evaluations_are_not_a_loss(monkeypatch) -> None:
    workers = rpc._Workers()
    monkeypatch.setattr(rpc, "_WORKERS", workers)
    lost: list[str] = []
    link = rpc.RpcLink([Endpoint("10.0.0.9", 50052)], 0.3, lost.append)
    workers.link = link
    model = _Busy()
    link.watch(model)
    for _ in range(10):  # evaluations of 0.05 s, well inside the timeout
        model.busy_since = time.monotonic()
        time.sleep(0.05)
        model.busy_since = None
    time.sleep(0.4)
    assert lost == []
    link.close()


# -- whole runs: localspec worker + localspec complete --rpc --------------------------------


def env_for(home: Path) -> dict[str, str]:
    # llama.cpp's log on stderr says which devices hold the weights
    env = dict(os.environ, LOCALSPEC_HOME=str(home), HF_HUB_OFFLINE="1", LOCALSPEC_LLAMA_LOG="1")
    env.pop("PYTHONPATH", None)
    return env


class Worker:
    """``localspec worker`` on 127.0.0.1 in a subprocess, ready once it answers a hello."""

    def __init__(self, home: Path, threads: int = 1) -> None:
        self.port = free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "localspec", "worker", "--port", str(self.port),
             "--threads", str(threads)],
            env=env_for(home),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        deadline = time.monotonic() + 60
        while True:
            try:
                rpc.handshake(Endpoint("127.0.0.1", self.port), timeout=2)
                return
            except BackendError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"worker did not start: {self.proc.stderr.read().decode()}"  # type: ignore[union-attr]
                    ) from None
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def workers(tmp_path):
    started: list[Worker] = []

    def start(**kw) -> Worker:
        worker = Worker(tmp_path / "worker-home", **kw)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def complete_args(target: Path, draft: Path, *extra: str, ctx: int = 512) -> list[str]:
    return [sys.executable, "-m", "localspec", "complete", "--target", str(target),
            "--draft", str(draft), "--raw", "--ctx", str(ctx), "--threads", "1",
            *extra]  # fmt: skip


def run_complete(home: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, input=PROMPT, capture_output=True, text=True, env=env_for(home),
        timeout=RUN_TIMEOUT,
    )  # fmt: skip


def tokens_of(result: subprocess.CompletedProcess[str]) -> list[int]:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])["token_ids"]


def offloaded_to(stderr: str) -> list[str]:
    """The RPC devices llama.cpp put model weights on, from its own log."""
    lines = [line for line in stderr.splitlines() if line.startswith("load_tensors: RPC")]
    return sorted({line.split("[")[1].split("]")[0] for line in lines if "model buffer" in line})


def test_greedy_output_through_one_and_two_workers_equals_local(tiny_pair, workers, tmp_path):
    target, draft, _ = tiny_pair
    home = tmp_path / "home"
    local = tokens_of(
        run_complete(
            home, complete_args(target, draft, "--drafter", "none", "--max-tokens", "48", "--json")
        )
    )
    assert len(local) == 48
    one, two = workers(), workers()
    for rpc_arg in (one.endpoint, f"{one.endpoint},{two.endpoint}"):
        for drafter in ("none", "auto"):
            args = complete_args(target, draft, "--drafter", drafter, "--max-tokens", "48",
                                 "--json", "--rpc", rpc_arg)  # fmt: skip
            result = run_complete(home, args)
            assert tokens_of(result) == local, (rpc_arg, drafter)
            # the weights really went to the workers (through the local relays)
            assert len(offloaded_to(result.stderr)) == rpc_arg.count(",") + 1


def test_an_unreachable_worker_is_named(tiny_pair, tmp_path) -> None:
    target, draft, _ = tiny_pair
    port = free_port()
    result = run_complete(
        tmp_path / "home", complete_args(target, draft, "--rpc", f"127.0.0.1:{port}")
    )
    assert result.returncode == 1
    assert f"cannot reach RPC worker 127.0.0.1:{port}" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def slower_target(tmp_path_factory) -> Path:
    """A tiny model big enough that 1500 tokens take seconds (about 150 tok/s here), so a
    fault injected once the answer has begun lands in the middle of it."""
    from tests.tiny_gguf import write_tiny_llama

    folder = tmp_path_factory.mktemp("slower")
    return write_tiny_llama(
        folder / "target.gguf", seed=1, n_embd=256, n_layer=8, n_ff=1024, n_head=8, n_head_kv=4
    )


def start_long_run(target: Path, home: Path, worker: Worker, *extra: str) -> subprocess.Popen:
    args = complete_args(target, target, "--drafter", "none", "--max-tokens", "1500",
                         "--rpc", worker.endpoint, *extra, ctx=2048)  # fmt: skip
    proc = subprocess.Popen(
        args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=env_for(home),
    )  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(PROMPT.encode())
    proc.stdin.close()
    proc.stdin = None  # communicate() must not flush it
    first = proc.stdout.read(1)  # the answer has begun
    assert first, proc.stderr.read().decode()  # type: ignore[union-attr]
    return proc


@pytest.mark.parametrize("fault", ["killed", "frozen"])
def test_a_worker_lost_mid_answer_ends_it_with_an_error(slower_target, workers, tmp_path, fault):
    """Killed: the connection closes, reported at once. Frozen (SIGSTOP): it stays open
    but nothing answers, reported once an evaluation has waited --rpc-timeout seconds."""
    worker = workers()
    proc = start_long_run(slower_target, tmp_path / "home", worker, "--rpc-timeout", "2")
    started = time.monotonic()
    os.kill(worker.proc.pid, signal.SIGKILL if fault == "killed" else signal.SIGSTOP)
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        if fault == "frozen":
            os.kill(worker.proc.pid, signal.SIGCONT)
    elapsed = time.monotonic() - started
    text = err.decode()
    assert proc.returncode == 1, text
    if fault == "killed":  # the closed connection, not a wait for --rpc-timeout
        assert f"lost RPC worker {worker.endpoint}" in text and "did not answer" not in text
    else:
        assert "did not answer for 2 s" in text
        assert elapsed >= 2
    assert "Traceback" not in text and "GGML_ABORT" not in text


def test_rpc_without_the_backend_gives_the_rebuild_hint(tiny_pair, monkeypatch) -> None:
    from typer.testing import CliRunner

    from localspec.cli.app import app

    target, draft, _ = tiny_pair
    monkeypatch.setattr(rpc, "supports_rpc", lambda: False)
    result = CliRunner().invoke(
        app,
        ["complete", "--target", str(target), "--draft", str(draft), "--rpc", "127.0.0.1:50052"],
        input=PROMPT,
    )
    assert result.exit_code == 1
    assert "lacks" in result.output and "GGML_RPC=ON" in result.output


def test_worker_refuses_a_network_address_without_allow_remote() -> None:
    from typer.testing import CliRunner

    from localspec.cli.app import app

    result = CliRunner().invoke(app, ["worker", "--host", "0.0.0.0"])
    assert result.exit_code == 2
    assert "no authentication" in result.output and "--allow-remote" in result.output


# -- the chat when the workers are lost ---------------------------------------------------


@pytest.mark.asyncio
async def test_chat_keeps_its_history_when_the_workers_are_lost() -> None:
    from tests.fake_session import FakeSession, ScriptedAnswer
    from tests.test_tui import make_app, ready, record_notifications, send, wait_for

    session = FakeSession(
        [ScriptedAnswer.plain("First answer."), ScriptedAnswer.plain("one two three four five")],
        hold_after=2,
    )
    session.hold_after = None
    app = make_app(session)
    async with app.run_test() as pilot:
        await ready(pilot)
        seen = record_notifications(app)
        await send(pilot, "first")
        session.hold_after = 2  # the second answer stops after two tokens, waiting
        await send(pilot, "second", wait=False)
        await wait_for(pilot, session.held.is_set)
        assert session.on_lost is not None
        lost = "lost RPC worker 127.0.0.1:50052: Connection reset by peer"
        threading.Thread(target=session.on_lost, args=(lost,)).start()  # as the relay does
        await wait_for(pilot, lambda: not app.chat.generating)
        assert app.chat.workers_lost == lost
        turns = app.chat.conversation.turns
        assert [t.user for t in turns] == ["first", "second"]
        assert turns[0].answer == "First answer."
        assert (turns[1].answer, turns[1].finish) == ("one two", "error")
        assert any(title == lost and sev == "error" for _, title, sev in seen)
        # the autosaved conversation holds the cut answer too
        from localspec.storage.conversations import read_conversation

        assert app.chat.autosave_file is not None
        saved = read_conversation(app.chat.autosave_file)
        assert [m.content for m in saved.messages] == [
            "first", "First answer.", "second", "one two"
        ]  # fmt: skip
        # nothing more can be generated; what is there stays, and sending says why
        calls = len(session.calls)
        await send(pilot, "third", wait=False)
        await pilot.pause()
        assert len(session.calls) == calls and len(app.chat.conversation.turns) == 2
        assert seen[-1][1] == lost
        session.release.set()  # let the held fake thread end before the app exits


def test_lost_workers_are_reported_as_every_error_and_end_the_process() -> None:
    """The loss is a ``WorkersLostError``: the same ``error:``/``hint:`` lines as any other
    error, exit status 1, and what was already written on stdout stays written."""
    code = (
        "import sys\n"
        "from localspec.errors import WorkersLostError, exit_with\n"
        "sys.stdout.write('partial answer')\n"
        "exit_with(WorkersLostError('lost RPC worker 127.0.0.1:50052'))\n"
        "print('not reached')\n"
    )
    root = Path(__file__).resolve().parent.parent  # this checkout's localspec
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert proc.returncode == 1
    assert proc.stdout == "partial answer"
    assert proc.stderr == (
        "error: lost RPC worker 127.0.0.1:50052\nhint: check the worker, then run again\n"
    )


def test_the_cli_words_a_lost_worker_as_exit_with_does(capsys) -> None:
    from localspec.cli.common import echo_error
    from localspec.errors import WorkersLostError, error_lines

    lost = WorkersLostError("the RPC workers (127.0.0.1:50052) did not answer for 2 s")
    assert echo_error(lost) == 1
    lines, code = error_lines(lost)
    assert capsys.readouterr().err.splitlines() == lines and code == 1
