"""A model whose KV cache mirrors a token list: the contract the engine drives.

``CachedModel.forward(tokens, n_logits)`` makes the cache hold exactly ``tokens`` and
returns the logits rows of the last ``n_logits`` positions. It keeps the longest common
prefix of what is cached, rolls back the rest, and evaluates only the missing suffix in
one batch, so a draft model never re-evaluates what it holds, a rejected draft costs a
rollback rather than a re-evaluation, and a new chat turn evaluates only its new tokens.

Subclasses implement ``_evaluate`` (append tokens at the cache's end, logits for the last
``n_logits`` of them) and ``_remove_from`` (drop cached positions >= n). ``FakeModel``
in the tests and ``LlamaModel`` in ``backend/llama.py`` are the two implementations.

Work per call in O(what changes) rather than O(context), for loops whose steps take a few
milliseconds (a GPU):

- ``forward_after(start, tail, n_logits)`` is ``forward(cached[:start] + tail, n_logits)``
  without reading the first ``start`` tokens. ``changes`` counts every change of the cache:
  a caller that noted it after its own last call knows, while it is unchanged, that the
  cache still holds what that call left there, and so how far it agrees with its context.
- ``borrow=True`` lets a subclass whose ``_evaluate`` returns views of its own buffer
  (``borrowed_rows``; ``LlamaModel`` does) hand them over without a copy. Such rows are
  read-only and valid only until the next evaluation on this model: for a caller that
  consumes them at once. Without ``borrow`` the rows are always the caller's own.

Draft trees (``core.tree``): ``forward_tree(committed, tree)`` evaluates the last committed
token and every node of a ``DraftTree`` in one batch, each node seeing only the committed
tokens and its own ancestors, and leaves the cache provisional; ``keep_path(path)`` then
keeps the accepted nodes and drops the others. A subclass that can do this sets
``supports_trees`` and implements ``_evaluate_tree`` and ``_keep_path``; the others raise
``NotImplementedError``. Any other cache operation on a provisional cache first drops every
node, as ``keep_path([])`` would, so ``cached`` never parts from the cache. A tree's size is
bounded by the model: ``tree_seqs`` leaves (one sequence each) and ``n_batch`` tokens in all.

Greedy choices instead of rows. Greedy decoding needs only the token with the highest logit
after each position, so ``greedy_after(start, tail, n)`` (and ``greedy``, ``greedy_tree``)
moves the cache as ``forward_after`` (``forward_tree``) does and returns those token ids
(``Greedy``), with the top token's probability at temperature 1 where ``confidence`` asks
(a draft model's stopping rule). Here they are read off the rows (``np.argmax``: the lowest
id among equal top logits); a backend that picks them where the rows are computed overrides
``_evaluate_greedy`` and ``_evaluate_tree_greedy``, so no row reaches the host, and says so
in ``greedy_where`` (``"device"``; ``"host"`` here).

``TargetModel`` is what the engine needs of a target: a ``CachedModel`` with its tokens'
bytes and end-of-generation test. ``PendingModel`` is a draft model still loading, which the
engine takes up once it is there.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from localspec.core.sampling import top_probabilities
from localspec.core.tree import MAX_BRANCHES, TREE_MAX_NODES, DraftTree

HOST = "host"  # greedy choices read off rows copied to the host
DEVICE = "device"  # greedy choices made where the rows are computed


@dataclass(frozen=True)
class Greedy:
    """The greedy token after each asked-for position, in order, and (where asked for) its
    probability at temperature 1."""

    ids: list[int]
    top_p: list[float] | None = None


def greedy_ids(rows: np.ndarray) -> list[int]:
    """The greedy token of each logits row: the lowest id among equal top logits."""
    return np.argmax(rows, axis=-1).tolist() if len(rows) else []


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    head_a, head_b = a[:n], b[:n]
    if not (isinstance(head_a, list) and isinstance(head_b, list)):
        head_a, head_b = list(head_a), list(head_b)  # a list never equals a tuple
    if head_a == head_b:  # the usual case: one extends the other
        return n
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class CachedModel(ABC):
    n_ctx: int
    n_vocab: int
    # The largest draft tree it evaluates: leaves, and tokens in one batch (the last
    # committed one and every node). A backend with other limits sets its own.
    tree_seqs: int = MAX_BRANCHES
    n_batch: int = TREE_MAX_NODES + 1
    _tree: DraftTree | None = None  # evaluated by forward_tree, awaiting keep_path
    # Whether _evaluate and _evaluate_tree return views of a buffer the next evaluation
    # overwrites (then copied unless the caller borrows them).
    borrowed_rows = False
    greedy_where = HOST  # where greedy choices are made (see the module docstring)

    def __init__(self) -> None:
        self.cached: list[int] = []  # tokens whose keys/values are in the cache, in order
        self.evaluated_tokens = 0  # running count of tokens evaluated, for tests and stats
        self.changes = 0  # times ``cached`` changed (see the module docstring)

    @property
    def supports_trees(self) -> bool:
        """Whether ``forward_tree`` works on this model."""
        return False

    def forward(self, tokens: Sequence[int], n_logits: int, *, borrow: bool = False) -> np.ndarray:
        """Cache exactly ``tokens``; return float32 logits of shape (n_logits, n_vocab)
        (borrowed: see the module docstring)."""
        return self.forward_after(0, tokens, n_logits, borrow=borrow)

    def forward_after(
        self, start: int, tail: Sequence[int], n_logits: int, *, borrow: bool = False
    ) -> np.ndarray:
        """``forward(cached[:start] + tail, n_logits)``: the first ``start`` cached tokens
        are kept unread, the rest compared with ``tail`` from there."""
        new = self._advance(start, tail, n_logits)
        if new is None:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        rows = self._evaluate(new, n_logits)
        self._extend(new)
        return self._handed(rows, borrow)

    def greedy(
        self, tokens: Sequence[int], n: int, *, confidence: bool = False, vocab: int = 0
    ) -> Greedy:
        """Cache exactly ``tokens``; the greedy choices after its last ``n`` positions."""
        return self.greedy_after(0, tokens, n, confidence=confidence, vocab=vocab)

    def greedy_after(
        self, start: int, tail: Sequence[int], n: int, *, confidence: bool = False, vocab: int = 0
    ) -> Greedy:
        """``forward_after(start, tail, n)``, returning the greedy choices after those ``n``
        positions (and their probabilities where ``confidence`` asks) instead of rows.
        ``vocab``: choose among the first ``vocab`` ids only (0: all of them), as a draft
        model whose vocabulary is larger than its target's must."""
        new = self._advance(start, tail, n)
        if new is None:
            return Greedy([], [] if confidence else None)
        found = self._evaluate_greedy(new, n, confidence, vocab or self.n_vocab)
        self._extend(new)
        return found

    def _advance(self, start: int, tail: Sequence[int], n_logits: int) -> list[int] | None:
        """Roll the cache back to what ``cached[:start] + tail`` keeps of it; the tokens
        left to evaluate (None when nothing is, and no row is asked for)."""
        self._settle()
        if not 0 <= start <= len(self.cached):
            raise ValueError(f"the cache holds {len(self.cached)} tokens, not {start}")
        total = start + len(tail)
        if total > self.n_ctx:
            raise ValueError(f"{total} tokens exceed the context of {self.n_ctx}")
        if n_logits > total:
            raise ValueError("cannot return logits for more positions than tokens")
        ahead = self.cached[start:] if start else self.cached  # no copy of the whole cache
        # The usual call (a round's batch after the cache's end) has nothing to compare.
        agreed = start + common_prefix_length(ahead, tail) if ahead else start
        keep = min(agreed, total - n_logits)
        if n_logits == 0 and keep == total:
            self.truncate(keep)
            return None
        # Rows wanted for cached tokens before ``start`` mean evaluating those again.
        new = [*self.cached[keep:start], *tail] if keep < start else list(tail[keep - start :])
        self.truncate(keep)
        return new

    def _extend(self, new: list[int]) -> None:
        self.cached.extend(new)
        self.changes += 1
        self.evaluated_tokens += len(new)

    def _handed(self, rows: np.ndarray, borrow: bool) -> np.ndarray:
        """Rows as the caller may keep them: the caller's own unless it borrows them."""
        return rows.copy() if self.borrowed_rows and not borrow else rows

    def forward_tree(
        self, committed: Sequence[int], tree: DraftTree, *, borrow: bool = False
    ) -> np.ndarray:
        """Make the cache hold ``committed[:-1]`` (keeping the common prefix, as ``forward``
        does), then evaluate ``committed[-1]`` and every node of ``tree`` in ONE batch, each
        node attending to ``committed`` and its own ancestors only. Returns float32 logits,
        shape (1 + len(tree), n_vocab): row 0 after ``committed[-1]``, row 1 + i after node
        i (borrowed: see the module docstring). The cache is in a provisional state until
        ``keep_path`` is called."""
        self._open_tree(committed, tree)
        rows = self._evaluate_tree(len(self.cached), int(committed[-1]), tree)
        self._hang_tree(committed, tree)
        return self._handed(rows, borrow)

    def greedy_tree(self, committed: Sequence[int], tree: DraftTree) -> list[int]:
        """``forward_tree``, returning the greedy choice after ``committed[-1]`` and after
        each node (1 + len(tree) ids) instead of rows."""
        self._open_tree(committed, tree)
        ids = self._evaluate_tree_greedy(len(self.cached), int(committed[-1]), tree)
        self._hang_tree(committed, tree)
        return ids

    def _open_tree(self, committed: Sequence[int], tree: DraftTree) -> None:
        if not self.supports_trees:
            raise NotImplementedError(f"{type(self).__name__} cannot evaluate draft trees")
        if not committed:
            raise ValueError("a draft tree needs a committed token to hang from")
        if len(committed) + len(tree) > self.n_ctx:  # every node takes a cache cell
            raise ValueError(
                f"{len(committed)} tokens and a tree of {len(tree)} exceed the context "
                f"of {self.n_ctx}"
            )
        self.forward(committed[:-1], 0)

    def _hang_tree(self, committed: Sequence[int], tree: DraftTree) -> None:
        self.cached.append(int(committed[-1]))
        self.changes += 1
        self.evaluated_tokens += 1 + len(tree)
        self._tree = tree

    def keep_path(self, path: Sequence[int]) -> None:
        """After ``forward_tree``: keep the nodes of ``path`` (a root-to-node path, possibly
        empty) and drop every other node, so that
        ``cached == committed + [tree.tokens[i] for i in path]``."""
        tree = self._tree
        if tree is None:
            raise RuntimeError("keep_path needs a forward_tree before it")
        if not tree.is_path(path):
            raise ValueError(f"{list(path)} is not a root-to-node path of the tree")
        self._keep_path(len(self.cached), tree, list(path))
        self._tree = None
        self.cached.extend(tree.tokens[i] for i in path)
        self.changes += 1

    def _settle(self) -> None:
        """Drop a tree nobody kept a path of, so the cache holds ``cached`` again."""
        if self._tree is not None:
            self.keep_path([])

    def truncate(self, n: int) -> None:
        """Roll the cache back to its first ``n`` tokens."""
        self._settle()
        if n < len(self.cached):
            self._remove_from(n)
            del self.cached[n:]
            self.changes += 1

    def reset(self) -> None:
        self.truncate(0)

    @abstractmethod
    def _evaluate(self, tokens: list[int], n_logits: int) -> np.ndarray:
        """Append ``tokens`` at position ``len(self.cached)``; logits of the last n_logits."""

    @abstractmethod
    def _remove_from(self, n: int) -> None:
        """Drop cached positions ``>= n``."""

    def _evaluate_greedy(self, tokens: list[int], n: int, confidence: bool, vocab: int) -> Greedy:
        """``_evaluate``'s greedy choices among the first ``vocab`` ids for its last ``n``
        positions, read off its rows."""
        rows = self._evaluate(tokens, n)[:, :vocab]
        return Greedy(greedy_ids(rows), top_probabilities(rows) if confidence else None)

    def _evaluate_tree_greedy(self, start: int, last: int, tree: DraftTree) -> list[int]:
        """``_evaluate_tree``'s greedy choices, read off its rows."""
        return greedy_ids(self._evaluate_tree(start, last, tree))

    def _evaluate_tree(self, start: int, last: int, tree: DraftTree) -> np.ndarray:
        """Evaluate ``last`` at position ``start`` and the nodes of ``tree`` after it (node i
        at ``start + tree.depth(i)``) in one batch; 1 + len(tree) logits rows."""
        raise NotImplementedError(f"{type(self).__name__} cannot evaluate draft trees")

    def _keep_path(self, start: int, tree: DraftTree, path: list[int]) -> None:
        """Keep the nodes of ``path`` at positions ``start``, ``start + 1``...; free the
        other nodes of the tree evaluated last."""
        raise NotImplementedError(f"{type(self).__name__} cannot evaluate draft trees")


