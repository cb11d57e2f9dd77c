"""The bench's decoding modes as a type, and the ``--modes`` text parsed into them.

``BenchMode`` names a mode a bench run can measure: one of ``NAMES``, or
``auto-without-DRAFTER``, ``auto`` with one drafter of the registry left out (``left_out``),
which runs beside ``auto`` to show what that drafter costs or brings. A mode is its name as
text (a ``str``), so records and summaries written as JSON keep the plain names; making one
of another name raises ``ValueError``. A mode knows whether llama.cpp's binaries run it
(``is_native``), which drafter of the engine it runs (``drafter``: auto's variants run auto),
whether it runs the draft model when there is one (``loads_draft_model``, so that the pair
loads it) and whether it cannot run without one (``needs_draft_model``). The groups below
(``ENGINE_MODES``, ``AUTO_MODES``, ``NATIVE_MODES``...) are what the summary compares with
what. ``parse_modes`` turns ``"none,ngram"`` into modes, ``none`` always first, or raises
``UsageError``.
"""

from __future__ import annotations

from typing import Any

from pydantic_core import core_schema

from localspec.core.drafting.registry import drafter_names
from localspec.core.params import DrafterMode
from localspec.errors import UsageError

# Every mode of a fixed name, in the order ``--modes`` lists them.
NAMES = (
    "none",
    "ngram",
    "model",
    "auto",
    # Drafters that need no second model, run when named: self, the draft model when it was
    # derived from the target (``--draft self``), and lookahead (the target's own rows).
    "self",
    "lookahead",
    "auto-store",  # auto with the session's datastores (``--store``); auto has none
    "auto-chains",  # auto without draft trees: single draft chains only
    # auto with each prompt's prediction: the one it gives, else its first code block
    "auto-prediction",
    # auto asked each question again in a fresh process, the history holding its first
    # answer (or the answer to the prompt's ``first`` question)
    "auto-again",
    # auto after an earlier process evaluated the same prompt (the prompt cache on): the
    # first process evaluates it cold and keeps it, the second, recorded, restores it
    "auto-warm",
    # llama-speculative-simple's speculative types; "best native" is the fastest of them all.
    "native-draft",  # llama.cpp with the draft model
    "native-ngram",
    "native-ngram-map-k",
    "native-ngram-mod",
    "native-none",  # llama.cpp without speculation: compared with `none`
    "native-bench",  # llama-bench's plain decoding at the prompt's depth
)
WITHOUT = "auto-without-"  # + a drafter's registry name: auto with that drafter left out


def _left_out(name: str) -> str | None:
    drafter = name.removeprefix(WITHOUT)
    return drafter if name.startswith(WITHOUT) and drafter in drafter_names() else None


class BenchMode(str):
    """A decoding mode of the bench, by name (see the module docstring)."""

    __slots__ = ()

    def __new__(cls, name: str) -> BenchMode:
        name = str(name)
        if name not in NAMES and _left_out(name) is None:
            raise ValueError(f"no bench mode {name!r}")
        return super().__new__(cls, name)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        """Checked from its name, as a field of a pydantic model."""
        return core_schema.no_info_after_validator_function(cls, core_schema.str_schema())

    @property
    def left_out(self) -> str | None:
        """The drafter an ``auto-without-DRAFTER`` mode leaves out of auto's."""
        return _left_out(self)

    @property
    def is_native(self) -> bool:
        """Whether llama.cpp's own binaries run this mode, rather than the engine."""
        return self in NATIVE_MODES

    @property
    def drafter(self) -> DrafterMode:
        """The engine's drafter mode an engine mode runs (auto's variants run auto)."""
        if self.is_native:
            raise ValueError(f"{self} is run by llama.cpp, not by the engine")
        if self in AUTO_MODES or self.left_out is not None:
            return DrafterMode.AUTO
        return DrafterMode(str(self))

    @property
    def loads_draft_model(self) -> bool:
        """Whether this mode runs the draft model when there is one (so it is loaded)."""
        if self.is_native:
            return self == NATIVE_DRAFT
        return self.drafter.loads_draft_model and self.left_out != MODEL_DRAFTER

    @property
    def needs_draft_model(self) -> bool:
        """Whether the engine cannot run this mode without a draft model."""
        return not self.is_native and self.drafter.needs_draft_model


MODEL_DRAFTER = DrafterMode.MODEL.value  # the registry's name of the draft model's drafter
NONE, NGRAM, MODEL, AUTO = map(BenchMode, ("none", "ngram", "model", "auto"))
BASELINE = NONE
ENGINE_MODES = (NONE, NGRAM, MODEL, AUTO)
SELF_MODE, LOOKAHEAD_MODE = BenchMode("self"), BenchMode("lookahead")
MORE_ENGINE_MODES = (SELF_MODE, LOOKAHEAD_MODE)
STORE_MODE = BenchMode("auto-store")
CHAINS_MODE = BenchMode("auto-chains")
PREDICTION_MODE = BenchMode("auto-prediction")
AGAIN_MODE = BenchMode("auto-again")
WARM_MODE = BenchMode("auto-warm")
# Modes a fresh process runs twice, the second recorded.
TWICE_MODES = (AGAIN_MODE, WARM_MODE)
# The cost model's, beside auto-without-DRAFTER.
AUTO_MODES = (AUTO, STORE_MODE, CHAINS_MODE, PREDICTION_MODE, AGAIN_MODE, WARM_MODE)
NATIVE_DRAFT = BenchMode("native-draft")
NATIVE_SPEC_MODES = (
    NATIVE_DRAFT, *map(BenchMode, ("native-ngram", "native-ngram-map-k", "native-ngram-mod")),
)  # fmt: skip
NATIVE_PLAIN = BenchMode("native-none")
NATIVE_BENCH = BenchMode("native-bench")
NATIVE_MODES = (*NATIVE_SPEC_MODES, NATIVE_PLAIN, NATIVE_BENCH)


def parse_modes(text: str) -> tuple[BenchMode, ...]:
    """``"none,ngram"`` -> ``(NONE, NGRAM)``; ``none`` is always included, first."""
    names = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in names if m not in NAMES and _left_out(m) is None]
    if bad or not names:
        without = f"{WITHOUT}DRAFTER (DRAFTER: {', '.join(drafter_names())})"
        raise UsageError(
            f"invalid --modes {text!r}" + (f": unknown {', '.join(bad)}" if bad else ""),
            f"use a comma-separated list of {', '.join(NAMES)}, {without}",
        )
    # Ratios are paired against `none` on the same prompt, so it is always run.
    return tuple(dict.fromkeys([BASELINE, *map(BenchMode, names)]))
