"""The loop's own work at short steps: the target is given only each round's new tokens while
its cache is as the engine left it, rows are borrowed rather than copied, and the time
outside the models' evaluations is reported. Output stays the target's own."""

from __future__ import annotations

import time

import numpy as np
import pytest

from localspec.core.cached_model import CachedModel, common_prefix_length, greedy_ids
from localspec.core.engine import SpecDecoder, run_to_completion
from localspec.core.events import PrefillDone, RoundCompleted, TokenEmitted
from localspec.core.params import GenerationParams
from localspec.core.stats import GenerationStats
from localspec.core.verify import Verdict, verify_greedy
from tests.fakes import FakeModel, plain_greedy
from tests.test_engine import CHEAP_VERIFY, PROMPT

# --- CachedModel.forward_after and changes ---


def test_forward_after_is_forward_of_the_kept_prefix_and_the_tail():
    model, reference = FakeModel(seed=7), FakeModel(seed=7)
    model.forward([1, 2, 3, 4, 5], 0)
    rows = model.forward_after(3, [4, 9, 2], 2)
    assert model.cached == [1, 2, 3, 4, 9, 2]
    assert np.array_equal(rows, reference.forward([1, 2, 3, 4, 9, 2], 2))
    # Only what differs from the cache is evaluated: 4 was kept, 9 and 2 are new.
    assert model.calls[-1] == (4, 2, 2)


def test_forward_after_evaluates_cached_tokens_again_for_their_rows():
    model, reference = FakeModel(seed=7), FakeModel(seed=7)
    model.forward([1, 2, 3, 4], 0)
    rows = model.forward_after(4, [5], 3)  # rows after 3, 4 and 5
    assert model.cached == [1, 2, 3, 4, 5] and model.calls[-1] == (2, 3, 3)
    assert np.array_equal(rows, reference.forward([1, 2, 3, 4, 5], 3))


def test_forward_after_refuses_a_prefix_the_cache_does_not_hold():
    model = FakeModel()
    model.forward([1, 2], 0)
    with pytest.raises(ValueError, match="holds 2 tokens"):
        model.forward_after(3, [4], 1)
    with pytest.raises(ValueError, match="exceed the context"):
        model.forward_after(2, [0] * model.n_ctx, 1)


def test_changes_count_every_change_of_the_cache_and_nothing_else():
    model = FakeModel()
    seen = model.changes
    model.forward([1, 2, 3], 1)
    assert model.changes > seen
    seen = model.changes
    model.forward([1, 2, 3], 0)  # already cached: nothing changes
    model.truncate(5)  # nothing past the end to drop
    assert model.changes == seen
    model.truncate(1)
    assert model.changes > seen


@pytest.mark.parametrize(
    ("a", "b", "n"),
    [([1, 2, 3], [1, 2, 3, 4], 3), ([1, 2, 3], (1, 2, 3), 3), ([1, 5], [1, 2], 1), ([], [1], 0)],
)
def test_common_prefix_length_of_lists_and_tuples(a, b, n):
    assert common_prefix_length(a, b) == n == common_prefix_length(b, a)


class ViewModel(FakeModel):
    """A fake whose rows are views of one buffer the next evaluation overwrites, as
    llama.cpp's logits buffer is."""

    borrowed_rows = True

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.buffer = np.zeros((64, self.n_vocab), dtype=np.float32)

    def _evaluate(self, tokens: list[int], n_logits: int) -> np.ndarray:
        rows = super()._evaluate(tokens, n_logits)
        self.buffer[:n_logits] = rows
        view = self.buffer[:n_logits]
        view.flags.writeable = False
        return view


def test_rows_are_the_callers_own_unless_borrowed():
    model = ViewModel(seed=3)
    kept = model.forward([1, 2, 3], 1)
    assert not np.shares_memory(kept, model.buffer) and kept.flags.writeable
    before = kept.copy()
    borrowed = model.forward([1, 2, 3, 4], 1, borrow=True)
    assert np.shares_memory(borrowed, model.buffer) and not borrowed.flags.writeable
    assert np.array_equal(kept, before)  # the next evaluation did not touch the caller's rows


