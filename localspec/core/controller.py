"""The cost model that chooses, each round, the drafter and draft length (or none).

Inputs: what each drafter offers this round (``drafters.Offer``), this machine's costs
(``costs.LiveCosts``) and running estimates of conditional acceptance per draft position:
one for the draft model, and for n-gram drafts one per bucket of matched suffix length and
streak (a long match is nearly always a copy; a 2-token match is weak evidence). For every
candidate (plain step; each offer with k = 1..available) it computes

    E[tokens] = 1 + sum_{j=1..k} prod_{i<=j} alpha_i        (the +1 is the target's token)
    seconds   = verify(k) + draft set-up + k * draft step   (n-gram drafts cost no steps)

and picks the highest expected tokens per second, so a plain step wins whenever speculating
is not expected to pay. A draft model that could pay if its acceptance were high, but has
not been tried for a long while, is probed with a short draft so its estimate can recover.

What was learned can be exported (``learned``) and restored (``restore``) so that the next
process starts warm; restored evidence is discounted so that new rounds soon outweigh it.
Pure arithmetic: no clocks, no model calls, no I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from localspec.core.costs import CostProfile, LiveCosts
from localspec.core.drafters import Offer
from localspec.core.params import DrafterKind

# n-gram match-length buckets: (smallest length, prior acceptance of the first draft token).
# Measured over greedy answers of the default pair (code and prose, every answer position):
# a match of 16+ tokens is a copy (0.99 per token on code, 0.92 on prose), a 2-token match
# is right about half the time. Priors sit at the cautious end of what was measured.
NGRAM_BUCKETS = (
    (0, 0.5),  # RESYNC: resuming a parted copy
    (1, 0.3),
    (2, 0.4),
    (3, 0.5),
    (4, 0.65),
    (6, 0.75),
    (8, 0.8),
    (12, 0.85),
    (16, 0.95),
)
STREAK_PRIOR = 0.97  # the previous n-gram draft was accepted whole: the copy likely goes on
# After a short match, a draft that survived a few tokens has found a copy and tends to go on:
# each deeper position starts from the previous one's estimate with its failure chance
# scaled by this. Long matches and streaks are copies already, flat with depth.
NGRAM_DEPTH_GAIN = 0.8
# A copy that has not yet shown itself (no streak, a match shorter than COPY_MATCH) drafts at
# most NGRAM_FIRST_MAX tokens: long batches pay little more per accepted token, but cost many
# plain steps when the copy parts at once. After a long draft accepted whole, or on a match
# of COPY_MATCH tokens, the full length is allowed.
NGRAM_FIRST_MAX = 16
COPY_MATCH = 16
MODEL_PRIOR = 0.6
# A draft is taken only when it is expected to beat a plain step by this factor: estimates
# and measured costs are noisy, and the best of many noisy candidates is biased upward, so a
# draft expected to win by less loses about as often as it wins (measured on prose).
SPECULATE_MARGIN = 1.1
# How far this text copies is learned per generation from every n-gram draft: the positions
# that failed against the failures the priors expected there (``Controller.doubt``). Code
# copies far more than prose, and a long first draft that parts at once costs several plain
# steps, so a new text starts doubted: drafts on matches shorter than DOUBT_BELOW have their
# chance of failure scaled by the doubt, and while it is 1 or more they draft at most
# UNPROVEN_MAX tokens. COPY_PSEUDO expected failures' worth of the starting doubt stands
# before the evidence. Chosen with scripts/ngram_replay.py over code and prose answers.
COPY_DOUBT = 1.5
COPY_PSEUDO = 1.0
UNPROVEN_MAX = 4
DOUBT_BELOW = 12  # matches this long are copies in prose too (measured): never doubted
OPTIMISTIC_ALPHA = 0.9  # acceptance a probe hopes for; no probe if even that would not pay
FIXED_MODEL_P_MIN = 0.75  # llama.cpp's default draft confidence cut-off


RESYNC = 0  # the bucket of drafts that resume a parted copy (``Offer.resync``)


def ngram_bucket(n: int) -> int:
    """The smallest length of the bucket that a match of ``n`` tokens falls in."""
    return max(lo for lo, _ in NGRAM_BUCKETS if lo <= max(n, 1))


@dataclass
class AcceptanceEstimate:
    """Decayed Beta estimates of P(accept position i | positions before it accepted)."""

    prior: float
    prior_weight: float = 2.0
    decay: float = 0.97
    depth_gain: float = 1.0  # < 1: deeper positions lean toward acceptance (copies go on)
    extrapolate: bool = False  # untried depths may inherit more than the prior gives them
    hits: list[float] = field(default_factory=list)
    tries: list[float] = field(default_factory=list)

    def alphas(self, k: int, doubt: float = 1.0) -> list[float]:
        """Conditional acceptance for positions 1..k. Each position's estimate shrinks
        toward the one before it, since acceptance varies smoothly with depth and deep
        positions are tried less often; unless ``extrapolate``, never above the prior's own
        value at that depth, so a few short successes do not vouch for positions never
        tried. ``doubt`` scales the prior's chance of failure at every depth (see
        ``Controller.doubt``); evidence is weighed against the scaled prior."""
        out: list[float] = []
        priors = [1.0 - min(1.0, (1.0 - p) * doubt) for p in self.prior_curve(k)]
        anchor = priors[0] if priors else self.prior
        for i, prior in enumerate(priors):
            h = self.hits[i] if i < len(self.hits) else 0.0
            t = self.tries[i] if i < len(self.tries) else 0.0
            if i > 0:
                anchor = 1.0 - (1.0 - anchor) * self.depth_gain
            if not self.extrapolate:
                anchor = min(anchor, prior)
            anchor = (h + anchor * self.prior_weight) / (t + self.prior_weight)
            out.append(anchor)
        return out

    def prior_curve(self, k: int) -> list[float]:
        """The prior's own acceptance at positions 1..k, before any evidence."""
        out, p = [], self.prior
        for i in range(k):
            if i > 0:
                p = 1.0 - (1.0 - p) * self.depth_gain
            out.append(p)
        return out

    def expected_accepted(self, k: int, doubt: float = 1.0) -> list[float]:
        """Cumulative expected accepted tokens for draft lengths 1..k."""
        out, reach, total = [], 1.0, 0.0
        for a in self.alphas(k, doubt):
            reach *= a
            total += reach
            out.append(total)
        return out

    @property
    def evidence(self) -> float:
        return self.tries[0] if self.tries else 0.0

    def shrink(self, keep: float) -> None:
        """Keep only a share of the evidence, so new data outweighs old sooner."""
        self.hits = [h * keep for h in self.hits]
        self.tries = [t * keep for t in self.tries]

    def observe(self, drafted: int, accepted: int) -> None:
        while len(self.tries) < drafted:
            self.hits.append(0.0)
            self.tries.append(0.0)
        for i in range(len(self.tries)):
            self.hits[i] *= self.decay
            self.tries[i] *= self.decay
        for i in range(min(drafted, accepted + 1)):  # positions actually tested
            self.tries[i] += 1.0
            if i < accepted:
                self.hits[i] += 1.0

    def to_dict(self) -> dict[str, list[float]]:
        return {
            "hits": [round(h, 4) for h in self.hits],
            "tries": [round(t, 4) for t in self.tries],
        }

    def load(self, data: Any, keep: float) -> None:
        """Take ``keep`` of saved evidence; ``ValueError`` unless it is well formed."""
        hits, tries = data["hits"], data["tries"]
        if not (isinstance(hits, list) and isinstance(tries, list) and len(hits) == len(tries)):
            raise ValueError("hits and tries must be lists of one length")
        pairs = [(float(h), float(t)) for h, t in zip(hits, tries, strict=True)]
        if any(not (0 <= h <= t and math.isfinite(t)) for h, t in pairs):
            raise ValueError("hits must lie between 0 and tries")
        self.hits = [h * keep for h, _ in pairs]
        self.tries = [t * keep for _, t in pairs]


