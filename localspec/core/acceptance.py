"""What the controller knows of acceptance, as pure arithmetic over counts.

- ``NGRAM_BUCKETS``: per matched suffix length, the measured chance that a match starts a
  long copy in a text that copies, and the acceptance per token of a match that parts.
- ``AcceptanceEstimate``: decayed Beta estimates of acceptance per draft position (the draft
  model's, and per bucket the copies under way, ``streak_estimate``).
- ``CopyEvidence``: a copying drafter's graded drafts of this text against what the buckets'
  chances expected: its odds of copying at length.

Every estimate exports its evidence as plain data and loads it back discounted, raising
``ValueError`` on malformed data, so that persisted learning is checked before use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

# n-gram match-length buckets: (smallest length, chance that a match this long starts a long
# copy in a text that copies, acceptance per token of a match that parts). Measured over
# greedy answers of the default pair at every answer position: in code a 16+ token match
# runs on for 16 more tokens 92% of the time and a 2-token match 16%; in prose almost never
# (2% at most, at any length), while a match that parts keeps a few tokens in both (mean 1.2
# tokens after a 2-token match, 4-5 after 12). The parting rates below sit under those means:
# at the measured ones, first drafts in prose cost more than they returned in replays of the
# bench's answers (scripts/ngram_replay.py). Which kind of text this is is learned per text
# (``Controller.copy_odds``).
NGRAM_BUCKETS = (
    (0, 0.3, 0.25),  # RESYNC: resuming a parted copy
    (1, 0.1, 0.0),
    (2, 0.16, 0.1),
    (3, 0.27, 0.25),
    (4, 0.41, 0.48),
    (6, 0.5, 0.62),
    (8, 0.59, 0.7),
    (12, 0.73, 0.78),
    (16, 0.92, 0.92),
)
COPY_ALPHA = 0.99  # per token along a copy of code (measured)
STREAK_PRIOR = 0.97  # the previous n-gram draft was accepted whole: the copy likely goes on
# A new text's odds of long copies against the buckets' chances, worth COPY_PSEUDO drafts of
# evidence: unknown text starts at half, so prose pays for at most a draft or two before
# its drafts and passed-over drafts show that it does not copy. A draft or passed-over draft
# is graded a copy when it held for COPY_DEPTH tokens.
COPY_ODDS = 0.5
# A datastore is the user's own corpus, which may have nothing to do with the text at hand:
# its drafts start at lower odds and earn theirs the same way.
STORE_COPY_ODDS = 0.25
# A long store match says less than a long match in the prompt: a question quoting a file
# matches that file for as long as it quotes it, and the answer then writes its own code.
# Unless the text copies the store, its drafts are priced as parting almost at once (as a
# 3-token prompt match does), so only the copy chance, earned by graded drafts, buys long ones.
STORE_PARTING_ALPHA = 0.25
COPY_PSEUDO = 1.0
COPY_DEPTH = 12
COPY_DECAY = 0.9  # per graded draft: a text that copied may go on to write anew
COPY_MAX = 0.97  # never certain: a copy can always end
RESYNC = 0  # the bucket of drafts that resume a parted copy (``Offer.resync``)


def ngram_bucket(n: int) -> int:
    """The smallest length of the bucket that a match of ``n`` tokens falls in."""
    return max(lo for lo, _, _ in NGRAM_BUCKETS if lo <= max(n, 1))


def copy_chance(bucket: int) -> float:
    return next(w for lo, w, _ in NGRAM_BUCKETS if lo == bucket)


def parting_alpha(bucket: int) -> float:
    return next(a for lo, _, a in NGRAM_BUCKETS if lo == bucket)


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


def streak_estimate() -> AcceptanceEstimate:
    """A copy under way, proven by a long draft accepted whole: what held at the depths
    tried holds deeper too (measured: 0.99 a token all along copies of code)."""
    return AcceptanceEstimate(prior=STREAK_PRIOR, extrapolate=True)


@dataclass
class CopyEvidence:
    """A copying drafter's graded drafts that held ``COPY_DEPTH`` tokens (``copies``) and
    how many of them the buckets' chances expected, both decayed per graded draft."""

    start: float  # the odds before any evidence, worth ``COPY_PSEUDO`` drafts
    copies: float = 0.0
    expected: float = 0.0

    @property
    def odds(self) -> float:
        return (self.copies + COPY_PSEUDO * self.start) / (self.expected + COPY_PSEUDO)

    def grade(self, copied: float, expected: float) -> None:
        self.copies = self.copies * COPY_DECAY + copied
        self.expected = self.expected * COPY_DECAY + expected

    def shrink(self, keep: float) -> None:
        self.copies *= keep
        self.expected *= keep

    def to_list(self) -> list[float]:
        return [round(self.copies, 4), round(self.expected, 4)]

    def load(self, data: Any, keep: float) -> None:
        """Take ``keep`` of saved evidence; ``ValueError`` unless it is well formed."""
        copies, expected = (float(x) for x in data)
        if not (copies >= 0 and expected >= 0 and math.isfinite(copies + expected)):
            raise ValueError("copy evidence must be two non-negative numbers")
        self.copies, self.expected = copies * keep, expected * keep


def load_streaks(data: Any, keep: float) -> dict[int, AcceptanceEstimate]:
    streaks: dict[int, AcceptanceEstimate] = {}
    for key, value in data.items():
        bucket = int(key)
        if bucket not in {lo for lo, _, _ in NGRAM_BUCKETS}:
            raise ValueError(f"unknown n-gram bucket {key!r}")
        est = streak_estimate()
        est.load(value, keep)
        streaks[bucket] = est
    return streaks
