"""The cost model's decisions, live costs, and what it learned, saved and restored."""

from __future__ import annotations

import pytest

from localspec.core.controller import (
    COPY_DEPTH,
    COPY_ODDS,
    LOSS_BUDGET,
    LOSS_HORIZON,
    MAX_BRANCHES,
    TREE_MAX_NODES,
    Controller,
    Plan,
    ngram_bucket,
)
from localspec.core.costs import CostProfile
from localspec.core.drafters import Offer
from localspec.core.engine import DEFAULT_COSTS
from localspec.core.params import DrafterKind

MODEL, NGRAM = DrafterKind.MODEL, DrafterKind.NGRAM

# Verification costs shaped like a small CPU: a batch of k+1 costs far more than a step,
# and the curve is not monotonic (a batch of 16 measured cheaper than one of 12).
CPU = CostProfile(
    plain_s=0.036,
    verify_s={
        1: 0.082,
        3: 0.104,
        4: 0.116,
        8: 0.2,
        11: 0.266,
        15: 0.212,
        31: 0.457,
        47: 0.33,
        63: 0.45,
    },
    draft_step_s=0.02,
)


def ngram(available: int, match: int = 3, streak: bool = False) -> Offer:
    return Offer(NGRAM, available, match=match, streak=streak)


def model(available: int, catch_up: int = 0) -> Offer:
    return Offer(MODEL, available, catch_up=catch_up)


def learn(c: Controller, offer: Offer, drafted: int, accepted: int, times: int) -> None:
    for _ in range(times):
        plan = c.plan([offer])
        c.observe(plan, offer, drafted, accepted)


def expected_rate(c: Controller, offer: Offer, k: int) -> float:
    step = CPU.draft_step_s * k if offer.kind == MODEL else 0.0
    return (1 + c.expected_accepted(offer, k)[-1]) / (CPU.verify(k) + step)


def test_never_picks_a_draft_slower_than_a_plain_step():
    c = Controller(CPU)
    learn(c, model(4), 4, 0, 30)  # a model drafter that is usually wrong
    learn(c, ngram(4, 2), 4, 0, 30)
    checked = 0
    for _ in range(10):
        plan = c.plan([ngram(8, 2), model(16)])
        if plan.drafter is not None:
            assert plan.reason.startswith("probe")
        else:
            assert plan.expected_tokens_per_s == pytest.approx(1 / CPU.plain_s)
        checked += 1
    assert checked == 10


def test_chosen_plan_is_the_best_candidate():
    c = Controller(CPU)
    offer = ngram(12, 3)
    learn(c, offer, COPY_DEPTH, COPY_DEPTH, 20)
    plan = c.plan([offer])
    assert plan.drafter == NGRAM and plan.match == 3
    best = max(expected_rate(c, offer, k) for k in range(1, 13))
    assert plan.expected_tokens_per_s == pytest.approx(best)
    assert plan.expected_tokens_per_s > 1 / CPU.plain_s


def test_draft_length_grows_with_how_often_the_text_copies():
    lengths = []
    for copies in (0, 4, 8, 16):  # of 16 graded drafts, how many held COPY_DEPTH tokens
        c = Controller(CPU)
        offer = ngram(64, 6)
        for i in range(16):
            c.observe(Plan(NGRAM, 16, 0.0, ""), offer, 16, 16 if i < copies else 1)
        plan = c.plan([offer])
        lengths.append(plan.k if plan.drafter else 0)
    assert lengths == sorted(lengths) and lengths[0] == 0 and lengths[-1] > 16


def test_a_long_match_drafts_on_a_cold_start_and_a_streak_drafts_longer():
    c = Controller(CPU)  # nothing learned yet: priors alone
    weak = c.plan([ngram(64, match=2)])
    assert weak.drafter is None  # a 2-token match does not pay for a verify batch here
    medium = c.plan([ngram(64, match=12)])
    strong = c.plan([ngram(64, match=20)])
    assert strong.drafter == NGRAM  # a long match is likely a copy
    assert strong.expected_tokens_per_s > medium.expected_tokens_per_s
    assert ngram_bucket(20) == 16 and ngram_bucket(2) == 2
    copying = Controller(CPU)
    offer = ngram(64, match=20, streak=True)
    learn(copying, offer, 47, 47, 20)
    assert copying.plan([offer]).k > 16  # a copy that keeps being accepted whole: longer


