"""The core imports no UI, CLI, network or llama.cpp code, so every front end can share it."""

from __future__ import annotations

import subprocess
import sys

CORE = [
    "events",
    "params",
    "sampling",
    "verify",
    "stats",
    "drafters",
    "controller",
    "engine",
    "text",
    "cached_model",
]
FORBIDDEN = ["textual", "typer", "rich", "llama_cpp", "huggingface_hub"]


def test_core_modules_import_no_front_end_or_backend():
    code = (
        "import sys\n"
        + "".join(f"import localspec.{m}\n" for m in CORE)
        + f"print(','.join(m for m in {FORBIDDEN!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
