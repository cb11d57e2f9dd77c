"""Exact mode's choice of llama.cpp's CPU kernels, made once per process.

llama.cpp's CPU backend reads its tiled-matmul switch (``TILED_MM_SWITCH``) once per
process, at the first matrix multiplication. Set to ``"0"``, it skips the tiled K-quant
matmul (taken for batches of 8 rows or more), whose sums differ from the per-row dot
products. ``exact_kernels`` sets it before anything evaluates; every decode tells
``note_decoded``, after which the choice is made for good.
"""

from __future__ import annotations

import os

from localspec.errors import BackendError

TILED_MM_SWITCH = "GGML_CPU_TILED_MM"
_decoded = False  # whether this process has evaluated anything yet (see exact_kernels)
_tiled_off = False  # whether the switch was off when llama.cpp read it, at the first decode
_switched = False  # whether exact_kernels set the switch (rather than the user)


def note_decoded() -> None:
    """A decode ran: the switch is read from now on (called by every decode)."""
    global _decoded, _tiled_off
    if not _decoded:
        _decoded = True
        _tiled_off = os.environ.get(TILED_MM_SWITCH) == "0"


def exact_kernels() -> None:
    """Choose llama.cpp's batch-invariant CPU kernels for this process, before any decode.

    The tiled-matmul switch is read once per process, so it can no longer change after a
    first evaluation; ``BackendError`` then, unless it was already off at that evaluation
    (what the environment says now does not matter any more)."""
    if _decoded:
        if _tiled_off:
            return
        raise BackendError(
            "exact mode must be chosen before this process evaluates anything",
            "start a new process with --exact",
        )
    if os.environ.get(TILED_MM_SWITCH) == "0":
        return
    os.environ[TILED_MM_SWITCH] = "0"
    global _switched
    _switched = True


def default_kernels_environ() -> dict[str, str]:
    """This process's environment without the switch ``exact_kernels`` set, for child
    processes (llama.cpp's own tools in the bench) that should run their usual kernels."""
    env = dict(os.environ)
    if _switched:
        env.pop(TILED_MM_SWITCH, None)
    return env