def _ngram_estimate(bucket: int, streak: bool) -> AcceptanceEstimate:
    prior = dict(NGRAM_BUCKETS)[bucket]
    if streak:  # a copy under way, proven by a long draft accepted whole: what held at the
        # depths tried holds deeper too (measured: 0.99 a token all along copies of code)
        return AcceptanceEstimate(prior=max(prior, STREAK_PRIOR), extrapolate=True)
    if bucket >= 12:  # a copy, as likely to part at any token (measured)
        return AcceptanceEstimate(prior=prior)
    return AcceptanceEstimate(prior=prior, depth_gain=NGRAM_DEPTH_GAIN)


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
    ) -> None:
        """``fixed`` drafts ``draft_max`` tokens whenever a drafter can (no cost model)."""
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
        self.model = AcceptanceEstimate(prior=MODEL_PRIOR)
        self.ngram: dict[tuple[int, bool], AcceptanceEstimate] = {}
        self._idle = {kind: 0 for kind in DrafterKind}
        self._generations = 0
        self._failed = 0.0  # drafted n-gram positions that failed, this text
        self._expected_failed = 0.0  # failures the unscaled priors expected there

    def limit(self, kind: DrafterKind, remaining: int) -> int:
        """The longest draft ``kind`` may propose when ``remaining`` drafts can still be used."""
        return min(self.limits[kind], remaining)

    def estimate(self, offer: Offer) -> AcceptanceEstimate:
        if offer.kind == DrafterKind.MODEL:
            return self.model
        bucket = RESYNC if offer.resync else ngram_bucket(offer.match)
        key = (bucket, offer.streak)
        if key not in self.ngram:
            self.ngram[key] = _ngram_estimate(bucket, offer.streak)
        return self.ngram[key]

    def _seconds(self, offer: Offer, k: int) -> float:
        """Draft and verify time of a k-token draft from ``offer``."""
        seconds = self.costs.verify(k)
        if offer.kind == DrafterKind.MODEL:
            step = self.costs.draft_step_s or 0.0
            first = self.costs.catch_up(offer.catch_up) if offer.catch_up else step
            seconds += first + (k - 1) * step
        return seconds

    def plan(self, offers: list[Offer]) -> Plan:
        """Choose this round's drafter and draft length among ``offers`` (each already
        bounded by ``limit``), or a plain step."""
        offers = [o for o in offers if o.kind in self.allow and o.available >= 1]
        if self.fixed:
            for offer in offers:
                p_min = FIXED_MODEL_P_MIN if offer.kind == DrafterKind.MODEL else 0.0
                reason = f"fixed {offer.kind} draft of {offer.available}"
                return Plan(offer.kind, offer.available, 0.0, reason, p_min, offer.match)
        plain = Plan(None, 0, 1.0 / self.costs.plain_s, "plain step")
        best = Plan(None, 0, plain.expected_tokens_per_s * self.margin, "plain step")
        for offer in offers:
            top = offer.available
            if offer.kind == DrafterKind.NGRAM and not offer.streak and offer.match < COPY_MATCH:
                top = min(top, NGRAM_FIRST_MAX)
            doubt = self.doubt if self._doubted(offer) else 1.0
            if doubt >= 1.0 and self._doubted(offer):  # not yet shown to copy: short drafts
                top = min(top, UNPROVEN_MAX)
            acc = self.estimate(offer).expected_accepted(top, doubt)
            for k in range(self.draft_min, top + 1):
                rate = (1.0 + acc[k - 1]) / self._seconds(offer, k)
                if rate > best.expected_tokens_per_s:
                    what = f"{offer.kind} k={k}{_evidence(offer)}"
                    best = Plan(offer.kind, k, rate, f"{what}: {rate:.1f} tok/s expected")
        if best.drafter is None:
            return self._probe(offers) or plain
        offer = next(o for o in offers if o.kind == best.drafter)
        p_min = self._p_min() if best.drafter == DrafterKind.MODEL else 0.0
        return Plan(
            best.drafter, best.k, best.expected_tokens_per_s, best.reason, p_min, offer.match
        )

    @staticmethod
    def _doubted(offer: Offer) -> bool:
        """Whether ``offer``'s estimate is scaled by ``doubt``: n-gram drafts not yet
        shown to be copies (no streak, a match shorter than DOUBT_BELOW)."""
        return (
            offer.kind == DrafterKind.NGRAM
            and not offer.streak
            and (offer.resync or offer.match < DOUBT_BELOW)
        )

    @property
    def doubt(self) -> float:
        """How many times the priors' chance of failure this text's n-gram drafts show."""
        return (self._failed + COPY_PSEUDO * COPY_DOUBT) / (self._expected_failed + COPY_PSEUDO)

    def _probe(self, offers: list[Offer]) -> Plan | None:
        """A short draft from a drafter left idle for long, if it could pay at all: a probe
        that could never win would only cost time."""
        plain_rate = 1.0 / self.costs.plain_s
        for offer in offers:
            # n-gram estimates recover with every new prompt (``new_generation``) and are
            # backed by the match length: no probe needed, and a probe costs a verify batch.
            if offer.kind == DrafterKind.NGRAM or self._idle[offer.kind] < self.probe_every:
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

    def new_generation(self, keep: float = 0.1) -> None:
        """A new prompt may be a different kind of text (code vs prose), whose acceptance
        differs a lot: keep what was learned, but let the new prompt's rounds outweigh it
        within a few rounds. Costs are properties of the machine and are kept whole. The
        first generation keeps what was restored (already discounted) whole."""
        self._generations += 1
        if self._generations == 1:
            return
        self.model.shrink(keep)
        for est in self.ngram.values():
            est.shrink(keep)
        self._failed *= keep
        self._expected_failed *= keep

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
        if offer is not None and drafted > 0:
            est = self.estimate(offer)
            if offer.kind == DrafterKind.NGRAM:  # each tells how far this text copies
                tested = min(drafted, accepted + 1)
                self._failed += tested - accepted
                self._expected_failed += sum(1.0 - a for a in est.prior_curve(tested))
            est.observe(drafted, accepted)

    # -- persistence ----------------------------------------------------------------------

    def learned(self) -> dict[str, Any]:
        """The acceptance evidence, as plain data (see ``restore``)."""
        return {
            "copy": [round(self._failed, 4), round(self._expected_failed, 4)],
            "model": self.model.to_dict(),
            "ngram": {
                f"{bucket}{'s' if streak else ''}": est.to_dict()
                for (bucket, streak), est in sorted(self.ngram.items())
            },
        }

    def restore(self, data: Any, keep: float = 0.5) -> None:
        """Start from evidence saved by ``learned`` (discounted to ``keep``). Raises
        ``ValueError``/``KeyError``/``TypeError`` on malformed data, changing nothing."""
        model = AcceptanceEstimate(prior=MODEL_PRIOR)
        model.load(data["model"], keep)
        ngram: dict[tuple[int, bool], AcceptanceEstimate] = {}
        for key, value in data["ngram"].items():
            streak = key.endswith("s")
            bucket = int(key.rstrip("s"))
            if bucket not in dict(NGRAM_BUCKETS):
                raise ValueError(f"unknown n-gram bucket {key!r}")
            est = _ngram_estimate(bucket, streak)
            est.load(value, keep)
            ngram[(bucket, streak)] = est
        failed, expected = (float(x) for x in data.get("copy", (0.0, 0.0)))
        if not (failed >= 0 and expected >= 0 and math.isfinite(failed + expected)):
            raise ValueError("copy evidence must be two non-negative numbers")
        self.model, self.ngram = model, ngram
        self._failed, self._expected_failed = failed * keep, expected * keep
