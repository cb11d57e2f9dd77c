"""What a copy is drafted on: the evidence kinds and the offer that carries one.

Every copying drafter (``copying.CopyDrafter``) says each round what it could draft and on
what evidence, as a ``CopyOffer``; the pricing (``pricing.CopyPricing``) reads the kind and
nothing else about where the copy came from. The kinds (``Evidence``):

- ``MATCH``: the text's last ``match`` tokens occurred earlier (in the prompt, the answer, a
  prediction or a store), or a copy has been followed through the answer's edits for
  ``match`` tokens; worth the prior of its length's bucket (``tunables.MATCH_PRIORS``);
- ``UNDER_WAY``: the same, and drafts of this copy have been accepted whole in a row
  (``copying.Streak``): priced by its own estimate along copies, per length bucket;
- ``RESUMED``: a copy parted a few tokens ago and the answer came back to its source;
- ``START``: the answer has come to a prediction's first tokens, or back to a long copy of
  the prediction after an edit.

Where the copy's occurrences disagree, ``support`` is the share of them behind the draft and
``shares`` the share behind each distinct next token (the drafted one first).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from localspec.core.drafting.tunables import MATCH_PRIORS, RESUMED_PRIOR, START_PRIOR, Prior


class Evidence(Enum):
    MATCH = "match"
    UNDER_WAY = "under way"
    RESUMED = "resumed"
    START = "start"


def match_bucket(n: int) -> int:
    """The smallest length of the bucket that a match of ``n`` tokens falls in."""
    return max(lo for lo, _ in MATCH_PRIORS if lo <= max(n, 1))


def match_prior(n: int) -> Prior:
    bucket = match_bucket(n)
    return next(prior for lo, prior in MATCH_PRIORS if lo == bucket)


@dataclass(frozen=True)
class CopyOffer:
    """What a copy source could draft this round (``available`` tokens at most), and on
    what evidence (module docstring)."""

    available: int
    match: int = 0  # tokens matched, or followed (0 for RESUMED and START)
    evidence: Evidence = Evidence.MATCH
    support: float = 1.0  # share of the occurrences that go on as drafted
    shares: tuple[float, ...] = ()  # per distinct next token, the drafted one first

    @property
    def under_way(self) -> bool:
        return self.evidence is Evidence.UNDER_WAY

    @property
    def prior(self) -> Prior:
        """What a draft on this evidence is worth before the text shows whether it copies
        (a copy under way is priced by its own estimate instead)."""
        if self.evidence is Evidence.START:
            return START_PRIOR
        if self.evidence is Evidence.RESUMED:
            return RESUMED_PRIOR
        return match_prior(self.match)

    @property
    def label(self) -> str:
        """How the round's reason shows the evidence."""
        if self.evidence is Evidence.START:
            return " (the prediction's start)"
        if self.evidence is Evidence.RESUMED:
            return " (resuming a parted copy)"
        if self.match:
            return f" (match {self.match}{', streak' if self.under_way else ''})"
        return ""
