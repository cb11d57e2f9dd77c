"""Prompt lookup, stats arithmetic, and the cost model's decisions."""

from __future__ import annotations

import pytest

from localspec.controller import Controller, CostProfile
from localspec.drafters import MODEL, NGRAM, NgramDrafter
from localspec.events import Origin, PrefillDone, RoundCompleted, TokenEmitted
from localspec.stats import GenerationStats

# -- n-gram drafter ------------------------------------------------------------------------


def test_ngram_prefers_longest_match():
    d = NgramDrafter(1, 3)
    # "5 6" occurs with continuation 7 8; "6" alone last occurred before 9.
    d.begin([5, 6, 7, 8, 1, 6, 9, 2, 5, 6])
    m = d.match()
    assert m.n == 2
    assert d.propose(2, m).tokens == [7, 8]


def test_ngram_uses_most_recent_occurrence():
    d = NgramDrafter(2, 2)
    d.begin([1, 2, 3, 9, 1, 2, 4, 9, 1, 2])
    assert d.propose(3).tokens == [4, 9, 1]


def test_ngram_no_match_and_incremental_extension():
    d = NgramDrafter(2, 3)
    d.begin([1, 2, 3, 4])
    assert d.match() is None
    d.extend([1, 2, 3, 4, 1, 2])
    m = d.match()
    assert m.n == 2 and d.propose(8, m).tokens == [3, 4, 1, 2]


def test_ngram_never_matches_the_suffix_itself():
    d = NgramDrafter(1, 2)
    d.begin([7, 8])
    assert d.match() is None


# -- stats ------------------------------------------------------------------------------


def test_stats_arithmetic_and_per_position_acceptance():
    s = GenerationStats()
    s.observe(PrefillDone(10, 10, 0.5))
    rounds = [("model", 4, 2, 3), ("model", 4, 4, 5), ("ngram", 2, 0, 1), (None, 0, 0, 1)]
    n = 0
    for i, (drafter, drafted, accepted, emitted) in enumerate(rounds):
        for j in range(emitted):
            origin = Origin.TARGET if j == accepted else Origin(drafter)
            s.observe(TokenEmitted(n, "x", origin, n))
            n += 1
        s.observe(RoundCompleted(i, drafter, drafted, accepted, emitted, 0.25))
    d = s.to_dict()
    assert d["drafted"] == 10 and d["accepted"] == 6 and d["rounds"] == 4
    assert d["acceptance_rate"] == 0.6
    assert d["mean_accepted_length"] == 2.5  # 1 + 6 / 4
    assert d["generated_tokens"] == 10
    assert d["decode_tokens_per_s"] == 10.0
    assert d["tokens_by_origin"] == {"model": 6, "ngram": 0, "target": 4}
    model = d["by_drafter"]["model"]
    assert model["per_position_acceptance"] == [1.0, 1.0, 0.5, 0.5]
    assert model["mean_accepted_length"] == 4.0
    assert d["by_drafter"]["none"]["rounds"] == 1


# -- controller ------------------------------------------------------------------------

# Verification costs shaped like a small CPU: a batch of k+1 costs far more than a step.
CPU = CostProfile(
    plain_s=0.036, verify_s={1: 0.082, 3: 0.104, 4: 0.116, 8: 0.2, 15: 0.212}, draft_step_s=0.02
)


def expected_rate(c: Controller, drafter: str, k: int, n: int | None = None) -> float:
    est = c.model if drafter == MODEL else c._ngram_estimate(n)
    step = CPU.draft_step_s if drafter == MODEL else 0.0
    return (1 + est.expected_accepted(k)[-1]) / (CPU.verify(k) + k * step)


def test_never_picks_a_draft_slower_than_a_plain_step():
    c = Controller(CPU)
    for _ in range(30):  # a model drafter that is usually wrong
        c.observe(MODEL, None, 4, 0)
    for _ in range(30):
        c.observe(NGRAM, 2, 4, 0)
    for _ in range(10):
        plan = c.plan(ngram_n=2, ngram_available=8, remaining=100)
        if plan.drafter is not None and not plan.reason.startswith("probe"):
            assert plan.expected_tokens_per_s >= 1 / CPU.plain_s
        assert plan.drafter is None or plan.reason.startswith("probe")


def test_chosen_plan_is_the_best_candidate():
    c = Controller(CPU)
    for _ in range(20):
        c.observe(NGRAM, 3, 8, 8)
    plan = c.plan(ngram_n=3, ngram_available=12, remaining=100)
    assert plan.drafter == NGRAM
    best = max(expected_rate(c, NGRAM, k, 3) for k in range(1, 13))
    assert plan.expected_tokens_per_s == pytest.approx(best)
    assert plan.expected_tokens_per_s > 1 / CPU.plain_s


