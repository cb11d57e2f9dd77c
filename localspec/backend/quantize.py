"""Requantize a GGUF model with llama.cpp (``localspec models optimize``).

Contract: ``quantize(src, dst, qtype)`` writes ``dst`` as a ``qtype`` copy of ``src`` (for
example ``Q4_0``, whose simple blocks are the fastest to evaluate on many CPUs) and returns
it. The output appears under its final name only when llama.cpp reports success; a failure
raises ``ModelFileError`` and leaves nothing behind. llama.cpp's log lines are hidden unless
``verbose``. ``QUANT_TYPES`` lists the accepted names. The CLI imports this module at start,
so llama_cpp is imported by the functions that call it.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from localspec.backend.runtime import ensure_backend
from localspec.errors import ModelFileError, UsageError

QUANT_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K_M", "Q4_K_S", "Q5_K_M", "Q6_K")


def ftype_for(qtype: str) -> int:
    """llama.cpp's ftype constant for a type name; ``UsageError`` if unknown."""
    import llama_cpp

    name = qtype.upper()
    value = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{name}", None)
    if name not in QUANT_TYPES or value is None:
        raise UsageError(
            f"unknown quantization type {qtype!r}",
            f"choose one of {', '.join(QUANT_TYPES)}",
        )
    return int(value)


@contextlib.contextmanager
def _quiet_llama(verbose: bool) -> Iterator[None]:
    # llama-cpp-python's log callback prints whatever its logger's own level lets through.
    logger = logging.getLogger("llama-cpp-python")
    old = logger.level
    if not verbose:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(old)


def quantize(
    src: Path, dst: Path, qtype: str = "Q4_0", *, threads: int = 0, verbose: bool = False
) -> Path:
    """Write a ``qtype`` copy of ``src`` at ``dst``; ``threads=0`` lets llama.cpp choose."""
    ftype = ftype_for(qtype)
    src, dst = Path(src), Path(dst)
    if src.resolve() == dst.resolve():
        raise UsageError(f"refusing to overwrite {src} with its own requantized copy")
    # llama-cpp-python's logger keeps printing llama.cpp's lines, as _quiet_llama expects.
    import llama_cpp

    ensure_backend(capture_log=False)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.nthread = threads
    # Catalog models are already quantized (Q4_K_M); converting them needs this flag.
    params.allow_requantize = True
    tmp = dst.with_name(dst.name + ".partial")
    dst.parent.mkdir(parents=True, exist_ok=True)
    with _quiet_llama(verbose):
        rc = llama_cpp.llama_model_quantize(
            str(src).encode(), str(tmp).encode(), ctypes.byref(params)
        )
    if rc != 0 or not tmp.is_file():
        tmp.unlink(missing_ok=True)
        raise ModelFileError(
            f"llama.cpp could not quantize {src} to {qtype.upper()} (code {rc})",
            "run again with --verbose to see llama.cpp's reason",
        )
    os.replace(tmp, dst)
    return dst
