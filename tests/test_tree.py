"""Draft trees over scripted models: the trie, greedy verification over hand-made logits,
and the cache bookkeeping of ``forward_tree`` / ``keep_path`` on ``FakeModel``."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.core.tree import ROOT, DraftTree, TreeVerdict, verify_tree_greedy
from tests.fakes import FakeModel, branches_of, plain_greedy, verdict_tokens

COMMITTED = [1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4]
V = 10  # vocabulary of the hand-made rows


# -- the trie ---------------------------------------------------------------------------


def test_from_branches_merges_shared_prefixes_first_branch_first():
    tree = DraftTree.from_branches([[3, 4, 5], [3, 4, 6], [7], [3, 8]])
    assert tree.tokens == (3, 4, 5, 6, 7, 8)
    assert tree.parents == (ROOT, 0, 1, 1, ROOT, 0)
    assert tree.children(ROOT) == [0, 4]
    assert tree.children(1) == [2, 3]
    assert tree.leaves() == [2, 3, 4, 5]
    assert branches_of(tree) == [[3, 4, 5], [3, 4, 6], [7], [3, 8]]
    assert [tree.depth(i) for i in range(len(tree))] == [1, 2, 3, 3, 1, 2]
    assert tree.path(3) == [0, 1, 3]


def test_one_branch_is_the_chain():
    tree = DraftTree.from_branches([[9, 2, 9, 2]])
    assert tree.tokens == (9, 2, 9, 2)
    assert tree.parents == (ROOT, 0, 1, 2)
    assert branches_of(tree) == [[9, 2, 9, 2]]


def test_empty_and_duplicate_branches_are_dropped():
    tree = DraftTree.from_branches([[], [5, 6], [5, 6], [], [5]])
    assert tree.tokens == (5, 6)
    assert branches_of(tree) == [[5, 6]]
    empty = DraftTree.from_branches([[], []])
    assert len(empty) == 0 and empty.leaves() == [] and branches_of(empty) == []


def test_a_tree_needs_parents_before_children():
    with pytest.raises(ValueError, match="parents must come before"):
        DraftTree((1, 2), (1, ROOT))
    with pytest.raises(ValueError, match="one parent per token"):
        DraftTree((1, 2), (ROOT,))


def test_is_path():
    tree = DraftTree.from_branches([[3, 4, 5], [7]])
    assert tree.is_path([]) and tree.is_path([0, 1]) and tree.is_path([3])
    assert not tree.is_path([1]) and not tree.is_path([0, 3]) and not tree.is_path([9])


# -- greedy verification ----------------------------------------------------------------


def test_verify_accepts_down_the_branch_the_target_takes():
    tree = DraftTree.from_branches([[3, 4, 5], [3, 6, 1], [7]])  # nodes 3,4,5,6,1,7
    # root -> 3 (node 0) -> 6 (node 3) -> 2: node 4 carries 1, so 2 is the correction.
    verdict = verify_tree_greedy([3, 6, 0, 0, 2, 0, 0], tree)
    assert verdict == TreeVerdict(path=(0, 3), accepted=2, token=2)
    assert verdict_tokens(verdict, tree) == [3, 6, 2]


def test_verify_stops_at_the_root_with_the_correction():
    tree = DraftTree.from_branches([[3, 4], [7]])
    verdict = verify_tree_greedy([9, 4, 0, 0], tree)
    assert verdict == TreeVerdict((), 0, 9)
    assert verdict_tokens(verdict, tree) == [9]


def test_verify_adds_the_bonus_token_after_a_fully_accepted_leaf():
    tree = DraftTree.from_branches([[3, 4], [7, 8]])  # nodes 3,4,7,8
    verdict = verify_tree_greedy([7, 0, 0, 8, 1], tree)
    assert verdict == TreeVerdict((2, 3), 2, 1)
    assert verdict_tokens(verdict, tree) == [7, 8, 1]


def test_verify_an_empty_tree_is_a_plain_step():
    verdict = verify_tree_greedy([6], DraftTree.from_branches([]))
    assert verdict == TreeVerdict((), 0, 6)


def test_verify_needs_a_row_per_node():
    with pytest.raises(ValueError, match="choices"):
        verify_tree_greedy([1, 2], DraftTree.from_branches([[1, 2]]))


# -- FakeModel: rows and cache bookkeeping ----------------------------------------------


def test_tree_rows_equal_each_branch_evaluated_as_a_chain():
    branches = [[3, 4, 11], [3, 8], [6, 2, 2, 9], [3, 4, 12]]
    tree = DraftTree.from_branches(branches)
    model = FakeModel(seed=4)
    model.forward(COMMITTED[:-1], 0)
    rows = model.forward_tree(COMMITTED, tree)
    assert rows.shape == (1 + len(tree), model.n_vocab) and rows.dtype == np.float32
    for leaf, branch in zip(tree.leaves(), branches_of(tree), strict=True):
        chain = FakeModel(seed=4).forward(COMMITTED + branch, len(branch) + 1)
        assert np.array_equal(rows[[0] + [1 + i for i in tree.path(leaf)]], chain)


def test_a_one_branch_tree_gives_the_chains_rows():
    model, chain = FakeModel(seed=5), FakeModel(seed=5)
    branch = [7, 7, 3]
    tree_rows = model.forward_tree(COMMITTED, DraftTree.from_branches([branch]))
    assert np.array_equal(tree_rows, chain.forward(COMMITTED + branch, len(branch) + 1))


def test_keep_path_leaves_committed_plus_path_and_nothing_is_evaluated_twice():
    tree = DraftTree.from_branches([[3, 4, 11], [6, 2, 9]])  # nodes 3,4,11,6,2,9
    model = FakeModel(seed=6)
    model.forward(COMMITTED[:-1], 0)
    before = model.evaluated_tokens
    model.forward_tree(COMMITTED, tree)
    assert model.calls[-1] == (len(COMMITTED) - 1, 1 + len(tree), 1 + len(tree))
    assert model.evaluated_tokens - before == 1 + len(tree)
    model.keep_path([3, 4])
    assert model.cached == COMMITTED + [6, 2]
    rows = model.forward(COMMITTED + [6, 2, 5], 1)
    assert model.calls[-1] == (len(COMMITTED) + 2, 1, 1)  # only the new token
    assert np.array_equal(rows, FakeModel(seed=6).forward(COMMITTED + [6, 2, 5], 1))


def test_keep_path_accepts_an_empty_path_and_refuses_a_foreign_one():
    tree = DraftTree.from_branches([[3, 4], [6]])
    model = FakeModel(seed=7)
    model.forward_tree(COMMITTED, tree)
    with pytest.raises(ValueError, match="not a root-to-node path"):
        model.keep_path([1])
    model.keep_path([])
    assert model.cached == COMMITTED
    with pytest.raises(RuntimeError, match="forward_tree"):
        model.keep_path([])


def test_any_other_cache_operation_drops_an_unkept_tree():
    model = FakeModel(seed=8)
    model.forward_tree(COMMITTED, DraftTree.from_branches([[3, 4], [6]]))
    model.truncate(len(COMMITTED) - 1)
    assert model.cached == COMMITTED[:-1]
    with pytest.raises(RuntimeError):
        model.keep_path([])  # the tree is gone
    model.forward_tree(COMMITTED, DraftTree.from_branches([[3, 4]]))
    model.forward(COMMITTED + [9], 1)
    assert model.cached == COMMITTED + [9]


def test_a_model_without_trees_says_so_up_front():
    class ChainOnly(FakeModel):
        supports_trees = False  # type: ignore[assignment]

    model = ChainOnly()
    assert not model.supports_trees
    with pytest.raises(NotImplementedError):
        model.forward_tree(COMMITTED, DraftTree.from_branches([[1]]))
    assert model.cached == []  # nothing touched


def test_a_tree_must_fit_the_context():
    model = FakeModel(n_ctx=len(COMMITTED) + 2)
    with pytest.raises(ValueError, match="exceed the context"):
        model.forward_tree(COMMITTED, DraftTree.from_branches([[1, 2], [3]]))


def test_tree_rounds_give_the_targets_own_greedy_tokens():
    """An engine-like loop: each round verifies a tree of the true continuation (cut or
    corrupted at random) and a wrong branch; the output is plain greedy decoding."""
    target = FakeModel(seed=9, window=2)
    n_new = 80
    expected = plain_greedy(target, COMMITTED, n_new)
    rng = np.random.default_rng(0)
    committed = list(COMMITTED)
    target.forward(committed[:-1], 0)
    rounds = 0
    while len(committed) - len(COMMITTED) < n_new:
        truth = plain_greedy(target, committed, 6)
        good = truth[: int(rng.integers(0, 7))]
        if good and rng.random() < 0.4:  # the drafter goes wrong part way
            good[int(rng.integers(0, len(good)))] = int(rng.integers(0, target.n_vocab))
        wrong = [int(rng.integers(0, target.n_vocab)) for _ in range(3)]
        tree = DraftTree.from_branches([wrong, good] if rounds % 2 else [good, wrong])
        before = target.evaluated_tokens
        verdict = verify_tree_greedy(target.greedy_tree(committed, tree), tree)
        assert target.calls[-1][0] == len(committed) - 1  # the cache held committed[:-1]
        assert target.evaluated_tokens - before == 1 + len(tree)
        target.keep_path(verdict.path)
        committed += verdict_tokens(verdict, tree)
        assert target.cached == committed[:-1]
        rounds += 1
    assert committed[len(COMMITTED) :][:n_new] == expected
    assert rounds < n_new  # trees accepted more than one token a round
