"""The engine over scripted models: exact greedy output, cache bookkeeping, endings."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from localspec.core.costs import CostProfile
from localspec.core.drafting.tunables import COPY_ODDS
from localspec.core.engine import SpecDecoder, run_to_completion
from localspec.core.events import (
    Finished,
    FinishReason,
    PrefillDone,
    RoundCompleted,
    TokenEmitted,
)
from localspec.core.params import GenerationParams
from tests.fakes import FakeModel, plain_greedy

PROMPT = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4]
CHEAP_VERIFY = CostProfile(
    plain_s=1.0, verify_s={k: 1.0 + 0.05 * k for k in range(1, 17)}, draft_step_s=0.05
)


def run(decoder, prompt, **kw):
    events = list(decoder.generate(prompt, GenerationParams(**kw)))
    return events, events[-1]


@pytest.mark.parametrize("mode", ["none", "ngram", "model", "lookahead", "auto"])
def test_greedy_decoding_asks_for_token_ids_and_sampling_for_rows(mode):
    target = FakeModel(seed=1, window=2)
    draft = FakeModel(seed=1, window=2, noise=0.6)
    decoder = SpecDecoder(target, draft, CHEAP_VERIFY)
    _, fin = run(decoder, PROMPT, max_tokens=40, drafter=mode)
    assert list(fin.token_ids) == plain_greedy(target, PROMPT, 40)
    assert target.rows_read == draft.rows_read == 0 and len(target.calls) > 1
    run(decoder, PROMPT, max_tokens=20, drafter=mode, temperature=0.8, seed=2)
    assert target.rows_read > 0
    if mode != "auto":  # whether auto drafts with the draft model depends on its offers
        assert (draft.rows_read > 0) == (mode == "model")  # q: the draft's distribution


@pytest.mark.parametrize("mode", ["none", "ngram", "model", "auto"])
@pytest.mark.parametrize("noise", [0.0, 0.6, 3.0])
def test_greedy_output_equals_the_targets_own_decoding(mode, noise):
    target = FakeModel(seed=1, window=2)
    draft = FakeModel(seed=1, window=2, noise=noise)
    decoder = SpecDecoder(target, draft, CHEAP_VERIFY)
    _, fin = run(decoder, PROMPT, max_tokens=60, drafter=mode)
    assert list(fin.token_ids) == plain_greedy(target, PROMPT, 60)
    assert fin.reason == FinishReason.LENGTH


def test_event_order_and_bookkeeping():
    target = FakeModel(seed=2)
    draft = FakeModel(seed=2, noise=0.8)
    events, fin = run(
        SpecDecoder(target, draft, CHEAP_VERIFY), PROMPT, max_tokens=40, drafter="model"
    )
    assert isinstance(events[0], PrefillDone)
    assert events[0].prompt_tokens == len(PROMPT)
    assert isinstance(fin, Finished)
    tokens = [e for e in events if isinstance(e, TokenEmitted)]
    rounds = [e for e in events if isinstance(e, RoundCompleted)]
    assert [t.index for t in tokens] == list(range(40))
    assert sum(r.emitted for r in rounds) == 40
    # Every round but possibly the last emits accepted + 1 tokens.
    assert all(r.emitted == r.accepted + 1 for r in rounds[:-1])
    s = fin.stats
    assert s.generated_tokens == 40
    assert s.drafted == sum(r.drafted for r in rounds)
    assert s.accepted == sum(r.accepted for r in rounds)
    assert s.rounds == len(rounds)
    assert s.mean_accepted_length == pytest.approx(1 + s.accepted / s.rounds)
    model_tokens = sum(1 for t in tokens if t.origin == "model")
    assert model_tokens == s.accepted == s.by_origin["model"]


def test_target_cache_holds_committed_minus_last_after_every_round():
    target = FakeModel(seed=3)
    draft = FakeModel(seed=3, noise=1.0)
    committed = list(PROMPT)
    checked = 0
    for event in SpecDecoder(target, draft, CHEAP_VERIFY).generate(
        PROMPT, GenerationParams(max_tokens=30, drafter="model")
    ):
        if isinstance(event, TokenEmitted):
            committed.append(event.token_id)
        if isinstance(event, RoundCompleted) and event.emitted == event.accepted + 1:
            assert target.cached == committed[:-1]
            checked += 1
    assert checked >= 5  # every full round was checked, and there were several


def test_prefill_requests_no_logits_and_draft_never_reevaluates():
    target = FakeModel(seed=4)
    draft = FakeModel(seed=4)  # always agrees
    _, fin = run(
        SpecDecoder(target, draft, CHEAP_VERIFY),
        PROMPT,
        max_tokens=50,
        drafter="model",
        draft_max=4,
    )
    assert target.calls[0] == (0, len(PROMPT) - 1, 0)
    # The draft evaluates each position at most once: prompt + generated, nothing twice.
    assert draft.evaluated_tokens <= len(PROMPT) + 50
    assert fin.stats.acceptance_rate == 1.0


def test_kv_cache_is_reused_for_a_continued_prompt():
    target = FakeModel(seed=5)
    decoder = SpecDecoder(target, None, CHEAP_VERIFY)
    _, first = run(decoder, PROMPT, max_tokens=10, drafter="none")
    follow = PROMPT + list(first.token_ids) + [9, 9]
    events, _ = run(decoder, follow, max_tokens=5, drafter="none")
    prefill = events[0]
    assert prefill.evaluated_tokens <= 3  # only the new tokens and the one left uncached


def test_eos_inside_a_draft_ends_generation_there():
    target = FakeModel(seed=6)
    ref = plain_greedy(target, PROMPT, 30)
    eos = ref[7]
    target = FakeModel(seed=6, eog=(eos,))
    draft = FakeModel(seed=6, eog=(eos,))
    _, fin = run(
        SpecDecoder(target, draft, CHEAP_VERIFY),
        PROMPT,
        max_tokens=30,
        drafter="model",
        draft_max=16,
    )
    assert fin.reason == FinishReason.EOS
    assert list(fin.token_ids) == ref[: ref.index(eos)]


def test_max_tokens_is_exact_even_with_long_drafts():
    target = FakeModel(seed=7)
    draft = FakeModel(seed=7)
    for n in (1, 2, 5, 17):
        _, fin = run(
            SpecDecoder(target, draft, CHEAP_VERIFY), PROMPT, max_tokens=n, drafter="model"
        )
        assert len(fin.token_ids) == n and fin.reason == FinishReason.LENGTH


def test_stop_string_ends_generation_and_is_not_streamed():
    target = FakeModel(seed=8)
    ref = plain_greedy(target, PROMPT, 40)
    text = "".join(target.token_bytes(t).decode() for t in ref)
    stop = text[10:13]
    events, fin = run(
        SpecDecoder(target, None, CHEAP_VERIFY), PROMPT, max_tokens=40, drafter="none", stop=(stop,)
    )
    streamed = "".join(e.text for e in events if isinstance(e, TokenEmitted)) + fin.tail
    assert fin.reason == FinishReason.STOP
    assert fin.text == text[: text.index(stop)]
    assert streamed == fin.text


def test_cancel_stops_between_rounds_and_keeps_partial_output():
    target = FakeModel(seed=9)
    cancel = threading.Event()
    tokens = []
    finished = None
    for event in SpecDecoder(target, None, CHEAP_VERIFY).generate(
        PROMPT, GenerationParams(max_tokens=100, drafter="none"), cancel
    ):
        if isinstance(event, TokenEmitted):
            tokens.append(event.token_id)
            if len(tokens) == 5:
                cancel.set()
        if isinstance(event, Finished):
            finished = event
    assert finished is not None and finished.reason == FinishReason.CANCELLED
    assert list(finished.token_ids) == tokens
    assert len(tokens) == 5


def test_generation_stops_when_the_context_is_full():
    target = FakeModel(n_ctx=20, seed=10)
    _, fin = run(SpecDecoder(target, None, CHEAP_VERIFY), PROMPT, max_tokens=100, drafter="none")
    assert fin.reason == FinishReason.LENGTH
    assert len(PROMPT) + len(fin.token_ids) <= 21


def test_sampled_generation_is_reproducible_with_a_seed():
    target = FakeModel(seed=11, sharpness=1.0)
    draft = FakeModel(seed=11, sharpness=1.0, noise=0.5)
    kw = dict(
        max_tokens=30, temperature=0.8, seed=42, drafter="model", top_k=0, top_p=1.0, min_p=0.0
    )
    _, a = run(SpecDecoder(target, draft, CHEAP_VERIFY), PROMPT, **kw)
    _, b = run(
        SpecDecoder(
            FakeModel(seed=11, sharpness=1.0),
            FakeModel(seed=11, sharpness=1.0, noise=0.5),
            CHEAP_VERIFY,
        ),
        PROMPT,
        **kw,
    )
    assert a.token_ids == b.token_ids


def first_token_distance(target: FakeModel, draft: FakeModel, n: int = 3000) -> float:
    """Total variation distance between the first sampled token over ``n`` seeds (drafted by
    ``draft``) and the target's own distribution."""
    params = dict(max_tokens=1, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, drafter="model")
    counts = np.zeros(target.n_vocab)
    decoder = SpecDecoder(target, draft, CHEAP_VERIFY)
    for seed in range(n):
        fin = run_to_completion(decoder.generate(PROMPT, GenerationParams(seed=seed, **params)))
        counts[fin.token_ids[0]] += 1
    logits = target.logits_after(PROMPT).astype(np.float64)
    p = np.exp(logits - logits.max())
    p /= p.sum()
    return 0.5 * float(np.abs(counts / n - p).sum())