def test_prefers_draft_lengths_whose_measured_cost_per_token_is_low():
    c = Controller(CPU)
    offer = ngram(60, match=20, streak=True)  # a copy under way: long drafts are allowed
    learn(c, offer, 47, 47, 30)  # copies accepted whole
    plan = c.plan([offer])
    # 47 drafts cost 0.33 s as measured, less than 31 drafts (0.457 s): take the cheaper batch
    assert plan.k >= 47


def test_limit_bounds_each_drafter():
    c = Controller(CPU, draft_max=6, ngram_draft_max=40)
    assert c.limit(MODEL, 100) == 6
    assert c.limit(NGRAM, 100) == 40
    assert c.limit(NGRAM, 3) == 3
    assert c.plan([ngram(0, 20)]).drafter is None


def test_idle_drafter_is_probed_only_if_it_could_pay():
    cheap = CostProfile(plain_s=0.036, verify_s={1: 0.04, 3: 0.05, 15: 0.1}, draft_step_s=0.004)
    c = Controller(cheap, probe_every=5)
    learn(c, model(4), 4, 0, 30)
    plans = []
    for _ in range(12):
        p = c.plan([model(8)])
        plans.append(p)
        c.observe(p, model(8) if p.drafter else None, p.k if p.drafter else 0, 0)
    assert any(p.drafter == MODEL and p.reason.startswith("probe") for p in plans)
    assert sum(p.drafter is None for p in plans) >= 8
    # On the small CPU the draft model could not pay even at 90% acceptance: never probed.
    slow = Controller(CPU, probe_every=5)
    learn(slow, model(4), 4, 0, 30)
    for _ in range(12):
        p = slow.plan([model(8)])
        assert p.drafter is None
        slow.observe(p, None, 0, 0)


def test_fixed_mode_always_drafts_when_it_can():
    c = Controller(CPU, allow=(NGRAM,), fixed=True, draft_max=6)
    offer = ngram(c.limit(NGRAM, 100), 2)
    learn(c, offer, 6, 0, 30)
    assert c.plan([offer]).k == 6
    assert c.plan([]).drafter is None
    fixed_model = Controller(CPU, allow=(MODEL,), fixed=True)
    assert fixed_model.plan([model(16)]).p_min == 0.75


def test_cost_interpolation_between_measured_sizes():
    assert CPU.verify(0) == CPU.plain_s
    assert CPU.verify(2) == pytest.approx((0.082 + 0.104) / 2)
    assert CPU.verify(4) == 0.116
    assert CPU.verify(13) == pytest.approx((0.266 + 0.212) / 2)
    assert CPU.verify(127) == pytest.approx(0.45 * 2)  # past the largest: its cost per token
    assert CostProfile.from_dict(CPU.to_dict()) == CPU


@pytest.mark.parametrize(
    "bad",
    [
        {"plain_s": 0, "verify_s": {"1": 0.1}},
        {"plain_s": 0.1, "verify_s": []},
        {"plain_s": float("nan"), "verify_s": {"1": 0.1}},
        {"plain_s": 0.1, "verify_s": {"1": -2}},
        {"plain_s": 0.1, "verify_s": {}},
        {"plain_s": 0.1, "verify_s": {"0": 0.1}},
        [],
    ],
)
def test_cost_profile_rejects_bad_values(bad):
    with pytest.raises((ValueError, TypeError, KeyError)):
        CostProfile.from_dict(bad)


