"""Draft trees on llama.cpp: every node of a tree verified in one batch, one sequence a leaf.

Sequence s (0, or a lane's own: backend/lanes.py) holds the committed tokens. A tree with
m leaves gives leaf j sequence s + j (1..m): the committed prefix is tagged with every one
of them (``seq_cp``, which in a unified cache only adds tags), the last committed token
carries s..s + m, and each node carries the sequences of the leaves below it. llama.cpp
masks attention by sequence and position, so a node sees the prefix, the last token and its
own ancestors, never another branch. Keeping a path tags its cells with s; removing the
leaves' sequences then frees the cells of every other node and drops the branch tags from
the rest (``seq_keep(0)`` where the context has no other lane).

``TreeBatches`` is the part of ``LlamaModel`` that does it (``_evaluate_tree`` for rows,
``_evaluate_tree_greedy`` for the device's greedy choices, ``_keep_path``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import llama_cpp
import numpy as np

from localspec.backend.lanes import Slice
from localspec.core.cached_model import greedy_ids
from localspec.core.tree import DraftTree
from localspec.errors import BackendError


class TreeBatches:
    """Tree batches of a ``LlamaModel`` (its context, batch, memory and device samplers)."""

    n_batch: int
    n_vocab: int
    tree_seqs: int
    lanes: int
    _seq0: int
    _turns: Any
    _gather_here: bool
    _gathered: Any
    _write: Any
    _device_choices: Any
    _batch: Any
    _memory: Any
    _device: Any
    # LlamaModel's own: one timed decode of the filled batch, a rollback, its device samplers.
    _run_batch: Any
    _remove_from: Any
    _device_for: Any

    @property
    def _gathers(self) -> bool:
        """Whether this lane's next batch is gathered with other lanes' (backend/lanes.py):
        not while no other lane has anything to evaluate."""
        turns = self._turns
        return turns is not None and turns.gather and self._gather_here and not turns.alone

    @property
    def supports_trees(self) -> bool:
        return self.tree_seqs > 0

    def _evaluate_tree(self, start: int, last: int, tree: DraftTree) -> np.ndarray:
        if self._device is not None:
            self._device.detach()  # rows are wanted: llama.cpp copies them again
        rows = self._run_tree(start, last, tree, greedy=False)
        assert rows is not None
        return rows

    def _evaluate_tree_greedy(self, start: int, last: int, tree: DraftTree) -> list[int]:
        device = self._device_for(False, self._device.vocab if self._device else self.n_vocab)
        if device is None:
            return greedy_ids(self._evaluate_tree(start, last, tree))
        return self._run_tree(start, last, tree, greedy=True)[0]

    def _run_tree(self, start: int, last: int, tree: DraftTree, *, greedy: bool):
        seqs = self._leaf_seqs(tree)
        if 1 + len(tree) > self.n_batch:
            raise ValueError(
                f"a tree of {len(tree)} nodes does not fit a batch of {self.n_batch} tokens"
            )
        m = len(tree.leaves())
        base = self._seq0
        for j in range(1, m + 1):
            llama_cpp.llama_memory_seq_cp(self._memory, base, base + j, -1, -1)
        tokens = [last, *tree.tokens]
        positions = [start] + [start + tree.depth(i) for i in range(len(tree))]
        tags = [[base + j for j in range(m + 1)]] + [[base + j for j in s] for s in seqs]
        work = Slice(tokens, positions, tags, [True] * len(tokens), device=greedy)
        try:
            if self._gathers:
                return self._gathered(work)
            self._write([work])
            rows = self._run_batch(start, len(tokens), greedy=greedy)
            return self._device_choices(len(tokens)) if greedy else rows
        except BackendError:
            self._drop_tree(start, m)
            raise

    def _leaf_seqs(self, tree: DraftTree) -> list[list[int]]:
        """For each node, the sequence ids of the leaves below it (leaf j: sequence j + 1)."""
        leaves = tree.leaves()
        if len(leaves) > self.tree_seqs:
            raise ValueError(
                f"a tree of {len(leaves)} leaves needs more sequences than the "
                f"{self.tree_seqs} this context has"
            )
        seqs: list[list[int]] = [[] for _ in tree.tokens]
        for j, leaf in enumerate(leaves, start=1):
            for node in tree.path(leaf):
                seqs[node].append(j)
        return seqs

    def _fill(self, j: int, token: int, pos: int, seqs: Sequence[int], out: bool = True) -> None:
        """Row ``j`` of the batch: ``token`` at ``pos`` in ``seqs``, with logits if ``out``."""
        b = self._batch
        assert b is not None
        b.token[j] = token
        b.pos[j] = pos
        b.n_seq_id[j] = len(seqs)
        for k, s in enumerate(seqs):
            b.seq_id[j][k] = s
        b.logits[j] = out

    def _keep_path(self, start: int, tree: DraftTree, path: list[int]) -> None:
        base = self._seq0
        if path:
            leaf = base + self._leaf_seqs(tree)[path[-1]][0]  # its sequence runs along path
            llama_cpp.llama_memory_seq_cp(self._memory, leaf, base, start, start + len(path))
        self._drop_leaves(len(tree.leaves()))

    def _drop_leaves(self, m: int) -> None:
        """Free the cells only the tree's ``m`` leaves' sequences hold."""
        if self.lanes == 1:
            llama_cpp.llama_memory_seq_keep(self._memory, 0)
            return
        for j in range(1, m + 1):  # the other lanes' sequences stay
            llama_cpp.llama_memory_seq_rm(self._memory, self._seq0 + j, -1, -1)

    def _drop_tree(self, start: int, m: int) -> None:
        """After a failed tree pass: back to the committed prefix, ``start`` tokens."""
        self._drop_leaves(m)
        self._remove_from(start)
