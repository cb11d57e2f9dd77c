"""Draft trees on llama.cpp (tiny GGUF models): one batch with a sequence id per leaf in a
unified cache gives each branch the logits it would get alone, and ``keep_path`` leaves a
cache indistinguishable from one that only ever saw the committed tokens and the path."""

from __future__ import annotations

import llama_cpp
import numpy as np
import pytest

from localspec.backend import weights
from localspec.backend.llama import MAX_TREE_SEQS, LlamaModel, LoadOptions
from localspec.core.tree import DraftTree, verify_tree_greedy
from tests.fakes import branches_of, verdict_tokens

COMMITTED = [1, 5, 9, 14, 20, 7]
BRANCHES = [[3, 4, 11], [3, 8], [6, 2, 2, 9], [3, 4, 12]]
OPTIONS = LoadOptions(n_ctx=128, n_threads=1)
# Flash attention accumulates values in f16, so keys in other cells (a kept path is not
# contiguous in the cache) move logits by ~1e-2; without it the kernels agree to ~1e-6. A
# stale token left in the context moves them by ~4 on these models.
TOLERANCE = {True: 2e-2, False: 1e-4}


@pytest.fixture
def models(tiny_pair):
    """Load models of the tiny target, all closed at the end."""
    target, _, _ = tiny_pair
    loaded: list[LlamaModel] = []

    def load(options: LoadOptions = OPTIONS) -> LlamaModel:
        loaded.append(LlamaModel(target, options))
        return loaded[-1]

    yield load
    for m in loaded:
        m.close()


def cells(model: LlamaModel) -> int:
    """Bytes of the model's state: grows with every occupied cache cell."""
    return llama_cpp.llama_state_get_size(model.shared.ctx)


def test_tree_rows_match_each_branch_alone(models):
    model = models()
    assert model.supports_trees and model.tree_seqs == MAX_TREE_SEQS
    assert llama_cpp.llama_n_seq_max(model.shared.ctx) == 1 + MAX_TREE_SEQS
    tree = DraftTree.from_branches(BRANCHES)
    rows = model.forward_tree(COMMITTED, tree)
    assert rows.shape == (1 + len(tree), model.n_vocab)
    assert model.evaluated_tokens == len(COMMITTED) + len(tree)
    fresh = models()
    for leaf, branch in zip(tree.leaves(), branches_of(tree), strict=True):
        fresh.reset()
        chain = fresh.forward(COMMITTED + branch, len(branch) + 1)
        mine = rows[[0] + [1 + i for i in tree.path(leaf)]]
        assert np.allclose(mine, chain, atol=1e-4), branch


def test_a_one_branch_tree_is_the_chain(models):
    model, chain = models(), models()
    branch = BRANCHES[2]
    rows = model.forward_tree(COMMITTED, DraftTree.from_branches([branch]))
    assert np.allclose(rows, chain.forward(COMMITTED + branch, len(branch) + 1), atol=1e-4)


@pytest.mark.parametrize("flash_attn", [True, False])
@pytest.mark.parametrize("kept", [[], [0], [0, 1, 2], [4, 5], [4, 5, 6, 7], [0, 1, 8]])
def test_keep_path_leaves_only_committed_and_path(models, flash_attn, kept):
    options = LoadOptions(n_ctx=128, n_threads=1, flash_attn=flash_attn)
    model, clean = models(options), models(options)
    tree = DraftTree.from_branches(BRANCHES)  # nodes 3,4,11,8,6,2,2,9,12
    model.forward_tree(COMMITTED, tree)
    model.keep_path(kept)
    path = [tree.tokens[i] for i in kept]
    assert model.cached == COMMITTED + path
    memory = model.shared.memory
    assert llama_cpp.llama_memory_seq_pos_max(memory, 0) == len(COMMITTED) + len(path) - 1
    for seq in range(1, len(tree.leaves()) + 1):
        assert llama_cpp.llama_memory_seq_pos_max(memory, seq) == -1
    # The cache goes on as if it had only ever seen committed + path.
    after = model.forward(COMMITTED + path + [17, 30], 2)
    expected = clean.forward(COMMITTED + path + [17, 30], 2)
    assert np.allclose(after, expected, atol=TOLERANCE[flash_attn])
    assert cells(model) == cells(clean)  # no cell of a rejected branch is left


