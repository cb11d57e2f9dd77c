"""Lanes on llama.cpp (tiny GGUF models): several generations in one context, each lane its
own sequences, evaluated in turn or gathered into one batch, give each lane the logits it
would get alone, and no lane's tokens reach another's cache or rows."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from localspec.backend.lanes import LaneClock, LaneScheduler, Slice, gather_pays
from localspec.backend.llama import LlamaModel, LoadOptions
from localspec.core.tree import DraftTree
from localspec.errors import BackendError

OPTIONS = LoadOptions(n_ctx=128, n_threads=1)
PROMPTS = ([1, 5, 9, 14, 20, 7], [2, 6, 6, 30, 11], [4, 4, 17, 3, 8, 8, 21, 2])
TOLERANCE = 2e-2  # flash attention over cells in other places (see test_backend_tree.py)


@pytest.fixture
def load(tiny_pair):
    target, _, _ = tiny_pair
    loaded: list[LlamaModel] = []

    def load(**options) -> LlamaModel:
        loaded.append(LlamaModel(target, LoadOptions(**{**OPTIONS.__dict__, **options})))
        return loaded[-1]

    yield load
    for m in loaded:
        m.close()


def alone(load, tokens: list[int], n: int) -> np.ndarray:
    model = load()
    return model.forward(tokens, n).copy()


def test_each_lane_has_a_context_of_its_own_and_its_own_sequences(load):
    model = load(lanes=3)
    lanes = [model.lane(i) for i in range(3)]
    assert lanes[0] is model and len({id(m) for m in lanes}) == 3
    assert all(m.n_ctx >= 128 for m in lanes)
    assert [m._seq0 for m in lanes] == [0, 1 + model.tree_seqs, 2 * (1 + model.tree_seqs)]
    assert model.lane(2) is lanes[2]  # one model per lane
    with pytest.raises(ValueError):
        model.lane(3)


def test_lanes_in_turn_give_each_prompt_its_own_logits(load):
    model = load(lanes=3)
    rows = [model.lane(i).forward(p, 2).copy() for i, p in enumerate(PROMPTS)]
    # Lane 0 rolls back and goes on while the others hold their tokens.
    model.truncate(3)
    again = model.forward(PROMPTS[0], 2).copy()
    for i, prompt in enumerate(PROMPTS):
        assert np.allclose(rows[i], alone(load, prompt, 2), atol=TOLERANCE), i
    assert np.allclose(again, rows[0], atol=TOLERANCE)
    assert [model.lane(i).cached for i in range(3)] == [list(p) for p in PROMPTS]


def test_a_lane_emptied_leaves_the_others_untouched(load):
    model = load(lanes=2)
    other = model.lane(1)
    other.forward(PROMPTS[1], 1)
    model.forward(PROMPTS[0], 1)
    model.reset()
    after = other.forward([*PROMPTS[1], 3], 1)
    assert np.allclose(after, alone(load, [*PROMPTS[1], 3], 1), atol=TOLERANCE)
    assert other.evaluated_tokens == len(PROMPTS[1]) + 1  # its prefix was kept


def test_trees_on_a_lane_keep_to_its_own_sequences(load):
    model = load(lanes=2)
    other = model.lane(1)
    other.forward(PROMPTS[1], 0)
    tree = DraftTree.from_branches([[3, 4, 11], [3, 8], [6, 2]])
    rows = other.forward_tree(PROMPTS[0], tree).copy()
    other.keep_path(tree.path(tree.leaves()[0]))
    solo = load()
    expected = solo.forward_tree(PROMPTS[0], tree).copy()
    assert np.allclose(rows, expected, atol=TOLERANCE)
    # Lane 0 never saw the tree: its logits are a fresh context's.
    assert np.allclose(model.forward(PROMPTS[2], 1), alone(load, PROMPTS[2], 1), atol=TOLERANCE)
    assert other.cached == [*PROMPTS[0], 3, 4, 11]


def run_lanes(model: LlamaModel, gather: bool, steps: int) -> tuple[list, list[LaneClock]]:
    """Each lane, in a thread of its own taking turns, evaluates its prompt and then
    ``steps`` greedy tokens, one per round; each lane's rows after every round."""
    results: list[list[np.ndarray]] = [[] for _ in PROMPTS]
    lanes = [model.lane(i) for i in range(len(PROMPTS))]

    def lane(i: int) -> None:
        m = lanes[i]
        with m.turn(gather=gather) as turn:
            tokens = list(PROMPTS[i])
            for _ in range(steps):
                row = m.forward(tokens, 1)[0].copy()
                results[i].append(row)
                tokens.append(int(np.argmax(row)))
                turn.pass_on()

    threads = [threading.Thread(target=lane, args=(i,)) for i in range(len(PROMPTS))]
    run_queued(scheduler_of(model), threads)
    return results, [m.clock for m in lanes]


def scheduler_of(model: LlamaModel) -> LaneScheduler:
    scheduler = model.shared.scheduler
    assert scheduler is not None
    return scheduler