class TargetModel(Protocol):
    """What the engine needs of the target (``CachedModel`` plus its vocabulary)."""

    n_ctx: int
    n_vocab: int
    evaluated_tokens: int
    changes: int
    tree_seqs: int
    n_batch: int

    @property
    def greedy_where(self) -> str: ...
    def forward(
        self, tokens: Sequence[int], n_logits: int, *, borrow: bool = False
    ) -> np.ndarray: ...
    def forward_after(
        self, start: int, tail: Sequence[int], n_logits: int, *, borrow: bool = False
    ) -> np.ndarray: ...
    def truncate(self, n: int) -> None: ...
    @property
    def supports_trees(self) -> bool: ...
    def forward_tree(
        self, committed: Sequence[int], tree: DraftTree, *, borrow: bool = False
    ) -> np.ndarray: ...
    def keep_path(self, path: Sequence[int]) -> None: ...
    def greedy_after(
        self, start: int, tail: Sequence[int], n: int, *, confidence: bool = False, vocab: int = 0
    ) -> Greedy: ...
    def greedy(
        self, tokens: Sequence[int], n: int, *, confidence: bool = False, vocab: int = 0
    ) -> Greedy: ...
    def greedy_tree(self, committed: Sequence[int], tree: DraftTree) -> list[int]: ...
    def token_bytes(self, token: int) -> bytes: ...
    def is_eog(self, token: int) -> bool: ...
    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = True
    ) -> list[int]: ...


class PendingModel(Protocol):
    """A draft model loading while the engine runs (a session's background load).

    ``settled`` turns true once the load has ended, loaded or failed; ``ready()`` is then
    the model, or None when the load failed, which ``problem`` says; before that it is None.
    ``wait()`` blocks until the load ends and returns the model, or raises the load's error.
    """

    @property
    def settled(self) -> bool: ...

    @property
    def problem(self) -> str: ...

    def ready(self) -> CachedModel | None: ...

    def wait(self) -> CachedModel: ...
