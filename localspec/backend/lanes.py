"""Lanes: several generations over one loaded model, taking turns, their target batches
gathered into one evaluation where that pays.

A model loaded with ``LoadOptions.lanes = N`` has N lanes over one llama.cpp context (its
``SharedContext``, backend/context.py), each a ``CachedModel`` of its own
(``LlamaModel.lane(i)``): lane i's committed tokens are one sequence of the context, its
draft trees' leaves the sequences after it, and every lane may fill the lane's context (the
context holds N of them, in one unified cache). llama.cpp masks attention by sequence, so
no lane's tokens reach another's logits.

``LaneScheduler`` is how the lanes' threads share the models: one runs at a time
(llama.cpp's context is not for two threads at once, and where one evaluation fills the
machine two side by side take as long as one after the other), first come first served. A
thread holds its lane's turn through a round (``turn`` gives it a ``Turn``) and passes it on
between rounds (``Turn.pass_on``), so the running generations advance round by round, none
waiting for another to end. An interactive lane (``turn(first=True)``: an editor's
completion, which someone typing waits for) goes before the others waiting, but an ordinary
lane passed over ``SKIPS`` times goes
next, so no lane gets less than one round in ``SKIPS + 1``: where another lane's tokens in
its batch would slow it (``joining_slows``: a CPU, where a batch's time grows with each
token), not where they cost little (a GPU).

A lane's turn is also its client's (``turn(client=...)``: whose request it serves). Where
lanes of several clients wait, the turn goes by client before lane: each client's waiting
lanes put forward the one that would go first among them, and of those the rule above
picks, clients in the order they last had a round (longest ago first). A client holding
several lanes thus takes no more rounds than one holding one: of K clients whose lanes of
one kind wait, each has one round in K; and a client's ordinary lane, passed over
``SKIPS`` times by other clients' interactive lanes, still goes next. With ``gather`` the
order decides who drafts first, and every lane parked joins the one evaluation: there each
of a client's lanes advances a round per evaluation.

With ``gather`` (a turn's: ``turn(gather=True)``), a lane whose round needs the target parks
that batch (``Turn.park``) and lets the next lane run; once no lane that would run first
wants the turn (an interactive lane's batch does not wait for an ordinary lane that is not
due), the batches parked are evaluated together (``SharedContext.evaluate_slices``: one
``llama_decode`` of every lane's tokens, as many as fit a batch), and each lane goes on with
its own rows. Whether gathering pays is the machine's: one batch of b tokens against two of
b/2 (``gather_pays``, from the measured verification costs).

Every evaluation of the lanes runs on one thread of their own (``LaneScheduler.call``),
whichever lane's thread asks: llama.cpp's CPU backend runs a graph on a team of OpenMP
threads per calling thread, and where the teams outnumber the cores OpenMP stops keeping
its threads awake between evaluations, which a step then waits for (a third slower on two
cores). A pair's draft model evaluates on its target's scheduler's thread too, never
gathered. The thread ends when the scheduler's owner closes (``close``).

``LaneClock`` is a lane's clock for the engine: it runs while the lane holds its turn, and a
gathered evaluation counts for each lane by its share of the batch's tokens, so the costs
the engine learns from its rounds are what the lane's own work cost, not its wait for the
others (the engine already leaves out the time its consumer holds it).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

# Gathering pays where one batch of 2b tokens costs at most this share of two batches of b.
GATHER_SAVES = 0.95
# Rounds an interactive lane may take before an ordinary lane waiting for the turn gets
# one: an ordinary lane has at least 1 / (SKIPS + 1) of the rounds while it runs.
SKIPS = 7
# Clients remembered (when each last had a round) before those with no lane are forgotten.
CLIENTS_KEPT = 64
# Interactive lanes go before the others where a batch of two tokens costs at least this
# many single steps: there a token that joins an interactive lane's batch slows it.
JOINING_SLOWS = 1.5


def joining_slows(plain_s: float, verify_s: dict[int, float]) -> bool:
    """Whether another lane's token in a batch slows the lane whose batch it joins (on a
    CPU, a batch's time grows with each token; on a GPU a few more cost little): where it
    does, interactive lanes run their rounds first (``SKIPS``)."""
    two = verify_s.get(1)
    return two is None or plain_s <= 0 or two / plain_s >= JOINING_SLOWS


def gather_pays(verify_s: dict[int, float]) -> bool:
    """Whether one evaluation of two lanes' rounds costs less than two: ``verify_s`` maps
    drafted tokens k to the measured seconds of a (k + 1)-token batch. Compared where both
    a batch and twice its size were measured (at small, typical round sizes)."""
    pairs = [(k, 2 * k + 1) for k in (1, 2, 3, 4) if k in verify_s and 2 * k + 1 in verify_s]
    if not pairs:
        return False
    ratios = [verify_s[big] / (2 * verify_s[small]) for small, big in pairs]
    return sum(ratios) / len(ratios) <= GATHER_SAVES


@dataclass
class Slice:
    """One lane's part of a batch: each token's position, sequence ids and whether it gives
    an output; ``device``: the outputs are greedy choices made on the device (token ids and,
    with ``confidence``, probabilities), not logits rows."""

    tokens: list[int]
    positions: list[int]
    seqs: Sequence[Sequence[int]]
    outputs: list[bool]
    device: bool = False
    confidence: bool = False

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def n_outputs(self) -> int:
        return sum(self.outputs)


class LaneClock:
    """``now()``: seconds of this lane's own work (see the module docstring)."""

    def __init__(self) -> None:
        self.waited = 0.0  # seconds not counted: waits for the turn, others' shares

    def now(self) -> float:
        return time.perf_counter() - self.waited


