"""Generations over one loaded pair: as many at once as the pair has lanes, the others
queued, short ones first but none starved.

``GenerationWorker`` runs a thread per lane of the session's pair (``Session.lanes``; one
lane is the server of one generation at a time). ``submit`` queues a ``Job`` (``QueueFull``
when ``max_queue`` jobs wait already); a free lane takes the waiting job that goes first
(``_take_next``: while other clients wait, none of a client that holds a lane already; then
a job passed over ``AGE_PASSES`` times or waiting ``AGE_S`` seconds; then an interactive one,
whose whole work, prompts times ``max_tokens``, is at most ``INTERACTIVE_TOKENS`` new tokens,
``FIM_TOKENS`` for a fill-in-the-middle; then in arrival order), and puts each engine event
into the job's ``Events``, then ``None`` when the job is over: a request on the event loop
waits for them on an ``asyncio`` queue, never on a thread. ``withdraw`` takes a job whose
client left out of the queue at once. An ``EngineWarning`` (a failed history or learning
save among them) is written to the server's log as it passes, as an answer has no place for
it.
With several lanes their threads take turns round by round (backend/lanes.py), so a new
request starts within a round of the ones running and none waits for another to end (on a
CPU an interactive one takes most rounds while it runs, each other at least one in eight),
each lane's rounds counted for its job's client: a client holding several lanes takes no
more rounds than one holding one while both wait for the turn; where this machine's
measured costs say that one evaluation of several lanes' rounds costs less than one after
another, the rounds' batches are gathered into one. Setting ``job.cancel``
stops the generation after its current round (the engine's cancel flag), and its lane
takes the next job at once. A follow-up turn of a conversation reuses its lane's KV caches
(longest common prefix): a job goes to a lane that served its client last where it can,
one that served a job of its kind (interactive or not) first.

Clients are kept apart: each ``Job`` names its ``client`` (a digest of its API key, see
serve/access.py), and before a lane runs a job of another client than its last one the
worker calls ``on_client(session, client)`` on that lane's session (``begin_client``: its
caches emptied, its drafters as they were restored at start, that client's own history),
so that nothing one client asked or was answered shapes another's drafts or cache figures.
Lanes share nothing else a client could see: each has its own sequences of the models'
caches, its own drafters and its own timings.

``cancel_all`` cancels every waiting job and the running ones, marking them ``stopped`` (a
server told to stop does it first, so that no client's generation holds the shutdown, and
each answer says why it was cut short); ``stop`` then ends the threads and returns whether
they ended: only then may the session's models be freed (a generation still running would
use freed memory).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from localspec.backend.lanes import gather_pays, joining_slows
from localspec.core.events import EngineWarning, Event
from localspec.core.params import GenerationParams
from localspec.serve.metrics import Metrics
from localspec.session.session import Session

log = logging.getLogger("localspec.serve")
# A request whose whole work (its prompts times its max_tokens) is at most this many new
# tokens is interactive: it goes before longer ones waiting for a lane. A fill-in-the-middle
# (someone typing waits for it) is interactive up to FIM_TOKENS.
INTERACTIVE_TOKENS = 128
FIM_TOKENS = 512
# A waiting job passed over this many times (later jobs given a lane before it), or waiting
# this many seconds, goes next: short requests arriving without end cannot starve it.
AGE_PASSES = 4
AGE_S = 5.0


class QueueFull(Exception):
    """Every waiting slot is taken."""


class Events:
    """A job's events (``Event``, ``BaseException``, then ``None``), put by the worker's
    threads for one reader: a thread (``get``) or, once ``bind`` has tied them to an event
    loop, a coroutine (``next``) waiting on an ``asyncio.Queue`` that ``put`` feeds with
    ``call_soon_threadsafe``, so that no thread waits for a reader that is waiting."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._plain: queue.Queue[Any] = queue.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queue: asyncio.Queue[Any] | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Hand every event from now on to ``loop`` (called on its thread)."""
        with self._lock:
            self._queue = asyncio.Queue()
            self._loop = loop
            while not self._plain.empty():  # what came before, in order
                self._queue.put_nowait(self._plain.get_nowait())

    def put(self, item: Any) -> None:
        with self._lock:
            loop, into = self._loop, self._queue
            if loop is None or into is None:
                self._plain.put(item)
                return
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody reads them
            loop.call_soon_threadsafe(into.put_nowait, item)

    def get(self, timeout: float | None = None) -> Any:
        """The next event, for a reader on a thread (never bound)."""
        return self._plain.get(timeout=timeout)

    async def next(self) -> Any:
        """The next event, on the loop they are bound to."""
        assert self._queue is not None, "bind the events to the loop first"
        return await self._queue.get()


