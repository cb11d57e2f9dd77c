"""Draft trees: several competing continuations verified by the target in one pass.

A ``DraftTree`` is a trie of draft tokens hanging off the last committed token (the root).
Nodes are stored parents first, so a batch in node order always evaluates a node after its
ancestors; ``from_branches`` merges shared prefixes, so each prefix is evaluated once, and
puts the first branch's nodes first, in order, so a one-branch tree is exactly that chain.

``verify_tree_greedy`` walks the tree with the target's greedy choice at each node: it accepts
the child carrying that token and goes on, else stops and returns the choice as the correction
(or, after a fully accepted leaf, as the bonus token). The accepted tokens are then exactly
the target's own greedy decoding, as for a chain. Only greedy verification is supported:
exact speculative sampling over a tree needs per-branch residual distributions (as in
SpecInfer's multi-step rejection), which this module does not implement.

Choices follow ``CachedModel.greedy_tree``: ``choices[0]`` is the target's greedy token after
the last committed token, ``choices[1 + i]`` after node ``i``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ROOT = -1  # the parent index of a child of the last committed token
MAX_BRANCHES = 4  # most branches of a draft tree (each takes one of the target's sequences)
TREE_MAX_NODES = 64  # most nodes of a draft tree: as long as the longest n-gram chain


@dataclass(frozen=True)
class DraftTree:
    tokens: tuple[int, ...]  # node tokens, parents always before their children
    parents: tuple[int, ...]  # each node's parent index; ROOT: child of the last committed

    def __post_init__(self) -> None:
        if len(self.tokens) != len(self.parents):
            raise ValueError("a draft tree needs one parent per token")
        for i, p in enumerate(self.parents):
            if not ROOT <= p < i:
                raise ValueError(f"node {i} has parent {p}: parents must come before children")

    @classmethod
    def from_branches(cls, branches: Sequence[Sequence[int]]) -> DraftTree:
        """The trie of ``branches``; empty ones are ignored and duplicates merged."""
        tokens: list[int] = []
        parents: list[int] = []
        child_of: dict[tuple[int, int], int] = {}  # (parent, token) -> node
        for branch in branches:
            node = ROOT
            for tok in branch:
                key = (node, int(tok))
                if key not in child_of:
                    child_of[key] = len(tokens)
                    tokens.append(int(tok))
                    parents.append(node)
                node = child_of[key]
        return cls(tuple(tokens), tuple(parents))

    def __len__(self) -> int:
        return len(self.tokens)

    def depth(self, node: int) -> int:
        """1 for a child of the root."""
        return len(self.path(node))

    def path(self, node: int) -> list[int]:
        """Node indices from the root's child down to ``node``."""
        out: list[int] = []
        while node != ROOT:
            out.append(node)
            node = self.parents[node]
        return out[::-1]

    def children(self, node: int) -> list[int]:
        """Children of ``node`` in node order; ``ROOT`` for the root's."""
        return [i for i, p in enumerate(self.parents) if p == node]

    def leaves(self) -> list[int]:
        has_child = set(self.parents)
        return [i for i in range(len(self.tokens)) if i not in has_child]

    def is_path(self, nodes: Sequence[int]) -> bool:
        """Whether ``nodes`` is a root-to-node path of this tree (empty included)."""
        parent = ROOT
        for node in nodes:
            if not 0 <= node < len(self.tokens) or self.parents[node] != parent:
                return False
            parent = node
        return True


@dataclass(frozen=True)
class TreeVerdict:
    path: tuple[int, ...]  # accepted nodes, root-to-node
    accepted: int  # len(path)
    token: int  # the target's own token after the accepted path (correction or bonus)


def verify_tree_greedy(choices: Sequence[int], tree: DraftTree) -> TreeVerdict:
    """Accept the path of the target's own greedy choices; ``choices`` has 1 + len(tree)."""
    if len(choices) < len(tree) + 1:
        raise ValueError(f"{len(choices)} greedy choices for a tree of {len(tree)} nodes")
    path: list[int] = []
    row, node = 0, ROOT
    while True:
        choice = int(choices[row])
        follow = [c for c in tree.children(node) if tree.tokens[c] == choice]
        if not follow:
            return TreeVerdict(tuple(path), len(path), choice)
        node = follow[0]  # from_branches never gives two children the same token
        path.append(node)
        row = node + 1