# --- the engine ---


@pytest.mark.parametrize("mode", ["none", "ngram", "model", "auto"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_borrowed_rows_give_the_same_answer(mode, temperature):
    """The engine consumes borrowed rows before the next evaluation: a target handing out
    views of one buffer decodes exactly as one handing out copies."""
    answers = []
    for target in (FakeModel(seed=1, window=2), ViewModel(seed=1, window=2)):
        decoder = SpecDecoder(target, FakeModel(seed=1, window=2, noise=0.6), CHEAP_VERIFY)
        params = GenerationParams(
            max_tokens=60, drafter=mode, temperature=temperature, seed=5, trees=False
        )
        answers.append(run_to_completion(decoder.generate(PROMPT, params)).token_ids)
    assert answers[0] == answers[1]
    if temperature == 0.0:
        assert list(answers[0]) == plain_greedy(FakeModel(seed=1, window=2), PROMPT, 60)


class CountingReads(FakeModel):
    """Counts how many cached tokens each call compares (the O(context) work)."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.full_forwards = 0

    def forward(self, tokens, n_logits, *, borrow=False):
        self.full_forwards += 1
        return super().forward(tokens, n_logits, borrow=borrow)


def test_each_round_gives_the_target_only_its_new_tokens():
    target = CountingReads(seed=2)
    events = list(
        SpecDecoder(target, None, CHEAP_VERIFY).generate(
            PROMPT, GenerationParams(max_tokens=40, drafter="ngram", trees=False)
        )
    )
    rounds = [e for e in events if isinstance(e, RoundCompleted)]
    assert len(rounds) > 1
    assert target.full_forwards == 1  # the prefill; every round went through forward_after
    position = len(PROMPT) - 1
    for (start, n, n_logits), r in zip(target.calls[1:], rounds, strict=True):
        assert (start, n, n_logits) == (position, r.drafted + 1, r.drafted + 1)
        position += r.emitted


def test_a_target_used_elsewhere_between_rounds_is_compared_whole():
    """Someone else evaluating on the target between rounds (the cache no longer as the
    engine left it) costs a comparison of the whole context, never a wrong answer."""
    target = FakeModel(seed=4, window=2)
    stream = SpecDecoder(target, None, CHEAP_VERIFY).generate(
        PROMPT, GenerationParams(max_tokens=30, drafter="none")
    )
    tokens = []
    for event in stream:
        if isinstance(event, TokenEmitted):
            tokens.append(event.token_id)
            if len(tokens) % 7 == 0:
                target.forward([9, 9, 9], 1)  # another user of the model
    assert tokens == plain_greedy(FakeModel(seed=4, window=2), PROMPT, 30)


class Timed(FakeModel):
    """A fake that times its evaluations as LlamaModel does (each at least 1 ms)."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.compute_seconds = 0.0

    def _logits(self, tokens: list[int], n_logits: int) -> np.ndarray:
        t0 = time.perf_counter()
        time.sleep(0.001)
        rows = super()._logits(tokens, n_logits)
        self.compute_seconds += time.perf_counter() - t0
        return rows


def test_rounds_report_their_models_compute_and_the_stats_the_overhead():
    target = Timed(seed=5)
    events = list(
        SpecDecoder(target, None, CHEAP_VERIFY).generate(
            PROMPT, GenerationParams(max_tokens=20, drafter="none")
        )
    )
    rounds = [e for e in events if isinstance(e, RoundCompleted)]
    assert all(r.seconds > r.compute_seconds >= 0.001 for r in rounds)
    stats = events[-1].stats
    expected = sum(r.seconds - r.compute_seconds for r in rounds)
    assert stats.overhead_s == pytest.approx(expected, abs=1e-5)
    assert stats.overhead_per_round_ms == pytest.approx(1e3 * expected / len(rounds), abs=1e-3)


def test_models_that_do_not_time_themselves_report_no_overhead():
    events = list(
        SpecDecoder(FakeModel(seed=5), None, CHEAP_VERIFY).generate(
            PROMPT, GenerationParams(max_tokens=5, drafter="none")
        )
    )
    assert all(e.compute_seconds is None for e in events if isinstance(e, RoundCompleted))
    stats = events[-1].stats
    assert stats.timed_rounds == 0 and stats.overhead_per_round_ms is None
    assert stats.to_dict()["overhead_s"] is None  # not 0.0: unknown


def test_overhead_arithmetic():
    stats = GenerationStats()
    stats.observe(PrefillDone(4, 4, 1.0))
    stats.observe(RoundCompleted(0, None, 0, 0, 1, 0.010, compute_seconds=0.008))
    stats.observe(RoundCompleted(1, None, 0, 0, 1, 0.012, compute_seconds=0.009))
    stats.observe(RoundCompleted(2, None, 0, 0, 1, 0.012))  # untimed: left out
    d = stats.to_dict()
    assert d["overhead_s"] == pytest.approx(0.005)
    assert d["overhead_per_round_ms"] == pytest.approx(2.5)
    assert d["decode_s"] == pytest.approx(0.034)


def test_the_cached_model_contract_is_unchanged_for_plain_callers():
    assert CachedModel.forward.__kwdefaults__ == {"borrow": False}


# --- greedy verification reads token ids ---


def one_pass_greedy(rows: np.ndarray, draft: list[int]) -> tuple[int, int]:
    """The reference: every row's argmax at once, then the first disagreement."""
    choices = np.argmax(rows[: len(draft) + 1], axis=-1)
    for i, d in enumerate(draft):
        if int(choices[i]) != d:
            return i, int(choices[i])
    return len(draft), int(choices[len(draft)])


@pytest.mark.parametrize("k", [0, 1, 2, 3, 4, 7, 8, 15, 16, 17, 48])
def test_greedy_verification_of_the_rows_choices_equals_one_pass_over_the_rows(k):
    rng = np.random.default_rng(k)
    for _ in range(40):
        rows = rng.normal(size=(k + 1, 50)).astype(np.float32)
        choices = np.argmax(rows, axis=-1)
        cut = int(rng.integers(0, k + 1))  # drafts agree up to here, then one differs
        draft = [int(c) for c in choices[:k]]
        if cut < k:
            draft[cut] = (draft[cut] + 1 + int(rng.integers(0, 48))) % 50
        verdict = verify_greedy(greedy_ids(rows), draft)
        assert (verdict.accepted, verdict.token) == one_pass_greedy(rows, draft)
        assert isinstance(verdict.token, int)


def test_greedy_choices_read_off_rows_keep_the_first_of_tied_maxima():
    rows = np.zeros((3, 6), dtype=np.float32)
    rows[:, 2] = rows[:, 4] = 1.0  # a tie: the lowest id is taken
    assert greedy_ids(rows) == [2, 2, 2]
    assert verify_greedy(greedy_ids(rows), [2, 4]) == Verdict(1, 2)


def test_a_round_without_offers_is_the_plain_step_the_controller_would_plan():
    """Rounds where no drafter offers anything skip the controller's planning: it could
    only have planned this plain step, as its own answer to no offers shows."""
    from localspec.core.controller import PLAIN_STEP, Controller
    from localspec.core.engine import DEFAULT_COSTS

    for fixed in (False, True):
        planned = Controller(DEFAULT_COSTS, fixed=fixed).choose([])
        assert (planned.drafter, planned.k, planned.reason, planned.branches) == (
            PLAIN_STEP.drafter, PLAIN_STEP.k, PLAIN_STEP.reason, PLAIN_STEP.branches,
        )  # fmt: skip
        assert planned.match == PLAIN_STEP.match