def run_queued(turns: LaneScheduler, threads: list[threading.Thread]) -> None:
    """Start the lanes' threads, every one queued for the turn before the first runs (as
    under load), and wait for them to end."""
    with turns.turn():
        for t in threads:
            t.start()
        while turns.waiting < len(threads):
            time.sleep(0.001)
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)


@pytest.mark.parametrize("gather", [False, True])
def test_lanes_in_threads_match_each_lane_alone(load, gather):
    model = load(lanes=3)
    turns = scheduler_of(model)
    results, clocks = run_lanes(model, gather, steps=5)
    for i, prompt in enumerate(PROMPTS):
        solo = load()
        tokens = list(prompt)
        for row in results[i]:
            expected = solo.forward(tokens, 1)[0]
            assert np.allclose(row, expected, atol=TOLERANCE), i
            tokens.append(int(np.argmax(row)))
    if gather:  # the rounds of the three lanes ran as shared evaluations
        assert turns.gathered == 3 * 5  # every lane's rounds, its prompt in its first
        assert turns.evaluations == 5  # one decode for the three lanes' round
    else:
        assert turns.evaluations == 0
    assert all(c.waited >= 0 for c in clocks)


def test_a_failed_gathered_evaluation_fails_each_lane_and_rolls_it_back(load):
    model = load(lanes=2)
    lane = model.lane(1)
    lane.forward(PROMPTS[1], 0)
    bad = model.n_vocab + 5  # llama.cpp refuses a token id past its vocabulary
    with lane.turn(gather=True), pytest.raises(BackendError):
        lane.forward([*PROMPTS[1], bad], 1)
    assert lane.cached == list(PROMPTS[1])
    row = lane.forward([*PROMPTS[1], 3], 1)[0]
    solo = load()
    assert np.allclose(row, solo.forward([*PROMPTS[1], 3], 1)[0], atol=TOLERANCE)


