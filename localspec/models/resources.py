"""Memory estimate for loading a target/draft pair, so a front end can warn before a load.

Contract: ``estimate_memory(target, draft, n_ctx)`` returns ``(needed, available)`` in bytes.
``needed`` is the model files (mapped into memory whole) plus each model's f16 KV cache for
``n_ctx`` tokens (2 x layers x n_ctx x kv_heads x head_dim x 2 bytes, from the GGUF metadata)
plus a fixed allowance for compute buffers. ``available`` is ``MemAvailable`` from
``/proc/meminfo`` (or the free physical pages where that file is missing), ``None`` when
the platform tells neither. Unreadable metadata counts as no KV cache rather than an error:
this is advice, and the load itself reports broken files. The header is untrusted: shapes
beyond ``MAX_*`` (far past any real model) count as unreadable too, so a crafted
``block_count`` neither raises nor allocates.

``model_name(path)`` is a model's name as its header gives it (its file's stem otherwise).

``footprint(path, n_ctx)`` describes a model for GPU placement: its offloadable layers
(llama.cpp counts the blocks and the output layer), its weights and its KV cache; its
``needed(n)`` is the GPU memory ``n`` offloaded layers take.

``check_disk(directory, needed)`` raises ``DownloadError`` with the numbers when a pull
would not fit; ``human(n)`` formats byte counts for messages.
"""

from __future__ import annotations

import os
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path

from localspec.errors import DownloadError
from localspec.models.gguf import read_metadata

# Compute buffers and runtime bookkeeping per loaded model, measured loosely on llama.cpp.
OVERHEAD_PER_MODEL = 128 << 20
# llama.cpp's compute buffers on a GPU (the logits of a 512-token batch alone are
# 512 x n_vocab floats, 311 MB for a 151,936-token vocabulary) and its bookkeeping.
GPU_COMPUTE_ALLOWANCE = 512 << 20
# Room left on the disk after a pull, so a model never fills it to the last byte.
DISK_MARGIN = 256 << 20
# Bounds of a believable GGUF shape (the largest models have ~130 layers, 16k-wide
# embeddings and 128 heads of 256).
MAX_LAYERS = 4096
MAX_WIDTH = 1 << 20  # embedding length, head dimensions
MAX_HEADS = 1 << 16


def kv_cache_bytes(path: Path, n_ctx: int) -> int:
    """f16 K and V for ``n_ctx`` positions, all layers; 0 if the metadata is unreadable."""
    return _shape(path, n_ctx)[1]


def _shape(path: Path, n_ctx: int) -> tuple[int, int]:
    """(blocks, KV cache bytes for ``n_ctx``); (0, 0) if the metadata is unreadable."""
    try:
        meta = read_metadata(path)
        arch = meta["general.architecture"]
        keys = (
            "block_count",
            "embedding_length",
            "attention.head_count",
            "attention.head_count_kv",
            "attention.key_length",
            "attention.value_length",
        )
        n_layer, n_embd, n_head, n_head_kv, key_len, value_len = (
            meta.get(f"{arch}.{k}") for k in keys
        )
        n_layer = _bounded(n_layer, MAX_LAYERS)
        n_embd = _bounded(n_embd, MAX_WIDTH)
        # Some architectures give per-layer head counts as arrays.
        heads = n_head if isinstance(n_head, list) else [n_head] * n_layer
        kv_heads = n_head_kv if isinstance(n_head_kv, list) else [n_head_kv or heads[0]] * n_layer
        total = 0
        for h, kv in zip(heads, kv_heads, strict=False):
            if not h or not kv:
                continue
            k_dim = _bounded(key_len or n_embd // _bounded(h, MAX_HEADS), MAX_WIDTH)
            v_dim = _bounded(value_len or k_dim, MAX_WIDTH)
            total += _bounded(kv, MAX_HEADS) * (k_dim + v_dim)
    except (OSError, ValueError, KeyError, TypeError, IndexError, OverflowError):
        return 0, 0
    return n_layer, total * n_ctx * 2


def _bounded(value: object, most: int) -> int:
    """``value``, a number of the header, as an ``int`` if a real model could have it; else
    ``ValueError`` (a crafted header), or ``TypeError`` for a value that is no number."""
    if not isinstance(value, int | float | str):
        raise TypeError(f"a model shape that is no number ({type(value).__name__})")
    number = int(value)
    if not 0 <= number <= most:
        raise ValueError(f"an impossible model shape ({number})")
    return number


@dataclass(frozen=True)
class Footprint:
    """A model as GPU placement sees it: ``layers`` offloadable (blocks + output layer),
    ``weights`` bytes (the file), ``kv`` bytes of KV cache over all blocks."""

    layers: int
    weights: int
    kv: int

    def needed(self, n: int) -> int:
        """GPU memory for ``n`` offloaded layers: their share of the weights and of the KV
        cache, and the compute allowance once anything is offloaded."""
        if n <= 0:
            return 0
        n = min(n, self.layers)
        blocks = max(self.layers - 1, 1)
        weights = self.weights * n // self.layers
        kv = self.kv * min(n, blocks) // blocks
        return weights + kv + GPU_COMPUTE_ALLOWANCE


def model_name(path: Path) -> str:
    """The model's ``general.name`` from its header, else the file's stem."""
    try:
        name = read_metadata(path).get("general.name")
    except (OSError, ValueError):
        name = None
    return name if isinstance(name, str) and name.strip() else Path(path).stem


def footprint(path: Path, n_ctx: int) -> Footprint:
    """``path``'s footprint; a file whose metadata cannot be read counts as one layer."""
    path = Path(path)
    blocks, kv = _shape(path, n_ctx)
    size = path.stat().st_size if path.is_file() else 0
    return Footprint(layers=blocks + 1, weights=size, kv=kv)


def available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def estimate_memory(
    target_path: Path, draft_path: Path | None, n_ctx: int
) -> tuple[int, int | None]:
    needed = 0
    for path in (target_path, draft_path):
        if path is None:
            continue
        path = Path(path)
        size = path.stat().st_size if path.is_file() else 0
        needed += size + kv_cache_bytes(path, n_ctx) + OVERHEAD_PER_MODEL
    return needed, available_memory()


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def check_disk(directory: Path, needed: int) -> None:
    probe = directory
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if free < needed + DISK_MARGIN:
        raise DownloadError(
            f"not enough disk space in {directory}: need {human(needed + DISK_MARGIN)}, "
            f"{human(free)} free",
            "free some space, or set LOCALSPEC_HOME to a disk with more room",
        )


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what the platform module says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
