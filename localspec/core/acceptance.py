"""Acceptance estimates every drafter may price its drafts with: pure arithmetic over counts.

- ``AcceptanceEstimate``: decayed Beta estimates of acceptance per draft position (the draft
  model's; a copying drafter's along copies under way).
- ``TextCount``: what a drafter keeps of its evidence as a new answer begins.

Every estimate exports its evidence as plain data and loads it back discounted, raising
``ValueError`` on malformed data, so that persisted learning is checked before use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

# The acceptance a drafter that has not shown its own is hoped to reach: a draft that could
# not pay even at this is never worth trying (a probe, or readying the draft model).
OPTIMISTIC_ALPHA = 0.9
# What a new prompt keeps of the evidence learned before it: it may be another kind of text
# (code vs prose), whose acceptance differs a lot, so its own rounds soon outweigh the rest.
PROMPT_KEEP = 0.1


@dataclass
class TextCount:
    """The answers a drafter has begun."""

    texts: int = 0

    def begin(self, keep: float = PROMPT_KEEP) -> float | None:
        """A new answer begins: the share of the evidence to keep, or None to keep it whole
        (the first answer starts from what was restored, which was discounted already)."""
        self.texts += 1
        return None if self.texts == 1 else keep


@dataclass
class AcceptanceEstimate:
    """Decayed Beta estimates of P(accept position i | positions before it accepted)."""

    prior: float
    prior_weight: float = 2.0
    decay: float = 0.97
    extrapolate: bool = False  # untried depths may inherit more than the prior gives them
    hits: list[float] = field(default_factory=list)
    tries: list[float] = field(default_factory=list)

    def alphas(self, k: int) -> list[float]:
        """Conditional acceptance for positions 1..k. Each position's estimate shrinks
        toward the one before it, since acceptance varies smoothly with depth and deep
        positions are tried less often; unless ``extrapolate``, never above the prior's own
        value at that depth, so a few short successes do not vouch for positions never
        tried."""
        out: list[float] = []
        anchor = self.prior
        for i in range(k):
            h = self.hits[i] if i < len(self.hits) else 0.0
            t = self.tries[i] if i < len(self.tries) else 0.0
            if not self.extrapolate:
                anchor = min(anchor, self.prior)
            anchor = (h + anchor * self.prior_weight) / (t + self.prior_weight)
            out.append(anchor)
        return out

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
        self._grow(drafted)
        for i in range(len(self.tries)):
            self.hits[i] *= self.decay
            self.tries[i] *= self.decay
        self._count(0, drafted, accepted)

    def observe_beyond(self, offset: int, drafted: int, accepted: int) -> None:
        """What a draft accepted whole would have had accepted had it been ``drafted``
        tokens longer: positions ``offset + 1`` on, tested as ``observe`` tests them. The
        draft itself was observed already (and the decay applied then), so nothing decays
        here: this only fills in the depths its length kept untried."""
        self._grow(offset + drafted)
        self._count(offset, drafted, accepted)

    def _grow(self, n: int) -> None:
        while len(self.tries) < n:
            self.hits.append(0.0)
            self.tries.append(0.0)

    def _count(self, offset: int, drafted: int, accepted: int) -> None:
        """Positions ``offset + 1`` on of a draft of ``drafted`` with ``accepted`` accepted:
        those actually tested (up to the first rejected one) and those accepted."""
        for i in range(offset, offset + min(drafted, accepted + 1)):
            self.tries[i] += 1.0
            if i < offset + accepted:
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
