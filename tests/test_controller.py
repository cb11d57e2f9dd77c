"""The cost model's decisions: drafters' priced offers against live verify costs, the
margin and the answer's balance, probes, trees, and what the drafters learn from rounds."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from localspec.core.controller import (
    LOSS_BUDGET,
    LOSS_HORIZON,
    REACH_ALPHA,
    REACH_CHANCE,
    REACH_DRAFT,
    REACH_SHARE,
    Choice,
    Controller,
)
from localspec.core.costs import CostProfile
from localspec.core.drafting.base import Offer
from localspec.core.drafting.evidence import CopyOffer, Evidence, match_bucket
from localspec.core.drafting.grades import Grade
from localspec.core.drafting.model import ModelDrafter
from localspec.core.drafting.pricing import CopyPricing
from localspec.core.drafting.tunables import COPY_DEPTH, COPY_ODDS
from localspec.core.engine import DEFAULT_COSTS
from localspec.core.tree import MAX_BRANCHES, TREE_MAX_NODES

MODEL, NGRAM = "model", "ngram"

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


class Pair:
    """A controller and the pricing of the drafters it weighs, driven as the engine drives
    them: prompt lookup's copy pricing, and the draft model's drafter."""

    def __init__(self, costs: CostProfile, **kw) -> None:
        self.c = Controller(costs, **kw)
        self.copies = CopyPricing(COPY_ODDS)
        self.model = ModelDrafter(SimpleNamespace(cached=[]), lambda t: False, costs=self.c.costs)
        self._copies: dict[int, CopyOffer] = {}

    def ngram(self, available: int, match: int = 3, under_way: bool = False, **kw) -> Offer:
        evidence = Evidence.UNDER_WAY if under_way else Evidence.MATCH
        copy = CopyOffer(available, match, evidence, **kw)
        offer = self.copies.offer(NGRAM, copy)
        self._copies[id(offer)] = copy  # what observe grades
        return offer

    def model_offer(self, available: int, catch_up: int = 0) -> Offer:
        # The draft model lags ``catch_up`` tokens behind the text (none: it holds all but
        # the last token, as after a round).
        committed = list(range(max(catch_up, 1) + 1))
        self.model.model.cached = committed[: len(committed) - max(catch_up, 1)]
        return self.model.offer(committed, available)

    def choose(self, *offers: Offer, **kw) -> Choice:
        return self.c.choose(list(offers), **kw)

    def observe(self, plan: Choice, offer: Offer | None, drafted: int, accepted: int) -> None:
        """A finished round, as the engine folds it in."""
        if offer is not None and drafted > 0:
            if offer.drafter == NGRAM:
                self.copies.grade(Grade.DRAFTED, self._copies[id(offer)], drafted, accepted)
            else:
                self.model.estimate.observe(drafted, accepted)
        self.c.observe(plan, offer, drafted, accepted)

    def learn(self, offer: Offer, drafted: int, accepted: int, times: int) -> None:
        for _ in range(times):
            self.observe(self.choose(offer), offer, drafted, accepted)

    def expected_rate(self, offer: Offer, k: int) -> float:
        step = CPU.draft_step_s * k if offer.drafter == MODEL else 0.0
        return (1 + offer.expected_accepted(k)[-1]) / (CPU.verify(k) + step)


def test_never_picks_a_draft_slower_than_a_plain_step():
    p = Pair(CPU)
    p.learn(p.model_offer(4), 4, 0, 30)  # a model drafter that is usually wrong
    p.learn(p.ngram(4, 2), 4, 0, 30)
    for _ in range(10):
        plan = p.choose(p.ngram(8, 2), p.model_offer(16))
        if plan.drafter is not None:
            assert plan.reason.startswith("probe")
        else:
            assert plan.expected_tokens_per_s == pytest.approx(1 / CPU.plain_s)


def test_chosen_plan_is_the_best_candidate():
    p = Pair(CPU)
    offer = p.ngram(12, 3)
    p.learn(offer, COPY_DEPTH, COPY_DEPTH, 20)
    offer = p.ngram(12, 3)
    plan = p.choose(offer)
    assert plan.drafter == NGRAM and plan.match == 3
    best = max(p.expected_rate(offer, k) for k in range(1, 13))
    assert plan.expected_tokens_per_s == pytest.approx(best)
    assert plan.expected_tokens_per_s > 1 / CPU.plain_s


def test_draft_length_grows_with_how_often_the_text_copies():
    lengths = []
    for copies in (0, 4, 8, 16):  # of 16 graded drafts, how many held COPY_DEPTH tokens
        p = Pair(CPU)
        offer = p.ngram(64, 6)
        for i in range(16):
            p.observe(Choice(NGRAM, 16, 0.0, ""), offer, 16, 16 if i < copies else 1)
        plan = p.choose(p.ngram(64, 6))
        lengths.append(plan.k if plan.drafter else 0)
    assert lengths == sorted(lengths) and lengths[0] == 0 and lengths[-1] > 16


def test_a_long_match_drafts_on_a_cold_start_and_a_streak_drafts_longer():
    p = Pair(CPU)  # nothing learned yet: priors alone
    weak = p.choose(p.ngram(64, match=2))
    assert weak.drafter is None  # a 2-token match does not pay for a verify batch here
    medium = p.choose(p.ngram(64, match=12))
    strong = p.choose(p.ngram(64, match=20))
    assert strong.drafter == NGRAM  # a long match is likely a copy
    assert strong.expected_tokens_per_s > medium.expected_tokens_per_s
    assert match_bucket(20) == 16 and match_bucket(2) == 2
    copying = Pair(CPU)
    offer = copying.ngram(64, match=20, under_way=True)
    copying.learn(offer, 47, 47, 20)
    assert copying.choose(copying.ngram(64, match=20, under_way=True)).k > 16  # accepted whole


def test_prefers_draft_lengths_whose_measured_cost_per_token_is_low():
    p = Pair(CPU)
    offer = p.ngram(60, match=20, under_way=True)  # a copy under way: long drafts are allowed
    p.learn(offer, 47, 47, 30)  # copies accepted whole
    # 47 drafts cost 0.33 s as measured, less than 31 drafts (0.457 s): take the cheaper batch
    assert p.choose(p.ngram(60, match=20, under_way=True)).k >= 47


def test_idle_drafter_is_probed_only_if_it_could_pay():
    cheap = CostProfile(plain_s=0.036, verify_s={1: 0.04, 3: 0.05, 15: 0.1}, draft_step_s=0.004)
    p = Pair(cheap, probe_every=5)
    p.learn(p.model_offer(4), 4, 0, 30)
    plans = []
    for _ in range(12):
        offer = p.model_offer(8)
        plan = p.choose(offer)
        plans.append(plan)
        p.observe(plan, offer if plan.drafter else None, plan.k if plan.drafter else 0, 0)
    assert any(q.drafter == MODEL and q.reason.startswith("probe") for q in plans)
    assert sum(q.drafter is None for q in plans) >= 8
    # On the small CPU the draft model could not pay even at 90% acceptance: never probed.
    slow = Pair(CPU, probe_every=5)
    slow.learn(slow.model_offer(4), 4, 0, 30)
    for _ in range(12):
        plan = slow.choose(slow.model_offer(8))
        assert plan.drafter is None
        slow.observe(plan, None, 0, 0)


def test_fixed_mode_always_drafts_when_it_can():
    p = Pair(CPU, fixed=True)
    offer = p.ngram(6, 2)
    p.learn(offer, 6, 0, 30)
    assert p.choose(p.ngram(6, 2)).k == 6
    assert p.choose().drafter is None
    assert p.choose(p.model_offer(16)).reason == "fixed model draft of 16"


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
        # Denormal durations pass a finite-and-positive check, then divide by zero in
        # every plan; a day-long step is no measurement either.
        {"plain_s": 5e-324, "verify_s": {"1": 5e-324}, "draft_step_s": 5e-324},
        {"plain_s": 0.1, "verify_s": {"1": 1e-300}},
        {"plain_s": 0.1, "verify_s": {"1": 0.2}, "draft_prefill_s": 5e-324},
        {"plain_s": 86400.0, "verify_s": {"1": 0.2}},
        [],
    ],
)
def test_cost_profile_rejects_bad_values(bad):
    with pytest.raises((ValueError, TypeError, KeyError)):
        CostProfile.from_dict(bad)


def test_draft_catch_up_cost_keeps_a_lagging_draft_model_idle():
    costs = CostProfile(plain_s=0.06, verify_s={4: 0.12}, draft_step_s=0.005, draft_prefill_s=0.004)
    p = Pair(costs)
    p.learn(p.model_offer(4), 4, 4, 20)
    assert p.choose(p.model_offer(50)).drafter == MODEL
    lagging = p.choose(p.model_offer(50, catch_up=400))
    assert lagging.drafter is None  # 1.6 s of catching up does not pay for one round


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
    from localspec.machine.calibrate import looks_disturbed

    assert not looks_disturbed(CPU)
    assert looks_disturbed(CostProfile(plain_s=2.8, verify_s={1: 2.8, 4: 0.42}))


def test_a_new_generation_relearns_acceptance_quickly():
    p = Pair(CPU)
    p.copies.new_text()  # the first text starts from what was restored, kept whole
    p.c.new_generation()
    offer = p.ngram(16, 6)
    p.learn(offer, 16, 16, 200)  # a long stretch of code being copied: drafts always accepted
    assert p.choose(p.ngram(16, 6)).drafter == NGRAM
    p.copies.new_text()
    p.c.new_generation()
    for _ in range(6):  # prose: the same matches now fail at once
        offer = p.ngram(16, 6)
        p.observe(p.choose(offer), offer, 4, 0)
    assert p.choose(p.ngram(16, 6)).drafter is None


def test_one_stalled_round_does_not_poison_the_costs():
    """A pause of the whole process (another program) makes one round very slow: the
    estimates move a bounded step, and plain steps stay the choice they were."""
    p = Pair(CPU)
    for _ in range(10):
        p.c.observe_timing(0, CPU.plain_s)
        p.c.observe_timing(2, CPU.verify(2))
    before = p.choose(p.ngram(8, match=2))
    p.c.observe_timing(0, 40 * CPU.plain_s)  # a 1.4 s stall on a 36 ms step
    p.c.observe_timing(2, 40 * CPU.verify(2))
    assert p.c.costs.plain_s < 1.2 * CPU.plain_s
    assert p.c.costs.verify(2) < 1.2 * CPU.verify(2)
    assert p.choose(p.ngram(8, match=2)).drafter == before.drafter is None


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
    prose, code = Pair(CPU), Pair(CPU)
    assert prose.copies.copies.odds == code.copies.copies.odds == pytest.approx(COPY_ODDS)
    for _ in range(4):
        prose.observe(Choice(NGRAM, 16, 0.0, ""), prose.ngram(16, 6), 16, 2)
        code.observe(Choice(NGRAM, 16, 0.0, ""), code.ngram(16, 6), 16, 16)
    assert prose.copies.copies.odds < COPY_ODDS < code.copies.copies.odds
    assert prose.choose(prose.ngram(64, 8)).drafter is None
    assert (
        code.choose(code.ngram(64, 8)).k > 16
    )  # a text that copies drafts long on a middling match


# Verify costs relative to a plain step as measured on a 2-core CPU during real answers.
IN_SITU = CostProfile(plain_s=0.033, verify_s={1: 0.055, 2: 0.075, 3: 0.085, 15: 0.185})


def test_a_new_text_waits_for_a_long_match_or_for_copies_to_show():
    p = Pair(IN_SITU)
    assert p.choose(p.ngram(40, match=4)).drafter is None  # in prose, it would part at once
    assert p.choose(p.ngram(40, match=20)).drafter == NGRAM
    for _ in range(2):  # the answer copied what plain steps passed over
        p.copies.grade(Grade.PASSED, CopyOffer(40, match=4), COPY_DEPTH, COPY_DEPTH)
    assert p.choose(p.ngram(40, match=4)).drafter == NGRAM


def test_a_draft_expected_to_win_by_less_than_the_margin_is_not_taken():
    p = Pair(IN_SITU, margin=1.0)
    offer = p.ngram(1, match=20, under_way=True)
    rate = (1 + offer.expected_accepted(1)[-1]) / IN_SITU.verify(1)
    assert rate > 1 / IN_SITU.plain_s  # it would win, a little
    assert p.choose(offer).drafter == NGRAM
    p.c.margin = rate * IN_SITU.plain_s * 1.01
    assert p.choose(offer).drafter is None


def test_drafts_that_lost_time_raise_the_bar_until_the_answer_is_ahead_again():
    """A text whose first long matches parted at once (code rewritten line by line) does
    not keep paying for more such bets: the margin grows with the answer's deficit."""
    p = Pair(IN_SITU)
    c = p.c
    c.new_generation()
    for _ in range(150):  # plain steps: the answer so far copied nothing
        p.observe(p.choose(), None, 0, 0)
    assert c.required_margin == c.margin
    long_match = p.ngram(40, match=20)
    bet = p.choose(long_match)
    assert bet.drafter == NGRAM and bet.k == 15  # a cold long match is worth a bet
    c.observe(bet, long_match, bet.k, 0)  # which lost: a verify batch for one token
    deficit = IN_SITU.verify(15) - IN_SITU.plain_s
    budget = LOSS_BUDGET * IN_SITU.plain_s * max(151, LOSS_HORIZON)
    assert c.required_margin == pytest.approx(c.margin * (1 + deficit / budget))
    assert p.choose(p.ngram(40, match=12)).drafter is None  # weaker evidence waits
    copy = p.ngram(40, match=20, under_way=True)  # a copy under way still clears the bar
    plan = p.choose(copy)
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


