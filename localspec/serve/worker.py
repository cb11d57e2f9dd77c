"""One generation at a time over one ``Session``, in arrival order.

``GenerationWorker`` owns the session on a single thread. ``submit`` puts a ``Job`` in a
bounded FIFO (``QueueFull`` when it is full); the thread runs jobs one by one and pushes
each engine event onto the job's own queue, then ``None`` when the job is over; an
``EngineWarning`` (a failed history or learning save among them) is written to the server's
log as it passes, as an answer has no place for it. Setting
``job.cancel`` stops the generation after its current round (the engine's cancel flag), so
a client that went away frees the engine for the next job. Keeping one session means a
follow-up turn of a conversation reuses both models' KV caches (longest common prefix).

Clients are kept apart: each ``Job`` names its ``client`` (a digest of its API key, see
serve/access.py), and before the first job of another client than the last one's the
worker calls ``on_client(session, client)`` (``begin_client``: the models' caches emptied,
the drafters as they were restored at start, that client's own history), so that nothing
one client asked or was answered shapes another's drafts or cache figures.

``cancel_all`` cancels every waiting job and the running one, marking them ``stopped`` (a
server told to stop does it first, so that no client's generation holds the shutdown, and
each answer says why it was cut short); ``stop`` then ends the
thread and returns whether it ended: only then may the session's models be freed (a
generation still running would use freed memory).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from localspec.core.events import EngineWarning, Event
from localspec.core.params import GenerationParams
from localspec.session.session import Session

log = logging.getLogger("localspec.serve")


class QueueFull(Exception):
    """Every waiting slot is taken."""


@dataclass
class Job:
    """``start(session, cancel)`` returns the event iterator (it may raise a typed error)."""

    start: Callable[[Session, threading.Event], Iterator[Event]]
    params: GenerationParams
    client: str = ""  # whose job this is ("" when the server has no key)
    cancel: threading.Event = field(default_factory=threading.Event)
    stopped: bool = False  # cancelled because the server is stopping (not by its client)
    events: queue.Queue = field(default_factory=queue.Queue)  # Event | BaseException | None


OnClient = Callable[[Session, str], None]


class GenerationWorker:
    def __init__(
        self, session: Session, max_queue: int = 16, on_client: OnClient | None = None
    ) -> None:
        if max_queue < 1:  # queue.Queue(0) would never be full
            raise ValueError("max_queue must be at least 1")
        self.session = session
        self.on_client = on_client
        self._client: str | None = None  # whose job ran last
        self._running: Job | None = None
        self._stopping = False
        self._jobs: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._thread = threading.Thread(target=self._run, name="localspec-worker", daemon=True)
        self.busy = False
        self.served = 0
        self.submitted = 0  # jobs accepted into the queue so far

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> Job:
        if self._stopping:
            raise QueueFull
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            raise QueueFull from None
        self.submitted += 1
        return job

    @property
    def waiting(self) -> int:
        return self._jobs.qsize()

    def cancel_all(self) -> None:
        """Take no more jobs; cancel the waiting ones and the running one (it ends after its
        current round). What a server does as soon as it is told to stop."""
        self._stopping = True
        while True:  # cancel everything still waiting
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.stopped = True
                job.cancel.set()
                job.events.put(None)
        running = self._running
        if running is not None:
            running.stopped = True
            running.cancel.set()

    def stop(self, timeout: float = 30.0) -> bool:
        """``cancel_all``, then wait for the thread to end; False if it is still running
        after ``timeout`` (then the session's models must not be freed)."""
        self.cancel_all()
        self._jobs.put(None)
        if self._thread.ident is None:  # never started: nothing can be running
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if job.cancel.is_set():  # its client left while it waited
                job.events.put(None)
                continue
            self.busy = True
            self._running = job
            if self._stopping:  # stop() may have looked before this job was running
                job.cancel.set()
            try:
                if job.client != self._client and self.on_client is not None:
                    self._client = None  # in case the switch fails half-way
                    self.on_client(self.session, job.client)
                self._client = job.client
                for event in job.start(self.session, job.cancel):
                    if isinstance(event, EngineWarning):  # the server's operator reads its log
                        log.warning("%s", event.message)
                    job.events.put(event)
            except BaseException as err:  # handed to the request, which renders it
                job.events.put(err)
            finally:
                self._running = None
                self.busy = False
                self.served += 1
                job.events.put(None)
