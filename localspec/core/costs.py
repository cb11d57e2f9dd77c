"""What speculation costs on this machine: a calibrated profile, corrected as rounds run.

``CostProfile`` holds seconds measured for the loaded pair: a plain target step, a target
batch verifying k drafts (k+1 tokens, logits for each) for the measured k, a draft-model
step and the draft model's catch-up cost per token. Verify costs are used as measured: on
CPUs the curve is not monotonic (kernels change with the batch size), so between measured
sizes the cost is interpolated but never smoothed over a measured point.

``LiveCosts`` corrects the profile's target costs with what rounds actually take, so a
machine that got busier or quieter since calibrating is judged by its present speed; a
drafter that times its own work (the draft model) corrects its costs the same way (``Ema``),
scaled as the target's batches are until it has been timed. ``could_pay`` says whether a
drafter could beat plain decoding at all at such costs. Pure arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

# The durations a measurement can give: no model step takes less than a tenth of a
# microsecond, or more than an hour. A value outside is a damaged or crafted file; one
# too small to divide by would fail every plan.
MIN_SECONDS = 1e-7
MAX_SECONDS = 3600.0


def _positive(value: Any) -> float:
    x = float(value)
    if not MIN_SECONDS <= x <= MAX_SECONDS:  # NaN compares false too
        raise ValueError(f"not a duration between {MIN_SECONDS} and {MAX_SECONDS} s: {value!r}")
    return x


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
        if below:  # past the largest measured size: at that size's cost per token
            edge = below[-1]
            return self.verify_s[edge] * (k + 1) / (edge + 1)
        return self.plain_s + (self.verify_s[above[0]] - self.plain_s) * k / above[0]

    def to_dict(self) -> dict[str, object]:
        return {
            "plain_s": self.plain_s,
            "verify_s": {str(k): v for k, v in sorted(self.verify_s.items())},
            "draft_step_s": self.draft_step_s,
            "draft_prefill_s": self.draft_prefill_s,
        }

    @classmethod
    def from_dict(cls, data: Any) -> CostProfile:
        """Raises ``ValueError`` (or ``TypeError``/``KeyError``) unless every value is a
        duration between ``MIN_SECONDS`` and ``MAX_SECONDS`` and every key a positive
        draft length."""
        if not isinstance(data, dict) or not isinstance(data.get("verify_s"), dict):
            raise ValueError("not a cost profile")
        verify = {}
        for k, v in data["verify_s"].items():
            if int(k) < 1:
                raise ValueError(f"bad draft length {k!r}")
            verify[int(k)] = _positive(v)
        if not verify:
            raise ValueError("no verify costs")
        step, prefill = data.get("draft_step_s"), data.get("draft_prefill_s")
        return cls(
            plain_s=_positive(data["plain_s"]),
            verify_s=verify,
            draft_step_s=None if step is None else _positive(step),
            draft_prefill_s=None if prefill is None else _positive(prefill),
        )


TABLE_SIZE = 129  # draft lengths priced from a precomputed table (longer ones are rare)
CLIP = 1.5  # one observation moves a cost estimate by at most this factor


@dataclass
class Ema:
    """A running average of observed seconds that one outlier cannot drag far."""

    value: float = 0.0
    count: int = 0

    def add(self, x: float, weight: float, expected: float | None = None) -> None:
        """Fold in ``x``, first clipped to [1/CLIP, CLIP] x the value so far (or
        ``expected`` before any): a pause of the whole process (another program, a page
        fault storm) must not make one batch size look slow for many rounds, while a
        machine that really slowed down moves the estimate a step at a time."""
        ref = self.value if self.count else expected
        if ref is not None and ref > 0:
            x = min(max(x, ref / CLIP), ref * CLIP)
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
        self._verify: dict[int, Ema] = {}
        # The controller prices every draft length every round: interpolate once.
        self._base = [base.verify(k) for k in range(TABLE_SIZE)]
        self._scale: float | None = None

    def observe_verify(self, k: int, seconds: float) -> None:
        self._verify.setdefault(k, Ema()).add(seconds, self.weight, self.verify(k))
        self._scale = None

    def scale(self) -> float:
        """Observed/calibrated for batch sizes not observed enough yet: the geometric mean
        over well-observed verify batches; before any, the plain step's ratio, but never
        below 1. A plain step that runs faster than calibrated says little about batches
        (a disturbed calibration of the plain step makes every batch look cheap next to
        it), and pricing batches down on its word drafts where it does not pay; a machine
        that got slower is slower for both."""
        if self._scale is None:
            logs = [
                math.log(e.value / self.base.verify(k))
                for k, e in self._verify.items()
                if k > 0 and e.count >= self.min_obs and e.value > 0
            ]
            if logs:
                self._scale = math.exp(sum(logs) / len(logs))
            else:
                plain = self._verify.get(0)
                seen = plain is not None and plain.count >= self.min_obs
                ratio = plain.value / self.base.plain_s if plain is not None and seen else 1.0
                self._scale = max(1.0, ratio)
        return self._scale

    def verify(self, k: int) -> float:
        e = self._verify.get(k)
        if e is not None and e.count >= self.min_obs:
            return e.value
        base = self._base[k] if k < TABLE_SIZE else self.base.verify(k)
        return base * self.scale()

    @property
    def plain_s(self) -> float:
        return self.verify(0)

    def plain_drift(self) -> float | None:
        """Observed / calibrated plain step time, once plain steps were seen enough."""
        e = self._verify.get(0)
        if e is None or e.count < 4 * self.min_obs:
            return None
        return e.value / self.base.plain_s


class StepCosts(Protocol):
    """What ``could_pay`` prices with: a ``CostProfile`` or ``LiveCosts``."""

    @property
    def plain_s(self) -> float: ...

    def verify(self, k: int) -> float: ...


def could_pay(costs: StepCosts, limit: int, alpha: float, step_s: float = 0.0) -> bool:
    """Whether a draft of some length up to ``limit`` could beat a plain step at these
    costs if each of its tokens were accepted at ``alpha`` and drafting one cost
    ``step_s`` seconds (0 for drafts that cost nothing to make)."""
    plain_rate = 1.0 / costs.plain_s
    hoped = 1.0
    for k in range(1, limit + 1):
        hoped += alpha**k
        if hoped / (costs.verify(k) + k * step_s) > plain_rate:
            return True
    return False