# A machine where verifying is dear (a 2-core CPU without AVX-512): a failed draft costs 1.6
# plain steps, a long one tens of them, so no draft can run much past 2x a plain step.
STEEP = CostProfile(
    plain_s=0.0507,
    verify_s={1: 0.0832, 4: 0.167, 8: 0.274, 16: 0.477, 32: 0.862, 64: 1.622},
)


def strongest_rate(costs: CostProfile) -> float:
    """The fastest a draft on the strongest evidence is expected to run, in plain steps'
    rates: a long copy that holds at ``REACH_CHANCE``, ``REACH_ALPHA`` a token along it."""
    return max(
        (1 + sum(REACH_CHANCE * REACH_ALPHA**i for i in range(1, k + 1)))
        * costs.plain_s
        / costs.verify(k)
        for k in range(1, REACH_DRAFT + 1)
    )


def test_a_deep_deficit_never_raises_the_bar_past_what_a_draft_can_reach():
    """One long draft that parted at once, where it cost 30 plain steps: the bar rises, but
    a copy under way that holds can still clear it, so drafting does not end for the rest
    of the answer (only drafting rounds move the balance)."""
    p = Pair(STEEP)
    c = p.c
    c.new_generation()
    copy = p.ngram(64, match=32, under_way=True)
    plan = Choice(NGRAM, 64, 0.0, "a long draft of a copy under way")
    c.observe(plan, copy, plan.k, 0)  # parted at its first token
    best = strongest_rate(STEEP)
    assert c.reach() == pytest.approx(REACH_SHARE * best)
    deficit = STEEP.verify(plan.k) - STEEP.plain_s
    budget = LOSS_BUDGET * STEEP.plain_s * LOSS_HORIZON
    assert c.margin * (1 + deficit / budget) > best  # uncapped, out of any draft's reach
    assert c.required_margin == pytest.approx(c.reach())
    for _ in range(4):  # the copy's estimate learns that it holds (drafts passed over)
        p.copies.grade(Grade.DRAFTED, CopyOffer(64, 32, Evidence.UNDER_WAY), 32, 32)
    assert p.choose(copy).drafter == NGRAM
    assert p.choose(p.ngram(40, match=4)).drafter is None  # weak evidence still waits


