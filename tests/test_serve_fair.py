"""The server's queue when it is busy: which waiting job a free lane takes (ageing, whole
work, one lane per client while others wait), a client's share of the lanes' rounds, a
job whose client left leaving the queue at once, and a job's events reaching the event
loop with no thread waiting for them. The worker over a stand-in session whose jobs run
until the test lets them end."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import pytest

from localspec.backend.lanes import LaneScheduler
from localspec.core.events import PrefillDone
from localspec.core.params import GenerationParams
from localspec.serve.worker import AGE_PASSES, FIM_TOKENS, GenerationWorker, Job


class StandInLane:
    """A lane's session that evaluates nothing (the jobs are the test's): it takes turns
    under one scheduler, and its jobs pass the turn on after each round, as the engine does
    (``round``)."""

    def __init__(self, scheduler: LaneScheduler, sessions: list[StandInLane]) -> None:
        self.scheduler, self.costs, self.held = scheduler, None, None
        self.lanes = lambda: sessions

    @contextlib.contextmanager
    def turn(self, *, first: bool = False, client: str = "", gather: bool = False):
        with self.scheduler.turn(first=first, client=client, gather=gather) as held:
            self.held = held
            yield held

    def round(self) -> None:
        self.held.pass_on()


def stand_in(lanes: int = 1) -> StandInLane:
    """A session with ``lanes`` lanes that evaluate nothing (the jobs are the test's)."""
    scheduler, sessions = LaneScheduler(), []
    sessions += [StandInLane(scheduler, sessions) for _ in range(lanes)]
    return sessions[0]


class Gate:
    """Jobs that each run until the test releases them; ``started`` lists them in the order
    the lanes took them."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.cond = threading.Condition()
        self.released: set[str] = set()
        self.names: dict[int, str] = {}

    def job(self, name: str, max_tokens: int = 24, client: str = "", **kw) -> Job:
        def start(session, cancel):
            with self.cond:
                self.started.append(name)
                self.cond.notify_all()
            # Rounds until released: a lane passes the turn on after each (several lanes).
            while True:
                with self.cond:
                    if self.cond.wait_for(lambda: name in self.released or cancel.is_set(), 0.01):
                        return
                yield PrefillDone(1, 1, 0.0)
                if len(session.lanes()) > 1:
                    session.round()

        job = Job(start, GenerationParams(max_tokens=max_tokens), client=client, **kw)
        self.names[id(job)] = name
        return job

    def running(self, w: GenerationWorker) -> set[str]:
        """The jobs the worker's lanes hold (with several lanes, one at a time evaluates:
        a job may hold its lane before it has started)."""
        with w._cond:
            return {self.names[id(lane.job)] for lane in w._lanes if lane.job is not None}

    def release(self, name: str) -> None:
        with self.cond:
            self.released.add(name)
            self.cond.notify_all()

    def wait_started(self, count: int) -> list[str]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.started) >= count, 10), self.started
            return list(self.started)


@pytest.fixture
def worker():
    made: list[GenerationWorker] = []

    def make(lanes: int = 1) -> GenerationWorker:
        made.append(GenerationWorker(stand_in(lanes), max_queue=64))
        made[-1].start()
        return made[-1]

    yield make
    for w in made:
        w.stop(5)


def test_a_long_job_is_not_starved_by_short_ones_arriving_without_end(worker):
    """One lane; a long request waits while a short one arrives each time the lane frees:
    once passed over ``AGE_PASSES`` times, the long one goes next."""
    w, gate = worker(1), Gate()
    w.submit(gate.job("busy"))
    gate.wait_started(1)
    w.submit(gate.job("long", max_tokens=300))
    running = "busy"
    for i in range(AGE_PASSES + 3):
        w.submit(gate.job(f"short{i}", max_tokens=24))
        gate.release(running)
        running = gate.wait_started(i + 2)[-1]
        if running == "long":
            break
    assert gate.started == ["busy", *[f"short{i}" for i in range(AGE_PASSES)], "long"]
    gate.release("long")


def test_a_job_waiting_long_enough_goes_next(worker, monkeypatch):
    from localspec.serve import worker as module

    monkeypatch.setattr(module, "AGE_S", 0.0)  # every job has waited long enough at once
    w, gate = worker(1), Gate()
    w.submit(gate.job("busy"))
    gate.wait_started(1)
    w.submit(gate.job("long", max_tokens=300))
    w.submit(gate.job("short", max_tokens=8))
    gate.release("busy")
    assert gate.wait_started(2)[-1] == "long"  # first come, as it has aged
    gate.release("long"), gate.release("short")


@pytest.mark.parametrize(
    "max_tokens, prompts, fim, first",
    [
        (128, 1, False, True),
        (129, 1, False, False),
        (128, 16, False, False),  # sixteen short prompts are a long request
        (64, 2, False, True),
        (FIM_TOKENS, 1, True, True),  # a fill-in-the-middle: someone typing waits for it
        (FIM_TOKENS, 2, True, False),
    ],
)
def test_a_job_is_interactive_by_its_whole_work(max_tokens, prompts, fim, first):
    job = Job(lambda s, c: iter(()), GenerationParams(max_tokens=max_tokens),
              interactive=fim, prompts=prompts)  # fmt: skip
    assert job.first is first


def test_many_short_prompts_do_not_go_before_a_long_request(worker):
    w, gate = worker(1), Gate()
    w.submit(gate.job("busy"))
    gate.wait_started(1)
    w.submit(gate.job("long", max_tokens=300))
    w.submit(gate.job("sixteen", max_tokens=100, prompts=16))  # 1600 tokens in all
    w.submit(gate.job("short", max_tokens=100))
    gate.release("busy")
    assert gate.wait_started(2)[-1] == "short"
    gate.release("short")
    assert gate.wait_started(3)[-1] == "long"  # arrival order among the long ones
    gate.release("long"), gate.release("sixteen")


def test_a_client_holding_a_lane_waits_while_other_clients_wait(worker):
    """Two lanes: client a runs on one; when the other frees, client b's request goes
    before a's next one, although a's came first."""
    w, gate = worker(2), Gate()
    w.submit(gate.job("a1", client="a"))
    w.submit(gate.job("c1", client="c"))
    wait_for(lambda: gate.running(w) == {"a1", "c1"})
    w.submit(gate.job("a2", client="a"))
    w.submit(gate.job("b1", client="b"))
    gate.release("c1")
    wait_for(lambda: gate.running(w) == {"a1", "b1"})
    gate.release("a1")
    wait_for(lambda: gate.running(w) == {"a2", "b1"})  # nobody else waits: a may have two
    gate.release("a2"), gate.release("b1")


def test_a_client_holding_two_lanes_takes_no_more_rounds_than_one_holding_one(worker):
    """Three lanes: client a's two jobs took two while nobody else waited; client b's job
    takes the third, and while it runs the rounds alternate between the clients."""
    w, rounds, b_done = worker(3), [], threading.Event()

    def start(client: str, until):
        def run(session, cancel):
            while not (until() or cancel.is_set()):
                rounds.append(client)
                yield PrefillDone(1, 1, 0.0)
                session.round()

        return run

    for _ in range(2):
        w.submit(Job(start("a", b_done.is_set), GenerationParams(max_tokens=24), client="a"))
    wait_for(lambda: w.running == 2 and "a" in rounds)
    b_rounds = lambda: rounds.count("b") >= 12  # noqa: E731
    b = w.submit(Job(start("b", b_rounds), GenerationParams(max_tokens=24), client="b"))
    assert b.events.get(timeout=10) is not None  # its first round
    wait_for(b_rounds)
    b_done.set()
    window = rounds[rounds.index("b") : len(rounds) - rounds[::-1].index("b")]
    assert window.count("b") == 12 and window.count("a") <= 13, window


def wait_for(condition, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_withdrawn_waiting_job_leaves_the_queue_at_once(worker):
    w, gate = worker(1), Gate()
    w.submit(gate.job("busy"))
    gate.wait_started(1)
    left = w.submit(gate.job("left"))
    stays = w.submit(gate.job("stays"))
    assert w.waiting == 2
    w.withdraw(left)
    assert w.waiting == 1 and left.cancel.is_set()
    assert left.events.get(timeout=1) is None  # its reader is told it is over
    gate.release("busy")
    assert gate.wait_started(2)[-1] == "stays"
    gate.release("stays")
    assert stays.events.get(timeout=5) is None


def test_events_reach_the_loop_with_no_thread_waiting_for_them():
    """A reader on the event loop waits on an asyncio queue the worker's thread feeds:
    nothing of Python's thread pool is used, however many wait."""

    async def main() -> list:
        loop = asyncio.get_running_loop()
        jobs = [Job(lambda s, c: iter(()), GenerationParams()) for _ in range(40)]
        for job in jobs:
            job.events.put("early")  # before it was bound: kept, in order
            job.events.bind(loop)
        readers = [asyncio.create_task(_read_all(job)) for job in jobs]
        await asyncio.sleep(0.05)
        pool = [t for t in threading.enumerate() if t.name.startswith("asyncio")]

        def feed() -> None:
            for job in jobs:
                job.events.put("late")
                job.events.put(None)

        threading.Thread(target=feed).start()
        return [pool, *(await asyncio.gather(*readers))]

    pool, *read = asyncio.run(main())
    assert pool == []
    assert read == [["early", "late"]] * 40


async def _read_all(job: Job) -> list:
    items = []
    while (item := await job.events.next()) is not None:
        items.append(item)
    return items


def test_interactive_jobs_go_first_only_where_joining_a_batch_slows_it():
    """On a GPU (another lane's token in a batch costs little) every lane takes its turn in
    order; where nothing is measured, as on a CPU, an interactive job's rounds go first."""
    from localspec.core.costs import CostProfile

    job = Job(lambda session, cancel: iter(()), GenerationParams(max_tokens=24))
    assert job.first
    for costs, first in ((CostProfile(plain_s=0.010, verify_s={1: 0.0105}), False), (None, True)):
        session = stand_in(2)
        session.costs = costs
        w = GenerationWorker(session)
        assert w.defer is first
        with w._turn(w._lanes[0], job) as held:
            assert held.first is first
