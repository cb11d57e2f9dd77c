"""A tree round: competing drafts verified in one target pass, read back as a chain.

``verify_branches(target, committed, branches)`` merges the branches into a ``DraftTree``,
has the target evaluate the last committed token and every node in one batch and return its
greedy choice after each (``greedy_tree``: token ids, no logits rows), accepts the path of
those choices (``verify_tree_greedy``), keeps that path in the target's cache
(``keep_path``), and says which branch the target took: the first whose tokens start with
the accepted path (the first branch, the drafted one, when the path is empty). The result
reads as the chain round of that branch (``Verdict`` over its tokens), so the engine emits
and learns from it as from any chain. Greedy decoding only (see ``core.tree``).

``tree_shape(target)`` is the largest tree a target verifies: each leaf takes one of its
sequences (``tree_seqs``) and the whole tree one batch with the last committed token
(``n_batch``), within the trees' own bounds (``core.tree``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from localspec.core.cached_model import TargetModel
from localspec.core.tree import MAX_BRANCHES, TREE_MAX_NODES, DraftTree, verify_tree_greedy
from localspec.core.verify import Verdict


@dataclass(frozen=True)
class TreeVerified:
    taken: int  # index of the branch the target took
    verdict: Verdict  # over ``branches[taken]``, as for a chain
    nodes: int  # draft tokens the target evaluated (the tree's nodes)


def taken_branch(branches: Sequence[Sequence[int]], path: Sequence[int]) -> int:
    """The first branch whose tokens start with ``path`` (the accepted tokens); 0 when
    ``path`` is empty or no branch does."""
    if path:
        for i, branch in enumerate(branches):
            if list(branch[: len(path)]) == list(path):
                return i
    return 0


def verify_branches(
    target: TargetModel,
    committed: list[int],
    branches: list[list[int]],
    watch: Callable[[DraftTree, list[int]], None] | None = None,
) -> TreeVerified:
    """Verify ``branches`` after ``committed`` in one target pass; afterwards the target's
    cache holds ``committed`` plus the accepted tokens, as after a chain round. ``watch``
    is shown the tree and the target's choices."""
    tree = DraftTree.from_branches(branches)
    choices = target.greedy_tree(committed, tree)
    found = verify_tree_greedy(choices, tree)
    if watch is not None:
        watch(tree, choices)
    target.keep_path(found.path)
    taken = taken_branch(branches, [tree.tokens[i] for i in found.path])
    return TreeVerified(taken, Verdict(found.accepted, found.token), len(tree))


def tree_shape(target: TargetModel) -> tuple[int, int]:
    """The most branches and nodes a draft tree may have on ``target``."""
    return min(target.tree_seqs, MAX_BRANCHES), min(target.n_batch - 1, TREE_MAX_NODES)
