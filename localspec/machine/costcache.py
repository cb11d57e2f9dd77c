"""This machine's step costs for a pair, measured once and cached on disk.

``costs_key`` names a pair loaded with given options on this machine, its models placed as
the placement says; ``cached_costs`` is what was measured for it (without loading
anything), None if nothing. ``step_costs`` returns the cached profile of a loaded pair, or
measures it now (again if the machine looked busy) and saves it; a damaged cache file is
ignored with a warning, and a failure to save is a warning too. Nothing is measured
without ``options.calibrate``; ``options.recalibrate`` measures even when a profile exists.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

from localspec.backend.llama import LlamaModel
from localspec.core.costs import CostProfile
from localspec.machine.calibrate import (
    DRAFT_SIZES,
    CostCache,
    fastest_of,
    file_identity,
    looks_disturbed,
    machine_key,
    measure_costs,
)
from localspec.machine.placement import Placement
from localspec.progress import OnProgress, ProgressKind, tell


class CostOptions(Protocol):
    """What of a pair's options its step costs depend on, and whether to measure them: the
    session's ``ModelOptions`` holds these, among others."""

    @property
    def threads(self) -> int | None: ...
    @property
    def flash_attn(self) -> bool: ...
    @property
    def n_ctx(self) -> int: ...
    @property
    def rpc(self) -> tuple[str, ...]: ...
    @property
    def rpc_split(self) -> tuple[float, ...]: ...
    @property
    def exact(self) -> bool: ...
    @property
    def calibrate(self) -> bool: ...
    @property
    def recalibrate(self) -> bool: ...


CALIBRATION_TEXT = (
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + "
    "fibonacci(n - 2)\n\nfor i in range(10):\n    print(i, fibonacci(i))\n"
)


def costs_key(
    options: CostOptions, placement: Placement, target_path: Path, draft_path: Path | None
) -> str:
    """The calibration cache's key for a pair loaded with ``options`` on this machine, its
    models placed as ``placement`` says (a CPU-only placement adds nothing, so costs
    measured before placement existed stay valid)."""
    return machine_key(
        file_identity(target_path),
        file_identity(draft_path),
        options.threads or os.cpu_count(),
        0,  # kept so that CPU profiles measured before placement keep their keys
        options.flash_attn,
        options.n_ctx,
        *(("rpc", *options.rpc, *options.rpc_split) if options.rpc else ()),  # other costs
        *(("exact",) if options.exact else ()),  # other kernels, other costs
        DRAFT_SIZES,  # a cache measured for other draft lengths is measured again
        *placement.key(),
    )


def cached_costs(
    options: CostOptions, placement: Placement, target_path: Path, draft_path: Path | None
) -> CostProfile | None:
    """What was measured for a pair with ``options``, without loading it; None if nothing."""
    return cost_cache().load(costs_key(options, placement, target_path, draft_path))


def cost_cache() -> CostCache:
    from localspec.models.paths import cache_root

    return CostCache(cache_root() / "calibration")


def step_costs(
    options: CostOptions,
    placement: Placement,
    target: LlamaModel,
    draft: LlamaModel | None,
    target_path: Path,
    draft_path: Path | None,
    on_progress: OnProgress | None,
) -> tuple[CostProfile | None, Path | None]:
    """The loaded pair's step costs and the file they are cached in: read from the cache,
    or measured now and saved; ``(None, None)`` without ``options.calibrate``."""
    if not options.calibrate:
        return None, None
    key = costs_key(options, placement, target_path, draft_path)
    cache = cost_cache()
    costs, problem = (None, "") if options.recalibrate else cache.load_checked(key)
    if problem:
        tell(on_progress, problem, ProgressKind.WARNING)
    if costs is None:
        with cache.measuring(key, on_progress):  # one process measures a pair at a time
            costs = None if options.recalibrate else cache.load(key)  # measured meanwhile
            if costs is None:
                costs = _measure(target, draft, on_progress)
                # Saved even if still disturbed: live timings correct it, and measuring
                # again in every process would cost far more than a rough start.
                problem = cache.save(key, costs)
                if problem:
                    tell(on_progress, problem, ProgressKind.WARNING)
    return costs, cache.path(key)


def _measure(
    target: LlamaModel, draft: LlamaModel | None, on_progress: OnProgress | None
) -> CostProfile:
    tell(
        on_progress,
        "measuring this machine's step costs (once per model pair)",
        ProgressKind.WAIT,
    )
    # A few hundred tokens of context, as in a typical answer: attention cost grows
    # with it, so a near-empty context would flatter every step.
    room = max(8, min(320, target.n_ctx - 80))  # leave room for the k+1 verified tokens
    context = target.tokenize(CALIBRATION_TEXT * 8, add_special=False)[:room]
    costs = measure_costs(target, draft, context)
    if looks_disturbed(costs):
        tell(
            on_progress,
            "the machine looked busy while measuring; measuring again",
            ProgressKind.WAIT,
        )
        costs = fastest_of(costs, measure_costs(target, draft, context))
    return costs
