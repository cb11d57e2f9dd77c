"""Generation parameters shared by the engine, the CLI, the TUI and the benchmark.

``GenerationParams`` is validated once (pydantic) so the core can trust its values:
greedy decoding is ``temperature == 0``; the warps (top-k, top-p, min-p) apply only when
sampling, in llama.cpp's order (top-k, top-p, min-p, then temperature).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DrafterMode = Literal["auto", "model", "ngram", "none"]


class GenerationParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    max_tokens: int = Field(512, ge=1, description="new tokens at most")
    temperature: float = Field(0.0, ge=0.0, le=100.0, description="0 is greedy")
    top_k: int = Field(40, ge=0, description="0 disables top-k")
    top_p: float = Field(0.95, gt=0.0, le=1.0, description="1 disables top-p")
    min_p: float = Field(0.05, ge=0.0, lt=1.0, description="0 disables min-p")
    seed: int | None = Field(None, description="random seed for sampling; None draws one")
    drafter: DrafterMode = "auto"
    draft_max: int = Field(16, ge=1, le=64, description="longest draft in one round")
    draft_min: int = Field(1, ge=1, description="shortest draft worth verifying")
    ngram_min: int = Field(2, ge=1, le=8, description="shortest n-gram that may match")
    ngram_max: int = Field(4, ge=1, le=16, description="longest n-gram tried first")
    stop: tuple[str, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
