"""Rolling a model's KV cache back when llama.cpp cannot drop a suffix (recurrent and hybrid
caches return false from ``llama_memory_seq_rm``): the backend clears the sequence and
evaluates the kept prefix again, so its logits stay those of a model that never saw the
dropped tokens."""

from __future__ import annotations

import llama_cpp
import numpy as np

from localspec.backend.llama import LlamaModel, LoadOptions


def test_a_refused_partial_rollback_re_evaluates_the_prefix(tiny_pair, monkeypatch):
    target, _, _ = tiny_pair
    options = LoadOptions(n_ctx=128, n_threads=1)
    model = LlamaModel(target, options)
    fresh = LlamaModel(target, options)
    try:
        real = llama_cpp.llama_memory_seq_rm
        refused: list[int] = []

        def recurrent(memory, seq, p0, p1):
            if p0 > 0:  # only a whole sequence can go
                refused.append(p0)
                return False
            return real(memory, seq, p0, p1)

        monkeypatch.setattr(llama_cpp, "llama_memory_seq_rm", recurrent)
        prompt = [1, 5, 9, 14, 20, 7]
        model.forward(prompt + [3, 4, 11], 1)
        rolled = model.forward(prompt + [8], 1)  # keeps 6 tokens, drops 3
        assert refused == [6] and model.refills == 1
        assert model.cached == prompt + [8]
        # Equal up to the batch-shape noise of the f32 kernels (the prefix went in as a batch
        # of 6 here and of 7 there); stale keys would move them by far more.
        expected = fresh.forward(prompt + [8], 1)
        assert np.allclose(rolled, expected, atol=1e-4)
        # And the cache goes on from there as if nothing had been dropped.
        after = model.forward(prompt + [8, 2], 1)
        assert np.allclose(after, fresh.forward(prompt + [8, 2], 1), atol=1e-4)
    finally:
        model.close()
        fresh.close()
