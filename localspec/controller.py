"""The cost model that chooses, each round, the drafter and draft length (or none).

Inputs: a ``CostProfile`` measured on this machine for the loaded pair (a plain target step,
a target batch verifying k drafts for each k, a draft-model step) and running estimates of
conditional acceptance per drafter and per draft position (for n-gram drafts, per matched
n-gram length too). For every candidate (plain step; n-gram with k = 1..available; model
with k = 1..K) it computes expected tokens per second:

    E[tokens] = 1 + sum_{j=1..k} prod_{i<=j} alpha_i        (the +1 is the target's token)
    seconds   = verify(k) + k * draft_step   (n-gram drafts cost no draft steps)

and picks the best, so a plain step wins whenever speculating is not expected to pay.
Drafters that are not chosen for a long while are probed with a short draft so their
estimates can recover. Costs are live too (``LiveCosts``): what rounds actually take
corrects the calibration, so a machine that got busier or quieter since calibrating is
judged by its present speed. Pure arithmetic: no clocks, no model calls.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from localspec.drafters import MODEL, NGRAM


@dataclass(frozen=True)
class CostProfile:
    """Seconds measured on this machine. ``verify_s[k]`` verifies k drafts (k+1 tokens)."""

    plain_s: float
    verify_s: dict[int, float]
    draft_step_s: float | None = None  # None when there is no draft model
    draft_prefill_s: float | None = None  # per token, when the draft catches up in a batch

    def verify(self, k: int) -> float:
        if k == 0:
            return self.plain_s
        if k in self.verify_s:
            return self.verify_s[k]
        known = sorted(self.verify_s)
        if not known:
            return self.plain_s * (1 + k)
        below = [x for x in known if x < k]
        above = [x for x in known if x > k]
        if below and above:  # linear between the nearest measured sizes
            lo, hi = below[-1], above[0]
            w = (k - lo) / (hi - lo)
            return self.verify_s[lo] * (1 - w) + self.verify_s[hi] * w
        edge = below[-1] if below else above[0]
        return self.verify_s[edge] * (k + 1) / (edge + 1)

    def to_dict(self) -> dict[str, object]:
        return {
            "plain_s": self.plain_s,
            "verify_s": {str(k): v for k, v in sorted(self.verify_s.items())},
            "draft_step_s": self.draft_step_s,
            "draft_prefill_s": self.draft_prefill_s,
        }

    @classmethod
    def from_dict(cls, data: dict) -> CostProfile:
        return cls(
            plain_s=float(data["plain_s"]),
            verify_s={int(k): float(v) for k, v in data["verify_s"].items()},
            draft_step_s=_optional_float(data.get("draft_step_s")),
            draft_prefill_s=_optional_float(data.get("draft_prefill_s")),
        )


def _optional_float(value: object) -> float | None:
    return None if value is None else float(value)  # type: ignore[arg-type]


@dataclass
class _Ema:
    value: float = 0.0
    count: int = 0

    def add(self, x: float, weight: float) -> None:
        self.value = x if self.count == 0 else (1 - weight) * self.value + weight * x
        self.count += 1


class LiveCosts:
    """A calibrated ``CostProfile`` corrected by the time rounds actually take.

    A batch size seen at least ``min_obs`` times costs its running average; other sizes
    cost their calibrated time times the typical observed/calibrated ratio, so a machine
    that is uniformly slower than at calibration is modelled as such.
    """

    def __init__(self, base: CostProfile, *, weight: float = 0.15, min_obs: int = 3) -> None:
        self.base = base
        self.weight, self.min_obs = weight, min_obs
        self._verify: dict[int, _Ema] = {}
        self._draft = _Ema()

    def observe_verify(self, k: int, seconds: float) -> None:
        self._verify.setdefault(k, _Ema()).add(seconds, self.weight)

    def observe_draft(self, steps: int, seconds: float) -> None:
        if steps > 0:
            self._draft.add(seconds / steps, self.weight)

    def scale(self) -> float:
        """Geometric mean of observed/calibrated over well-observed batch sizes (1: none)."""
        logs = [
            math.log(e.value / self.base.verify(k))
            for k, e in self._verify.items()
            if e.count >= self.min_obs and e.value > 0
        ]
        return math.exp(sum(logs) / len(logs)) if logs else 1.0

    def verify(self, k: int) -> float:
        e = self._verify.get(k)
        if e is not None and e.count >= self.min_obs:
            return e.value
        return self.base.verify(k) * self.scale()

    @property
    def plain_s(self) -> float:
        return self.verify(0)

    @property
    def draft_step_s(self) -> float | None:
        if self.base.draft_step_s is None:
            return None
        if self._draft.count >= self.min_obs:
            return self._draft.value
        return self.base.draft_step_s * self.scale()

    def catch_up(self, tokens: int) -> float:
        """Seconds for the draft model to evaluate ``tokens`` it lacks, in one batch."""
        if tokens <= 0 or self.base.draft_step_s is None:
            return 0.0
        per_token = self.base.draft_prefill_s or self.base.draft_step_s / 4
        return tokens * per_token * self.scale()

    def plain_drift(self) -> float | None:
        """Observed / calibrated plain step time, once plain steps were seen enough."""
        e = self._verify.get(0)
        if e is None or e.count < 4 * self.min_obs:
            return None
        return e.value / self.base.plain_s


@dataclass
class AcceptanceEstimate:
    """Decayed Beta estimates of P(accept position i | positions before it accepted)."""

    prior: float
    prior_weight: float = 2.0
    decay: float = 0.97
    hits: list[float] = field(default_factory=list)
    tries: list[float] = field(default_factory=list)

    def alphas(self, k: int) -> list[float]:
        """Conditional acceptance for positions 1..k. Each position's estimate shrinks
        toward the one before it (not toward the prior), since acceptance varies smoothly
        with depth and deep positions are tried less often."""
        out: list[float] = []
        anchor = self.prior
        for i in range(k):
            h = self.hits[i] if i < len(self.hits) else 0.0
            t = self.tries[i] if i < len(self.tries) else 0.0
            anchor = (h + anchor * self.prior_weight) / (t + self.prior_weight)
            out.append(anchor)
        return out

    def alpha(self, i: int) -> float:
        return self.alphas(i + 1)[i]

    def expected_accepted(self, k: int) -> list[float]:
        """Cumulative expected accepted tokens for draft lengths 1..k."""
        out, reach, total = [], 1.0, 0.0
        for a in self.alphas(k):
            reach *= a
            total += reach
            out.append(total)
        return out

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


@dataclass(frozen=True)
class Plan:
    drafter: str | None  # MODEL, NGRAM or None (plain step)
    k: int
    expected_tokens_per_s: float
    reason: str
    p_min: float = 0.0


class Controller:
    def __init__(
        self,
        costs: CostProfile,
        *,
        allow: tuple[str, ...] = (NGRAM, MODEL),
        draft_max: int = 16,
        draft_min: int = 1,
        probe_every: int = 48,
        fixed: bool = False,
    ) -> None:
        """``fixed`` drafts ``draft_max`` tokens whenever a drafter can (no cost model)."""
        self.costs = LiveCosts(costs)
        self.allow = (
            allow if costs.draft_step_s is not None else tuple(a for a in allow if a != MODEL)
        )
        self.draft_max, self.draft_min = draft_max, draft_min
        self.probe_every = probe_every
        self.fixed = fixed
        self.model = AcceptanceEstimate(prior=0.6)
        # n-gram acceptance per (match length, streak): a streak means the previous round's
        # n-gram draft was accepted whole, i.e. the answer is copying a span of the prompt.
        self.ngram: dict[tuple[int, bool], AcceptanceEstimate] = {}
        self._idle = {MODEL: 0, NGRAM: 0}

    def _ngram_estimate(self, n: int, streak: bool = False) -> AcceptanceEstimate:
        prior = 0.8 if streak else min(0.85, 0.25 + 0.1 * n)
        return self.ngram.setdefault((min(n, 6), streak), AcceptanceEstimate(prior=prior))

    def plan(
        self,
        *,
        ngram_n: int | None,
        ngram_available: int,
        remaining: int,
        ngram_streak: bool = False,
        model_catch_up: int = 0,
    ) -> Plan:
        """Choose this round's drafter and draft length.

        ``ngram_n``: length of the current prompt-lookup match (None: no match);
        ``ngram_available``: continuation tokens it offers; ``remaining``: drafts that can
        still be used (tokens left before max-tokens or the context end, minus one);
        ``model_catch_up``: tokens the draft model must evaluate before it can draft.
        """
        kmax = min(self.draft_max, remaining)
        plain_rate = 1.0 / self.costs.plain_s
        best = Plan(None, 0, plain_rate, "plain step")
        # (drafter, longest draft, cumulative expected accepted, seconds per drafted token,
        # seconds before the first draft token)
        options: list[tuple[str, int, list[float], float, float]] = []
        if NGRAM in self.allow and ngram_n is not None and kmax >= 1:
            k = min(kmax, ngram_available)
            est = self._ngram_estimate(ngram_n, ngram_streak)
            options.append((NGRAM, k, est.expected_accepted(k), 0.0, 0.0))
        if MODEL in self.allow and kmax >= 1:
            step = self.costs.draft_step_s or 0.0
            setup = self.costs.catch_up(model_catch_up)
            options.append((MODEL, kmax, self.model.expected_accepted(kmax), step, setup))
        for name, k_top, acc, step, setup in options:
            if self.fixed:
                return Plan(name, k_top, 0.0, f"fixed {name} draft of {k_top}")
            for k in range(self.draft_min, k_top + 1):
                rate = (1.0 + acc[k - 1]) / (setup + self.costs.verify(k) + k * step)
                if rate > best.expected_tokens_per_s:
                    best = Plan(name, k, rate, f"{name} k={k}: {rate:.1f} tok/s expected")
        if best.drafter is None:
            probe = self._probe(options)
            if probe is not None:
                return probe
        if best.drafter == MODEL:
            best = Plan(MODEL, best.k, best.expected_tokens_per_s, best.reason, self._p_min())
        return best

    def _probe(self, options: list[tuple[str, int, list[float], float, float]]) -> Plan | None:
        for name, k_top, _, _, setup in options:
            # A probe must stay cheap: not one that makes the draft model catch up far.
            if self._idle[name] >= self.probe_every and setup <= 2 * self.costs.plain_s:
                k = min(2, k_top)
                return Plan(
                    name, k, 0.0, f"probe {name} k={k}", self._p_min() if name == MODEL else 0
                )
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
        within a few rounds. Costs are properties of the machine and are kept whole."""
        self.model.shrink(keep)
        for est in self.ngram.values():
            est.shrink(keep)

    def observe_timing(
        self, k: int, verify_s: float, model_steps: int = 0, draft_s: float = 0.0
    ) -> None:
        """What a round took: verifying k drafts, and ``model_steps`` draft-model steps."""
        self.costs.observe_verify(k, verify_s)
        self.costs.observe_draft(model_steps, draft_s)

    def observe(
        self,
        drafter: str | None,
        n: int | None,
        drafted: int,
        accepted: int,
        streak: bool = False,
    ) -> None:
        """Fold in a finished round (``n``, ``streak``: the n-gram match it drafted from)."""
        for name in self._idle:
            self._idle[name] = 0 if name == drafter else self._idle[name] + 1
        if drafter == MODEL:
            self.model.observe(drafted, accepted)
        elif drafter == NGRAM and n is not None:
            self._ngram_estimate(n, streak).observe(drafted, accepted)
