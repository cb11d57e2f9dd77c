"""Measure what speculation costs on this machine for a loaded pair.

``measure_costs`` times, on the models themselves: a plain target step (one token, one
logits row), a target batch verifying k drafts (k+1 tokens, logits for every one) for each
k, and a draft-model step. The minimum over repetitions is kept: interference from other
work only ever adds time. Results feed ``controller.CostProfile``; ``CostCache`` keeps them
per model pair, thread count and machine so later runs skip the measurement.
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from localspec.cached_model import CachedModel
from localspec.controller import CostProfile


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
    reps: int = 2,
) -> CostProfile:
    """``context``: a few dozen real tokens; the measurement appends copies of them."""
    base = list(context)
    extra = (base * (k_max // max(len(base), 1) + 2))[: k_max + 1]

    def step(model: CachedModel, n: int) -> float:
        model.forward(base, 0)
        return _timed(lambda: model.forward(base + extra[:n], n))

    step(target, 4)  # warm-up: first batches allocate and choose kernels
    plain = min(step(target, 1) for _ in range(reps + 2))
    verify = {k: min(step(target, k + 1) for _ in range(reps)) for k in range(1, k_max + 1)}
    draft_step = None
    if draft is not None:
        step(draft, 2)
        draft_step = min(step(draft, 1) for _ in range(reps + 2))
    target.truncate(0)
    if draft is not None:
        draft.truncate(0)
    return CostProfile(plain_s=plain, verify_s=verify, draft_step_s=draft_step)


def machine_key(*parts: object) -> str:
    """A stable key for a pair on this machine: file identities, settings, CPU."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    raw = json.dumps([cpu, *[str(p) for p in parts]])
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

    def load(self, key: str) -> CostProfile | None:
        path = self.directory / f"{key}.json"
        try:
            return CostProfile.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None  # missing or unreadable: measure again

    def save(self, key: str, costs: CostProfile) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self.directory / f"{key}.json.tmp"
        tmp.write_text(json.dumps(costs.to_dict(), indent=1))
        tmp.replace(self.directory / f"{key}.json")
