"""The cost model that chooses, each round, the drafter and draft length (or none).

Inputs: what each drafter offers this round (``drafters.Offer``), this machine's costs
(``costs.LiveCosts``) and running estimates of conditional acceptance per draft position:
one for the draft model, and for the streaks (copies under way) of each copying drafter
(prompt lookup, the datastore) one per bucket of matched suffix length. For every candidate
(plain step; each offer with k = 1..available) it computes

    E[tokens] = 1 + sum_{j=1..k} prod_{i<=j} alpha_i        (the +1 is the target's token)
    seconds   = verify(k) + draft set-up + k * draft step   (copied drafts cost no steps)

and picks the highest expected tokens per second, so a plain step wins whenever speculating
is not expected to pay by ``margin``. Each answer keeps a balance of what its drafting
rounds saved or lost against plain steps, at the costs they were priced with; while it is in
deficit the margin grows with the deficit (``required_margin``), so a text whose first bets
lost pays for few more unless the evidence is strong, and a text ahead bets freely.

A copying offer not yet shown to be a copy is priced as a mixture: with this text's chance
of a long copy it runs on at ``COPY_ALPHA`` a token, otherwise it parts at the match
length's own rate. That chance is learned per text and per copying drafter from its drafts
and from the drafts rounds passed over (``observe_passed``), graded as the answer goes on;
a passed-over draft of a copy under way teaches that copy's estimate. A draft model that
could pay if its acceptance were high, but has not been tried for a long while, is probed
with a short draft so its estimate can recover.

Draft trees (greedy decoding only). When a copying offer's sources disagree
(``Offer.shares``), the controller also prices trees of m = 2..``MAX_BRANCHES`` branches of
k tokens, the competing continuations verified in one target pass: a tree of n = m * k nodes
is one batch of n + 1 tokens, so it costs ``verify(n)`` as a chain of n drafts would, and
it keeps the copy going when any of its branches is the one the answer copies, so its long
copy chance is the chain's times (the m branches' shares) / (the drafted one's share). The
best of chains, trees and a plain step wins. Trees are never planned for sampled decoding:
exact speculative sampling over a tree (per-branch residual distributions) is not
implemented, so ``plan(..., sampled=True)`` prices chains only.

What was learned can be exported (``learned``) and restored (``restore``) so that the next
process starts warm; restored evidence is discounted so that new rounds soon outweigh it,
and a text's odds of copies start afresh (they belong to the text that earned them).
Pure arithmetic: no clocks, no model calls, no I/O.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from localspec.core.acceptance import (
    COPY_ALPHA,
    COPY_DEPTH,
    COPY_MAX,
    COPY_ODDS,
    RESYNC,
    STORE_COPY_ODDS,
    STORE_PARTING_ALPHA,
    AcceptanceEstimate,
    CopyEvidence,
    copy_chance,
    load_streaks,
    ngram_bucket,
    parting_alpha,
    streak_estimate,
)
from localspec.core.costs import CostProfile, LiveCosts
from localspec.core.drafters import Offer
from localspec.core.ngram import STREAK_MIN
from localspec.core.params import DrafterKind

MODEL_PRIOR = 0.6
# A draft is taken only when it is expected to beat a plain step by this factor: estimates
# and measured costs are noisy, and the best of many noisy candidates is biased upward, so a
# draft expected to win by less loses about as often as it wins (measured on prose).
SPECULATE_MARGIN = 1.1
OPTIMISTIC_ALPHA = 0.9  # acceptance a probe hopes for; no probe if even that would not pay
MAX_BRANCHES = 4  # most branches of a draft tree (each takes one of the target's sequences)
TREE_MAX_NODES = 64  # most nodes of a draft tree: as long as the longest n-gram chain
FIXED_MODEL_P_MIN = 0.75  # llama.cpp's default draft confidence cut-off
# What a new prompt keeps of the evidence learned before it: it may be another kind of text
# (code vs prose), whose acceptance differs a lot, so its own rounds soon outweigh the rest.
PROMPT_KEEP = 0.1
# The answer's running balance against plain decoding (what its drafting rounds saved or
# lost, at the cost model's prices) sets how sure a draft must be: in deficit, the margin grows
# by the deficit over LOSS_BUDGET of the plain time of the answer so far (at least
# LOSS_HORIZON tokens of it). Drafts are bets that pay on average; a text where the first
# bets lost (code rewritten line by line, each copy parting after a few tokens) would
# otherwise keep paying for them. Once ahead, the plain margin applies again.
LOSS_BUDGET = 0.05
LOSS_HORIZON = 200


# Drafters whose drafts are copies of earlier text, priced by ``copy_curve``; each has its
# own odds and streak estimates, since one may copy where the other does not.
COPYING = (DrafterKind.NGRAM, DrafterKind.STORE)
_START_ODDS = {DrafterKind.NGRAM: COPY_ODDS, DrafterKind.STORE: STORE_COPY_ODDS}


def _copy_bucket(offer: Offer) -> int:
    """The bucket an n-gram offer not yet shown to be a copy is priced and graded in."""
    return RESYNC if offer.resync else ngram_bucket(offer.match)


def _evidence(offer: Offer) -> str:
    if offer.resync:
        return " (resuming a parted copy)"
    if offer.match:
        return f" (match {offer.match}{', streak' if offer.streak else ''})"
    return ""


@dataclass(frozen=True)
class Plan:
    drafter: DrafterKind | None  # None: a plain step
    k: int
    expected_tokens_per_s: float
    reason: str
    p_min: float = 0.0
    match: int = 0  # the n-gram match length the plan drafts from (0: none)
    branches: int = 1  # a draft tree of this many branches of k tokens each (1: a chain)


class Controller:
    def __init__(
        self,
        costs: CostProfile,
        *,
        allow: tuple[DrafterKind, ...] = (DrafterKind.NGRAM, DrafterKind.MODEL),
        draft_max: int = 16,
        ngram_draft_max: int = 64,
        draft_min: int = 1,
        probe_every: int = 64,
        fixed: bool = False,
        margin: float = SPECULATE_MARGIN,
        trees: bool = False,
        max_branches: int = MAX_BRANCHES,
    ) -> None:
        """``fixed`` drafts ``draft_max`` tokens whenever a drafter can (no cost model).
        ``trees``: draft trees of at most ``max_branches`` branches may be planned (for
        greedy rounds only, and never when ``fixed``)."""
        self.costs = LiveCosts(costs)
        self.allow = tuple(
            a for a in allow if a != DrafterKind.MODEL or costs.draft_step_s is not None
        )
        self.limits = {
            DrafterKind.MODEL: draft_max,
            DrafterKind.NGRAM: draft_max if fixed else ngram_draft_max,
        }
        self.draft_min = draft_min
        self.probe_every = probe_every
        self.fixed = fixed
        self.margin = margin
        self.trees = trees and not fixed
        self.max_branches = max(1, min(max_branches, MAX_BRANCHES))
        self.limits[DrafterKind.STORE] = self.limits[DrafterKind.NGRAM]
        self.model = AcceptanceEstimate(prior=MODEL_PRIOR)
        # per copying drafter, per match-length bucket
        self.streaks: dict[DrafterKind, dict[int, AcceptanceEstimate]] = {k: {} for k in COPYING}
        self.copies = {kind: CopyEvidence(_START_ODDS[kind]) for kind in COPYING}
        self._idle = {kind: 0 for kind in DrafterKind}
        self._generations = 0
        self._balance = 0.0  # seconds this answer's drafting rounds saved (< 0: lost)
        self._tokens = 0  # tokens this answer has emitted

    def limit(self, kind: DrafterKind, remaining: int) -> int:
        """The longest draft ``kind`` may propose when ``remaining`` drafts can still be used."""
        return min(self.limits[kind], remaining)

    def estimate(self, offer: Offer) -> AcceptanceEstimate | None:
        """The learned per-position acceptance ``offer`` is priced with: the draft model's,
        or a streak's per drafter and match-length bucket; None for a copying offer not yet
        shown to be a copy (priced by ``copy_curve``)."""
        if offer.kind == DrafterKind.MODEL:
            return self.model
        if not offer.streak:
            return None
        streaks = self.streaks[offer.kind]
        bucket = ngram_bucket(offer.match)
        if bucket not in streaks:
            streaks[bucket] = streak_estimate()
        return streaks[bucket]

    def expected_accepted(self, offer: Offer, k: int) -> list[float]:
        """Cumulative expected accepted tokens for drafts of 1..k from ``offer``."""
        est = self.estimate(offer)
        return est.expected_accepted(k) if est is not None else self.copy_curve(offer, k)

    def copy_curve(self, offer: Offer, k: int, scale: float = 1.0) -> list[float]:
        """Expected accepted tokens for drafts of 1..k from a copying offer not yet shown to
        be a copy: a long copy (``COPY_ALPHA`` a token) with this text's chance of one at
        this match length from this drafter (times the share of a datastore match's
        occurrences that go on as drafted, and times ``scale``: a tree's branches' shares
        over the drafted one's), else a match that parts at its bucket's rate (a datastore
        match at once: ``STORE_PARTING_ALPHA``)."""
        bucket = _copy_bucket(offer)
        odds = self.copies[offer.kind].odds
        w = min(COPY_MAX, copy_chance(bucket) * odds * offer.support * scale)
        parting = parting_alpha(bucket)
        if offer.kind == DrafterKind.STORE:
            parting = min(parting, STORE_PARTING_ALPHA)
        out, copy, part, total = [], 1.0, 1.0, 0.0
        for _ in range(k):
            copy *= COPY_ALPHA
            part *= parting
            total += w * copy + (1.0 - w) * part
            out.append(total)
        return out

    @property
    def copy_odds(self) -> float:
        """This text's long n-gram copies against what the buckets' chances expected,
        starting from ``COPY_ODDS`` worth ``COPY_PSEUDO`` drafts."""
        return self.copies[DrafterKind.NGRAM].odds

    def _seconds(self, offer: Offer, k: int) -> float:
        """Draft and verify time of a k-token draft from ``offer``."""
        seconds = self.costs.verify(k)
        if offer.kind == DrafterKind.MODEL:
            step = self.costs.draft_step_s or 0.0
            first = self.costs.catch_up(offer.catch_up) if offer.catch_up else step
            seconds += first + (k - 1) * step
        return seconds

    def plan(
        self, offers: list[Offer], *, sampled: bool = False, nodes: int = TREE_MAX_NODES
    ) -> Plan:
        """Choose this round's drafter and draft length among ``offers`` (each already
        bounded by ``limit``), or a plain step; a draft tree too when trees are on, the
        round is greedy (not ``sampled``) and a copying offer's sources disagree, of at most
        ``nodes`` nodes (what the context and the target's batch still hold)."""
        offers = [o for o in offers if o.kind in self.allow and o.available >= 1]
        if self.fixed:
            for offer in offers:
                p_min = FIXED_MODEL_P_MIN if offer.kind == DrafterKind.MODEL else 0.0
                reason = f"fixed {offer.kind} draft of {offer.available}"
                return Plan(offer.kind, offer.available, 0.0, reason, p_min, offer.match)
        nodes = min(nodes, TREE_MAX_NODES)
        trees = self.trees and not sampled
        plain = Plan(None, 0, 1.0 / self.costs.plain_s, "plain step")
        best = Plan(None, 0, plain.expected_tokens_per_s * self.required_margin, "plain step")
        for offer in offers:
            candidates = self._chains(offer)
            if trees:
                candidates = itertools.chain(candidates, self._trees(offer, nodes))
            for k, m, rate in candidates:
                if rate > best.expected_tokens_per_s:
                    shape = f"k={k}" if m == 1 else f"tree {m}x{k}"
                    what = f"{offer.kind} {shape}{_evidence(offer)}"
                    best = Plan(
                        offer.kind, k, rate, f"{what}: {rate:.1f} tok/s expected", branches=m
                    )
        if best.drafter is None:
            return self._probe(offers) or plain
        offer = next(o for o in offers if o.kind == best.drafter)
        p_min = self._p_min() if best.drafter == DrafterKind.MODEL else 0.0
        return replace(best, p_min=p_min, match=offer.match)

    @property
    def required_margin(self) -> float:
        """How many times a plain step's rate a draft must be expected to reach: ``margin``,
        raised while this answer's drafts have lost time (see ``LOSS_BUDGET``)."""
        deficit = max(0.0, -self._balance)
        budget = LOSS_BUDGET * self.costs.plain_s * max(self._tokens, LOSS_HORIZON)
        return self.margin * (1.0 + deficit / budget)

    def _chains(self, offer: Offer) -> Iterator[tuple[int, int, float]]:
        """(k, 1, expected tokens per second) of every chain ``offer`` could draft."""
        acc = self.expected_accepted(offer, offer.available)
        for k in range(self.draft_min, offer.available + 1):
            yield k, 1, (1.0 + acc[k - 1]) / self._seconds(offer, k)

    def _trees(self, offer: Offer, nodes: int) -> Iterator[tuple[int, int, float]]:
        """(k, m, expected tokens per second) of every tree of m >= 2 branches of k tokens
        (at most ``nodes`` nodes) a copying offer whose sources disagree could draft. A copy
        under way (a streak) keeps to its own source: no tree."""
        shares = offer.shares
        if offer.kind not in COPYING or offer.streak or len(shares) < 2 or shares[0] <= 0:
            return
        for m in range(2, min(self.max_branches, len(shares)) + 1):
            top = min(offer.available, nodes // m)
            if top < self.draft_min:
                break
            acc = self.copy_curve(offer, top, sum(shares[:m]) / shares[0])
            for k in range(self.draft_min, top + 1):
                yield k, m, (1.0 + acc[k - 1]) / self.costs.verify(m * k)

    def _probe(self, offers: list[Offer]) -> Plan | None:
        """A short draft from a drafter left idle for long, if it could pay at all: a probe
        that could never win would only cost time."""
        plain_rate = 1.0 / self.costs.plain_s
        for offer in offers:
            # Copy odds recover with every new prompt (``new_generation``) and from passed-over
            # drafts: no probe needed, and a probe costs a verify batch.
            if offer.kind in COPYING or self._idle[offer.kind] < self.probe_every:
                continue
            k = min(3, offer.available)
            hoped = sum(OPTIMISTIC_ALPHA**j for j in range(k + 1))
            if hoped / self._seconds(offer, k) <= plain_rate:
                continue
            p_min = self._p_min() if offer.kind == DrafterKind.MODEL else 0.0
            return Plan(offer.kind, k, 0.0, f"probe {offer.kind} k={k}", p_min, offer.match)
        return None

    def _p_min(self) -> float:
        """Draft confidence below which one more draft token does not pay.

        One more token costs a draft step and a longer verify batch; it pays only when
        its acceptance chance times a plain step's worth of time exceeds that cost.
        """
        c = self.costs
        marginal = (c.draft_step_s or 0.0) + max(c.verify(2) - c.verify(1), 0.0)
        return min(0.95, max(0.05, marginal / (marginal + c.plain_s)))

    def new_generation(self, keep: float = PROMPT_KEEP) -> None:
        """A new prompt may be a different kind of text (code vs prose), whose acceptance
        differs a lot: keep what was learned, but let the new prompt's rounds outweigh it
        within a few rounds. Costs are properties of the machine and are kept whole. The
        first generation keeps what was restored (already discounted) whole."""
        self._generations += 1
        self._balance, self._tokens = 0.0, 0
        if self._generations == 1:
            return
        self.model.shrink(keep)
        for kind in COPYING:
            for est in self.streaks[kind].values():
                est.shrink(keep)
            self.copies[kind].shrink(keep)

    def observe_timing(self, k: int, verify_s: float, draft: Any = None) -> None:
        """What a round took: verifying k drafts, and the draft model's passes if it drafted."""
        self.costs.observe_verify(k, verify_s)
        if draft is not None:
            self.costs.observe_draft(draft.steps, draft.step_seconds)
            self.costs.observe_catch_up(draft.catch_up_tokens, draft.catch_up_seconds)

    def observe(self, plan: Plan, offer: Offer | None, drafted: int, accepted: int) -> None:
        """Fold in a finished round: ``offer`` is the one the plan drafted from."""
        for kind in self._idle:
            self._idle[kind] = 0 if kind == plan.drafter else self._idle[kind] + 1
        self._tokens += accepted + 1
        if offer is not None and drafted > 0:
            # At the cost model's prices, not the round's own timing, so that noise on a
            # busy machine does not move the balance.
            if plan.branches > 1:  # a tree of k * m nodes, verified as one batch
                spent = self.costs.verify(plan.k * plan.branches)
            else:
                spent = self._seconds(offer, drafted)
            self._balance += (accepted + 1) * self.costs.plain_s - spent
            est = self.estimate(offer)
            if est is None:
                self._grade_copy(offer, drafted, accepted)
            else:
                est.observe(drafted, accepted)

    def observe_passed(self, offer: Offer, drafted: int, accepted: int) -> None:
        """A round passed over ``offer``; the answer has since shown that ``drafted`` tokens
        of its continuation would have had ``accepted`` accepted (``accepted == drafted``, or
        the token after the last accepted one is known). Free evidence of whether this text
        copies from where ``offer`` would have copied; for a copy under way (a streak), of
        how far its copies go on, so that estimate recovers too while rounds pass it over."""
        if offer.kind not in COPYING or drafted == 0:
            return
        if offer.streak:
            est = self.estimate(offer)
            assert est is not None
            est.observe(drafted, accepted)
            return
        if accepted == drafted >= STREAK_MIN:  # it held as far as the text went: a copy
            drafted = accepted = COPY_DEPTH  # (a source a few tokens back, e.g. a repeated line)
        self._grade_copy(offer, drafted, accepted)

    def _grade_copy(self, offer: Offer, drafted: int, accepted: int) -> None:
        """A draft held ``COPY_DEPTH`` tokens (a copy) or parted before; a shorter draft
        accepted whole says nothing either way."""
        if accepted < min(drafted, COPY_DEPTH):
            copied = 0.0
        elif accepted >= COPY_DEPTH:
            copied = 1.0
        else:
            return
        expected = copy_chance(_copy_bucket(offer)) * offer.support
        self.copies[offer.kind].grade(copied, expected)

    # -- persistence ----------------------------------------------------------------------

    def learned(self) -> dict[str, Any]:
        """The acceptance evidence, as plain data (see ``restore``)."""

        def streaks(kind: DrafterKind) -> dict[str, Any]:
            return {str(b): est.to_dict() for b, est in sorted(self.streaks[kind].items())}

        return {
            "copies": self.copies[DrafterKind.NGRAM].to_list(),
            "model": self.model.to_dict(),
            "streaks": streaks(DrafterKind.NGRAM),
            "store": {
                "copies": self.copies[DrafterKind.STORE].to_list(),
                "streaks": streaks(DrafterKind.STORE),
            },
        }

    def restore(self, data: Any, keep: float = 0.5) -> None:
        """Start from evidence saved by ``learned``, discounted to ``keep``: the acceptance
        along copies under way and the draft model's, which are properties of the pair. The
        odds of copies are checked but start afresh: they are a property of the text that
        earned them (code that copies its prompt, or prose), and a new process's prompt is
        a new text (replays of the bench's answers in a shuffled order lost up to 10% on
        summaries after code when they were carried over). Raises
        ``ValueError``/``KeyError``/``TypeError`` on malformed data, changing nothing."""
        text_keep = 0.0
        model = AcceptanceEstimate(prior=MODEL_PRIOR)
        model.load(data["model"], keep)
        streaks = {DrafterKind.NGRAM: load_streaks(data["streaks"], keep)}
        copies = {kind: CopyEvidence(_START_ODDS[kind]) for kind in COPYING}
        copies[DrafterKind.NGRAM].load(data["copies"], text_keep)
        store = data.get("store")  # absent from files saved before the datastore drafter
        if store is not None:
            streaks[DrafterKind.STORE] = load_streaks(store["streaks"], keep)
            copies[DrafterKind.STORE].load(store["copies"], text_keep)
        else:
            streaks[DrafterKind.STORE] = {}
        self.model, self.streaks, self.copies = model, streaks, copies
