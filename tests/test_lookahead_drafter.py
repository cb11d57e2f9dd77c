"""The lookahead drafter: what it keeps of the target's rows (recycled successors, the
n-gram pool, the Jacobi window), the trees it drafts, when the cost model uses it, and that
the output stays the target's own."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.core.costs import CostProfile, LiveCosts
from localspec.core.drafting.base import NOT_CHOSEN, Outcome
from localspec.core.drafting.lookahead import NGRAM, LookaheadDrafter
from localspec.core.engine import SpecDecoder, run_to_completion
from localspec.core.params import DrafterMode, GenerationParams
from localspec.core.replay import VirtualClock
from localspec.core.tree import ROOT, DraftTree
from tests.fakes import FakeModel, TimedFake, plain_greedy

VOCAB = 32
# Verification nearly as cheap as a step (a GPU's shape) and a small CPU's, where a batch of
# k drafts costs k more steps: no draft can pay there, even if almost always accepted.
FLAT = CostProfile(plain_s=1.0, verify_s={k: 1.0 + 0.05 * k for k in range(1, 65)})
STEEP = CostProfile(plain_s=1.0, verify_s={k: 1.0 + 1.0 * k for k in range(1, 65)})


def drafter(costs=FLAT, fixed=True) -> LookaheadDrafter:
    d = LookaheadDrafter(lambda t: False, VOCAB, costs=LiveCosts(costs), limit=8, fixed=fixed)
    d.begin([1, 2, 3], GenerationParams())
    return d


def test_a_pass_recycles_successors_and_pools_the_ngrams_of_its_branch():
    d = drafter()
    committed = [1, 2, 3]
    d.offer(committed, 8)
    # A chain [10, 11, 12] after 3; the target chose 10 after 3, 11 after 10, 20 after 11
    # (the draft's 12 was wrong) and 21 after 12.
    d.watch([10, 11, 12], [ROOT, 0, 1], [10, 11, 20, 21])
    committed += [10, 11, 20]  # two accepted, then the target's own
    d.observe(committed, Outcome(True, 3, 2))
    assert d.successors[3] == [10] and d.successors[10] == [11] and d.successors[11] == [20]
    assert d.successors[12] == [21]
    # Each node's guess with the NGRAM - 1 tokens before it on its branch.
    assert NGRAM == 4
    assert d.pool[2] == [(3, 10, 11)] and d.pool[3] == [(10, 11, 20)]
    assert d.pool[10] == [(11, 12, 21)]
    # The Jacobi window: past the accepted [10, 11], the rejected 12 sat where 20 now is,
    # so the target's token after it (21) is its guess for the next position.
    assert d.window == [21] and d._window_at == len(committed)


def test_the_window_is_drafted_when_it_follows_the_text_and_dropped_when_not():
    d = drafter()
    committed = [1, 2, 3]
    d.offer(committed, 8)
    d.watch([10, 11, 12, 13], [ROOT, 0, 1, 2], [10, 11, 20, 21, 22])
    committed += [10, 11, 20]
    d.observe(committed, Outcome(True, 4, 2))
    assert d.window == [21, 22]
    # Its first token differs from the recycled successor of 20 (none yet): it is a
    # candidate of its own, extended by recycled successors (21 -> 22 from the pass).
    candidates = d._candidates(committed, 8)
    assert [21, 22] in [c[:2] for c in candidates]
    committed.append(30)  # the text moved on without it: the window no longer applies
    assert all(c[:2] != [21, 22] for c in d._candidates(committed, 8))


def test_candidates_start_with_distinct_tokens_and_lay_out_as_one_tree():
    d = drafter(fixed=False)
    d.successors = {5: [6, 7], 6: [8], 7: [9]}
    d.pool = {5: [(7, 9, 1), (6, 8, 2)]}
    committed = [4, 5]
    offer = d.offer(committed, 4)
    assert offer is not None and offer.branches == 2 and offer.tree is not None
    branches = d.alternatives(4, 4)
    assert [b[0] for b in branches] == [6, 7]  # the recycled successor first, then the pool's
    assert branches[0] == [6, 8]  # extended by recycled successors while there are some
    tree = DraftTree.from_branches(branches)
    assert tree.parents[: len(branches[0])] == (ROOT, 0)  # the first branch is a chain
    # A tree is priced above the chain it starts with: either first token may be right.
    assert offer.tree(2, 2)[0] > offer.expected_accepted(2)[0]


def test_passed_over_rounds_grade_what_it_would_have_drafted():
    d = drafter(fixed=False)
    d.successors = {3: [4], 4: [5], 5: [6]}
    committed = [1, 2, 3]
    assert d.offer(committed, 4) is not None
    committed += [4, 5, 9]  # another drafter's round: 4 and 5 as it would have drafted
    d.observe(committed, NOT_CHOSEN)
    assert d.estimate.tries[:3] == [1.0, 1.0, 1.0] and d.estimate.hits[:3] == [1.0, 1.0, 0.0]


def test_ids_outside_the_vocabulary_are_never_drafted():
    d = drafter()
    d.successors = {3: [4], 4: [VOCAB + 5]}
    assert d._candidates([3], 8) == [[4]]


def test_where_no_draft_could_pay_it_neither_watches_nor_offers():
    d = drafter(STEEP, fixed=False)
    assert not d.could_pay() and d.watching is None
    assert d.offer([1, 2, 3], 8) is None
    assert drafter(STEEP, fixed=True).watching is not None  # asked for by name, it drafts


def run(target, prompt, params, costs, n=None):
    clock = VirtualClock()
    timed = TimedFake(clock, costs, seed=target.seed, window=target.window, n_vocab=VOCAB)
    decoder = SpecDecoder(timed, None, costs, clock=clock)
    return run_to_completion(decoder.generate(prompt, params)), clock.now


@pytest.mark.parametrize("window", [1, 2, 3])
@pytest.mark.parametrize("mode", ["lookahead", "auto"])
def test_greedy_output_is_the_targets_own(window, mode):
    target = FakeModel(n_vocab=VOCAB, seed=7, window=window)
    prompt = [3, 1, 4, 1, 5]
    plain = plain_greedy(target, prompt, 120)
    params = GenerationParams(max_tokens=120, drafter=DrafterMode(mode))
    fin, _ = run(target, prompt, params, FLAT)
    assert list(fin.token_ids) == plain


def test_where_the_text_repeats_itself_lookahead_pays_on_cheap_verification():
    # Each token's successor depends on it alone: recycled successors are exact, and once
    # the text has passed a token the drafts after it are accepted.
    target = FakeModel(n_vocab=VOCAB, seed=3, window=1)
    prompt = [3, 1, 4, 1, 5]
    plain, plain_s = run(target, prompt, GenerationParams(max_tokens=200, drafter="none"), FLAT)
    auto, auto_s = run(target, prompt, GenerationParams(max_tokens=200), FLAT)
    assert list(auto.token_ids) == list(plain.token_ids)
    assert auto.stats.by_origin.get("lookahead", 0) > 60  # prompt lookup takes its share
    assert auto_s < 0.5 * plain_s
    # On a small CPU's costs the same text is decoded plainly: it could never pay there.
    steep, _ = run(target, prompt, GenerationParams(max_tokens=200), STEEP)
    assert "lookahead" not in steep.stats.by_drafter
    assert steep.stats.by_origin.get("lookahead", 0) == 0


def test_the_fixed_policy_drafts_the_length_its_acceptance_pays_best():
    d = drafter(FLAT)
    d.successors = {k: [k + 1] for k in range(3, 20)}
    assert d.offer([3], 8).available == 2  # its prior (0.3 a token) pays only short drafts
    for _ in range(30):
        d.estimate.observe(8, 8)
    assert d.offer([3], 8).available == 8  # accepted, and verified cheaply: as far as it can
    d = drafter(CostProfile(plain_s=1.0, verify_s={1: 1.1, 2: 3.0, 4: 6.0, 8: 12.0}))
    d.successors = {k: [k + 1] for k in range(3, 20)}
    for _ in range(30):
        d.estimate.observe(8, 8)
    assert d.offer([3], 8).available == 1  # a second token costs more than it brings


def test_sampled_output_keeps_the_targets_distribution():
    """The first sampled token over many seeds, drafted from the recycled successor of the
    prompt's last token (the target's greedy choice after it, kept from the first run)."""
    target = FakeModel(n_vocab=6, seed=12, sharpness=0.7, window=1)
    prompt = [1, 2, 2]
    logits = target.logits_after(prompt).astype(np.float64)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    decoder = SpecDecoder(target, None, FLAT)  # its drafter is kept from run to run
    counts = np.zeros(6)
    n, drafted = 3000, 0
    for seed in range(n):
        params = GenerationParams(
            max_tokens=2, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed,
            drafter="lookahead",
        )  # fmt: skip
        fin = run_to_completion(decoder.generate(prompt, params))
        counts[fin.token_ids[0]] += 1
        first = fin.stats.trace[0] if fin.stats.trace else None
        drafted += first is None and fin.stats.by_drafter.get("lookahead") is not None
    assert drafted >= n - 1  # every run but the first drafted its first token
    assert 0.5 * float(np.abs(counts / n - p).sum()) < 0.04