def test_draft_catch_up_cost_keeps_a_lagging_draft_model_idle():
    costs = CostProfile(plain_s=0.06, verify_s={4: 0.12}, draft_step_s=0.005, draft_prefill_s=0.004)
    c = Controller(costs, allow=(MODEL,))
    learn(c, model(4), 4, 4, 20)
    assert c.plan([model(50)]).drafter == MODEL
    lagging = c.plan([model(50, catch_up=400)])
    assert lagging.drafter is None  # 1.6 s of catching up does not pay for one round


def test_catch_up_is_timed_apart_from_draft_steps():
    class Timing:
        steps, step_seconds = 3, 0.03
        catch_up_tokens, catch_up_seconds = 50, 0.5

    costs = CostProfile(plain_s=0.06, verify_s={4: 0.12}, draft_step_s=0.005, draft_prefill_s=0.004)
    c = Controller(costs)
    for _ in range(30):
        c.observe_timing(3, 0.1, Timing())
    assert c.costs.draft_step_s == pytest.approx(0.01, rel=0.02)  # catch-up is not a step
    assert c.costs.catch_up(100) == pytest.approx(1.0, rel=0.02)  # 0.01 s a token, as seen


def test_live_costs_follow_what_rounds_take():
    c = Controller(CPU)
    for _ in range(30):
        c.observe_timing(0, 0.072)  # plain steps now take twice the calibrated time
        c.observe_timing(4, 0.232)
    assert c.costs.plain_s == pytest.approx(0.072, rel=0.01)
    assert c.costs.verify(4) == pytest.approx(0.232, rel=0.01)
    assert c.costs.verify(8) == pytest.approx(CPU.verify(8) * 2, rel=0.02)  # unseen: scaled
    assert c.costs.plain_drift() == pytest.approx(2.0, rel=0.01)


def test_calibration_disturbed_by_other_work_is_recognised():
    from localspec.session.calibrate import looks_disturbed

    assert not looks_disturbed(CPU)
    assert looks_disturbed(CostProfile(plain_s=2.8, verify_s={1: 2.8, 4: 0.42}))


def test_a_new_generation_relearns_acceptance_quickly():
    c = Controller(CPU, allow=(NGRAM,))
    offer = ngram(16, 6)
    c.new_generation()  # the first generation starts from what was restored, kept whole
    learn(c, offer, 16, 16, 200)  # a long stretch of code being copied: drafts always accepted
    assert c.plan([offer]).drafter == NGRAM
    c.new_generation()
    for _ in range(6):  # prose: the same matches now fail at once
        c.observe(c.plan([offer]), offer, 4, 0)
    assert c.plan([offer]).drafter is None


def test_learned_state_round_trips_discounted_and_the_texts_copy_odds_start_afresh():
    c = Controller(CPU)
    offer = ngram(16, 6)
    streak = ngram(16, 20, streak=True)
    learn(c, offer, 16, 2, 20)
    learn(c, offer, 16, 16, 50)
    learn(c, streak, 16, 10, 20)
    learn(c, model(4), 4, 3, 10)
    saved = c.learned()
    assert c.copy_odds > COPY_ODDS  # this text copied at length
    fresh = Controller(CPU)
    fresh.restore(saved, keep=1.0)
    # The pair's estimates come back whole; whether a text copies is the next text's own.
    restored = fresh.learned()
    assert restored["copies"] == restored["store"]["copies"] == [0.0, 0.0]
    assert restored["model"] == saved["model"] and restored["streaks"] == saved["streaks"]
    assert fresh.copy_odds == COPY_ODDS
    a, b = fresh.plan([streak]), c.plan([streak])
    assert (a.drafter, a.k) == (b.drafter, b.k)
    assert a.expected_tokens_per_s == pytest.approx(b.expected_tokens_per_s, rel=1e-4)  # rounded
    half = Controller(CPU)
    half.restore(saved, keep=0.5)
    evidence = c.estimate(streak).evidence
    assert half.estimate(streak).evidence == pytest.approx(evidence / 2, rel=1e-3)
    assert half.copy_odds == COPY_ODDS


