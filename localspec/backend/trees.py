"""Draft trees on llama.cpp: every node of a tree verified in one batch, one sequence a leaf.

Sequence s (a lane's first: ``SharedContext.first_seq``, backend/context.py) holds the
committed tokens. A tree with m leaves gives leaf j sequence s + j (1..m): the committed
prefix is tagged with every one of them (``seq_cp``, which in a unified cache only adds
tags), the last committed token carries s..s + m, and each node carries the sequences of
the leaves below it. llama.cpp masks attention by sequence and position, so a node sees the
prefix, the last token and its own ancestors, never another branch. Keeping a path tags its
cells with s; removing the leaves' sequences then frees the cells of every other node and
drops the branch tags from the rest (``seq_keep(0)`` where the context has no other lane).

Functions over (the shared context, the lane's first sequence): ``tree_slice`` tags the
prefix and gives the tree's batch as a ``Slice``, which the lane evaluates (alone or
gathered with other lanes'); ``keep_path`` keeps the accepted nodes, ``drop_leaves`` frees
the rest (also after a failed pass).
"""

from __future__ import annotations

import llama_cpp

from localspec.backend.context import SharedContext
from localspec.backend.lanes import Slice
from localspec.core.tree import DraftTree


def tree_slice(
    shared: SharedContext, seq: int, start: int, last: int, tree: DraftTree, *, greedy: bool
) -> Slice:
    """``last`` at ``start`` and every node of ``tree`` after it, tagged as the module
    docstring says, the committed prefix of sequence ``seq`` tagged for every leaf; outputs
    for every token (``greedy``: the device's choices). ``ValueError`` for a tree larger
    than the context's sequences or batch allow, before anything changes."""
    seqs = leaf_seqs(tree, shared.tree_seqs)
    if 1 + len(tree) > shared.n_batch:
        raise ValueError(
            f"a tree of {len(tree)} nodes does not fit a batch of {shared.n_batch} tokens"
        )
    m = len(tree.leaves())
    for j in range(1, m + 1):
        llama_cpp.llama_memory_seq_cp(shared.memory, seq, seq + j, -1, -1)
    tokens = [last, *tree.tokens]
    positions = [start] + [start + tree.depth(i) for i in range(len(tree))]
    tags = [[seq + j for j in range(m + 1)]] + [[seq + j for j in s] for s in seqs]
    return Slice(tokens, positions, tags, [True] * len(tokens), device=greedy)


def leaf_seqs(tree: DraftTree, capacity: int) -> list[list[int]]:
    """For each node, the sequence ids of the leaves below it (leaf j: sequence j + 1, of
    at most ``capacity`` leaves)."""
    leaves = tree.leaves()
    if len(leaves) > capacity:
        raise ValueError(
            f"a tree of {len(leaves)} leaves needs more sequences than the "
            f"{capacity} this context has"
        )
    seqs: list[list[int]] = [[] for _ in tree.tokens]
    for j, leaf in enumerate(leaves, start=1):
        for node in tree.path(leaf):
            seqs[node].append(j)
    return seqs


def keep_path(
    shared: SharedContext, seq: int, start: int, tree: DraftTree, path: list[int]
) -> None:
    """Keep the nodes of ``path`` in sequence ``seq`` at ``start``...; free the others."""
    if path:
        leaf = seq + leaf_seqs(tree, shared.tree_seqs)[path[-1]][0]  # it runs along path
        llama_cpp.llama_memory_seq_cp(shared.memory, leaf, seq, start, start + len(path))
    drop_leaves(shared, seq, len(tree.leaves()))


def drop_leaves(shared: SharedContext, seq: int, m: int) -> None:
    """Free the cells only the ``m`` leaves' sequences after ``seq`` hold."""
    if shared.lanes == 1:
        llama_cpp.llama_memory_seq_keep(shared.memory, 0)
        return
    for j in range(1, m + 1):  # the other lanes' sequences stay
        llama_cpp.llama_memory_seq_rm(shared.memory, seq + j, -1, -1)
