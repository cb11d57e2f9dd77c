"""Measure what speculation costs on this machine for a loaded pair.

``measure_costs`` times, on the models themselves: a plain target step (one token, one
logits row), a target batch verifying k drafts (k+1 tokens, logits for every one) for each
k, and a draft-model step. The minimum over repetitions is kept: interference from other
work only ever adds time. Results feed ``core.costs.CostProfile``; ``CostCache`` keeps them
per model pair, thread count and machine so later runs skip the measurement.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from localspec.core.cached_model import CachedModel
from localspec.core.costs import CostProfile
from localspec.models.resources import cpu_name


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure_costs(
    target: CachedModel,
    draft: CachedModel | None,
    context: Sequence[int],
    *,
    k_max: int = 16,
    sweeps: int = 3,
) -> CostProfile:
    """``context``: a few dozen real tokens; the measurement appends copies of them.

    Every size is measured once per sweep, sweeps interleaved, keeping each size's
    minimum: a burst of other work then spoils one sample of many sizes rather than every
    sample of one size, and the minimum discards it.
    """
    base = list(context)
    extra = (base * (k_max // max(len(base), 1) + 2))[: k_max + 1]

    def step(model: CachedModel, n: int) -> float:
        model.forward(base, 0)
        return _timed(lambda: model.forward(base + extra[:n], n))

    step(target, 4)  # warm-up: first batches allocate and choose kernels
    draft_prefill = None
    if draft is not None:
        step(draft, 2)
        draft.truncate(0)
        draft_prefill = _timed(lambda: draft.forward(base, 0)) / len(base)
    best: dict[int, float] = {}
    draft_best = float("inf")
    for _ in range(sweeps):
        for k in range(0, k_max + 1):
            t = step(target, k + 1)
            best[k] = min(best.get(k, float("inf")), t)
        if draft is not None:
            draft_best = min(draft_best, *(step(draft, 1) for _ in range(3)))
    target.truncate(0)
    if draft is not None:
        draft.truncate(0)
    plain = best.pop(0)
    return CostProfile(
        plain_s=plain,
        verify_s=best,
        draft_step_s=draft_best if draft is not None else None,
        draft_prefill_s=draft_prefill,
    )


def looks_disturbed(costs: CostProfile) -> bool:
    """A batch of k+1 tokens cannot really be much cheaper than one token; if it measured
    so, other work was competing for the cores while measuring."""
    return any(t < 0.8 * costs.plain_s for t in costs.verify_s.values())


def machine_key(*parts: object) -> str:
    """A stable key for a pair on this machine: file identities, settings, CPU."""
    raw = json.dumps([cpu_name(), *[str(p) for p in parts]])
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def file_identity(path: Path | None) -> str:
    if path is None:
        return "none"
    st = path.stat()
    return f"{path.resolve()}:{st.st_size}:{int(st.st_mtime)}"


class CostCache:
    """JSON files, one per key, under a directory the caller chooses."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def load(self, key: str) -> CostProfile | None:
        path = self.path(key)
        try:
            return CostProfile.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None  # missing or unreadable: measure again

    def save(self, key: str, costs: CostProfile) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f"{key}.json.tmp"
        tmp.write_text(json.dumps(costs.to_dict(), indent=1))
        tmp.replace(self.path(key))
