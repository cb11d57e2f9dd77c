"""The draft model is loaded only where it can pay: at once, in the background, or when a
drafter needs it (session/loading.py), and the engine takes up a draft that arrives late.

The session tests write a cost profile into the test's own calibration cache and count
loads of the draft through ``LlamaModel`` as ``session.open`` calls it (the loader faked at
its boundary: the target still loads for real, a tiny model the tests write)."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from localspec.core.costs import CostProfile
from localspec.core.engine import SpecDecoder, run_to_completion
from localspec.core.events import EngineWarning, RoundCompleted
from localspec.core.params import GenerationParams
from localspec.session.loading import DraftDecision, DraftPlan, DraftSlot, plan_draft
from tests.fakes import FakeModel, plain_greedy

# A small CPU's shape: a verify batch costs several plain steps, a draft step half of one.
CPU = CostProfile(
    plain_s=0.024, verify_s={1: 0.046, 2: 0.061, 4: 0.094, 8: 0.142, 16: 0.188}, draft_step_s=0.015
)
# A GPU's shape: verifying 16 drafts costs little more than a plain step.
GPU = CostProfile(plain_s=0.004, verify_s={1: 0.0042, 4: 0.0045, 16: 0.0052}, draft_step_s=0.0012)
PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4]


# -- when to load ---------------------------------------------------------------------------


def test_a_drafter_that_needs_the_draft_loads_it_at_once_whatever_the_costs():
    assert plan_draft(CPU, 16, optional=False, measuring=False).plan is DraftPlan.NOW


def test_costs_not_measured_yet_load_it_at_once_to_measure_its_step():
    for costs, measuring in ((None, True), (CPU, True), (None, False)):
        decision = plan_draft(costs, 16, optional=True, measuring=measuring)
        assert decision.plan is DraftPlan.NOW and "measure" in decision.reason


def test_costs_that_rule_the_draft_out_leave_it_unloaded_and_say_why():
    decision = plan_draft(CPU, 16, optional=True, measuring=False)
    assert decision.plan is DraftPlan.ON_DEMAND
    assert "15.0 ms" in decision.reason and "24.0 ms" in decision.reason


def test_costs_where_it_may_pay_load_it_in_the_background():
    assert plan_draft(GPU, 16, optional=True, measuring=False).plan is DraftPlan.BACKGROUND


# -- the slot -------------------------------------------------------------------------------


class Loaded:
    def __init__(self):
        self.closed = False

    def close(self):
        self.closed = True


def test_a_background_load_that_is_still_running_is_aborted_at_close():
    polls = threading.Event()

    def loader(abort):
        while not abort():
            polls.set()
            time.sleep(0.01)
        raise RuntimeError("stopped")

    slot = DraftSlot(__file__, DraftDecision(DraftPlan.BACKGROUND, "why"), loader)
    slot.start()
    assert polls.wait(5)
    assert not slot.settled and slot.state() == "loading"
    slot.close()  # returns once the loader has seen the abort
    assert slot.settled and slot.model is None and slot.state() == "failed"


def test_left_for_later_it_loads_when_waited_for_and_is_freed_at_close():
    made: list[Loaded] = []

    def loader(abort):
        made.append(Loaded())
        return made[-1]

    slot = DraftSlot(__file__, DraftDecision(DraftPlan.ON_DEMAND, "why"), loader)
    assert slot.model is None and not slot.settled and made == []
    assert slot.wait() is made[0] and slot.model is made[0] and len(made) == 1
    assert slot.to_dict()["state"] == "loaded"
    slot.close()
    assert made[0].closed


def test_a_failed_load_raises_when_waited_for():
    def loader(abort):
        raise ValueError("a broken file")

    slot = DraftSlot(__file__, DraftDecision(DraftPlan.ON_DEMAND, "why"), loader)
    with pytest.raises(ValueError, match="broken"):
        slot.wait()
    assert slot.problem == "a broken file"


# -- the engine takes up a draft that arrives late -------------------------------------------


class LatePending:
    """A draft model whose load ends after ``rounds`` looks at it."""

    def __init__(self, model, rounds: int, problem: str = ""):
        self.model, self.left, self._problem = model, rounds, problem
        self.waited = False

    @property
    def settled(self) -> bool:
        self.left -= 1
        return self.left < 0

    @property
    def problem(self) -> str:
        return self._problem

    def ready(self):
        return None if self._problem else self.model

    def wait(self):
        self.waited = True
        if self._problem:
            raise RuntimeError(self._problem)
        return self.model


def test_auto_drafts_with_a_draft_model_that_arrives_mid_answer():
    target, draft = FakeModel(seed=1, window=2), FakeModel(seed=1, window=2)
    decoder = SpecDecoder(target, None, GPU, pending_draft=LatePending(draft, rounds=3))
    events = list(decoder.generate(PROMPT, GenerationParams(max_tokens=40, drafter="auto")))
    rounds = [e for e in events if isinstance(e, RoundCompleted)]
    assert all(r.drafter != "model" for r in rounds[:3])
    assert any(r.drafter == "model" for r in rounds[3:])
    assert list(events[-1].token_ids) == plain_greedy(target, PROMPT, 40)
    assert decoder.draft is draft and decoder.pending_draft is None


def test_a_drafter_that_needs_the_draft_waits_for_its_load():
    target, draft = FakeModel(seed=1, window=2), FakeModel(seed=1, window=2)
    pending = LatePending(draft, rounds=1000)
    decoder = SpecDecoder(target, None, GPU, pending_draft=pending)
    finished = run_to_completion(
        decoder.generate(PROMPT, GenerationParams(max_tokens=20, drafter="model"))
    )
    assert pending.waited and finished.stats.by_drafter["model"].drafted > 0


def test_a_failed_background_load_is_said_once_and_auto_drafts_without_it():
    target = FakeModel(seed=1, window=2)
    pending = LatePending(None, rounds=1, problem="out of memory")
    decoder = SpecDecoder(target, None, GPU, pending_draft=pending)
    events = list(decoder.generate(PROMPT, GenerationParams(max_tokens=20, drafter="auto")))
    warnings = [e.message for e in events if isinstance(e, EngineWarning)]
    assert warnings == ["drafting without the draft model: out of memory"]
    assert list(events[-1].token_ids) == plain_greedy(target, PROMPT, 20)


# -- a session on the tiny pair --------------------------------------------------------------


def _auto_session(monkeypatch, tiny_pair, costs: CostProfile | None):
    """An auto session opened with ``costs`` cached for the pair; the draft's loads by
    path, counted where session.open calls the loader."""
    from localspec.machine.costcache import cost_cache, costs_key
    from localspec.options.model import model_options
    from localspec.session import open as open_module
    from localspec.session import plan as plan_module

    target, draft, _ = tiny_pair
    monkeypatch.setattr(plan_module, "gpu_devices", lambda: [])
    monkeypatch.setattr(plan_module, "gpu_hardware", lambda: None)
    options = model_options(
        GenerationParams().drafter, target=str(target), draft=str(draft), n_ctx=256
    )
    if costs is not None:
        placement = plan_module.plan_placement(options, target, draft)
        cost_cache().save(costs_key(options, placement, target, draft), costs)
    loads: list[str] = []
    real = open_module.LlamaModel

    def counted(path, *args, **kw):
        loads.append(path.name)
        return real(path, *args, **kw)

    monkeypatch.setattr(open_module, "LlamaModel", counted)
    return open_module.open_session(options), loads


def test_auto_does_not_load_a_draft_that_cannot_pay_here(monkeypatch, tiny_pair):
    session, loads = _auto_session(monkeypatch, tiny_pair, CPU)
    try:
        assert loads == ["target.gguf"]
        assert session.draft is None and session.has_draft
        assert session.draft_status()["plan"] == "on demand"
        finished = run_to_completion(
            session.generate(session.plain_tokens("hello"), GenerationParams(max_tokens=4))
        )
        assert loads == ["target.gguf"] and "model" not in finished.stats.by_drafter
    finally:
        session.close()


def test_auto_loads_a_draft_that_may_pay_without_holding_back_the_answer(monkeypatch, tiny_pair):
    session, loads = _auto_session(monkeypatch, tiny_pair, GPU)
    try:
        assert session.draft_status()["plan"] == "background"
        assert session.slot.wait() is not None  # the load was started by open_session
        assert loads == ["target.gguf", "draft.gguf"]
        assert session.draft_status()["state"] == "loaded"
    finally:
        session.close()


def test_without_measured_costs_auto_loads_the_draft_at_once(monkeypatch, tiny_pair):
    session, loads = _auto_session(monkeypatch, tiny_pair, None)
    try:
        assert loads == ["target.gguf", "draft.gguf"]
        assert session.draft is not None and session.draft_status()["plan"] == "now"
    finally:
        session.close()


def test_a_closed_slot_still_says_its_model_was_loaded():
    """``complete --json`` and ``--stats`` read the slot after the session closed it."""
    slot = DraftSlot(__file__, DraftDecision(DraftPlan.ON_DEMAND, "why"), lambda abort: Loaded())
    slot.wait()
    slot.close()
    assert slot.to_dict()["state"] == "loaded"
    assert slot.summary().startswith(f"draft model {slot.path.name}: loaded;")
    unused = DraftSlot(__file__, DraftDecision(DraftPlan.ON_DEMAND, "why"), lambda abort: Loaded())
    unused.close()
    assert unused.to_dict()["state"] == "not loaded"


def test_complete_json_says_the_draft_model_it_drafted_with_was_loaded(tiny_pair, tmp_path):
    import json
    import os
    import subprocess
    import sys

    target, draft, _ = tiny_pair
    proc = subprocess.run(
        [sys.executable, "-m", "localspec.cli.app", "complete", "--json", "--stats",
         "--max-tokens", "8", "--drafter", "model", "--target", str(target), "--draft",
         str(draft), "--ctx", "256", "--threads", "1"],
        input=b"the cat sat on the mat", capture_output=True, timeout=120,
        env={**os.environ, "LOCALSPEC_HOME": str(tmp_path)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout)["stats"]
    assert stats["draft_model"]["state"] == "loaded", stats["draft_model"]
    assert f"draft model {draft.name}: loaded;" in proc.stderr.decode()


def test_loads_that_overlap_in_threads_leave_the_switch_interval_as_it_was():
    from localspec.session.loading import Loading
    from localspec.session.switching import LOADING_SWITCH_S, fast_switching

    before = sys.getswitchinterval()
    go_a, go_b = threading.Event(), threading.Event()
    with fast_switching():  # as the command line's entry allows it
        a = Loading(lambda: go_a.wait(5))
        b = Loading(lambda: go_b.wait(5))  # begins while a runs: a's short interval is current
        assert sys.getswitchinterval() == pytest.approx(LOADING_SWITCH_S)
        go_a.set()
        a.result()
        assert sys.getswitchinterval() == pytest.approx(LOADING_SWITCH_S)  # b still loads
        go_b.set()
        b.result()
    assert sys.getswitchinterval() == pytest.approx(before)


def test_a_load_whose_result_nobody_asks_for_restores_the_switch_interval():
    from localspec.session.loading import Loading
    from localspec.session.switching import fast_switching

    before = sys.getswitchinterval()
    done = threading.Event()
    with fast_switching():
        Loading(done.set)
        assert done.wait(5)
        deadline = time.monotonic() + 5
        while sys.getswitchinterval() != pytest.approx(before) and time.monotonic() < deadline:
            time.sleep(0.01)
    assert sys.getswitchinterval() == pytest.approx(before)


def test_a_load_leaves_the_switch_interval_alone_unless_the_entry_allows_it():
    """The Python API loads in a process its caller owns: the interval stays theirs."""
    from localspec.session.loading import Loading

    before = sys.getswitchinterval()
    go = threading.Event()
    loading = Loading(lambda: go.wait(5))
    assert sys.getswitchinterval() == pytest.approx(before)
    go.set()
    loading.result()
    assert sys.getswitchinterval() == pytest.approx(before)


def test_a_model_loaded_later_is_prepared_before_anyone_can_take_it():
    seen: list[tuple[object, bool]] = []
    loaded = object()
    slot = DraftSlot(__file__, DraftDecision(DraftPlan.BACKGROUND, "why"), lambda stop: loaded)
    slot.on_loaded = lambda model: seen.append((model, slot.ready() is None))
    slot.start()
    assert slot.wait() is loaded
    assert seen == [(loaded, True)]  # before the slot handed the model out
