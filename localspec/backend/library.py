"""llama.cpp's shared library, loaded when this module is imported, before numpy is.

A process that loads models imports this first: the ``localspec`` command before the
command's own modules (``cli/app.py``), ``import localspec`` before the Python API's
(``localspec/__init__.py``). On an NVIDIA H200 machine (CUDA 13.0) every process that had
imported numpy before llama.cpp's CUDA library crashed inside its first model load, and none
that loaded llama.cpp first did (docs/gpu.md). Loading is not initialising: the backend is
still set up by ``runtime.ensure_backend`` at its first use.
"""

from __future__ import annotations

import llama_cpp  # noqa: F401  (imported for what importing it does: loading the library)