def test_sampled_engine_matches_target_next_token_distribution():
    """Over many seeds, the first generated token follows the target's warped distribution."""
    target = FakeModel(n_vocab=6, seed=12, sharpness=0.7)
    draft = FakeModel(n_vocab=6, seed=12, sharpness=0.7, noise=1.5)
    assert first_token_distance(target, draft) < 0.04


def test_a_draft_with_a_larger_vocabulary_never_drafts_an_id_the_target_lacks():
    """Vocabularies may differ by up to 128 tokens: the draft's extra ids are never drafted,
    and sampled drafts stay exact (q has the target's size)."""
    target = FakeModel(n_vocab=20, seed=13, sharpness=1.0)
    draft = FakeModel(n_vocab=24, seed=14, sharpness=1.0)

    def biased(context: list[int]) -> np.ndarray:  # the draft's favourite ids are 20..23
        logits = FakeModel.logits_after(draft, context)
        logits[20:] += 50.0
        return logits

    draft.logits_after = biased  # type: ignore[method-assign]
    decoder = SpecDecoder(target, draft, CHEAP_VERIFY)
    for temperature in (0.0, 0.9):
        _, fin = run(
            decoder, PROMPT, max_tokens=30, drafter="model", temperature=temperature, seed=3
        )
        assert len(fin.token_ids) == 30 and max(fin.token_ids) < 20
        assert fin.stats.drafted > 0
    _, greedy = run(decoder, PROMPT, max_tokens=30, drafter="model")
    assert list(greedy.token_ids) == plain_greedy(target, PROMPT, 30)


