"""The cost model that chooses, each round, the drafter and draft length (or none).

It compares what the drafters offer this round (``drafting.Offer``), each priced by its
drafter: the expected accepted tokens for every draft length and the seconds drafting them
takes. Verification is priced from this machine's live costs (``costs.LiveCosts``). For every
candidate (a plain step; each offer with k = 1..available) it computes

    E[tokens] = 1 + accepted(k)                  (the +1 is the target's token)
    seconds   = verify(k) + draft_seconds(k)

and picks the highest expected tokens per second, so a plain step wins whenever speculating
is not expected to pay by ``margin``. Each answer keeps a balance of what its drafting
rounds saved or lost against plain steps, at the costs they were priced with; while it is in
deficit the margin grows with the deficit (``required_margin``), so a text whose first bets
lost pays for few more unless the evidence is strong, and a text ahead bets freely. A
drafter whose offers may be probed (``Offer.probe``: its estimate recovers only from its own
drafts) and that could pay if its acceptance were high, but has not drafted for a long
while, is given a short draft so its estimate can recover.

Draft trees (greedy decoding only). When an offer prices trees (``Offer.tree``: its
sources disagree), the controller also weighs trees of m = 2..``max_branches`` branches of
k tokens, the competing continuations verified in one target pass: a tree of n = m * k nodes
is one batch of n + 1 tokens, so it costs ``verify(n)`` as a chain of n drafts would. The
best of chains, trees and a plain step wins. Trees are never planned for sampled decoding:
exact speculative sampling over a tree (per-branch residual distributions) is not
implemented, so ``choose(..., sampled=True)`` prices chains only.

The controller knows no drafter by name: what a drafter learns is its own
(``Drafter.observe``). Pure arithmetic: no clocks, no model calls, no I/O.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace

from localspec.core.acceptance import OPTIMISTIC_ALPHA
from localspec.core.costs import CostProfile, LiveCosts
from localspec.core.drafting.base import Offer
from localspec.core.tree import MAX_BRANCHES, TREE_MAX_NODES

# A draft is taken only when it is expected to beat a plain step by this factor: estimates
# and measured costs are noisy, and the best of many noisy candidates is biased upward, so
# a smaller expected gain is within the noise (docs/how-it-works.md#what-makes-a-draft-pay).
SPECULATE_MARGIN = 1.1
# The answer's running balance against plain decoding (what its drafting rounds saved or
# lost, at the cost model's prices) sets how sure a draft must be: in deficit, the margin grows
# by the deficit over LOSS_BUDGET of the plain time of the answer so far (at least
# LOSS_HORIZON tokens of it). Drafts are bets that pay on average; a text where the first
# bets lost (code rewritten line by line, each copy parting after a few tokens) would
# otherwise keep paying for them. Once ahead, the plain margin applies again.
LOSS_BUDGET = 0.05
LOSS_HORIZON = 200
# However deep the deficit, the bar stays within reach: at most this share of the fastest a
# draft on the strongest evidence could be expected to run on this machine (a long copy, as
# the copying drafters price one that has not been drafted from yet: a chance of REACH_CHANCE
# that it holds, REACH_ALPHA a token along it), in plain steps' rates. Only drafting rounds
# move the balance, so a bar above what such a draft is expected to reach (one long draft
# that parted early, on a machine where a long verify costs tens of plain steps) would end
# drafting for the rest of the answer, copies and predictions included.
REACH_SHARE = 0.75
REACH_CHANCE = 0.97
REACH_ALPHA = 0.99
REACH_DRAFT = 64  # the longest draft the reach is measured over


@dataclass(frozen=True)
class Choice:
    """What the controller chose for a round: a drafter and its draft length (or a tree of
    ``branches`` drafts of that length), or a plain step; and why."""

    drafter: str | None  # the drafter's name; None: a plain step
    k: int
    expected_tokens_per_s: float
    reason: str
    match: int = 0  # the matched length the choice drafts from, for the round's record
    branches: int = 1  # a draft tree of this many branches of k tokens each (1: a chain)


PLAIN_STEP = Choice(None, 0, 0.0, "plain step")


class Controller:
    def __init__(
        self,
        costs: CostProfile | LiveCosts,
        *,
        draft_min: int = 1,
        probe_every: int = 64,
        fixed: bool = False,
        margin: float = SPECULATE_MARGIN,
        trees: bool = False,
        max_branches: int = MAX_BRANCHES,
    ) -> None:
        """``fixed`` drafts as far as a drafter offers whenever one can (no cost model).
        ``trees``: draft trees of at most ``max_branches`` branches may be planned (for
        greedy rounds only, and never when ``fixed``)."""
        self.costs = costs if isinstance(costs, LiveCosts) else LiveCosts(costs)
        self.draft_min = draft_min
        self.probe_every = probe_every
        self.fixed = fixed
        self.margin = margin
        self.trees = trees and not fixed
        self.max_branches = max(1, min(max_branches, MAX_BRANCHES))
        self._rounds = 0  # rounds observed
        self._last_drafted: dict[str, int] = {}  # by drafter: the round it last drafted
        self._balance = 0.0  # seconds this answer's drafting rounds saved (< 0: lost)
        self._tokens = 0  # tokens this answer has emitted

    def choose(
        self, offers: list[Offer], *, sampled: bool = False, nodes: int = TREE_MAX_NODES
    ) -> Choice:
        """Choose this round's drafter and draft length among ``offers`` (each already
        bounded by its drafter's limit), or a plain step; a draft tree too when trees are
        on, the round is greedy (not ``sampled``) and an offer prices trees, of at most
        ``nodes`` nodes (what the context and the target's batch still hold)."""
        offers = [o for o in offers if o.available >= 1]
        if self.fixed:
            for offer in offers:
                reason = f"fixed {offer.drafter} draft of {offer.available}"
                return Choice(offer.drafter, offer.available, 0.0, reason, offer.match)
        nodes = min(nodes, TREE_MAX_NODES)
        trees = self.trees and not sampled
        plain = Choice(None, 0, 1.0 / self.costs.plain_s, "plain step")
        best = Choice(None, 0, plain.expected_tokens_per_s * self.required_margin, "plain step")
        chosen: Offer | None = None
        for offer in offers:
            candidates = self._chains(offer)
            if trees:
                candidates = itertools.chain(candidates, self._trees(offer, nodes))
            for k, m, rate in candidates:
                if rate > best.expected_tokens_per_s:
                    shape = f"k={k}" if m == 1 else f"tree {m}x{k}"
                    what = f"{offer.drafter} {shape}{offer.label}"
                    best = Choice(
                        offer.drafter, k, rate, f"{what}: {rate:.1f} tok/s expected", branches=m
                    )
                    chosen = offer
        if chosen is None:
            return self._probe(offers) or plain
        return replace(best, match=chosen.match)

    @property
    def required_margin(self) -> float:
        """How many times a plain step's rate a draft must be expected to reach: ``margin``,
        raised while this answer's drafts have lost time (see ``LOSS_BUDGET``)."""
        deficit = max(0.0, -self._balance)
        if deficit == 0.0:
            return self.margin
        budget = LOSS_BUDGET * self.costs.plain_s * max(self._tokens, LOSS_HORIZON)
        return min(self.margin * (1.0 + deficit / budget), max(self.margin, self.reach()))

    def reach(self) -> float:
        """``REACH_SHARE`` of the fastest a draft on the strongest evidence is expected to
        run at these costs (see ``REACH_CHANCE``), as a multiple of a plain step's rate."""
        plain, best, accepted = self.costs.plain_s, 0.0, 0.0
        for k in range(1, REACH_DRAFT + 1):
            accepted += REACH_CHANCE * REACH_ALPHA**k
            best = max(best, (1.0 + accepted) * plain / self.costs.verify(k))
        return REACH_SHARE * best

    def _seconds(self, offer: Offer, k: int) -> float:
        """Draft and verify time of a k-token draft from ``offer``."""
        return self.costs.verify(k) + offer.draft_seconds(k)

    def _chains(self, offer: Offer) -> Iterator[tuple[int, int, float]]:
        """(k, 1, expected tokens per second) of every chain ``offer`` could draft."""
        acc = offer.expected_accepted(offer.available)
        for k in range(self.draft_min, offer.available + 1):
            yield k, 1, (1.0 + acc[k - 1]) / self._seconds(offer, k)

    def _trees(self, offer: Offer, nodes: int) -> Iterator[tuple[int, int, float]]:
        """(k, m, expected tokens per second) of every tree of m >= 2 branches of k tokens
        (at most ``nodes`` nodes) an offer that prices trees could draft."""
        if offer.tree is None:
            return
        for m in range(2, min(self.max_branches, offer.branches) + 1):
            top = min(offer.available, nodes // m)
            if top < self.draft_min:
                break
            acc = offer.tree(m, top)
            for k in range(self.draft_min, top + 1):
                yield k, m, (1.0 + acc[k - 1]) / self.costs.verify(m * k)

    def idle(self, drafter: str) -> int:
        """Rounds since ``drafter`` last drafted (or since this controller began)."""
        return self._rounds - self._last_drafted.get(drafter, 0)

    def _probe(self, offers: list[Offer]) -> Choice | None:
        """A short draft from a drafter left idle for long, if it could pay at all: a probe
        that could never win would only cost time."""
        plain_rate = 1.0 / self.costs.plain_s
        for offer in offers:
            # Others (copies) learn from the drafts rounds pass over, and a probe costs a
            # verify batch.
            if not offer.probe or self.idle(offer.drafter) < self.probe_every:
                continue
            k = min(3, offer.available)
            hoped = sum(OPTIMISTIC_ALPHA**j for j in range(k + 1))
            if hoped / self._seconds(offer, k) <= plain_rate:
                continue
            return Choice(offer.drafter, k, 0.0, f"probe {offer.drafter} k={k}", offer.match)
        return None

    def new_generation(self) -> None:
        """A new answer starts even: its balance against plain decoding is its own. Costs
        are properties of the machine and are kept whole."""
        self._balance, self._tokens = 0.0, 0

    def observe_timing(self, k: int, verify_s: float) -> None:
        """What verifying k drafts took (a plain step when k is 0)."""
        self.costs.observe_verify(k, verify_s)

    def observe(self, choice: Choice, offer: Offer | None, drafted: int, accepted: int) -> None:
        """Fold in a finished round: ``offer`` is the one the choice drafted from, after
        its drafter (and the costs) learned from the round."""
        self._rounds += 1
        if choice.drafter is not None:
            self._last_drafted[choice.drafter] = self._rounds
        self._tokens += accepted + 1
        if offer is not None and drafted > 0:
            # At the cost model's prices, not the round's own timing, so that noise on a
            # busy machine does not move the balance.
            if choice.branches > 1:  # a tree of k * m nodes, verified as one batch
                spent = self.costs.verify(choice.k * choice.branches)
            else:
                spent = self._seconds(offer, drafted)
            self._balance += (accepted + 1) * self.costs.plain_s - spent
