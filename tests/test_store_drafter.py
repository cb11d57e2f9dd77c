"""The datastore drafter: lookups over token corpora, its price, and exact output through the
engine on scripted models."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.core.controller import Controller
from localspec.core.costs import CostProfile
from localspec.core.drafting.base import Outcome
from localspec.core.drafting.evidence import CopyOffer, Evidence
from localspec.core.drafting.grades import Grade
from localspec.core.drafting.ngram import ngram_drafter
from localspec.core.drafting.store import store_drafter
from localspec.core.drafting.tunables import COPY_DEPTH, COPY_ODDS, STORE_COPY_ODDS
from localspec.core.engine import SpecDecoder, run_to_completion
from localspec.core.params import GenerationParams
from localspec.core.planner import restore_drafters
from localspec.storage.datastore import TokenIndex
from tests.fakes import FakeModel, plain_greedy

COSTS = CostProfile(plain_s=1.0, verify_s={k: 1.0 + 0.04 * k for k in range(1, 65)})
PARAMS = GenerationParams()


def test_the_longest_match_among_corpora_drafts_what_followed_it():
    short = TokenIndex.build([[1, 2, 3, 4, 50, 51]])
    long = TokenIndex.build([[9, 1, 2, 3, 4, 60, 61, 62], [7, 7, 7]])
    drafter = store_drafter([("short", short), ("long", long)], n_min=2)
    committed = [9, 1, 2, 3, 4]
    offer = drafter.offer(committed, 16)
    assert offer is not None and offer.drafter == "store"
    copy = drafter.copy_offer(committed, 16)
    assert copy.match == 5 and copy.available == 3 and copy.support == 1.0
    looked_up = drafter.source.lookup(committed)
    assert looked_up is not None and looked_up.source == "long"
    draft = drafter.propose(committed, 2, PARAMS, np.random.default_rng(0))
    assert draft.tokens == [60, 61] and draft.probs is None
    assert drafter.preview(16) == [60, 61, 62]


def test_a_draft_ends_at_an_end_of_generation_token_and_at_the_documents_end():
    index = TokenIndex.build([[1, 2, 3, 4, 5, 99, 6, 7], [1, 2, 3, 4, 5]])
    drafter = store_drafter([("s", index)], n_min=2, ends=lambda t: t == 99)
    assert drafter.preview(8) == []  # nothing looked up yet
    # 99 itself is drafted; the occurrence that ends its document adds nothing
    assert drafter.offer([1, 2, 3, 4, 5], 16).available == 1
    assert drafter.preview(8) == [99]


def test_nothing_is_offered_under_the_shortest_match_or_without_room():
    index = TokenIndex.build([[1, 2, 3, 4, 5, 6]])
    drafter = store_drafter([("s", index)], n_min=4)
    assert drafter.offer([0, 0, 3, 4], 16) is None  # a 2-token match is too weak
    assert drafter.offer([1, 2, 3, 4], 0) is None
    assert drafter.offer([1, 2, 3, 4], 16) is not None


def test_disagreeing_occurrences_lower_the_support_and_the_price():
    agree = TokenIndex.build([[1, 2, 3, 4, 5, 6, 7, 8]] * 4)
    split = TokenIndex.build([[1, 2, 3, 4, t, 6, 7, 8] for t in (5, 9, 10, 11)])
    context = [1, 2, 3, 4]
    a = store_drafter([("a", agree)])
    b = store_drafter([("b", split)])
    assert a.copy_offer(context, 16).support == 1.0
    assert b.copy_offer(context, 16).support == pytest.approx(0.25)
    assert (
        b.offer(context, 16).expected_accepted(4)[-1]
        < a.offer(context, 16).expected_accepted(4)[-1]
    )


def test_a_store_starts_at_lower_odds_than_prompt_lookup_and_earns_its_own():
    store, ngram = store_drafter([]).pricing, ngram_drafter().pricing
    copy = CopyOffer(16, 8)
    assert store.copies.odds == pytest.approx(STORE_COPY_ODDS)
    assert store.expected_accepted(copy, 16)[-1] < ngram.expected_accepted(copy, 16)[-1]
    for _ in range(4):
        store.grade(Grade.PASSED, copy, COPY_DEPTH, COPY_DEPTH)
    assert store.copies.odds > STORE_COPY_ODDS
    assert ngram.copies.odds == pytest.approx(COPY_ODDS)  # prompt lookup's odds are its own


def test_a_cold_long_store_match_buys_no_long_draft_until_the_text_copies_the_store():
    # Batches as on a 2-core CPU: a verify of k drafts costs 1 + 0.4 k plain steps.
    cpu = CostProfile(plain_s=1.0, verify_s={k: 1.0 + 0.4 * k for k in range(1, 65)})
    c = Controller(cpu)
    store = store_drafter([]).pricing
    quoted = CopyOffer(31, 32)  # a question quoting a file matches it at length
    assert c.choose([store.offer("store", quoted)]).drafter is None
    for _ in range(3):  # the answer showed it copies the store
        store.grade(Grade.PASSED, CopyOffer(31, 16), COPY_DEPTH, COPY_DEPTH)
    plan = c.choose([store.offer("store", quoted)])
    assert plan.drafter == "store" and plan.k >= 8


def test_passed_over_store_drafts_that_part_cut_its_odds_and_its_drafts_short():
    c = Controller(COSTS)  # verify batches cost little more than a step
    store = store_drafter([]).pricing
    copy = CopyOffer(16, 4)
    assert c.choose([store.offer("store", copy)]).k == 16  # a long bet on a long copy
    for _ in range(6):
        store.grade(Grade.PASSED, copy, COPY_DEPTH, 0)
    assert store.copies.odds < STORE_COPY_ODDS / 2
    assert c.choose([store.offer("store", copy)]).k <= 2  # only what a parting match keeps


def test_store_learning_round_trips_and_older_files_without_it_load():
    drafter = store_drafter([])
    drafter.pricing.grade(Grade.PASSED, CopyOffer(16, 8), COPY_DEPTH, COPY_DEPTH)
    drafter.pricing.grade(Grade.DRAFTED, CopyOffer(16, 16, Evidence.UNDER_WAY), 16, 16)
    saved = drafter.learned()
    assert saved["copies"][0] > 0 and saved["streaks"]
    fresh = store_drafter([])
    restore_drafters({"store": fresh}, {"drafters": {"store": saved}}, keep=1.0)
    assert fresh.learned()["streaks"] == saved["streaks"]
    # Whether the next text copies the store is its own to show: its odds start afresh.
    assert fresh.pricing.copies.odds == pytest.approx(STORE_COPY_ODDS)
    old = store_drafter([])
    restore_drafters({"store": old}, {"drafters": {}}, keep=1.0)  # saved without a store
    assert old.pricing.copies.odds == pytest.approx(STORE_COPY_ODDS)
    with pytest.raises(ValueError):
        bad = {"store": {"copies": [-1, 0], "streaks": {}}}
        restore_drafters({"store": store_drafter([])}, {"drafters": bad}, keep=1.0)


def test_greedy_output_with_a_store_is_the_targets_own_and_the_store_drafts_it():
    target = FakeModel(seed=4, window=2)
    prompt = [3, 1, 4]
    answer = plain_greedy(target, prompt, 120)
    # The store holds an earlier answer to the same prompt: a copy is available at once.
    history = [("history", TokenIndex.build([prompt + answer]))]
    decoder = SpecDecoder(target, None, COSTS, corpora=history)
    fin = run_to_completion(decoder.generate(prompt, GenerationParams(max_tokens=120)))
    assert list(fin.token_ids) == answer
    assert fin.stats.by_origin["store"] > 60
    assert fin.stats.by_drafter["store"].accepted == fin.stats.by_origin["store"]


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_an_irrelevant_store_changes_nothing_in_the_output(temperature):
    target = FakeModel(seed=5, window=2)
    prompt = [2, 7, 1, 8]
    rng = np.random.default_rng(0)
    noise = TokenIndex.build([rng.integers(0, 24, 400).tolist() for _ in range(5)])
    params = GenerationParams(max_tokens=80, temperature=temperature, seed=3)
    plain = run_to_completion(SpecDecoder(target, None, COSTS).generate(prompt, params))
    decoder = SpecDecoder(target, None, COSTS, corpora=[("noise", noise)])
    fin = run_to_completion(decoder.generate(prompt, params))
    if temperature == 0.0:
        assert fin.token_ids == plain.token_ids
    assert len(fin.token_ids) == 80


def test_the_store_is_left_out_when_auto_is_not_asked_for():
    target = FakeModel(seed=4, window=2)
    prompt = [3, 1, 4]
    answer = plain_greedy(target, prompt, 40)
    history = [("history", TokenIndex.build([prompt + answer]))]
    decoder = SpecDecoder(target, None, COSTS, corpora=history)
    fin = run_to_completion(
        decoder.generate(prompt, GenerationParams(max_tokens=40, drafter="ngram"))
    )
    assert "store" not in fin.stats.by_origin
    assert list(fin.token_ids) == answer


END = 99


def test_disagreeing_occurrences_give_shares_and_one_alternative_per_next_token():
    index = TokenIndex.build(
        [[1, 2, 3, 4, 5, 6, 7, 8]] * 2 + [[1, 2, 3, 4, 9, 10, END, 11], [1, 2, 3, 4, 12, 13]]
    )
    drafter = store_drafter([("s", index)], ends=lambda t: t == END)
    offer = drafter.copy_offer([1, 2, 3, 4], 16)
    assert offer.shares == (0.5, 0.25, 0.25) and offer.support == 0.5
    # The first is what propose drafts; the others end after an end-of-generation token.
    assert drafter.alternatives(8, 4) == [[5, 6, 7, 8], [9, 10, END], [12, 13]]
    assert drafter.alternatives(2, 2) == [[5, 6], [9, 10]]
    assert drafter.propose([1, 2, 3, 4], 8, PARAMS, np.random.default_rng(0)).tokens == [
        5, 6, 7, 8
    ]  # fmt: skip
    agree = store_drafter([("a", TokenIndex.build([[1, 2, 3, 4, 5, 6]] * 3))])
    assert agree.copy_offer([1, 2, 3, 4], 16).shares == ()
    assert agree.alternatives(4, 4) == [[5, 6]]


def test_taking_another_branch_starts_a_copy_of_its_own():
    index = TokenIndex.build([[1, 2, 3, 4, 5, 6, 7, 8]] * 2 + [[1, 2, 3, 4, 9, 10, 11, 12]])
    streaks = {}
    for taken in (0, 1):
        drafter = store_drafter([("s", index)])
        committed = [1, 2, 3, 4]
        drafter.offer(committed, 16)
        drafter.propose(committed, 4, PARAMS, np.random.default_rng(0))
        drafter.observe(committed, Outcome(True, 5, 5))  # an earlier draft accepted whole
        drafter.offer(committed, 16)
        drafter.alternatives(4, 2)
        drafter.take(taken)
        drafter.observe(committed, Outcome(True, 4, 4))  # the branch taken, accepted whole
        streaks[taken] = drafter.copy_offer(committed, 16).under_way
    # 5 + 4 in a row along the continuation most occurrences share make a copy under way;
    # the other branch's 4 are a copy of their own, not yet one.
    assert streaks == {0: True, 1: False}


class Broken:
    """A corpus whose file went bad under it: every lookup raises."""

    def longest_match(self, context, n_max=32, n_min=2):
        raise OSError(5, "Input/output error")

    def continuations(self, match, k, limit=64):
        raise AssertionError("never reached")


class Stray:
    """A corpus that drafts ids the target does not have (a crafted store)."""

    def __init__(self, good: TokenIndex) -> None:
        self.good = good

    def longest_match(self, context, n_max=32, n_min=2):
        return self.good.longest_match(context, n_max, n_min)

    def continuations(self, match, k, limit=64):
        return [((10**6, 10**6 + 1), 1)]


@pytest.mark.parametrize("bad", ["broken", "stray"])
def test_a_failing_store_is_left_out_of_the_answer_with_a_warning(bad):
    from localspec.core.events import EngineWarning

    target = FakeModel(seed=4, window=2)
    prompt = [3, 1, 4]
    answer = plain_greedy(target, prompt, 120)
    history = TokenIndex.build([prompt + answer])
    failing = Broken() if bad == "broken" else Stray(history)
    decoder = SpecDecoder(target, None, COSTS, corpora=[("bad", failing), ("history", history)])
    events = list(decoder.generate(prompt, GenerationParams(max_tokens=120)))
    warnings = [e.message for e in events if isinstance(e, EngineWarning)]
    assert len(warnings) == 1 and "datastore 'bad' was left out of this answer" in warnings[0]
    fin = events[-1]
    assert list(fin.token_ids) == answer  # the generation went on, from the good store
    assert fin.stats.by_origin["store"] > 60
    # The next answer tries the store again (it is read anew as every answer begins).
    again = list(decoder.generate(prompt, GenerationParams(max_tokens=8)))
    assert sum(isinstance(e, EngineWarning) for e in again) == 1
