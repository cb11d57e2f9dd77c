"""Sizes as people write them (``64MB``, ``2GB``, ``1.5GiB``, ``4096``), and the prompt
cache's default bounds from this machine's memory and free disk.

``size_in_bytes(text)``: bytes, or None for text that is not a size. Decimal units (kB, MB,
GB, TB) are powers of 1000, binary ones (KiB, MiB, GiB, TiB, and K, M, G alone) of 1024,
as ``du`` and ``ls -h`` spell them. ``default_bounds(root)``: the memory tier's and the
disk tier's bounds where none is given: an eighth of the memory, at most 2 GiB; a tenth of
the free space under ``root``, at most 4 GiB.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

PROMPT_CACHE_SIZE_ENV = "LOCALSPEC_PROMPT_CACHE_SIZE"
MEMORY_CAP = 2 << 30
DISK_CAP = 4 << 30
_UNITS = {
    "": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}  # fmt: skip
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


def size_in_bytes(text: str) -> int | None:
    match = _SIZE.fullmatch(text)
    if match is None or match.group(2).lower() not in _UNITS:
        return None
    size = float(match.group(1)) * _UNITS[match.group(2).lower()]
    return int(size) if size < 1 << 60 else None


def memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def default_bounds(root: Path) -> tuple[int, int]:
    """The memory tier's and the disk tier's bounds in bytes (see the module docstring)."""
    probe = Path(root)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        free = 0
    return min(MEMORY_CAP, memory_bytes() // 8), min(DISK_CAP, free // 10)