@dataclass(eq=False)
class Turn:
    """A lane's place in the queue for the turn, held from ``LaneScheduler.turn`` to the end
    of its block: what ``pass_on`` and ``park`` need, so that only a holder can call them."""

    scheduler: LaneScheduler
    first: bool = False  # interactive: goes before the others (see SKIPS)
    clock: LaneClock | None = None
    client: str = ""  # whose request the lane serves: clients share the rounds
    gather: bool = False  # its batches may be parked and evaluated with other lanes'
    skips: int = 0  # times passed over for an interactive lane since its last round

    def waited(self, seconds: float) -> None:
        """``seconds`` were not this lane's work."""
        if self.clock is not None:
            self.clock.waited += seconds

    def pass_on(self) -> None:
        """Between rounds: let every lane waiting for the turn have it first."""
        self.scheduler._pass_on(self)

    def park(self, work: Slice, evaluate: Evaluate) -> tuple[Any, float]:
        """Evaluate ``work`` with the other lanes' parked slices (``evaluate``: their
        results, in order, and the seconds the evaluations took); this lane's result and its
        share of those seconds. Returns holding the turn again."""
        return self.scheduler._park(self, work, evaluate)


Evaluate = Callable[[list[Slice]], tuple[list[Any], float]]


@dataclass
class _Parked:
    turn: Turn
    work: Slice
    evaluate: Evaluate
    done: bool = False
    result: Any = None
    share_s: float = 0.0  # this slice's share of the evaluations' seconds


