"""LlamaModel's logits rows are views of llama.cpp's buffer: handed over without a copy only
to a caller that borrows them, always the caller's own otherwise, and never overwritten
while ``forward`` still needs them (an evaluation split into several batches)."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.backend.llama import LlamaModel, LoadOptions
from localspec.core.engine import SpecDecoder, run_to_completion
from localspec.core.params import GenerationParams

pytest.importorskip("llama_cpp")

TOKENS = [1, 5, 9, 14, 20, 7, 3, 4, 11, 8, 2, 6]


@pytest.fixture
def model(tiny_pair):
    target, _, _ = tiny_pair
    m = LlamaModel(target, LoadOptions(n_ctx=128, n_threads=1))
    yield m
    m.close()


def test_kept_rows_are_copies_and_borrowed_rows_are_read_only_views(model):
    kept = model.forward(TOKENS[:6], 2)
    assert kept.flags.writeable and kept.flags.owndata
    before = kept.copy()
    borrowed = model.forward(TOKENS[:8], 2, borrow=True)
    assert not borrowed.flags.writeable and not borrowed.flags.owndata
    assert np.array_equal(kept, before)  # the later evaluation did not reach them
    again = model.forward(TOKENS[:8], 2)  # the same two positions, evaluated anew
    assert np.array_equal(borrowed, again)


def test_rows_of_several_batches_are_not_overwritten_by_the_later_batches(tiny_pair):
    target, _, _ = tiny_pair
    small = LlamaModel(target, LoadOptions(n_ctx=128, n_threads=1, n_batch=4, n_ubatch=4))
    whole = LlamaModel(target, LoadOptions(n_ctx=128, n_threads=1))
    try:
        split = small.forward(TOKENS, 10, borrow=True)  # batches of 4, 4 and 4 tokens
        reference = whole.forward(TOKENS, 10)
        assert split.shape == reference.shape == (10, small.n_vocab)
        # Equal up to the batch-shape noise of the f32 kernels; rows overwritten by a later
        # batch would be another position's logits altogether.
        assert np.allclose(split, reference, atol=1e-4)
        assert not np.allclose(split[0], split[-1], atol=1e-3)
    finally:
        small.close()
        whole.close()


def test_a_grown_buffer_gives_a_view_of_the_new_rows(model):
    one = model.forward(TOKENS[:4], 1, borrow=True).copy()
    many = model.forward(TOKENS[:4] + TOKENS[6:12], 7, borrow=True)  # more rows than before
    assert many.shape == (7, model.n_vocab)
    assert np.allclose(many[0], one[0], atol=1e-4)  # the row after TOKENS[3], again


def test_token_bytes_are_kept_per_token_and_unchanged(model):
    firsts = [model.token_bytes(t) for t in range(model.n_vocab)]
    assert firsts == [model._token_bytes(t, False) for t in range(model.n_vocab)]
    assert [model.token_bytes(t) for t in range(model.n_vocab)] == firsts
    assert model.token_bytes(1, special=True) == model._token_bytes(1, True)


@pytest.mark.parametrize("mode", ["none", "ngram"])
def test_a_generation_reports_its_overhead_outside_llama_decode(model, mode):
    decoder = SpecDecoder(model)
    params = GenerationParams(max_tokens=12, drafter=mode)
    finished = run_to_completion(decoder.generate(TOKENS, params))
    stats = finished.stats
    assert stats.rounds >= 1 and stats.timed_rounds == stats.rounds
    assert 0.0 <= stats.overhead_s <= stats.decode_s
    assert stats.overhead_per_round_ms == pytest.approx(
        1e3 * stats.overhead_s / stats.rounds, rel=1e-3, abs=1e-3
    )
