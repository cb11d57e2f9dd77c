"""Scripted models for engine tests: deterministic logits from the last few tokens.

``FakeModel`` is a real ``CachedModel``: it records every evaluation, so tests can check
rollback bookkeeping and that nothing is evaluated twice. Two fakes built with the same
``seed`` agree everywhere; ``noise`` makes a draft disagree with its target some of the time.
It evaluates draft trees too: a node's row is exactly what the chain from the root down to
that node would give. Asked for greedy choices (``greedy_after``, ``greedy_tree``), it gives
token ids without handing out a row, and ``rows_read`` counts the rows it did hand out, so
tests can check that greedy decoding asks for none.
"""

from __future__ import annotations

import re

import numpy as np

from localspec.core.cached_model import CachedModel, Greedy
from localspec.core.sampling import top_probability
from localspec.core.tree import DraftTree, TreeVerdict


class FakeModel(CachedModel):
    def __init__(
        self,
        n_vocab: int = 24,
        n_ctx: int = 512,
        *,
        seed: int = 0,
        noise: float = 0.0,
        noise_seed: int = 99,
        eog: tuple[int, ...] = (),
        window: int = 3,
        sharpness: float = 3.0,
    ) -> None:
        super().__init__()
        self.n_vocab, self.n_ctx = n_vocab, n_ctx
        self.seed, self.noise, self.noise_seed = seed, noise, noise_seed
        self.eog = set(eog)
        self.window = window
        self.sharpness = sharpness
        self.calls: list[tuple[int, int, int]] = []  # (start position, tokens, logits rows)
        self.rows_read = 0  # logits rows handed out (greedy choices are not rows)

    def logits_after(self, context: list[int]) -> np.ndarray:
        tail = [int(t) for t in context[-self.window :]]
        base = np.random.default_rng([self.seed, len(tail), *tail]).normal(size=self.n_vocab)
        if self.noise:
            base = base + self.noise * np.random.default_rng(
                [self.noise_seed, len(tail), *tail]
            ).normal(size=self.n_vocab)
        return (self.sharpness * base).astype(np.float32)

    def _logits(self, tokens: list[int], n_logits: int) -> np.ndarray:
        self.calls.append((len(self.cached), len(tokens), n_logits))
        ctx = list(self.cached)
        rows = []
        for j, tok in enumerate(tokens):
            ctx.append(tok)
            if j >= len(tokens) - n_logits:
                rows.append(self.logits_after(ctx))
        return np.array(rows, dtype=np.float32).reshape(n_logits, self.n_vocab)

    def _evaluate(self, tokens: list[int], n_logits: int) -> np.ndarray:
        self.rows_read += n_logits
        return self._logits(tokens, n_logits)

    def _evaluate_greedy(self, tokens: list[int], n: int, confidence: bool, vocab: int) -> Greedy:
        rows = self._logits(tokens, n)[:, :vocab]
        probs = [top_probability(row) for row in rows] if confidence else None
        return Greedy(np.argmax(rows, axis=-1).tolist(), probs)

    def _remove_from(self, n: int) -> None:
        pass  # nothing to free: the cached list is the whole state

    @property
    def supports_trees(self) -> bool:
        return True

    def _evaluate_tree(self, start: int, last: int, tree: DraftTree) -> np.ndarray:
        self.rows_read += 1 + len(tree)
        return self._tree_logits(start, last, tree)

    def _evaluate_tree_greedy(self, start: int, last: int, tree: DraftTree) -> list[int]:
        return np.argmax(self._tree_logits(start, last, tree), axis=-1).tolist()

    def _tree_logits(self, start: int, last: int, tree: DraftTree) -> np.ndarray:
        self.calls.append((start, 1 + len(tree), 1 + len(tree)))
        ctx = [*self.cached, last]
        rows = [self.logits_after(ctx)]
        for i in range(len(tree)):
            rows.append(self.logits_after(ctx + [tree.tokens[j] for j in tree.path(i)]))
        return np.array(rows, dtype=np.float32).reshape(1 + len(tree), self.n_vocab)

    def _keep_path(self, start: int, tree: DraftTree, path: list[int]) -> None:
        pass  # the base class appends the path's tokens to ``cached``

    def token_bytes(self, token: int) -> bytes:
        return chr(ord("a") + token % 26).encode() if token < 26 else f"<{token}>".encode()

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        """Letters a-z are tokens 0-25 and ``<N>`` token N, as ``token_bytes`` spells them;
        anything else is left out."""
        found = re.findall(r"<(\d+)>|([a-z])", text)
        return [int(number) if number else ord(letter) - ord("a") for number, letter in found]

    def is_eog(self, token: int) -> bool:
        return token in self.eog