# A 2-core Zen 4 with AVX-512 (tests/data/costs/avx512.json): a verify of 64 costs about 25
# plain steps, so even a copy never drafted from, on a 32-token match, runs below 2x.
AVX512 = CostProfile(
    plain_s=0.0332,
    verify_s={1: 0.0598, 3: 0.0963, 4: 0.1062, 15: 0.2722, 31: 0.4814, 47: 0.7204, 63: 0.8366},
)


def test_a_deep_deficit_leaves_a_long_match_within_reach():
    """Drafts that parted at once put the answer deep in deficit; while it lasts the drafts
    passed over show that the text copies (a long match held where the round took a plain
    step). A long match not drafted from yet, which no streak has made a copy under way,
    clears the bar again; a short one still waits."""
    p = Pair(AVX512)
    c = p.c
    c.new_generation()
    parted = p.ngram(64, match=32, under_way=True)
    for _ in range(2):
        c.observe(Choice(NGRAM, 64, 0.0, "a long draft"), parted, 64, 0)
    assert c.required_margin == pytest.approx(c.reach())
    for _ in range(6):  # passed over, and held: the text copies
        p.copies.grade(Grade.PASSED, CopyOffer(64, 32), COPY_DEPTH, COPY_DEPTH)
    assert p.choose(p.ngram(64, match=32)).drafter == NGRAM
    assert p.choose(p.ngram(64, match=3)).drafter is None


