"""The bench's decoding modes as a type, and the ``--modes`` text parsed into them.

``BenchMode`` names every mode a bench run can measure; being a ``StrEnum``, a mode is
also its name as text, so records and summaries written as JSON keep the plain names.
A mode knows whether llama.cpp's binaries run it (``is_native``), which drafter of the
engine it runs (``drafter``: auto's variants run auto), whether it runs the draft model when
there is one (``loads_draft_model``, so that the pair loads it) and whether it cannot run
without one (``needs_draft_model``). The groups below (``ENGINE_MODES``, ``AUTO_MODES``,
``NATIVE_MODES``...) are what the summary compares with what. ``parse_modes`` turns
``"none,ngram"`` into modes, ``none`` always first, or raises ``UsageError``.
"""

from __future__ import annotations

from enum import StrEnum

from localspec.core.params import DrafterMode
from localspec.errors import UsageError


class BenchMode(StrEnum):
    """A decoding mode of the bench, in the order ``--modes`` lists them."""

    NONE = "none"
    NGRAM = "ngram"
    MODEL = "model"
    AUTO = "auto"
    # Drafters that need no second model, run when named: self, the draft model when it was
    # derived from the target (``--draft self``), and lookahead (the target's own rows).
    SELF = "self"
    LOOKAHEAD = "lookahead"
    STORE = "auto-store"  # auto with the session's datastores (``--store``); auto has none
    CHAINS = "auto-chains"  # auto without draft trees: single draft chains only
    # auto with each prompt's prediction: the one it gives, else its first code block
    PREDICTION = "auto-prediction"
    # llama-speculative-simple's speculative types; "best native" is the fastest of them all.
    NATIVE_DRAFT = "native-draft"  # llama.cpp with the draft model
    NATIVE_NGRAM = "native-ngram"
    NATIVE_NGRAM_MAP_K = "native-ngram-map-k"
    NATIVE_NGRAM_MOD = "native-ngram-mod"
    NATIVE_NONE = "native-none"  # llama.cpp without speculation: compared with `none`
    NATIVE_BENCH = "native-bench"  # llama-bench's plain decoding at the prompt's depth

    @property
    def is_native(self) -> bool:
        """Whether llama.cpp's own binaries run this mode, rather than the engine."""
        return self in NATIVE_MODES

    @property
    def drafter(self) -> DrafterMode:
        """The engine's drafter mode an engine mode runs (auto's variants run auto)."""
        if self.is_native:
            raise ValueError(f"{self} is run by llama.cpp, not by the engine")
        return DrafterMode.AUTO if self in AUTO_MODES else DrafterMode(self.value)

    @property
    def loads_draft_model(self) -> bool:
        """Whether this mode runs the draft model when there is one (so it is loaded)."""
        if self.is_native:
            return self is BenchMode.NATIVE_DRAFT
        return self.drafter.loads_draft_model

    @property
    def needs_draft_model(self) -> bool:
        """Whether the engine cannot run this mode without a draft model."""
        return not self.is_native and self.drafter.needs_draft_model


BASELINE = BenchMode.NONE
ENGINE_MODES = (BenchMode.NONE, BenchMode.NGRAM, BenchMode.MODEL, BenchMode.AUTO)
SELF_MODE, LOOKAHEAD_MODE = BenchMode.SELF, BenchMode.LOOKAHEAD
MORE_ENGINE_MODES = (SELF_MODE, LOOKAHEAD_MODE)
STORE_MODE = BenchMode.STORE
CHAINS_MODE = BenchMode.CHAINS
PREDICTION_MODE = BenchMode.PREDICTION
AUTO_MODES = (BenchMode.AUTO, STORE_MODE, CHAINS_MODE, PREDICTION_MODE)  # the cost model's
NATIVE_DRAFT = BenchMode.NATIVE_DRAFT
NATIVE_SPEC_MODES = (
    NATIVE_DRAFT, BenchMode.NATIVE_NGRAM, BenchMode.NATIVE_NGRAM_MAP_K, BenchMode.NATIVE_NGRAM_MOD,
)  # fmt: skip
NATIVE_PLAIN = BenchMode.NATIVE_NONE
NATIVE_BENCH = BenchMode.NATIVE_BENCH
NATIVE_MODES = (*NATIVE_SPEC_MODES, NATIVE_PLAIN, NATIVE_BENCH)


def parse_modes(text: str) -> tuple[BenchMode, ...]:
    """``"none,ngram"`` -> ``(NONE, NGRAM)``; ``none`` is always included, first."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    valid = [mode.value for mode in BenchMode]
    bad = [m for m in names if m not in valid]
    if bad or not names:
        raise UsageError(
            f"invalid --modes {text!r}" + (f": unknown {', '.join(bad)}" if bad else ""),
            f"use a comma-separated list of {', '.join(valid)}",
        )
    # Ratios are paired against `none` on the same prompt, so it is always run.
    return tuple(dict.fromkeys([BASELINE, *map(BenchMode, names)]))
