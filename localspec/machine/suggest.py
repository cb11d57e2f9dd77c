"""Which target suits a GPU: the largest of the catalog's that fits it with its draft.

``suggest_target(gpus, n_ctx)`` looks at the GPU with the most free memory and picks the
largest catalog target that, with the default draft, fits in the share of it placement
plans for (``FREE_SHARE``): each model's file, a tenth of it for its cache at the default
context (Qwen2.5-Coder's caches at 4,096 tokens are 5-10% of their Q4_K_M files) and the
compute buffers placement allows (``GPU_COMPUTE_ALLOWANCE``). Only targets whose catalog
draft is the default draft are considered, so the pair shares one tokenizer. No file is
read: the catalog's sizes are enough for a suggestion, and ``doctor`` makes it before any
model is fetched. The reason is the draft's cost against the target's step there, as
reported for llama.cpp on GPUs (docs/gpu.md); none of it is measured by this module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from localspec.machine.placement import FREE_SHARE
from localspec.models.catalog import load_catalog
from localspec.models.resources import GPU_COMPUTE_ALLOWANCE

CACHE_SHARE = 0.1  # of a model's file: its cache at the default context, rounded up
DEFAULT_CTX = 4096
# Why a larger target pays with a draft on a GPU (reported figures, see docs/gpu.md).
WHY_LARGER = (
    "on a GPU a 1.5B target's step is launch-bound (1-3 ms), so its 0.5B draft costs "
    "0.6-0.8 of a step; draft models pay from about 7B targets up (Qwen2.5-7B with the "
    "0.5B draft: about +50% reported on an RTX 3090; 32B: 1.5-2.5x)"
)


@dataclass(frozen=True)
class Suggestion:
    target: str
    draft: str
    device: str
    need: int  # bytes the pair is planned to take
    room: int  # bytes planned for on the device
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "target": self.target, "draft": self.draft, "device": self.device,
            "need_bytes": self.need, "room_bytes": self.room, "reason": self.reason,
        }  # fmt: skip

    def line(self) -> str:
        return (
            f"for this GPU: --target {self.target} (with {self.draft}, about "
            f"{self.need / 1e9:.1f} GB of the {self.room / 1e9:.1f} GB planned for on "
            f"{self.device}): {self.reason}"
        )


def planned_bytes(size: int, n_ctx: int = DEFAULT_CTX) -> int:
    """What placement would plan a model of a ``size``-byte file to take on a GPU."""
    return int(size * (1 + CACHE_SHARE * n_ctx / DEFAULT_CTX)) + GPU_COMPUTE_ALLOWANCE


def suggest_target(gpus: list[Any], n_ctx: int = DEFAULT_CTX) -> Suggestion | None:
    """The largest catalog target that fits the roomiest of ``gpus`` (``Device``s) with
    the default draft; None without a GPU, or when not even the smallest fits."""
    if not gpus:
        return None
    gpu = max(gpus, key=lambda d: d.free)
    room = int(gpu.free * FREE_SHARE)
    catalog = load_catalog()
    draft = catalog.models[catalog.defaults.draft]
    fits = [
        (entry.size, name, planned_bytes(entry.size, n_ctx) + planned_bytes(draft.size, n_ctx))
        for name, entry in catalog.models.items()
        if entry.role == "target" and entry.draft == draft.name
    ]
    fits = [f for f in fits if f[2] <= room]
    if not fits:
        return None
    _, name, need = max(fits)
    default = catalog.defaults.target
    reason = WHY_LARGER if name != default else "no larger target of the catalog fits"
    return Suggestion(name, draft.name, gpu.name, need, room, reason)