def test_the_bar_in_deficit_is_never_below_the_plain_margin():
    flat = CostProfile(plain_s=1.0, verify_s={1: 1.9, 64: 120.0})  # no draft can pay
    c = Controller(flat)
    c.new_generation()
    c.observe(Choice(NGRAM, 1, 0.0, ""), Offer(NGRAM, 1, lambda k: [0.0] * k), 1, 0)
    assert c.reach() < c.margin
    assert c.required_margin == c.margin


# -- draft trees ---------------------------------------------------------------------------

# Batches that cost little more as they grow (a GPU, a larger CPU): verify(16) ~ verify(8).
FLAT = CostProfile(plain_s=1.0, verify_s={1: 1.5, 8: 1.6, 16: 1.65, 32: 1.8, 64: 2.0})


def fork(p: Pair, available: int = 16, match: int = 5, shares=(0.5, 0.5), **kw) -> Offer:
    return p.ngram(available, match, shares=shares, **kw)


def test_a_fork_is_verified_as_a_tree_when_batches_cost_little_more():
    p = Pair(FLAT, trees=True)
    plan = p.choose(fork(p))
    assert plan.drafter == NGRAM and plan.branches == 2
    assert plan.reason.startswith(f"ngram tree 2x{plan.k} (match 5): ")
    # The chain's copy curve, its long-copy chance times both shares over the drafted one's.
    curve = p.copies.curve(CopyOffer(16, 5, shares=(0.5, 0.5)), plan.k, scale=2.0)
    assert plan.expected_tokens_per_s == pytest.approx((1 + curve[-1]) / FLAT.verify(2 * plan.k))
    chains = Pair(FLAT)
    chain = chains.choose(fork(chains))
    assert chain.branches == 1 and chain.expected_tokens_per_s < plan.expected_tokens_per_s