def test_passed_over_drafts_of_a_copy_under_way_teach_its_estimate():
    """A copy under way whose estimate is pessimistic (learned from an earlier text whose
    copies parted) is passed over; what its previews would have had accepted raises the
    estimate until it drafts again, rather than plain steps for the rest of the answer."""
    c = Controller(CPU, allow=(NGRAM,))
    streak = ngram(32, 64, streak=True)
    learn(c, streak, 16, 1, 30)  # copies that parted at once
    c.new_generation()  # (in an earlier answer)
    assert c.plan([streak]).drafter is None
    for _ in range(40):
        c.observe_passed(streak, 12, 12)  # the answer went on copying all along
        if c.plan([streak]).drafter == NGRAM:
            break
    assert c.plan([streak]).drafter == NGRAM
    before = c.estimate(streak).evidence
    c.observe_passed(ngram(32, 64), 12, 3)  # not a streak: graded as this text's copy odds
    assert c.estimate(streak).evidence == pytest.approx(before)


@pytest.mark.parametrize(
    "bad",
    [
        {},
        {"copies": [0, 0], "model": {"hits": [1], "tries": [1]}, "streaks": {"5": {}}},
        {"copies": [0, 0], "model": {"hits": [2], "tries": [1]}, "streaks": {}},
        {"copies": [0, 0], "model": {"hits": [1], "tries": [1, 2]}, "streaks": {}},
        {"copies": [0, 0], "model": {"hits": "x", "tries": []}, "streaks": {}},
        {"copies": [-1, 2], "model": {"hits": [1], "tries": [1]}, "streaks": {}},
        {"model": {"hits": [1], "tries": [1]}, "streaks": {}},  # an older format's evidence
    ],
)
def test_restore_rejects_malformed_state_and_changes_nothing(bad):
    c = Controller(CPU)
    learn(c, ngram(16, 6), 8, 8, 5)
    before = c.learned()
    with pytest.raises((ValueError, KeyError, TypeError, AttributeError)):
        c.restore(bad)
    assert c.learned() == before


def test_one_stalled_round_does_not_poison_the_costs():
    """A pause of the whole process (another program) makes one round very slow: the
    estimates move a bounded step, and plain steps stay the choice they were."""
    c = Controller(CPU)
    weak = ngram(8, match=2)
    for _ in range(10):
        c.observe_timing(0, CPU.plain_s)
        c.observe_timing(2, CPU.verify(2))
    before = c.plan([weak])
    c.observe_timing(0, 40 * CPU.plain_s)  # a 1.4 s stall on a 36 ms step
    c.observe_timing(2, 40 * CPU.verify(2))
    assert c.costs.plain_s < 1.2 * CPU.plain_s
    assert c.costs.verify(2) < 1.2 * CPU.verify(2)
    assert c.plan([weak]).drafter == before.drafter is None


def test_a_machine_that_really_slowed_down_is_followed():
    c = Controller(CPU)
    for _ in range(40):
        c.observe_timing(0, 3 * CPU.plain_s)
    assert c.costs.plain_s == pytest.approx(3 * CPU.plain_s, rel=0.05)


def test_a_plain_step_faster_than_calibrated_does_not_make_batches_look_cheap():
    c = Controller(CPU)
    for _ in range(30):
        c.observe_timing(0, 0.5 * CPU.plain_s)  # a calibration whose plain steps were disturbed
    assert c.costs.plain_s == pytest.approx(0.5 * CPU.plain_s, rel=0.01)
    assert c.costs.verify(4) == pytest.approx(CPU.verify(4))  # not halved on its word
    for _ in range(30):
        c.observe_timing(4, 0.5 * CPU.verify(4))
    assert c.costs.verify(8) == pytest.approx(0.5 * CPU.verify(8), rel=0.02)  # batches say so


