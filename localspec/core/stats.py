"""Acceptance statistics in the field's own words (vLLM, llama.cpp).

- drafted: tokens proposed; accepted: drafted tokens that survived verification.
- acceptance rate = accepted / drafted.
- mean accepted length (tau) = tokens emitted per target forward pass, bonus included,
  i.e. 1 + accepted / rounds (rounds counts every target pass of the decode phase,
  plain steps included).
- per-position acceptance: for position i (1-based), the share of rounds that drafted at
  least i tokens and accepted at least i.
- decode tokens/s excludes prompt processing, which is reported as prefill_s.
- overhead: the decode time spent outside the models' evaluations (the loop's own work:
  drafting by lookup, verification, bookkeeping, events), over the rounds whose models count
  their compute time (``RoundCompleted.compute_seconds``); ``None`` when none does.

- prediction use (``prediction_use``): of a prediction's tokens, how many the answer used
  (answer tokens inside a stretch of at least ``USE_RUN`` tokens the prediction also holds)
  and how many of those were drafted (by any drafter: prompt lookup drafts a prediction's
  text the prompt also holds) rather than written by the target; a prediction the answer
  follows but that drafted little shows here without a trace.

``GenerationStats`` is fed the engine's events and is pure arithmetic: no clocks, no I/O.
It is what ``Finished.stats`` carries; ``merge`` adds another generation's (the choices of
one request, the answers of a conversation), and ``to_dict`` gives the JSON the front ends
print or send. ``trace`` holds every round's choice when the generation was asked to keep it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from localspec.core.drafting.prediction import NAME as PREDICTION
from localspec.core.events import TARGET, PrefillDone, RoundCompleted, TokenEmitted


@dataclass
class DrafterStats:
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    seconds: float = 0.0
    drafted_at: list[int] = field(default_factory=list)  # rounds that drafted >= i+1 tokens
    accepted_at: list[int] = field(default_factory=list)  # ... and accepted >= i+1

    def merge(self, other: DrafterStats) -> None:
        """Add ``other``'s rounds to these."""
        self.rounds += other.rounds
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.emitted += other.emitted
        self.seconds += other.seconds
        for mine, theirs in (
            (self.drafted_at, other.drafted_at),
            (self.accepted_at, other.accepted_at),
        ):
            mine.extend([0] * (len(theirs) - len(mine)))
            for i, n in enumerate(theirs):
                mine[i] += n

    def observe(self, drafted: int, accepted: int, emitted: int, seconds: float) -> None:
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        self.emitted += emitted
        self.seconds += seconds
        while len(self.drafted_at) < drafted:
            self.drafted_at.append(0)
            self.accepted_at.append(0)
        for i in range(drafted):
            self.drafted_at[i] += 1
            if i < accepted:
                self.accepted_at[i] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return 1.0 + self.accepted / self.rounds if self.rounds else 0.0

    def per_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at, strict=True)]

    def to_dict(self) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "emitted": self.emitted,
            "seconds": round(self.seconds, 6),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_accepted_length": round(self.mean_accepted_length, 4),
            "per_position_acceptance": [round(x, 4) for x in self.per_position()],
        }


PLAIN = "none"  # key of plain target steps in by_drafter
USE_RUN = 4  # answer tokens count as copying a prediction in stretches at least this long


@dataclass(frozen=True)
class PredictionUse:
    """What an answer made of its prediction (module docstring)."""

    tokens: int  # the prediction's
    used: int  # answer tokens copying it
    drafted: int  # of those, drafted and accepted
    by_prediction: int  # answer tokens the prediction's own drafts gave

    def to_dict(self) -> dict[str, int]:
        return {
            "used_tokens": self.used,
            "drafted_tokens": self.drafted,
            "drafted_by_prediction": self.by_prediction,
        }

    def summary(self) -> str:
        share = f" ({self.drafted / self.used:.0%})" if self.used else ""
        return (
            f"prediction: {self.tokens} tokens; the answer copied {self.used} of them, "
            f"{self.drafted} drafted{share} ({self.by_prediction} by the prediction), "
            f"{self.used - self.drafted} written by the target"
        )


def prediction_use(
    prediction: Sequence[int], answer: Sequence[int], origins: Sequence[str]
) -> PredictionUse:
    """``answer``'s use of ``prediction``, given each answer token's origin (``TARGET`` or
    the drafter whose draft it was), in time linear in their lengths: every stretch of
    ``USE_RUN`` answer tokens that the prediction holds too marks its tokens used."""
    n = USE_RUN
    held = {tuple(prediction[i : i + n]) for i in range(len(prediction) - n + 1)}
    used = [False] * len(answer)
    for i in range(len(answer) - n + 1):
        if tuple(answer[i : i + n]) in held:
            used[i : i + n] = [True] * n
    drafted = by_prediction = 0
    for on, origin in zip(used, origins, strict=False):
        if on and origin != TARGET:
            drafted += 1
            by_prediction += origin == PREDICTION
    return PredictionUse(len(prediction), min(sum(used), len(prediction)), drafted, by_prediction)