@dataclass(eq=False)
class Job:
    """``start(session, cancel)`` returns the event iterator (it may raise a typed error)."""

    start: Callable[[Session, threading.Event], Iterator[Event]]
    params: GenerationParams
    client: str = ""  # whose job this is ("" when the server has no key)
    interactive: bool = False  # a fill-in-the-middle: someone is typing and waits for it
    prompts: int = 1  # generations it runs, one after another (each up to max_tokens)
    cancel: threading.Event = field(default_factory=threading.Event)
    stopped: bool = False  # cancelled because the server is stopping (not by its client)
    events: Events = field(default_factory=Events)
    # Its place in the queue, kept by the worker: arrival, and times passed over.
    order: int = 0
    since: float = 0.0
    passes: int = 0
    outcome: str | None = None  # how it ended (serve/metrics.py's OUTCOMES), once it has

    @property
    def work(self) -> int:
        """The most new tokens it may generate in all."""
        return max(1, self.prompts) * self.params.max_tokens

    @property
    def first(self) -> bool:
        """Whether it goes before the jobs that are not (see the module docstring)."""
        return self.work <= (FIM_TOKENS if self.interactive else INTERACTIVE_TOKENS)

    def aged(self, now: float) -> bool:
        """Whether it has waited long enough to go next (``AGE_PASSES``, ``AGE_S``)."""
        return self.passes >= AGE_PASSES or now - self.since >= AGE_S


OnClient = Callable[[Session, str], None]


@dataclass(eq=False)
class _Lane:
    session: Session
    client: str | None = None  # whose job it ran last (None: nobody's yet, or unknown)
    first: bool = False  # whether that job was interactive
    job: Job | None = None  # the job it runs
    used: int = 0  # when it last ended a job, in jobs served


