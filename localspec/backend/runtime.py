"""llama.cpp's process-wide state, set up on first use rather than at import.

Contract: ``ensure_backend()`` initialises llama.cpp (``llama_backend_init``) once per
process, from whichever thread asks first; every caller that needs the library (a model
load, device enumeration, the RPC backend, quantization) calls it before its first llama_cpp
call. Unless told otherwise it first routes llama.cpp's log lines into a bounded tail
(``recent_llama_log``), which error messages quote, instead of printing them; set
``LOCALSPEC_LLAMA_LOG=1`` to see them on stderr as well. Importing this module imports
nothing from llama_cpp.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections import deque
from typing import Any

_LOG_TAIL: deque[str] = deque(maxlen=40)
_VERBOSE = os.environ.get("LOCALSPEC_LLAMA_LOG") == "1"
_LOCK = threading.Lock()
_initialised = False
# The ctypes callback llama.cpp calls: kept alive for the life of the process.
_log_callback: Any = None


def _capture_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    line = text.decode("utf-8", errors="replace")
    _LOG_TAIL.append(line)
    if _VERBOSE:
        os.write(2, text)


def ensure_backend(*, capture_log: bool = True) -> None:
    """Initialise llama.cpp once; with ``capture_log``, capture its log lines first (once).
    Without it, llama-cpp-python's own logger keeps printing them (quantization's
    ``--verbose`` relies on that)."""
    global _initialised, _log_callback
    with _LOCK:
        if _initialised and (_log_callback is not None or not capture_log):
            return
        # Deferred: llama_cpp loads its shared libraries, and ``localspec --help`` imports
        # backend modules that must stay light.
        import llama_cpp

        if capture_log and _log_callback is None:
            _log_callback = llama_cpp.llama_log_callback(_capture_log)
            llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))
        if not _initialised:
            llama_cpp.llama_backend_init()
            _initialised = True


def backend_initialised() -> bool:
    """Whether ``ensure_backend`` has initialised llama.cpp in this process."""
    return _initialised


def clear_llama_log() -> None:
    """Forget the captured lines, so that the next failure quotes only its own."""
    _LOG_TAIL.clear()


def recent_llama_log(lines: int = 6) -> str:
    tail = [s.strip() for s in list(_LOG_TAIL)[-lines:] if s.strip()]
    return " | ".join(tail)