def test_draft_length_grows_with_acceptance():
    lengths = []
    for accept in (0.5, 0.75, 0.9, 1.0):
        c = Controller(CPU)
        for _ in range(60):
            c.observe(NGRAM, 3, 10, int(accept * 10))
        plan = c.plan(ngram_n=3, ngram_available=16, remaining=100)
        lengths.append(plan.k if plan.drafter else 0)
    assert lengths == sorted(lengths) and lengths[-1] > lengths[0]


def test_respects_remaining_budget_and_availability():
    c = Controller(CPU)
    for _ in range(20):
        c.observe(NGRAM, 4, 8, 8)
    assert c.plan(ngram_n=4, ngram_available=3, remaining=100).k <= 3
    assert c.plan(ngram_n=4, ngram_available=16, remaining=2).k <= 2
    assert c.plan(ngram_n=4, ngram_available=16, remaining=0).drafter is None


def test_idle_drafter_is_probed_to_refresh_its_estimate():
    c = Controller(CPU, probe_every=5)
    for _ in range(30):
        c.observe(MODEL, None, 4, 0)
    plans = []
    for _ in range(12):
        p = c.plan(ngram_n=None, ngram_available=0, remaining=100)
        plans.append(p)
        c.observe(p.drafter, None, p.k if p.drafter else 0, 0)
    assert any(p.drafter == MODEL and p.reason.startswith("probe") for p in plans)
    assert sum(p.drafter is None for p in plans) >= 8


def test_fixed_mode_always_drafts_when_it_can():
    c = Controller(CPU, allow=(NGRAM,), fixed=True, draft_max=6)
    for _ in range(30):
        c.observe(NGRAM, 2, 6, 0)
    assert c.plan(ngram_n=2, ngram_available=10, remaining=100).k == 6
    assert c.plan(ngram_n=None, ngram_available=0, remaining=100).drafter is None


def test_cost_interpolation_between_measured_sizes():
    assert CPU.verify(0) == CPU.plain_s
    assert CPU.verify(2) == pytest.approx((0.082 + 0.104) / 2)
    assert CPU.verify(4) == 0.116
    assert CostProfile.from_dict(CPU.to_dict()) == CPU


def test_draft_catch_up_cost_keeps_a_lagging_draft_model_idle():
    costs = CostProfile(plain_s=0.06, verify_s={4: 0.12}, draft_step_s=0.005, draft_prefill_s=0.004)
    c = Controller(costs, allow=(MODEL,))
    for _ in range(20):
        c.observe(MODEL, None, 4, 4)
    assert c.plan(ngram_n=None, ngram_available=0, remaining=50).drafter == MODEL
    lagging = c.plan(ngram_n=None, ngram_available=0, remaining=50, model_catch_up=400)
    assert lagging.drafter is None  # 1.6 s of catching up does not pay for one round


def test_live_costs_follow_what_rounds_take():
    c = Controller(CPU)
    for _ in range(10):
        c.observe_timing(0, 0.072)  # plain steps now take twice the calibrated time
        c.observe_timing(4, 0.232)
    assert c.costs.plain_s == pytest.approx(0.072)
    assert c.costs.verify(4) == pytest.approx(0.232)
    assert c.costs.verify(8) == pytest.approx(CPU.verify(8) * 2, rel=0.01)  # unseen: scaled
    assert c.costs.plain_drift() is None or c.costs.plain_drift() == pytest.approx(2.0)


def test_calibration_disturbed_by_other_work_is_recognised():
    from localspec.calibrate import looks_disturbed

    assert not looks_disturbed(CPU)
    assert looks_disturbed(CostProfile(plain_s=2.8, verify_s={1: 2.8, 4: 0.42}))


def test_a_new_generation_relearns_acceptance_quickly():
    c = Controller(CPU, allow=(NGRAM,))
    for _ in range(200):  # a long stretch of code being copied: n-gram drafts always accepted
        c.observe(NGRAM, 3, 8, 8)
    assert c.plan(ngram_n=3, ngram_available=16, remaining=100).drafter == NGRAM
    c.new_generation()
    for _ in range(6):  # prose: the same matches now fail at once
        c.observe(NGRAM, 3, 4, 0)
    assert c.plan(ngram_n=3, ngram_available=16, remaining=100).drafter is None