class GenerationWorker:
    def __init__(
        self,
        session: Session,
        max_queue: int = 16,
        on_client: OnClient | None = None,
        *,
        gather: bool | None = None,
    ) -> None:
        """``gather``: gather the lanes' rounds into one evaluation (None: where this
        machine's measured costs say it pays)."""
        if max_queue < 1:  # a queue of 0 would refuse every job
            raise ValueError("max_queue must be at least 1")
        self.session = session
        self.on_client = on_client
        self.max_queue = max_queue
        self._lanes = [_Lane(lane) for lane in session.lanes()]  # lane 0: the session
        # How the lanes' turns go (backend/lanes.py): their rounds gathered, interactive
        # jobs' rounds first.
        several = len(self._lanes) > 1
        self.gather = several and (_gathers(session) if gather is None else gather)
        self.defer = several and _defers(session)
        self._cond = threading.Condition()
        self._waiting: list[Job] = []  # in arrival order (``_take_next`` picks)
        self._order = itertools.count()
        self._started = False  # lanes take jobs once their threads run
        self._stopping = False
        self._ended = False
        self._threads = [
            threading.Thread(
                target=self._run, args=(lane,), name=f"localspec-lane-{i}", daemon=True
            )  # fmt: skip
            for i, lane in enumerate(self._lanes)
        ]
        self.served = 0
        self.submitted = 0  # jobs accepted into the queue so far
        self.metrics = Metrics()

    @property
    def lanes(self) -> int:
        return len(self._lanes)

    @property
    def running(self) -> int:
        return sum(lane.job is not None for lane in self._lanes)

    def start(self) -> None:
        for thread in self._threads:
            thread.start()
        with self._cond:
            self._started = True
            self._dispatch()

    def submit(self, job: Job) -> Job:
        with self._cond:
            if self._stopping or len(self._waiting) >= self.max_queue:
                self._count_end(job, "queue_full")
                raise QueueFull
            job.order, job.since, job.passes = next(self._order), time.monotonic(), 0
            self._waiting.append(job)
            self.submitted += 1
            self._dispatch()
        return job

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def _dispatch(self) -> None:
        """Give waiting jobs to free lanes (the condition held)."""
        free = [lane for lane in self._lanes if lane.job is None] if self._started else []
        while free and self._waiting:
            job = self._take_next()
            if job.cancel.is_set():  # its client left while it waited
                self._count_end(job, "stopped" if job.stopped else "cancelled")
                job.events.put(None)
                continue
            lane = _lane_for(job, free)
            free.remove(lane)
            lane.job = job
        self._cond.notify_all()

    def _take_next(self) -> Job:
        """Take the waiting job that goes next (the condition held, some waiting): among
        the clients that hold no lane, where some wait (one lane per client while others
        wait), one aged (``Job.aged``), else an interactive one, else the first to come;
        the jobs that came before it count one more pass."""
        busy = {lane.job.client for lane in self._lanes if lane.job is not None}
        pool = [job for job in self._waiting if job.client not in busy] or self._waiting
        now = time.monotonic()
        aged = [job for job in pool if job.aged(now)]
        chosen = aged[0] if aged else min(pool, key=lambda job: (not job.first, job.order))
        self._waiting.remove(chosen)
        for job in self._waiting:
            if job.order < chosen.order:
                job.passes += 1
        return chosen

    def _count_end(self, job: Job, outcome: str) -> None:
        """Count how ``job`` ended, once (the first word on it stands)."""
        if job.outcome is None:
            job.outcome = outcome
            self.metrics.ended(job, outcome)

    def withdraw(self, job: Job) -> None:
        """Its client has gone: cancel it, and a waiting job leaves the queue at once (its
        slot free for the next request); its reader is told it is over."""
        job.cancel.set()
        with self._cond:
            if job in self._waiting:
                self._waiting.remove(job)
                self._count_end(job, "cancelled")
        job.events.put(None)

    def cancel_all(self) -> None:
        """Take no more jobs; cancel the waiting ones and the running ones (each ends after
        its current round). What a server does as soon as it is told to stop."""
        with self._cond:
            self._stopping = True
            for job in self._waiting:
                job.stopped = True
                job.cancel.set()
                self._count_end(job, "stopped")
                job.events.put(None)
            self._waiting.clear()
            for lane in self._lanes:
                if lane.job is not None:
                    lane.job.stopped = True
                    lane.job.cancel.set()

    def stop(self, timeout: float = 30.0) -> bool:
        """``cancel_all``, then wait for the threads to end; False if one still runs after
        ``timeout`` (then the session's models must not be freed)."""
        self.cancel_all()
        with self._cond:
            self._ended = True
            self._cond.notify_all()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            if thread.ident is None:  # never started: nothing can be running
                continue
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self._threads)

    def _run(self, lane: _Lane) -> None:
        while True:
            with self._cond:
                while lane.job is None and not self._ended:
                    self._cond.wait()
                job = lane.job
            if job is None:
                return
            try:
                self._serve(lane, job)
            finally:
                with self._cond:
                    lane.job = None
                    self.served += 1
                    lane.used = self.served
                    self._dispatch()

    def _serve(self, lane: _Lane, job: Job) -> None:
        try:
            with self._turn(lane, job):
                if self._stopping:  # cancel_all may have looked before this job was running
                    job.stopped = True
                    job.cancel.set()
                if job.cancel.is_set():  # its client left, or the server stops
                    return
                if job.client != lane.client and self.on_client is not None:
                    lane.client = None  # in case the switch fails half-way
                    self.on_client(lane.session, job.client)
                lane.client, lane.first = job.client, job.first
                for event in job.start(lane.session, job.cancel):
                    if isinstance(event, EngineWarning):  # the server's operator reads its log
                        log.warning("%s", event.message)
                    self.metrics.observe(job, event, time.monotonic())
                    job.events.put(event)
        except BaseException as err:  # handed to the request, which renders it
            self._count_end(job, "failed")
            job.events.put(err)
        finally:
            cut = job.stopped and "stopped" or job.cancel.is_set() and "cancelled"
            self._count_end(job, cut or "completed")
            job.events.put(None)

    def _turn(self, lane: _Lane, job: Job) -> contextlib.AbstractContextManager[Any]:
        """The lane's turn for ``job`` where several lanes take turns; the engine passes it
        on after every round."""
        if len(self._lanes) == 1:
            return contextlib.nullcontext()
        first = job.first and self.defer
        return lane.session.turn(first=first, client=job.client, gather=self.gather)


def _lane_for(job: Job, free: list[_Lane]) -> _Lane:
    """The free lane for ``job``: one its client used last for a job of its kind (an editor's
    completions find their file's prefix there, a chat its conversation's), else one never
    used, else one its client used last, else the one idle longest."""
    for lane in free:
        if lane.client == job.client and lane.first == job.first:
            return lane
    for lane in free:
        if lane.used == 0:  # empty: its client's other lane keeps its prefix
            return lane
    for lane in free:
        if lane.client == job.client:
            return lane
    return min(free, key=lambda lane: lane.used)


def _defers(session: Session) -> bool:
    """Whether interactive jobs take most rounds (where another lane's tokens would slow
    theirs: this machine's measured costs; without them, as on a CPU)."""
    costs = session.costs
    return costs is None or joining_slows(costs.plain_s, costs.verify_s)


def _gathers(session: Session) -> bool:
    """Whether gathering the lanes' rounds pays on this machine (its measured costs)."""
    return session.costs is not None and gather_pays(session.costs.verify_s)
