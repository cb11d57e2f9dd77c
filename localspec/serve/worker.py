"""One generation at a time over one ``Session``, in arrival order.

``GenerationWorker`` owns the session on a single thread. ``submit`` puts a ``Job`` in a
bounded FIFO (``QueueFull`` when it is full); the thread runs jobs one by one and pushes
each engine event onto the job's own queue, then ``None`` when the job is over. Setting
``job.cancel`` stops the generation after its current round (the engine's cancel flag), so
a client that went away frees the engine for the next job. Keeping one session means a
follow-up turn of a conversation reuses both models' KV caches (longest common prefix).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from localspec.core.events import Event
from localspec.core.params import GenerationParams


class QueueFull(Exception):
    """Every waiting slot is taken."""


@dataclass
class Job:
    """``start(session, cancel)`` returns the event iterator (it may raise a typed error)."""

    start: Callable[[Any, threading.Event], Iterator[Event]]
    params: GenerationParams
    cancel: threading.Event = field(default_factory=threading.Event)
    events: queue.Queue = field(default_factory=queue.Queue)  # Event | BaseException | None


class GenerationWorker:
    def __init__(self, session: Any, max_queue: int = 16) -> None:
        self.session = session
        self._jobs: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self._thread = threading.Thread(target=self._run, name="localspec-worker", daemon=True)
        self.busy = False
        self.served = 0
        self.submitted = 0  # jobs accepted into the queue so far

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> Job:
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            raise QueueFull from None
        self.submitted += 1
        return job

    @property
    def waiting(self) -> int:
        return self._jobs.qsize()

    def stop(self, timeout: float = 10.0) -> None:
        """Let the running job finish its round, then end the thread."""
        while True:  # cancel everything still waiting
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job.events.put(None)
        self._jobs.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if job.cancel.is_set():  # its client left while it waited
                job.events.put(None)
                continue
            self.busy = True
            try:
                for event in job.start(self.session, job.cancel):
                    job.events.put(event)
            except BaseException as err:  # handed to the request, which renders it
                job.events.put(err)
            finally:
                self.busy = False
                self.served += 1
                job.events.put(None)