@dataclass
class GenerationStats:
    """Running totals of one generation (or, merged, of a conversation)."""

    prompt_tokens: int = 0
    prefill_evaluated: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    generated_tokens: int = 0
    by_drafter: dict[str, DrafterStats] = field(default_factory=dict)
    # emitted tokens per origin: the target's, and each drafter's that were accepted
    by_origin: dict[str, int] = field(default_factory=lambda: {TARGET: 0})
    overhead_s: float = 0.0  # of decode_s, outside the models' evaluations
    timed_rounds: int = 0  # rounds whose compute time was known (overhead_s covers them)
    trace: list[dict[str, Any]] | None = None  # every round's choice, when asked for
    # The prompt's prefix restored from the prompt cache: tokens, the tier (the last one
    # when merged), and the prefill time that saved.
    restored_tokens: int = 0
    restored_from: str | None = None
    restore_saved_s: float = 0.0
    origins: list[str] = field(default_factory=list, repr=False)  # each emitted token's origin

    def merge(self, other: GenerationStats) -> None:
        """Add ``other``'s totals to these (rates are recomputed from the sums)."""
        self.prompt_tokens += other.prompt_tokens
        self.prefill_evaluated += other.prefill_evaluated
        self.prefill_s += other.prefill_s
        self.decode_s += other.decode_s
        self.generated_tokens += other.generated_tokens
        self.overhead_s += other.overhead_s
        self.timed_rounds += other.timed_rounds
        self.restored_tokens += other.restored_tokens
        self.restored_from = other.restored_from or self.restored_from
        self.restore_saved_s += other.restore_saved_s
        for name, drafter in other.by_drafter.items():
            self.by_drafter.setdefault(name, DrafterStats()).merge(drafter)
        for origin, n in other.by_origin.items():
            self.by_origin[origin] = self.by_origin.get(origin, 0) + n
        self.origins.extend(other.origins)
        if other.trace is not None:
            self.trace = [*(self.trace or []), *other.trace]

    @classmethod
    def merged(cls, all_stats: list[GenerationStats]) -> GenerationStats:
        """The sum of several generations' stats."""
        total = cls()
        for stats in all_stats:
            total.merge(stats)
        return total

    def observe(self, event: object) -> None:
        """Fold one engine event into the totals; other event kinds are ignored."""
        if isinstance(event, PrefillDone):
            self.prompt_tokens += event.prompt_tokens
            self.prefill_evaluated += event.evaluated_tokens
            self.prefill_s += event.seconds
            if event.restored is not None:
                self.restored_tokens += event.restored.tokens
                self.restored_from = event.restored.tier
                self.restore_saved_s += event.restored.saved_s
        elif isinstance(event, TokenEmitted):
            self.generated_tokens += 1
            self.by_origin[event.origin] = self.by_origin.get(event.origin, 0) + 1
            self.origins.append(event.origin)
        elif isinstance(event, RoundCompleted):
            self.decode_s += event.seconds
            if event.compute_seconds is not None:
                self.overhead_s += max(0.0, event.seconds - event.compute_seconds)
                self.timed_rounds += 1
            key = event.drafter or PLAIN
            self.by_drafter.setdefault(key, DrafterStats()).observe(
                event.drafted, event.accepted, event.emitted, event.seconds
            )

    @property
    def rounds(self) -> int:
        return sum(d.rounds for d in self.by_drafter.values())

    @property
    def drafted(self) -> int:
        return sum(d.drafted for d in self.by_drafter.values())

    @property
    def accepted(self) -> int:
        return sum(d.accepted for d in self.by_drafter.values())

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return 1.0 + self.accepted / self.rounds if self.rounds else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        return self.generated_tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def overhead_per_round_ms(self) -> float | None:
        return 1e3 * self.overhead_s / self.timed_rounds if self.timed_rounds else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "prefill_evaluated_tokens": self.prefill_evaluated,
            "generated_tokens": self.generated_tokens,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "mean_accepted_length": round(self.mean_accepted_length, 4),
            "rounds": self.rounds,
            "prefill_s": round(self.prefill_s, 6),
            "prompt_cache": {
                "restored_tokens": self.restored_tokens,
                "from": self.restored_from,
                "saved_s": round(self.restore_saved_s, 3),
            },
            "decode_s": round(self.decode_s, 6),
            "decode_tokens_per_s": round(self.decode_tokens_per_s, 3),
            "overhead_s": round(self.overhead_s, 6) if self.timed_rounds else None,
            "overhead_per_round_ms": (
                round(ms, 4) if (ms := self.overhead_per_round_ms) is not None else None
            ),
            "tokens_by_origin": dict(sorted(self.by_origin.items())),
            "by_drafter": {k: v.to_dict() for k, v in sorted(self.by_drafter.items())},
            **({"trace": self.trace} if self.trace is not None else {}),
        }