def test_a_draft_with_a_smaller_vocabulary_samples_exactly():
    """A target with more rows than the draft (Qwen2.5 7B and up against the 0.5B draft):
    the draft's q is padded with zeros to the target's size, so exact sampling works and
    keeps the target's distribution."""
    target = FakeModel(n_vocab=8, seed=12, sharpness=0.7)
    draft = FakeModel(n_vocab=6, seed=12, sharpness=0.7, noise=1.5)
    assert first_token_distance(target, draft) < 0.04
    decoder = SpecDecoder(target, draft, CHEAP_VERIFY)
    _, longer = run(decoder, PROMPT, max_tokens=30, drafter="model", temperature=0.9, seed=1)
    assert len(longer.token_ids) == 30 and longer.stats.drafted > 0


def test_drafts_that_plain_steps_pass_over_are_graded_by_the_answer():
    """A cycling answer copies what plain steps passed over; one that never repeats does
    not. Verify batches cost many plain steps here, so nothing is drafted: what the
    controller learns about the text comes from the passed-over drafts alone."""
    costly = CostProfile(plain_s=1.0, verify_s={k: 2.0 + 0.25 * k for k in range(1, 17)})
    odds = {}
    for seed in (0, 5):  # seed 0: the answer cycles with period 11; seed 5: no repeats
        target = FakeModel(seed=seed, window=2)
        decoder = SpecDecoder(target, None, costly)
        events, fin = run(decoder, PROMPT, max_tokens=60, drafter="auto")
        assert list(fin.token_ids) == plain_greedy(target, PROMPT, 60)
        assert all(r.drafted == 0 for r in events if isinstance(r, RoundCompleted))
        ngram = decoder.planner_for(GenerationParams(drafter="auto")).drafters["ngram"]
        odds[seed] = ngram.pricing.copies.odds
    assert odds[5] < COPY_ODDS < odds[0]


def test_a_predictions_index_is_freed_when_its_generation_ends():
    import gc
    import tracemalloc

    target = FakeModel(seed=1, window=2)
    decoder = SpecDecoder(target, FakeModel(seed=1, window=2), CHEAP_VERIFY)
    rng = np.random.default_rng(0)
    prediction = tuple(int(t) for t in rng.integers(0, 20, 300_000))
    params = GenerationParams(max_tokens=8, drafter="auto", prediction=prediction)
    for stop_reading in (False, True):  # read to the end, or abandoned after a few events
        gc.collect()
        tracemalloc.start()
        events = decoder.generate(PROMPT, params)
        if stop_reading:
            next(events), next(events)
            events.close()
        else:
            run_to_completion(events)
        del events
        gc.collect()
        kept, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        # The index of 300,000 tokens took tens of MB while the answer ran; a planner kept
        # for later answers holds none of it.
        assert peak > 20_000_000 and kept < 2_000_000, (kept, peak)
        assert decoder.planner_for(params).drafters["prediction"].source.prediction == ()


def test_planners_are_bounded_and_the_home_one_is_kept():
    from localspec.core.planner import MAX_PLANNERS

    decoder = SpecDecoder(FakeModel(seed=1), FakeModel(seed=1), CHEAP_VERIFY)
    home = GenerationParams(max_tokens=4, drafter="auto")
    run(decoder, PROMPT, max_tokens=4, drafter="auto")
    first = decoder.planner_for(home)
    for n_min in range(2, 30):  # a request's own limits, each building a planner
        run(decoder, PROMPT, max_tokens=4, drafter="auto", draft_min=n_min)
        assert len(decoder.controllers()) <= MAX_PLANNERS
    assert decoder.planner_for(home) is first  # the first generation's limits are the home
    assert decoder.planners.is_home(home)
    assert not decoder.planners.is_home(GenerationParams(drafter="auto", draft_min=2))
