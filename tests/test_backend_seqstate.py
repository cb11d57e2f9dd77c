"""A sequence's state saved and restored (``LlamaModel.sequence_state`` /
``restore_sequence``): the restored cache gives the logits of the cache that was saved, in
another context of the same model and in another lane, and bytes llama.cpp refuses leave
the cache empty rather than wrong."""

from __future__ import annotations

import numpy as np

from localspec.backend.llama import LlamaModel, LoadOptions

PROMPT = [1, 5, 9, 14, 20, 7, 3, 4, 11, 2, 6]


def test_a_restored_sequence_continues_as_the_saved_one(tiny_pair):
    target, _, _ = tiny_pair
    options = LoadOptions(n_ctx=128, n_threads=1)
    made, fresh = LlamaModel(target, options), LlamaModel(target, options)
    try:
        made.forward(PROMPT, 0)
        state = made.sequence_state()
        expected = made.forward([*PROMPT, 8], 1).copy()
        assert fresh.restore_sequence(PROMPT, state)
        assert fresh.cached == PROMPT
        evaluated = fresh.evaluated_tokens
        restored = fresh.forward([*PROMPT, 8], 1)
        assert fresh.evaluated_tokens == evaluated + 1  # only the new token
        assert np.array_equal(restored, expected)
        # A shorter prefix of it: the rest rolled back as after any evaluation.
        assert fresh.restore_sequence(PROMPT, state)
        shorter = fresh.forward([*PROMPT[:5], 8], 1)
        assert np.allclose(shorter, made.forward([*PROMPT[:5], 8], 1), atol=1e-4)
    finally:
        made.close()
        fresh.close()


def test_a_sequence_moves_between_lanes(tiny_pair):
    target, _, _ = tiny_pair
    model = LlamaModel(target, LoadOptions(n_ctx=64, n_threads=1, lanes=2))
    try:
        first, second = model.lane(0), model.lane(1)
        first.forward(PROMPT, 0)
        state = first.sequence_state()
        expected = first.forward([*PROMPT, 8], 1).copy()
        assert second.restore_sequence(PROMPT, state)
        assert np.array_equal(second.forward([*PROMPT, 8], 1), expected)
        assert first.cached == [*PROMPT, 8]  # the other lane is left alone
    finally:
        model.close()


def test_bytes_llama_cpp_refuses_leave_the_cache_empty(tiny_pair):
    target, _, _ = tiny_pair
    model = LlamaModel(target, LoadOptions(n_ctx=64, n_threads=1))
    try:
        model.forward(PROMPT, 0)
        state = model.sequence_state()
        model.forward([4, 4, 4], 0)
        assert not model.restore_sequence(PROMPT, state[: len(state) // 2])
        assert model.cached == []
        assert not model.restore_sequence(PROMPT[:3], state)  # positions that do not match
        assert model.cached == []
        # The context still works, from nothing.
        assert model.forward(PROMPT, 1).shape == (1, model.n_vocab)
    finally:
        model.close()
