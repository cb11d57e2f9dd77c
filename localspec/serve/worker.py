"""Generations over one loaded pair: as many at once as the pair has lanes, the others
queued, short ones first.

``GenerationWorker`` runs a thread per lane of the session's pair (``Session.lanes``; one
lane is the server of one generation at a time). ``submit`` queues a ``Job`` (``QueueFull``
when ``max_queue`` jobs wait already); a free lane takes the waiting job that goes first
(an interactive one, ``Job.interactive`` or at most ``INTERACTIVE_TOKENS`` new tokens, before
the others, then in arrival order), and pushes each engine event onto the job's own queue,
then ``None`` when the job is over; an ``EngineWarning`` (a failed history or learning save
among them) is written to the server's log as it passes, as an answer has no place for it.
With several lanes their threads take turns round by round (backend/lanes.py), so a new
request starts within a round of the ones running and none waits for another to end (on a
CPU an interactive one takes most rounds while it runs, each other at least one in eight);
where
this machine's measured costs say that one evaluation of several lanes' rounds costs less
than one after another, the rounds' batches are gathered into one. Setting ``job.cancel``
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

import contextlib
import heapq
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from localspec.backend.lanes import LaneClock, Turns, gather_pays, joining_slows
from localspec.core.events import EngineWarning, Event, PrefillDone, RoundCompleted
from localspec.core.params import GenerationParams
from localspec.session.session import Session

log = logging.getLogger("localspec.serve")
# The events after which a generation's next step is a round of its own: where a lane
# passes the turn on (the events of a round's tokens come without evaluating anything).
ROUND_ENDS = (PrefillDone, RoundCompleted)
# A request for at most this many new tokens is interactive (an editor's completion): it
# goes before longer ones waiting for a lane.
INTERACTIVE_TOKENS = 128


class QueueFull(Exception):
    """Every waiting slot is taken."""


@dataclass
class Job:
    """``start(session, cancel)`` returns the event iterator (it may raise a typed error)."""

    start: Callable[[Session, threading.Event], Iterator[Event]]
    params: GenerationParams
    client: str = ""  # whose job this is ("" when the server has no key)
    interactive: bool = False  # a fill-in-the-middle: someone is typing and waits for it
    cancel: threading.Event = field(default_factory=threading.Event)
    stopped: bool = False  # cancelled because the server is stopping (not by its client)
    events: queue.Queue = field(default_factory=queue.Queue)  # Event | BaseException | None

    @property
    def first(self) -> bool:
        """Whether it goes before the jobs that are not (see the module docstring)."""
        return self.interactive or self.params.max_tokens <= INTERACTIVE_TOKENS


OnClient = Callable[[Session, str], None]


@dataclass(eq=False)
class _Lane:
    session: Session
    clock: LaneClock = field(default_factory=LaneClock)
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
        self.turns: Turns | None = None
        if len(self._lanes) > 1:
            self.turns = Turns(
                gather=_gathers(session) if gather is None else gather, defer=_defers(session)
            )
            for lane in self._lanes:
                lane.session.run_lanes(self.turns, lane.clock.now)
        self._cond = threading.Condition()
        self._waiting: list[tuple[bool, int, Job]] = []  # a heap: first ones, then in order
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
                raise QueueFull
            heapq.heappush(self._waiting, (not job.first, next(self._order), job))
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
            job = heapq.heappop(self._waiting)[2]
            if job.cancel.is_set():  # its client left while it waited
                job.events.put(None)
                continue
            lane = _lane_for(job, free)
            free.remove(lane)
            lane.job = job
        self._cond.notify_all()

    def cancel_all(self) -> None:
        """Take no more jobs; cancel the waiting ones and the running ones (each ends after
        its current round). What a server does as soon as it is told to stop."""
        with self._cond:
            self._stopping = True
            for _, _, job in self._waiting:
                job.stopped = True
                job.cancel.set()
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
        turns = self.turns
        try:
            lanes = turns.turn(lane.clock, first=job.first) if turns is not None else None
            with lanes or contextlib.nullcontext():
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
                    job.events.put(event)
                    if turns is not None and isinstance(event, ROUND_ENDS):
                        turns.pass_on()  # the next event begins a round
        except BaseException as err:  # handed to the request, which renders it
            job.events.put(err)
        finally:
            job.events.put(None)


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
