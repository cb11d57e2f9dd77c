"""localspec: local speculative decoding over GGUF models with llama-cpp-python.

From Python (``localspec.api``; docs/python-api.md)::

    import localspec

    with localspec.load() as pair:
        print(pair.complete("def fib(n):", max_tokens=30).text)

Layers, each importing only from the ones before it (``tests/test_layers.py`` enforces it):

- ``errors``: typed errors with hints, usable everywhere;
- ``core``: events, params, sampling, verify, text, stats, drafting (the drafters and
  their registry), controller, engine, replay;
- ``backend`` (llama.cpp) and ``models`` (catalog, fetching, files), side by side;
- ``session``: a loaded pair, its chat template and cost calibration;
- front ends: ``api`` (for scripts), ``bench``, ``tui`` and ``serve``, then ``cli`` (which
  mounts them all).

The public names below are imported on first use, so that ``import localspec`` stays cheap
(``localspec.load`` is what loads llama.cpp).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# The public names, each imported on first use from the module that defines it.
_MODULES = {
    "localspec.api": ("load",),
    "localspec.api.speculator": ("Speculator",),
    "localspec.api.stream": ("Completion", "Stream"),
    "localspec.core.events": (
        "Event", "PrefillDone", "TokenEmitted", "RoundCompleted", "EngineWarning", "Finished",
        "FinishReason",
    ),
    "localspec.core.stats": ("GenerationStats",),
    "localspec.core.params": ("DrafterMode",),
    "localspec.errors": (
        "LocalspecError", "UsageError", "InputError", "ModelFileError", "ModelNotFoundError",
        "DownloadError", "IncompatibleModelsError", "ContextOverflowError", "BackendError",
    ),
}  # fmt: skip
_EXPORTS = {name: module for module, names in _MODULES.items() for name in names}
__all__ = [
    "BackendError", "Completion", "ContextOverflowError", "DownloadError", "DrafterMode",
    "EngineWarning", "Event", "FinishReason", "Finished", "GenerationStats",
    "IncompatibleModelsError", "InputError", "LocalspecError", "ModelFileError",
    "ModelNotFoundError", "PrefillDone", "RoundCompleted", "Speculator", "Stream",
    "TokenEmitted", "UsageError", "load",
]  # fmt: skip

if TYPE_CHECKING:
    from localspec.api import load
    from localspec.api.speculator import Speculator
    from localspec.api.stream import Completion, Stream
    from localspec.core.events import (
        EngineWarning,
        Event,
        Finished,
        FinishReason,
        PrefillDone,
        RoundCompleted,
        TokenEmitted,
    )
    from localspec.core.params import DrafterMode
    from localspec.core.stats import GenerationStats
    from localspec.errors import (
        BackendError,
        ContextOverflowError,
        DownloadError,
        IncompatibleModelsError,
        InputError,
        LocalspecError,
        ModelFileError,
        ModelNotFoundError,
        UsageError,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'localspec' has no attribute {name!r}")
    if module.startswith("localspec.api"):  # it loads models: llama.cpp's library first
        importlib.import_module("localspec.backend.library")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