@dataclass(eq=False)
class LaneScheduler:
    """One lane's thread at a time (see the module docstring); ``close`` ends its
    evaluating thread."""

    _cond: threading.Condition = field(default_factory=threading.Condition)
    _queue: deque = field(default_factory=deque)  # turns waiting, in order
    _holder: Turn | None = None
    _rounds: int = 0  # turns taken so far
    _last: dict[str, int] = field(default_factory=dict)  # client -> its last turn's number
    _parked: list[_Parked] = field(default_factory=list)
    evaluations: int = 0  # gathered evaluations run
    gathered: int = 0  # slices they evaluated
    _evaluating: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="localspec-compute")
    )

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` on the lanes' one evaluating thread (see the module docstring)."""
        return self._evaluating.submit(fn, *args).result()

    def close(self) -> None:
        """End the evaluating thread (its context is freed: nothing is evaluated again)."""
        self._evaluating.shutdown(wait=True)

    @contextlib.contextmanager
    def turn(
        self,
        clock: LaneClock | None = None,
        *,
        first: bool = False,
        client: str = "",
        gather: bool = False,
    ) -> Iterator[Turn]:
        """Hold a turn (waiting for it first), timed by ``clock``; its ``pass_on`` and
        ``park`` let the others run meanwhile. ``first``: an interactive lane; ``client``:
        whose request it serves; ``gather``: its batches may be gathered with the other
        lanes' (see the module docstring)."""
        turn = Turn(self, first, clock, client, gather)
        with self._cond:
            self._wait_for_turn(turn)
        try:
            yield turn
        finally:
            with self._cond:
                self._release(turn)

    def _wait_for_turn(self, turn: Turn) -> None:
        """Queue ``turn`` and wait until it is the holder (the condition held)."""
        t0 = time.perf_counter()
        self._queue.append(turn)
        self._cond.notify_all()
        self._await_turn(turn)
        turn.waited(time.perf_counter() - t0)

    def _await_turn(self, turn: Turn, ready: Callable[[], bool] = lambda: True) -> None:
        """Wait until ``ready()`` and ``turn`` goes next, and take it (the condition held,
        ``turn`` queued or queued once ``ready``)."""
        while not (ready() and self._holder is None and self._next() is turn):
            self._cond.wait()
        self._take(turn)

    def _next(self) -> Turn | None:
        """The waiting lane whose turn is next: of each client's waiting lanes the one
        ``_pick`` takes, and of those, clients in the order they last had a round, the one
        ``_pick`` takes (see the module docstring)."""
        by_client: dict[str, list[Turn]] = {}
        for turn in self._queue:
            by_client.setdefault(turn.client, []).append(turn)
        if len(by_client) <= 1:  # one client: its lanes in the rule's order
            return _pick(self._queue)
        ahead = sorted(by_client, key=lambda client: self._last.get(client, -1))
        return _pick([t for client in ahead if (t := _pick(by_client[client])) is not None])

    def _take(self, turn: Turn) -> None:
        """``turn`` is held; the ordinary lanes it went before count it, and its client's
        round is the latest."""
        self._rounds += 1
        self._last[turn.client] = self._rounds
        if len(self._last) > CLIENTS_KEPT:
            self._forget_clients()
        self._queue.remove(turn)
        self._holder = turn
        if not turn.first:
            turn.skips = 0
            return
        for other in self._queue:
            if not other.first:
                other.skips += 1

    def _forget_clients(self) -> None:
        """Keep the last rounds of the clients whose lanes wait, run or are parked only:
        a client that comes back later goes as one that never had a round."""
        live = {t.client for t in self._queue} | {p.turn.client for p in self._parked}
        if self._holder is not None:
            live.add(self._holder.client)
        self._last = {client: n for client, n in self._last.items() if client in live}

    def _none_due(self, turn: Turn) -> bool:
        """Whether no waiting lane would run before ``turn``'s next round: none waits, or
        ``turn`` is interactive and only ordinary lanes not yet due wait."""
        if not self._queue:
            return True
        return turn.first and all(not other.first and other.skips < SKIPS for other in self._queue)

    def _release(self, turn: Turn) -> None:
        """Give the turn up; with no one waiting for it, evaluate what is parked first."""
        assert self._holder is turn
        if not self._queue and self._parked:
            self._evaluate_parked(own=None)
        self._holder = None
        self._cond.notify_all()

    @property
    def waiting(self) -> int:
        """Lanes waiting for the turn."""
        return len(self._queue)

    @property
    def alone(self) -> bool:
        """Whether the holder of the turn has nothing to gather with: no lane that would run
        before its next round waits for the turn, and none is parked (its evaluation may
        then run at once, as without lanes)."""
        holder = self._holder
        return not self._parked and (holder is None or self._none_due(holder))

    def _pass_on(self, turn: Turn) -> None:
        with self._cond:
            if not self._queue:
                return
            self._holder = None
            self._wait_for_turn(turn)

    def _park(self, turn: Turn, work: Slice, evaluate: Evaluate) -> tuple[Any, float]:
        if not turn.gather:
            results, seconds = evaluate([work])
            return _raised(results[0]), seconds
        entry = _Parked(turn, work, evaluate)
        with self._cond:
            t0 = time.perf_counter()
            self._parked.append(entry)
            if self._none_due(turn):  # nobody else would run first: evaluate now
                self._evaluate_parked(own=entry)
            else:  # the turn goes on; it comes back once the batch was evaluated
                self._holder = None
                self._cond.notify_all()
                self._await_turn(turn, lambda: entry.done)
            # The others' shares of the evaluation, and their turns, are not this lane's work.
            turn.waited(time.perf_counter() - t0 - entry.share_s)
        return _raised(entry.result), entry.share_s

    def _evaluate_parked(self, own: _Parked | None) -> None:
        """Evaluate every parked slice (the condition and the turn held: nobody else runs
        meanwhile); their lanes queue for the turn again, ``own`` excepted."""
        parked, self._parked = self._parked, []
        by_model: dict[Any, list[_Parked]] = {}
        for entry in parked:
            by_model.setdefault(entry.evaluate, []).append(entry)
        for evaluate, entries in by_model.items():
            try:
                results, seconds = evaluate([e.work for e in entries])
            except BaseException as err:  # each lane raises it as its own
                results, seconds = [err] * len(entries), 0.0
            total = sum(len(e.work) for e in entries) or 1
            for entry, result in zip(entries, results, strict=True):
                entry.result = result
                entry.share_s = seconds * len(entry.work) / total
            self.evaluations += 1
            self.gathered += len(entries)
        for entry in parked:
            entry.done = True
            if entry is not own:
                self._queue.append(entry.turn)
        self._cond.notify_all()


def _pick(turns: Sequence[Turn]) -> Turn | None:
    """Of ``turns`` in their order, the one that goes next: an ordinary lane passed over
    ``SKIPS`` times, else the first interactive one, else the first."""
    for turn in turns:
        if not turn.first and turn.skips >= SKIPS:
            return turn
    for turn in turns:
        if turn.first:
            return turn
    return turns[0] if turns else None


def _raised(result: Any) -> Any:
    if isinstance(result, BaseException):
        raise result
    return result