def test_rounds_of_trees_give_plain_greedy_tokens(models):
    """Several rounds, each keeping a path from a different branch: the cache's holes and
    reused cells never change what the model decodes."""
    model, plain = models(), models()
    committed = list(COMMITTED)
    expected = list(COMMITTED)
    for _ in range(12):
        expected.append(int(np.argmax(plain.forward(expected, 1)[0])))
    rng = np.random.default_rng(3)
    while len(committed) < len(expected):
        truth = expected[len(committed) : len(committed) + 3]
        wrong = [int(t) for t in rng.integers(3, model.n_vocab, size=3)]
        tree = DraftTree.from_branches([wrong, truth[: int(rng.integers(0, 4))], wrong[:1]])
        verdict = verify_tree_greedy(model.greedy_tree(committed, tree), tree)
        model.keep_path(verdict.path)
        committed += verdict_tokens(verdict, tree)
    assert committed[: len(expected)] == expected


def test_a_chain_after_a_tree_rolls_back_as_usual(models):
    model, clean = models(), models()
    tree = DraftTree.from_branches(BRANCHES)
    model.forward_tree(COMMITTED, tree)
    model.keep_path([4, 5])
    model.forward(COMMITTED + [6, 2, 8, 8, 8], 3)
    rows = model.forward(COMMITTED + [6, 40], 1)  # drops 4 tokens, evaluates one
    assert model.cached == COMMITTED + [6, 40]
    assert np.allclose(rows, clean.forward(COMMITTED + [6, 40], 1), atol=TOLERANCE[True])
    assert cells(model) == cells(clean)


def test_an_unkept_tree_is_dropped_by_the_next_forward(models):
    model, clean = models(), models()
    model.forward_tree(COMMITTED, DraftTree.from_branches(BRANCHES))
    rows = model.forward(COMMITTED + [17], 1)
    assert np.allclose(rows, clean.forward(COMMITTED + [17], 1), atol=TOLERANCE[True])
    assert cells(model) == cells(clean)


def test_trees_too_large_for_one_pass_are_refused(models):
    model = models(LoadOptions(n_ctx=128, n_threads=1, n_batch=9))
    model.forward(COMMITTED[:-1], 0)
    with pytest.raises(ValueError, match="batch of 9"):
        model.forward_tree(COMMITTED, DraftTree.from_branches([[3, 4, 5, 6, 13], [7, 8, 9, 10]]))
    wide = DraftTree.from_branches([[t] for t in range(3, 4 + MAX_TREE_SEQS)])
    with pytest.raises(ValueError, match="leaves"):
        models().forward_tree(COMMITTED, wide)
    # Refused before anything was evaluated: the cache still holds committed[:-1].
    assert model.cached == COMMITTED[:-1]
    rows = model.forward_tree(COMMITTED, DraftTree.from_branches([[3, 4, 5, 6], [7, 8, 9, 10]]))
    assert rows.shape[0] == 9
    # llama.cpp keeps a logits row per sequence within the batch: a small batch has fewer.
    assert models(LoadOptions(n_ctx=128, n_threads=1, n_batch=4)).tree_seqs == 3


def test_exact_mode_has_no_trees(models, monkeypatch):
    # Exact mode's process switch and its batch-invariance check (which an f32 model fails)
    # are beside the point here.
    monkeypatch.setattr(weights, "exact_kernels", lambda: None)
    monkeypatch.setattr(LlamaModel, "_check_batch_invariance", lambda self: None)
    model = models(LoadOptions(n_ctx=128, n_threads=1, exact=True))
    assert model.exact and not model.supports_trees
    assert llama_cpp.llama_n_seq_max(model.shared.ctx) == 1
    with pytest.raises(NotImplementedError):
        model.forward_tree(COMMITTED, DraftTree.from_branches([[3]]))


def test_recurrent_models_and_tree_seqs_0_have_no_trees(models, monkeypatch):
    off = models(LoadOptions(n_ctx=128, n_threads=1, tree_seqs=0))
    assert not off.supports_trees and llama_cpp.llama_n_seq_max(off.shared.ctx) == 1
    monkeypatch.setattr(llama_cpp, "llama_model_is_recurrent", lambda model: True)
    recurrent = models()
    assert not recurrent.supports_trees and llama_cpp.llama_n_seq_max(recurrent.shared.ctx) == 1
    assert recurrent.forward(COMMITTED, 1).shape == (1, recurrent.n_vocab)