def test_turns_pass_from_lane_to_lane_in_order():
    turns = LaneScheduler()
    order: list[tuple[int, int]] = []
    started = threading.Barrier(2)

    def lane(i: int) -> None:
        started.wait()
        with turns.turn() as turn:
            for step in range(3):
                order.append((i, step))
                turn.pass_on()

    threads = [threading.Thread(target=lane, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    # Once both run, neither takes two steps while the other waits.
    firsts = [i for i, _ in order]
    assert sorted(order) == [(i, s) for i in range(2) for s in range(3)]
    assert (
        all(a != b for a, b in zip(firsts[1:-1], firsts[2:], strict=False))
        or len(set(firsts[:2])) == 1
    )


def test_park_in_a_turn_that_does_not_gather_evaluates_at_once():
    turns = LaneScheduler()
    work = Slice([1], [0], [(0,)], [True])
    with turns.turn(gather=False) as turn:
        result, seconds = turn.park(work, lambda slices: ([len(slices)], 0.5))
    assert (result, seconds) == (1, 0.5) and turns.evaluations == 0


def test_gathering_pays_where_a_double_batch_costs_less_than_two():
    linear = {k: 0.01 * (k + 1) for k in range(1, 10)}
    assert not gather_pays(linear)
    flat = {k: 0.02 + 0.002 * (k + 1) for k in range(1, 10)}
    assert gather_pays(flat)
    assert not gather_pays({})


def test_device_choices_gathered_match_each_lane_alone(load):
    """Greedy choices made by the backend sampler, several lanes in one batch: each lane
    reads its own outputs' choices."""
    model = load(lanes=2, device_greedy=True)
    if model.greedy_where != "device":
        pytest.skip("this llama.cpp build cannot run the samplers on its backend")
    turns = scheduler_of(model)
    chosen: list[list[int]] = [[], []]

    def lane(i: int) -> None:
        m = model.lane(i)
        with m.turn(gather=True) as turn:
            tokens = list(PROMPTS[i])
            for _ in range(4):
                found = m.greedy(tokens, 2).ids
                chosen[i].append(found[-1])
                tokens.append(found[-1])
                turn.pass_on()

    run_queued(turns, [threading.Thread(target=lane, args=(i,)) for i in range(2)])
    assert turns.evaluations < turns.gathered
    solo = load(device_greedy=True)
    for i in range(2):
        tokens = list(PROMPTS[i])
        for token in chosen[i]:
            assert solo.greedy(tokens, 1).ids == [token]
            tokens.append(token)


def test_an_interactive_lane_goes_first_but_never_starves_the_others():
    """An ordinary lane waiting while an interactive one runs gets one turn in SKIPS + 1."""
    from localspec.backend.lanes import SKIPS

    turns = LaneScheduler()
    order: list[str] = []

    def lane(name: str, first: bool, steps: int) -> None:
        with turns.turn(first=first) as turn:
            for _ in range(steps):
                order.append(name)
                turn.pass_on()

    run_queued(turns, [
        threading.Thread(target=lane, args=("ordinary", False, 10)),
        threading.Thread(target=lane, args=("editor", True, 40)),
    ])  # fmt: skip
    assert order.count("ordinary") == 10 and order.count("editor") == 40
    assert order[0] == "editor"  # queued second, run first
    # While both run: the ordinary lane's turns come SKIPS interactive turns apart.
    last_editor = max(i for i, name in enumerate(order) if name == "editor")
    ordinary = [i for i, name in enumerate(order) if name == "ordinary" and i < last_editor]
    gaps = [b - a for a, b in zip([-1, *ordinary], ordinary, strict=False)]
    assert ordinary and all(gap <= SKIPS + 1 for gap in gaps), order
    assert all(gap == SKIPS + 1 for gap in gaps), order


def test_interactive_lanes_go_first_where_joining_a_batch_slows_it():
    from localspec.backend.lanes import joining_slows

    assert joining_slows(0.026, {1: 0.051})  # a CPU: two tokens cost two steps
    assert not joining_slows(0.010, {1: 0.0105})  # a GPU: one more token costs little
    assert joining_slows(0.010, {})  # nothing measured: as on a CPU


def test_every_lane_evaluates_on_one_thread(load):
    """Whichever lane's thread asks, llama.cpp runs the lanes' evaluations on one thread
    (its CPU backend keeps a team of threads per calling thread: see backend/lanes.py)."""
    import llama_cpp

    model = load(lanes=2)
    callers: list[int] = []
    decode = llama_cpp.llama_decode

    def recording(ctx, batch):
        callers.append(threading.get_ident())
        return decode(ctx, batch)

    llama_cpp.llama_decode = recording
    try:
        threads = [
            threading.Thread(target=lambda i=i: model.lane(i).forward(PROMPTS[i], 1))
            for i in range(2)
        ]
        for t in threads:
            t.start()
            t.join(10)
    finally:
        llama_cpp.llama_decode = decode
    assert len(callers) == 2 and len(set(callers)) == 1
    assert callers[0] not in {t.ident for t in threads}


@pytest.mark.parametrize("first", [False, True])
def test_a_client_holding_two_lanes_takes_no_more_rounds_than_one_holding_one(first):
    """Client a's two lanes and client b's one, of one kind, all waiting for the turn: the
    rounds alternate between the clients (in lane order, b would have one in three)."""
    turns = LaneScheduler()
    order: list[str] = []

    def lane(name: str, client: str) -> None:
        with turns.turn(first=first, client=client) as turn:
            for _ in range(12):
                order.append(client)
                turn.pass_on()

    run_queued(turns, [
        threading.Thread(target=lane, args=("a1", "a")),
        threading.Thread(target=lane, args=("a2", "a")),
        threading.Thread(target=lane, args=("b1", "b")),
    ])  # fmt: skip
    while_b_runs = order[: max(i for i, client in enumerate(order) if client == "b") + 1]
    assert while_b_runs.count("b") == 12
    assert while_b_runs.count("a") <= 13, order
    assert all(x != y for x, y in zip(while_b_runs[1:], while_b_runs[2:], strict=False)), order


def test_other_clients_interactive_lanes_never_starve_an_ordinary_lane():
    """Client a's two interactive lanes and client b's ordinary one: b's lane still has one
    round in SKIPS + 1, as against one client's interactive lane."""
    from localspec.backend.lanes import SKIPS

    turns = LaneScheduler()
    order: list[str] = []

    def lane(client: str, first: bool, steps: int) -> None:
        with turns.turn(first=first, client=client) as turn:
            for _ in range(steps):
                order.append(client)
                turn.pass_on()

    run_queued(turns, [
        threading.Thread(target=lane, args=("b", False, 5)),
        threading.Thread(target=lane, args=("a", True, 40)),
        threading.Thread(target=lane, args=("a", True, 40)),
    ])  # fmt: skip
    ordinary = [i for i, client in enumerate(order) if client == "b"]
    gaps = [b - a for a, b in zip([-1, *ordinary], ordinary, strict=False)]
    assert len(ordinary) == 5 and all(gap == SKIPS + 1 for gap in gaps), order


def test_the_clients_turns_remember_are_bounded():
    """A server that meets many clients one after another keeps the last rounds of no more
    than CLIENTS_KEPT of them (and the one running), the latest among them."""
    from localspec.backend.lanes import CLIENTS_KEPT

    turns = LaneScheduler()
    for i in range(3 * CLIENTS_KEPT):
        with turns.turn(client=f"client {i}") as turn:
            turn.pass_on()
    assert len(turns._last) <= CLIENTS_KEPT + 1
    assert f"client {3 * CLIENTS_KEPT - 1}" in turns._last


def test_the_schedulers_thread_ends_when_its_context_is_freed(load):
    model = load(lanes=2)
    scheduler = scheduler_of(model)
    thread = scheduler.call(threading.current_thread)
    assert thread.is_alive()
    model.close()
    thread.join(10)
    assert not thread.is_alive()
    with pytest.raises(RuntimeError):
        scheduler.call(threading.current_thread)
