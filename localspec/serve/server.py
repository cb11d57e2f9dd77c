"""Running the app, and stopping it without pulling the models from under a generation.

``run(state, host, port)`` serves ``create_app(state)`` with uvicorn until it is told to
stop (Ctrl-C, SIGTERM) or the pair could not be loaded (``ServerState.load_error``: the
caller says why and exits with its code), then ``shutdown(state)``; either signal ends it
normally.
``StoppingServer`` is uvicorn's server whose shutdown first cancels every generation
(``GenerationWorker.cancel_all``): uvicorn waits for open responses to end before it
returns, and a stream still being written would otherwise hold it for as long as its answer
takes. ``shutdown`` waits for a pair being loaded to stop at its next step, ends the
worker's threads and frees the models only once they have ended; it returns False
when it could not (a generation or a loading step that did not stop in time), and the
caller must then leave the process without freeing anything (``os._exit``): llama.cpp
would read freed memory and crash.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

import uvicorn

from localspec.serve.app import ServerState, create_app

STOP_TIMEOUT_S = 30.0  # for the running round to end; llama.cpp cannot be interrupted


class StoppingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.localspec = state

    async def shutdown(self, sockets: Any = None) -> None:
        self.localspec.closing = True  # a pair still loading is not put to work
        if self.localspec.worker is not None:
            self.localspec.worker.cancel_all()
        await super().shutdown(sockets)

    async def on_tick(self, counter: int) -> bool:
        """Whether to stop: told to, or left without a pair to serve."""
        if self.localspec.load_error is not None:
            return True
        return await super().on_tick(counter)


class Stopped(Exception):
    """SIGTERM, as an exception: uvicorn raises the signal it caught again once it has
    stopped, and the default action would end the process before ``shutdown``."""


def run(state: ServerState, host: str, port: int) -> bool:
    """Serve until told to stop; whether the models could be freed (see ``shutdown``)."""
    # No lifespan: the app has no startup or shutdown handlers, and a lifespan task still
    # waiting when uvicorn raises the Ctrl-C again is logged as a cancelled traceback.
    config = uvicorn.Config(create_app(state), host=host, port=port, log_level="warning",
                            lifespan="off")  # fmt: skip
    # What stopped the server is raised again by uvicorn once it has: it was the plan.
    with _sigterm_raises(), contextlib.suppress(KeyboardInterrupt, Stopped):
        StoppingServer(config, state).run()
    try:
        return shutdown(state)
    except (KeyboardInterrupt, Stopped):  # told again while the round ends: leave as is
        return False


@contextlib.contextmanager
def _sigterm_raises() -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():
        yield  # signals reach the main thread only
        return

    def raise_stopped(signum: int, frame: Any) -> None:
        raise Stopped

    previous = signal.signal(signal.SIGTERM, raise_stopped)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def shutdown(state: ServerState, timeout: float = STOP_TIMEOUT_S) -> bool:
    """Stop the worker, then free the models if its thread ended. True when nothing can
    still use them (nothing was loaded, or they are freed)."""
    state.closing = True
    if state.worker is None and state.loader is not None:
        state.loader.join(timeout)  # the loading stops at its next step
    worker = state.worker
    if worker is None:
        return not state.loading
    if not worker.stop(timeout):
        return False
    worker.session.close()
    return True