class TimedFake(FakeModel):
    """A scripted model whose evaluations advance a virtual clock (``core.replay``) as a
    machine with ``costs`` would take them, so that the engine's choices, priced by what
    rounds take, do not depend on how fast the test machine runs."""

    def __init__(self, clock, costs, **kw) -> None:
        super().__init__(**kw)
        self.clock, self.costs = clock, costs

    def _logits(self, tokens, n_logits):
        if n_logits:
            self.clock.now += self.costs.verify(n_logits - 1)
        return super()._logits(tokens, n_logits)

    def _tree_logits(self, start, last, tree):
        self.clock.now += self.costs.verify(len(tree))
        return super()._tree_logits(start, last, tree)


def plain_greedy(model: FakeModel, prompt: list[int], n: int) -> list[int]:
    """Reference: the model's own greedy decoding, one token at a time, no cache."""
    ctx = list(prompt)
    out: list[int] = []
    for _ in range(n):
        tok = int(np.argmax(model.logits_after(ctx)))
        if model.is_eog(tok):
            break
        out.append(tok)
        ctx.append(tok)
    return out


def branches_of(tree: DraftTree) -> list[list[int]]:
    """The tokens of every root-to-leaf path of ``tree``, in leaf order."""
    return [[tree.tokens[i] for i in tree.path(leaf)] for leaf in tree.leaves()]


def verdict_tokens(verdict: TreeVerdict, tree: DraftTree) -> list[int]:
    """What a tree round emits: the accepted path's tokens, then the target's own."""
    return [*(tree.tokens[i] for i in verdict.path), verdict.token]


class FakeGrammar:
    """A grammar over token ids (``core.grammar.Grammar``): ``allowed(tokens)`` is the set of
    ids that may follow the tokens accepted so far."""

    def __init__(self, allowed, accepted: tuple[int, ...] = ()) -> None:
        self.rule, self.accepted = allowed, accepted
        self.passes = 0  # candidates asked about, as a backend's pass would read them

    def clone(self) -> FakeGrammar:
        return FakeGrammar(self.rule, self.accepted)

    def allows(self, token: int) -> bool:
        self.passes += 1
        return token in self.rule(self.accepted)

    def allowed(self, n_vocab: int) -> np.ndarray:
        return self.allowed_among(np.arange(n_vocab))

    def allowed_among(self, ids: np.ndarray) -> np.ndarray:
        self.passes += len(ids)
        ok = self.rule(self.accepted)
        return np.array([int(t) in ok for t in ids], dtype=bool)

    def accept(self, token: int) -> None:
        if not self.allows(token):
            raise ValueError(f"the grammar does not allow token {token} here")
        self.accepted = (*self.accepted, token)


def template_grammar(template: list[set[int]], eog: int):
    """Tokens position by position from ``template`` (a set per position), then ``eog``."""

    def allowed(accepted: tuple[int, ...]) -> set[int]:
        return template[len(accepted)] if len(accepted) < len(template) else {eog}

    return allowed


def plain_constrained(model: FakeModel, prompt: list[int], n: int, rule) -> list[int]:
    """Reference: greedy decoding under a grammar, one token at a time, no cache."""
    ctx, out = list(prompt), []
    for _ in range(n):
        ok = rule(tuple(out))
        row = model.logits_after(ctx)
        tok = max(ok, key=lambda t: (row[t], -t))
        if model.is_eog(tok):
            break
        out.append(tok)
        ctx.append(tok)
    return out
