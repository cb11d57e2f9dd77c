"""Generation parameters shared by the engine, the CLI, the TUI and the benchmark.

``DrafterMode`` is the user's choice of drafter (``auto`` chooses per round from measured
costs among every drafter; ``model``, ``ngram``, ``self`` (a draft derived from the
target's own layers, loaded as the draft model) and ``lookahead`` (the target's own rows)
use one drafter each with a fixed policy, as llama.cpp does; ``none`` is plain decoding),
and answers what it needs, its ``Policy`` among them; which drafters each mode drafts with
is the registry's (``core.drafting.registry``).

``GenerationParams`` is validated once (pydantic) so the core can trust its values:
greedy decoding is ``temperature == 0``, and a temperature under ``MIN_TEMPERATURE`` is
taken as 0 (logits divided by less overflow, and no probability is left); the warps
(top-k, top-p, min-p) apply only when sampling, in llama.cpp's order (top-k, top-p,
min-p, then temperature).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# Below this a temperature samples the most likely token anyway: it is decoded greedily.
MIN_TEMPERATURE = 1e-6


class Policy(StrEnum):
    """How a mode plans its rounds, which its controller and drafters are built for.
    ``PRICED``: each round's drafter, draft length and draft tree are chosen among every
    drafter's offers at this machine's measured costs. ``FIXED``: the mode's drafter drafts
    whenever it has a draft, as far as a fixed length and cut-off allow, as llama.cpp's
    examples do."""

    PRICED = "priced"
    FIXED = "fixed"

    @property
    def fixed(self) -> bool:
        return self is Policy.FIXED


class DrafterMode(StrEnum):
    AUTO = "auto"
    MODEL = "model"
    NGRAM = "ngram"
    SELF = "self"
    LOOKAHEAD = "lookahead"
    NONE = "none"

    @property
    def loads_draft_model(self) -> bool:
        """Whether this mode uses the draft model when one is there (so it is loaded)."""
        return self in (DrafterMode.AUTO, DrafterMode.MODEL, DrafterMode.SELF)

    @property
    def needs_draft_model(self) -> bool:
        """Whether this mode cannot run without a draft model."""
        return self in (DrafterMode.MODEL, DrafterMode.SELF)

    @property
    def derives_draft(self) -> bool:
        """Whether its draft model is derived from the target's own layers
        (``localspec models derive-draft``), whatever draft the target is paired with."""
        return self is DrafterMode.SELF

    @property
    def calibrates(self) -> bool:
        """Whether it prices drafts with this machine's measured costs (so the pair is
        calibrated): the cost model, and lookahead's draft length."""
        return self in (DrafterMode.AUTO, DrafterMode.LOOKAHEAD)

    @property
    def policy(self) -> Policy:
        """``PRICED`` for ``auto`` (so the pair is calibrated), ``FIXED`` for the others."""
        return Policy.PRICED if self is DrafterMode.AUTO else Policy.FIXED

    @property
    def learns(self) -> bool:
        """Whether what it learns of acceptance is kept for the next process."""
        return self is DrafterMode.AUTO


class GenerationParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    max_tokens: int = Field(512, ge=1, description="new tokens at most")
    temperature: float = Field(0.0, ge=0.0, le=100.0, description="0 is greedy")
    top_k: int = Field(40, ge=0, description="0 disables top-k")
    top_p: float = Field(0.95, gt=0.0, le=1.0, description="1 disables top-p")
    min_p: float = Field(0.05, ge=0.0, lt=1.0, description="0 disables min-p")
    seed: int | None = Field(None, ge=0, description="sampling seed; None (or -1) draws one")
    drafter: DrafterMode = DrafterMode.AUTO
    draft_max: int = Field(16, ge=1, le=64, description="longest draft-model draft in a round")
    ngram_draft_max: int = Field(64, ge=1, le=128, description="longest n-gram draft in a round")
    draft_min: int = Field(1, ge=1, description="shortest draft worth verifying")
    ngram_min: int = Field(2, ge=1, le=8, description="shortest suffix match that may draft")
    ngram_max: int = Field(32, ge=1, le=64, description="longest suffix match measured")
    stop: tuple[str, ...] = ()
    # OpenAI's predicted outputs: what the answer will mostly be (an edited file's old
    # version), as token ids; drafted from by ``auto`` (``core.drafting.prediction``).
    prediction: tuple[int, ...] = ()
    p_min: float | None = Field(
        None,
        ge=0.0,
        le=1.0,
        description="the draft model's confidence cut-off (None: what pays on this machine)",
    )
    trace: bool = Field(False, description="record every round's choice in the final stats")
    trees: bool = Field(
        True,
        description="auto may verify competing drafts as one draft tree (greedy decoding only)",
    )
    left_out: tuple[str, ...] = Field(
        (), description="drafters (by registry name) the mode does not draft with"
    )
    logprobs: int | None = Field(
        None,
        ge=0,
        le=20,
        description="each token's log-probability under the target, with this many of the "
        "most likely alternatives (None: none)",
    )

    @field_validator("temperature")
    @classmethod
    def _greedy_below_minimum(cls, value: float) -> float:
        return 0.0 if value < MIN_TEMPERATURE else value

    @field_validator("seed", mode="before")
    @classmethod
    def _random_seed(cls, value: object) -> object:
        return None if value == -1 else value  # llama.cpp's spelling of "draw one"

    @model_validator(mode="after")
    def _ngram_range(self) -> GenerationParams:
        if self.ngram_min > self.ngram_max:
            raise ValueError("ngram_min must not exceed ngram_max")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