def test_a_fork_is_drafted_as_a_chain_or_not_at_all_when_batches_are_steep():
    for costs in (CPU, DEFAULT_COSTS):
        for match in (2, 5, 8, 16):
            p = Pair(costs, trees=True)
            plan = p.choose(fork(p, match=match))
            assert plan.branches == 1, (costs, match, plan.reason)


def test_no_tree_when_trees_are_off_for_sampled_rounds_streaks_or_agreeing_sources():
    off = Pair(FLAT)
    assert off.choose(fork(off)).branches == 1
    p = Pair(FLAT, trees=True)
    assert p.choose(fork(p), sampled=True).branches == 1  # exact sampling over trees: no
    assert p.choose(fork(p, under_way=True)).branches == 1  # a copy under way keeps to its source
    assert p.choose(fork(p, shares=())).branches == 1
    fixed = Pair(FLAT, trees=True, fixed=True)
    assert fixed.choose(fork(fixed)).branches == 1


def test_never_more_branches_or_nodes_than_allowed():
    shares = (0.3, 0.25, 0.2, 0.15, 0.1)
    p = Pair(FLAT, trees=True)
    assert 2 <= p.choose(fork(p, 64, shares=shares)).branches <= MAX_BRANCHES
    two = Pair(FLAT, trees=True, max_branches=2)
    assert two.choose(fork(two, 64, shares=shares)).branches == 2
    one = Pair(FLAT, trees=True, max_branches=1)
    assert one.choose(fork(one, 64, shares=shares)).branches == 1
    for nodes in (TREE_MAX_NODES, 20, 3):
        plan = p.choose(fork(p, 64, shares=shares), nodes=nodes)
        assert plan.branches == 1 or plan.branches * plan.k <= nodes
    plan = p.choose(fork(p, 64, shares=shares), nodes=1000)
    assert plan.branches * plan.k <= TREE_MAX_NODES