def test_a_text_whose_drafts_part_at_once_loses_its_odds_and_one_that_copies_gains_them():
    prose, code = Controller(CPU, allow=(NGRAM,)), Controller(CPU, allow=(NGRAM,))
    assert prose.copy_odds == code.copy_odds == pytest.approx(COPY_ODDS)
    offer = ngram(16, 6)
    for _ in range(4):
        prose.observe(Plan(NGRAM, 16, 0.0, ""), offer, 16, 2)
        code.observe(Plan(NGRAM, 16, 0.0, ""), offer, 16, 16)
    assert prose.copy_odds < COPY_ODDS < code.copy_odds
    assert prose.plan([ngram(64, 8)]).drafter is None
    assert code.plan([ngram(64, 8)]).k > 16  # a text that copies drafts long on a middling match


def test_what_says_nothing_about_copies_leaves_the_odds_alone():
    c = Controller(CPU, allow=(NGRAM,))
    c.observe(Plan(NGRAM, 4, 0.0, ""), ngram(16, 6), 4, 4)  # short and accepted whole
    c.observe(Plan(NGRAM, 40, 0.0, ""), ngram(40, 20, streak=True), 40, 3)  # a streak's own
    c.observe_passed(ngram(16, 6), 0, 0)  # nothing was there to pass over
    assert c.copy_odds == pytest.approx(COPY_ODDS)


def test_drafts_passed_over_are_graded_like_drafts():
    drafted, passed = Controller(CPU, allow=(NGRAM,)), Controller(CPU, allow=(NGRAM,))
    for _ in range(3):
        drafted.observe(Plan(NGRAM, COPY_DEPTH, 0.0, ""), ngram(16, 4), COPY_DEPTH, COPY_DEPTH)
        passed.observe_passed(ngram(16, 4), COPY_DEPTH, COPY_DEPTH)
    assert passed.copy_odds == pytest.approx(drafted.copy_odds) and passed.copy_odds > COPY_ODDS
    passed.observe_passed(ngram(16, 4), COPY_DEPTH, 1)  # it parted after one token
    assert passed.copy_odds < drafted.copy_odds


# Verify costs relative to a plain step as measured on a 2-core CPU during real answers.
IN_SITU = CostProfile(plain_s=0.033, verify_s={1: 0.055, 2: 0.075, 3: 0.085, 15: 0.185})


def test_a_new_text_waits_for_a_long_match_or_for_copies_to_show():
    c = Controller(IN_SITU, allow=(NGRAM,))
    assert c.plan([ngram(40, match=4)]).drafter is None  # in prose, it would part at once
    assert c.plan([ngram(40, match=20)]).drafter == NGRAM
    for _ in range(2):  # the answer copied what plain steps passed over
        c.observe_passed(ngram(40, match=4), COPY_DEPTH, COPY_DEPTH)
    assert c.plan([ngram(40, match=4)]).drafter == NGRAM


def test_a_draft_expected_to_win_by_less_than_the_margin_is_not_taken():
    c = Controller(IN_SITU, allow=(NGRAM,), margin=1.0)
    offer = ngram(1, match=20, streak=True)
    rate = (1 + c.estimate(offer).expected_accepted(1)[-1]) / IN_SITU.verify(1)
    assert rate > 1 / IN_SITU.plain_s  # it would win, a little
    assert c.plan([offer]).drafter == NGRAM
    c.margin = rate * IN_SITU.plain_s * 1.01
    assert c.plan([offer]).drafter is None


def test_drafts_that_lost_time_raise_the_bar_until_the_answer_is_ahead_again():
    """A text whose first long matches parted at once (code rewritten line by line) does
    not keep paying for more such bets: the margin grows with the answer's deficit."""
    c = Controller(IN_SITU, allow=(NGRAM,))
    c.new_generation()
    for _ in range(150):  # plain steps: the answer so far copied nothing
        c.observe(c.plan([]), None, 0, 0)
    assert c.required_margin == c.margin
    long_match = ngram(40, match=20)
    bet = c.plan([long_match])
    assert bet.drafter == NGRAM and bet.k == 15  # a cold long match is worth a bet
    c.observe(bet, long_match, bet.k, 0)  # which lost: a verify batch for one token
    deficit = IN_SITU.verify(15) - IN_SITU.plain_s
    budget = LOSS_BUDGET * IN_SITU.plain_s * max(151, LOSS_HORIZON)
    assert c.required_margin == pytest.approx(c.margin * (1 + deficit / budget))
    assert c.plan([ngram(40, match=12)]).drafter is None  # weaker evidence waits
    copy = ngram(40, match=20, streak=True)  # a copy under way still clears the bar
    plan = c.plan([copy])
    assert plan.drafter == NGRAM
    c.observe(plan, copy, plan.k, plan.k)  # and puts the answer ahead again
    assert c.required_margin == c.margin
    c.observe(bet, long_match, bet.k, 0)  # a loss the gain covers
    assert c.required_margin == c.margin
    for _ in range(3):
        c.observe(bet, long_match, bet.k, 0)
    assert c.required_margin > c.margin
    c.new_generation()  # a new answer starts even
    assert c.required_margin == c.margin


