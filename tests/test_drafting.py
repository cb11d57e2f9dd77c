"""What drafters learn and how they price: copy pricing and its grading, the draft model's
own costs and confidence cut-off, learned state out and in, and the registry."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from localspec.core.acceptance import AcceptanceEstimate
from localspec.core.controller import Controller
from localspec.core.costs import CostProfile, LiveCosts
from localspec.core.drafting.base import Draft, Offer, Outcome, Resources
from localspec.core.drafting.copying import Streak, vote
from localspec.core.drafting.evidence import CopyOffer, Evidence
from localspec.core.drafting.grades import Grade, Grades, Pending
from localspec.core.drafting.model import FIXED_P_MIN, ModelDrafter
from localspec.core.drafting.pricing import CopyPricing
from localspec.core.drafting.registry import AUTO, REGISTRY, Registration, build_drafters
from localspec.core.drafting.store import store_drafter
from localspec.core.drafting.tunables import COPY_DEPTH, COPY_ODDS
from localspec.core.params import GenerationParams
from localspec.core.planner import Planner, restore_drafters
from tests.fakes import FakeModel

CPU = CostProfile(
    plain_s=0.036,
    verify_s={1: 0.082, 3: 0.104, 4: 0.116, 8: 0.2, 15: 0.212, 31: 0.457, 63: 0.45},
    draft_step_s=0.02,
)
FLAT = CostProfile(plain_s=1.0, verify_s={1: 1.5, 8: 1.6, 16: 1.65, 32: 1.8, 64: 2.0})


def test_vote_follows_the_continuation_most_runs_share():
    runs = [(5, 6, 7), (5, 6, 9), (8, 1)]
    tokens, agreeing, share = vote(runs, 8, [3, 1, 2])
    assert tokens == [5, 6, 7] and agreeing == [0]
    assert share == pytest.approx(4 / 6)
    assert vote(runs, 2, [3, 1, 2])[0] == [5, 6]
    assert vote([], 4) == ([], [], 0.0)
    # Ties go to the earlier run; a run ending in an end-of-generation token stops there.
    assert vote([(1, 2), (1, 3)], 4)[0] == [1, 2]
    assert vote([(1, 99, 4)], 4, ends=lambda t: t == 99)[0] == [1, 99]


def test_a_streak_counts_drafts_accepted_whole_from_one_copy():
    streak = Streak()
    streak.add(5, 5, same_copy=True)
    assert not streak.under_way
    streak.add(4, 4, same_copy=True)
    assert streak.under_way and streak.copied == 9
    streak.add(4, 4, same_copy=False)  # another copy starts its own count
    assert streak.copied == 4
    streak.add(4, 2, same_copy=True)  # parted
    assert streak.copied == 0


def passed(tokens: tuple[int, ...], start: int, match: int = 3) -> Pending[CopyOffer]:
    return Pending(Grade.PASSED, CopyOffer(len(tokens), match), tokens, start)


def test_pending_grades_come_due_as_the_answer_shows_them():
    grades: Grades[CopyOffer] = Grades()
    first, second = passed((7, 8, 9, 10), 3), passed((20, 21), 7)
    assert grades.add(first) and grades.add(second)  # a second one is kept, not dropped
    assert grades.due([1, 2, 3, 7, 8]) == [] and len(grades) == 2  # not known yet
    assert grades.due([1, 2, 3, 7, 8, 9, 10]) == [(first, 4, 4)]  # held whole
    assert grades.due([1, 2, 3, 7, 8, 9, 10, 20, 5]) == [(second, 2, 1)]  # parted
    assert len(grades) == 0
    assert not grades.add(passed((), 3))  # nothing to grade


def test_a_stretch_of_the_answer_is_graded_once_per_kind():
    grades: Grades[CopyOffer] = Grades()
    assert grades.add(passed((7, 8, 9, 10), 3))
    assert grades.covered(Grade.PASSED, 4) and not grades.covered(Grade.BEYOND, 4)
    assert not grades.add(passed((8, 9, 10, 11), 4))  # the same copy, one token on
    beyond = Pending(Grade.BEYOND, CopyOffer(4, 3), (8, 9), 4, offset=1)
    assert grades.add(beyond)  # another kind: graded on its own
    due = grades.due([1, 2, 3, 7, 8, 9, 10])
    assert [g[0].kind for g in due] == [Grade.PASSED, Grade.BEYOND]


def test_settle_grades_what_the_answer_has_shown_so_far():
    grades: Grades[None] = Grades()
    grades.add(Pending(Grade.PASSED, None, (7, 8, 9, 10), 3))
    grades.add(Pending(Grade.PASSED, None, (5, 6), 9))  # nothing of it shown yet
    (graded,) = grades.settle([1, 2, 3, 7, 8])
    assert graded[1:] == (2, 2) and len(grades) == 0


def test_what_says_nothing_about_copies_leaves_the_odds_alone():
    pricing = CopyPricing(COPY_ODDS)
    pricing.grade(Grade.DRAFTED, CopyOffer(16, 6), 4, 4)  # short and accepted whole
    under_way = CopyOffer(40, 20, evidence=Evidence.UNDER_WAY)
    pricing.grade(Grade.DRAFTED, under_way, 40, 3)  # a streak's own estimate
    pricing.grade(Grade.PASSED, CopyOffer(16, 6), 0, 0)  # nothing was there to pass over
    assert pricing.copies.odds == pytest.approx(COPY_ODDS)


def test_drafts_passed_over_are_graded_like_drafts():
    drafted, passed = CopyPricing(COPY_ODDS), CopyPricing(COPY_ODDS)
    for _ in range(3):
        drafted.grade(Grade.DRAFTED, CopyOffer(16, 4), COPY_DEPTH, COPY_DEPTH)
        passed.grade(Grade.PASSED, CopyOffer(16, 4), COPY_DEPTH, COPY_DEPTH)
    assert passed.copies.odds == pytest.approx(drafted.copies.odds)
    assert passed.copies.odds > COPY_ODDS
    passed.grade(Grade.PASSED, CopyOffer(16, 4), COPY_DEPTH, 1)  # it parted after one token
    assert passed.copies.odds < drafted.copies.odds


def test_what_a_draft_accepted_whole_would_have_had_accepted_deeper_is_counted_once():
    est = AcceptanceEstimate(prior=0.97, extrapolate=True)
    est.observe(4, 4)
    est.observe_beyond(4, 3, 2)  # two more would have held, the third parted
    assert est.tries == [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]
    assert est.hits == [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0]
    est.observe_beyond(4, 3, 0)  # the very next token parted: only it was tested
    assert est.tries[4:] == [2.0, 1.0, 1.0] and est.hits[4:] == [1.0, 1.0, 0.0]


def test_a_copy_whose_deep_tokens_held_again_is_drafted_long_again():
    """One deep failure shortens a copy's drafts; what the copy went on to write past the
    shorter drafts, once counted, lengthens them again."""
    c = Controller(CPU)
    streak = CopyOffer(64, 32, evidence=Evidence.UNDER_WAY)
    told, untold = CopyPricing(COPY_ODDS), CopyPricing(COPY_ODDS)
    for pricing in (told, untold):
        pricing.grade(Grade.DRAFTED, streak, 63, 63)
        for _ in range(3):
            pricing.grade(Grade.DRAFTED, streak, 63, 24)  # edits 25 tokens in
    short = c.choose([told.offer("ngram", streak)]).k
    assert short < 63
    for _ in range(2):
        for pricing in (told, untold):
            pricing.grade(Grade.DRAFTED, streak, short, short)
        told.grade(
            Grade.BEYOND, streak, 63 - short, 63 - short, short
        )  # the copy went on past them
    assert c.choose([told.offer("ngram", streak)]).k == 63
    assert c.choose([untold.offer("ngram", streak)]).k == short


def test_passed_over_drafts_of_a_copy_under_way_teach_its_estimate():
    """A copy under way whose estimate is pessimistic (learned from an earlier text whose
    copies parted) is passed over; what its previews would have had accepted raises the
    estimate until it drafts again, rather than plain steps for the rest of the answer."""
    c = Controller(CPU)
    pricing = CopyPricing(COPY_ODDS)
    streak = CopyOffer(32, 64, evidence=Evidence.UNDER_WAY)
    for _ in range(30):
        # copies that parted at once (in an earlier answer)
        pricing.grade(Grade.DRAFTED, streak, 16, 1)
    assert c.choose([pricing.offer("ngram", streak)]).drafter is None
    for _ in range(40):
        pricing.grade(Grade.PASSED, streak, 12, 12)  # the answer went on copying all along
        if c.choose([pricing.offer("ngram", streak)]).drafter == "ngram":
            break
    assert c.choose([pricing.offer("ngram", streak)]).drafter == "ngram"
    estimate = pricing.estimate(streak)
    before = list(estimate.tries)
    # not a streak: graded as this text's odds
    pricing.grade(Grade.PASSED, CopyOffer(32, 64), 12, 3)
    assert estimate.tries == before


def test_a_store_fork_prices_trees_as_a_copy_does():
    store = store_drafter([]).pricing
    offer = store.offer("store", CopyOffer(16, 8, support=0.5, shares=(0.5, 0.5)))
    assert offer.tree is not None and offer.branches == 2
    assert Controller(FLAT, trees=True).choose([offer]).branches == 2


def ngram_auto() -> tuple[Planner, dict]:
    costs = LiveCosts(CPU)
    target = FakeModel()
    resources = Resources(costs, target, FakeModel(), lambda: ())
    drafters = build_drafters(GenerationParams(), resources)
    return Planner(Controller(costs), drafters, GenerationParams()), drafters


def test_learned_state_round_trips_discounted_and_the_texts_copy_odds_start_afresh():
    planner, drafters = ngram_auto()
    ngram, model = drafters["ngram"].pricing, drafters["model"]
    for _ in range(20):
        ngram.grade(Grade.DRAFTED, CopyOffer(16, 6), 16, 2)
    for _ in range(50):
        ngram.grade(Grade.DRAFTED, CopyOffer(16, 6), 16, 16)
    for _ in range(20):
        ngram.grade(Grade.DRAFTED, CopyOffer(16, 20, Evidence.UNDER_WAY), 16, 10)
    for _ in range(10):
        model.estimate.observe(4, 3)
    saved = planner.learned()
    assert set(saved["drafters"]) == {"ngram", "prediction", "store", "model", "lookahead"}
    assert ngram.copies.odds > COPY_ODDS  # this text copied at length
    fresh, fresh_drafters = ngram_auto()
    restore_drafters(fresh_drafters, saved, keep=1.0)
    restored = fresh.learned()["drafters"]
    # The pair's estimates come back whole; whether a text copies is the next text's own.
    assert restored["ngram"]["copies"] == restored["store"]["copies"] == [0.0, 0.0]
    assert restored["model"] == saved["drafters"]["model"]
    assert restored["ngram"]["streaks"] == saved["drafters"]["ngram"]["streaks"]
    assert fresh_drafters["ngram"].pricing.copies.odds == COPY_ODDS
    half, half_drafters = ngram_auto()
    restore_drafters(half_drafters, saved, keep=0.5)
    streak = CopyOffer(16, 20, evidence=Evidence.UNDER_WAY)
    evidence = ngram.estimate(streak).tries[0]
    assert half_drafters["ngram"].pricing.estimate(streak).tries[0] == pytest.approx(
        evidence / 2, rel=1e-3
    )


@pytest.mark.parametrize(
    "bad",
    [
        {},
        {"drafters": []},
        {"drafters": {"ngram": {"copies": [0, 0], "streaks": {"5": {}}}}},
        {"drafters": {"model": {"hits": [2], "tries": [1]}}},
        {"drafters": {"model": {"hits": [1], "tries": [1, 2]}}},
        {"drafters": {"model": {"hits": "x", "tries": []}}},
        {"drafters": {"ngram": {"copies": [-1, 2], "streaks": {}}}},
        {"drafters": {"ngram": {"streaks": {}}}},
    ],
)
def test_restore_rejects_malformed_state(bad):
    with pytest.raises((ValueError, KeyError, TypeError)):
        restore_drafters(ngram_auto()[1], bad, keep=0.5)


def test_a_drafter_without_an_entry_starts_afresh():
    _, drafters = ngram_auto()
    restore_drafters(drafters, {"drafters": {"someone-else": {"x": 1}}}, keep=0.5)
    assert drafters["model"].learned() == {"hits": [], "tries": []}


def model_drafter(costs: CostProfile, **kw) -> ModelDrafter:
    return ModelDrafter(SimpleNamespace(cached=[]), lambda t: False, costs=LiveCosts(costs), **kw)


def test_catch_up_is_timed_apart_from_draft_steps():
    costs = CostProfile(plain_s=0.06, verify_s={4: 0.12}, draft_step_s=0.005, draft_prefill_s=0.004)
    drafter = model_drafter(costs)
    for _ in range(30):
        drafter.timing.observe(3, 0.03, 50, 0.5)
    assert drafter.timing.step_s == pytest.approx(0.01, rel=0.02)  # catch-up is not a step
    assert drafter.timing.catch_up(100) == pytest.approx(1.0, rel=0.02)  # 0.01 s a token, seen


def test_the_draft_model_stops_where_one_more_token_does_not_pay():
    fixed = model_drafter(CPU, fixed=True)
    assert fixed.p_min() == FIXED_P_MIN  # llama.cpp's cut-off
    priced = model_drafter(CPU)
    marginal = CPU.draft_step_s + CPU.verify(2) - CPU.verify(1)
    assert priced.p_min() == pytest.approx(marginal / (marginal + CPU.plain_s))


def test_the_draft_models_offer_prices_its_own_steps_and_catching_up():
    costs = CostProfile(plain_s=0.06, verify_s={4: 0.12}, draft_step_s=0.005, draft_prefill_s=0.004)
    drafter = model_drafter(costs)
    drafter.model.cached = [1, 2, 3]
    assert drafter.offer([1, 2, 3, 4], 8).draft_seconds(4) == pytest.approx(4 * 0.005)
    lagging = drafter.offer([1, 2, 3, *range(10, 110)], 8)
    assert lagging.draft_seconds(4) == pytest.approx(100 * 0.004 + 3 * 0.005)
    assert lagging.probe  # learned from its own drafts only: may be probed


def test_the_registry_builds_each_modes_drafters_with_their_limits():
    costs = LiveCosts(CPU)
    resources = Resources(costs, FakeModel(), FakeModel(), lambda: ())
    assert [r.name for r in REGISTRY] == ["ngram", "prediction", "store", "model", "lookahead"]

    def built(**kw):
        drafters = build_drafters(GenerationParams(**kw), resources)
        return {name: d.limit for name, d in drafters.items()}

    assert built() == {"ngram": 64, "prediction": 64, "store": 64, "model": 16, "lookahead": 16}
    assert built(draft_max=6, ngram_draft_max=40) == {
        "ngram": 40, "prediction": 40, "store": 40, "model": 6, "lookahead": 6,
    }  # fmt: skip
    assert built(drafter="ngram", draft_max=6) == {"ngram": 6}  # fixed: llama.cpp's limit
    assert built(drafter="model") == {"model": 16}
    assert built(drafter="lookahead") == {"lookahead": 16}
    assert built(drafter="none") == {}
    no_draft = Resources(costs, FakeModel(), None, lambda: ())
    assert set(build_drafters(GenerationParams(), no_draft)) == {
        "ngram", "prediction", "store", "lookahead",
    }  # fmt: skip
    # A draft derived from the target drafts under its own name, in self mode and in auto.
    derived = Resources(costs, FakeModel(), FakeModel(), lambda: (), draft_name="self")
    assert set(build_drafters(GenerationParams(drafter="self"), derived)) == {"self"}
    assert "self" in build_drafters(GenerationParams(), derived)


def test_outcomes_reach_only_the_drafter_that_drafted():
    drafter = model_drafter(CPU)
    drafter.observe([1, 2], Outcome(False))
    assert drafter.learned() == {"hits": [], "tries": []}
    drafter.observe([1, 2], Outcome(True, 4, 2))
    assert drafter.learned()["tries"] == [1.0, 1.0, 1.0, 0.0]


class EchoDrafter:
    """The example drafter of docs/development.md, as written there: drafts the last token again."""

    name, branching = "echo", None

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.estimate = AcceptanceEstimate(prior=0.3)

    def begin(self, prompt, params): ...

    def offer(self, committed, limit):
        return Offer("echo", limit, self.estimate.expected_accepted)

    def propose(self, committed, k, params, rng):
        return Draft("echo", [committed[-1]] * k)

    def observe(self, committed, outcome):
        if outcome.chosen and outcome.drafted:
            self.estimate.observe(outcome.drafted, outcome.accepted)

    def learned(self):
        return self.estimate.to_dict()

    def restore(self, data, keep):
        self.estimate.load(data, keep)


def test_a_new_drafter_is_a_module_and_a_registry_line(monkeypatch):
    from localspec.core.drafting import registry
    from localspec.core.engine import SpecDecoder, run_to_completion
    from tests.fakes import plain_greedy

    line = Registration("echo", lambda params, resources: EchoDrafter(params.draft_max), (AUTO,))
    monkeypatch.setattr(registry, "REGISTRY", (*registry.REGISTRY, line))
    # A target that repeats itself, with verification as cheap as a step: echoes pay.
    target = FakeModel(n_vocab=3, seed=2, window=1, sharpness=0.5)
    cheap = CostProfile(plain_s=1.0, verify_s={k: 1.0 + 0.01 * k for k in range(1, 17)})
    decoder = SpecDecoder(target, None, cheap)
    prompt = [0, 1, 2, 1]
    fin = run_to_completion(decoder.generate(prompt, GenerationParams(max_tokens=60)))
    assert list(fin.token_ids) == plain_greedy(target, prompt, 60)
    assert fin.stats.by_drafter["echo"].accepted > 0
    assert fin.stats.by_origin.get("echo", 0) == fin.stats.by_drafter["echo"].accepted
    assert "echo" in decoder.learned(GenerationParams())["drafters"]


# Verify batches that cost little more than a step, as on a GPU; the draft model's steps are
# a tenth of the target's, its catching up a fiftieth a token.
GPU = CostProfile(
    plain_s=1.0,
    verify_s={k: 1.0 + 0.02 * k for k in range(1, 17)},
    draft_step_s=0.1,
    draft_prefill_s=0.02,
)


def test_the_draft_model_reads_the_prompt_only_where_drafting_could_pay():
    prompt = list(range(1, 300))
    for costs, reads in ((GPU, True), (CPU, False)):
        draft = FakeModel(n_vocab=400)
        drafter = ModelDrafter(draft, lambda t: False, costs=LiveCosts(costs))
        assert drafter.could_pay() is reads
        drafter.begin(prompt, GenerationParams())
        assert draft.cached == (prompt[:-1] if reads else [])
        first = drafter.offer(prompt, 4).draft_seconds(4)
        if reads:  # the first draft takes its own steps, not a catch-up on the prompt
            assert first == pytest.approx(4 * costs.draft_step_s)
        else:
            assert first > 298 * costs.draft_step_s / 4


def test_auto_drafts_with_the_draft_model_from_the_first_rounds_where_it_pays(monkeypatch):
    """A prompt of a few hundred tokens and nothing to copy: the draft model, having read
    the prompt with the target, drafts from the start; caught up in one round instead, it
    would never have paid for it."""
    from localspec.core.engine import SpecDecoder, run_to_completion
    from tests.fakes import plain_greedy

    prompt = [int(t) for t in np.random.default_rng(3).integers(0, 24, 300)]
    target = FakeModel(seed=1, window=2)
    draft = FakeModel(seed=1, window=2, noise=0.3)
    decoder = SpecDecoder(target, draft, GPU)
    params = GenerationParams(max_tokens=40, trace=True)
    fin = run_to_completion(decoder.generate(prompt, params))
    assert list(fin.token_ids) == plain_greedy(target, prompt, 40)
    assert fin.stats.trace[0]["drafter"] == "model"  # from the first round
    assert fin.stats.by_drafter["model"].accepted > 0
    assert draft.calls[0] == (0, len(prompt) - 1, 0)  # the prompt, read once, no logits
    # Left to catch up on the prompt in its first draft, it is never chosen.
    monkeypatch.setattr(ModelDrafter, "could_pay", lambda self: False)
    unread = SpecDecoder(FakeModel(seed=1, window=2), FakeModel(seed=1, window=2), GPU)
    fin = run_to_completion(unread.generate(prompt, params))
    assert "model" not in fin.stats.by_drafter
