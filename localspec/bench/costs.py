"""``localspec bench costs``: this machine's cost profile, measured now, as a file to keep.

The costs the cost model prices rounds with (``core.costs.CostProfile``: a plain step, a
verify batch per draft length, a draft-model step) are measured for the pair afresh (not
taken from the cache, which it updates) and written as the JSON that ``bench replay
--costs`` and the replay tests read, with the machine they were measured on: its CPU model,
its vector extensions, its cores. A profile per kind of machine lets a change to a drafter
or the controller be replayed at the costs of machines other than the developer's.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

from localspec.progress import OnProgress
from localspec.session.open import open_session
from localspec.session.pair import ModelOptions

# The CPU's vector extensions that move the costs most (a batch's matrix kernels).
EXTENSIONS = ("avx512f", "avx512_vnni", "avx512_bf16", "avx2", "fma", "amx_tile", "neon", "sve")
CPUINFO = Path("/proc/cpuinfo")


def machine(cpuinfo: str | None = None) -> str:
    """The CPU's model, the extensions of ``EXTENSIONS`` it has and its cores, in words."""
    if cpuinfo is None:
        try:
            cpuinfo = CPUINFO.read_text(encoding="utf-8", errors="replace")
        except OSError:
            cpuinfo = ""
    model, flags = platform.processor() or platform.machine(), set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "hardware") and value.strip():
            model = value.strip()
        elif key in ("flags", "features"):
            flags |= set(value.split())
    found = [x for x in EXTENSIONS if x in flags] or ["none of " + ", ".join(EXTENSIONS[:3])]
    return f"{model}; {os.cpu_count() or 1} cores; {' '.join(found)}"


def capture(options: ModelOptions, on_progress: OnProgress | None = None) -> dict[str, Any]:
    """The pair's costs measured now, with the machine and the pair they belong to."""
    options = options.model_copy(
        update={"calibrate": True, "recalibrate": True, "learn": False, "history": False,
                "stores": (), "draft_on_demand": False}
    )  # fmt: skip
    session = open_session(options, on_progress=on_progress)
    try:
        costs, pair = session.costs, session.target_label
    finally:
        session.close()
    assert costs is not None  # recalibrate always measures
    return {"machine": machine(), "pair": pair, **costs.to_dict()}
