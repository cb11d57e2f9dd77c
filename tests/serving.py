"""A real ``localspec serve`` app in this process: uvicorn's server (the one ``localspec
serve`` runs, ``StoppingServer``) in a thread on a free loopback port, over a worker of a
given session. ``serving(session, ...)`` yields a ``Served`` (its URL, state and worker)
and stops everything afterwards; ``serve_options`` are the tiny pair's options as the
server opens it; ``slowed(session, seconds)`` makes every event of the session's
generations take that long, so a test can act while one is under way. ``serve_process``
runs ``localspec serve`` itself, for what only a real process shows (signals, exits)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn

from localspec.core.params import GenerationParams
from localspec.serve.access import Access
from localspec.serve.app import ServerState, create_app
from localspec.serve.clients import keep_apart
from localspec.serve.server import StoppingServer
from localspec.serve.worker import GenerationWorker, OnClient


def serve_options(tiny_pair: Any) -> Any:
    """The tiny pair's options as ``localspec serve`` opens it: no store, and the user's own
    history neither kept nor drafted from."""
    from localspec.session.pair import ModelOptions

    target, draft, _ = tiny_pair
    return ModelOptions(target=str(target), draft=str(draft), n_ctx=512, threads=1,
                        stores=(), history=False)  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Served:
    url: str
    port: int
    state: ServerState
    worker: GenerationWorker
    server: StoppingServer
    thread: threading.Thread


@contextlib.contextmanager
def serving(
    session: Any,
    *,
    access: Access | None = None,
    defaults: GenerationParams | None = None,
    on_client: OnClient | None = None,
    history: bool = False,
    **state: Any,
) -> Iterator[Served]:
    worker = GenerationWorker(session, max_queue=8, on_client=on_client or keep_apart(history))
    worker.start()
    app_state = ServerState(
        defaults=defaults or GenerationParams(max_tokens=24, drafter="auto"),
        access=access or Access(),
    )
    app_state.serve_with(worker)  # as the loader does, then the test's own settings
    app_state = dataclasses.replace(app_state, **{"model_id": "target", **state})
    port = free_port()
    config = uvicorn.Config(create_app(app_state), host="127.0.0.1", port=port,
                            log_level="warning")  # fmt: skip
    server = StoppingServer(config, app_state)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 10
    while not server.started and time.time() < deadline:
        time.sleep(0.01)
    served = Served(f"http://127.0.0.1:{port}", port, app_state, worker, server, thread)
    try:
        yield served
    finally:
        server.should_exit = True
        thread.join(10)
        worker.stop()


@contextlib.contextmanager
def slowed(session: Any, seconds: float) -> Iterator[list]:
    """Every event of ``session``'s generations takes ``seconds`` more; yields the list the
    ``Finished`` events are appended to, as they pass."""
    from localspec.core.events import Finished

    plain = session.generate
    finished: list = []

    def generate(tokens, params, cancel=None, **kw):
        for event in plain(tokens, params, cancel, **kw):
            time.sleep(seconds)
            if isinstance(event, Finished):
                finished.append(event)
            yield event

    session.generate = generate
    try:
        yield finished
    finally:
        del session.generate  # the method again


@contextlib.contextmanager
def serve_process(
    args: list[str], home: Path, *, ready: bool = True, python: str | None = None
) -> Iterator[tuple[subprocess.Popen, str]]:
    """``localspec serve ARGS`` as its own process, in the home ``home``, on a free port:
    yields it and its URL once ``/health`` answers ok (or at once, without ``ready``), and
    kills it afterwards if it is still running. Its stderr is a pipe, read as it ends.
    ``python``: code run as ``python -c`` with the arguments instead of ``localspec``."""
    import httpx

    port = free_port()
    env = {**os.environ, "LOCALSPEC_HOME": str(home)}
    start = ["-c", python] if python else ["-m", "localspec.cli.app"]
    proc = subprocess.Popen(
        [sys.executable, *start, "serve", "--port", str(port), *args],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while ready:
            assert proc.poll() is None, proc.communicate()[1]
            assert time.monotonic() < deadline, "the server did not get ready"
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.1)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