# -- draft trees ---------------------------------------------------------------------------

# Batches that cost little more as they grow (a GPU, a larger CPU): verify(16) ~ verify(8).
FLAT = CostProfile(plain_s=1.0, verify_s={1: 1.5, 8: 1.6, 16: 1.65, 32: 1.8, 64: 2.0})


def fork(available: int = 16, match: int = 5, shares=(0.5, 0.5), **kw) -> Offer:
    return Offer(NGRAM, available, match=match, shares=shares, **kw)


def test_a_fork_is_verified_as_a_tree_when_batches_cost_little_more():
    c = Controller(FLAT, trees=True)
    plan = c.plan([fork()])
    assert plan.drafter == NGRAM and plan.branches == 2
    assert plan.reason.startswith(f"ngram tree 2x{plan.k} (match 5): ")
    # The chain's copy curve, its long-copy chance times both shares over the drafted one's.
    curve = c.copy_curve(fork(), plan.k, scale=2.0)
    assert plan.expected_tokens_per_s == pytest.approx((1 + curve[-1]) / FLAT.verify(2 * plan.k))
    chain = Controller(FLAT).plan([fork()])
    assert chain.branches == 1 and chain.expected_tokens_per_s < plan.expected_tokens_per_s
    store = Offer(DrafterKind.STORE, 16, 8, support=0.5, shares=(0.5, 0.5))
    assert Controller(FLAT, allow=(DrafterKind.STORE,), trees=True).plan([store]).branches == 2


def test_a_fork_is_drafted_as_a_chain_or_not_at_all_when_batches_are_steep():
    for costs in (CPU, DEFAULT_COSTS):
        for match in (2, 5, 8, 16):
            plan = Controller(costs, trees=True).plan([fork(match=match)])
            assert plan.branches == 1, (costs, match, plan.reason)


def test_no_tree_when_trees_are_off_for_sampled_rounds_streaks_or_agreeing_sources():
    assert Controller(FLAT).plan([fork()]).branches == 1
    c = Controller(FLAT, trees=True)
    assert c.plan([fork()], sampled=True).branches == 1  # exact sampling over trees: no
    assert c.plan([fork(streak=True)]).branches == 1  # a copy under way keeps to its source
    assert c.plan([fork(shares=())]).branches == 1
    assert Controller(FLAT, trees=True, fixed=True).plan([fork()]).branches == 1


def test_never_more_branches_or_nodes_than_allowed():
    five = fork(available=64, shares=(0.3, 0.25, 0.2, 0.15, 0.1))
    assert 2 <= Controller(FLAT, trees=True).plan([five]).branches <= MAX_BRANCHES
    assert Controller(FLAT, trees=True, max_branches=2).plan([five]).branches == 2
    assert Controller(FLAT, trees=True, max_branches=1).plan([five]).branches == 1
    c = Controller(FLAT, trees=True)
    for nodes in (TREE_MAX_NODES, 20, 3):
        plan = c.plan([five], nodes=nodes)
        assert plan.branches == 1 or plan.branches * plan.k <= nodes
    plan = c.plan([five], nodes=1000)
    assert plan.branches * plan.k <= TREE_MAX_NODES
