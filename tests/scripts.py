"""Loading a script of experiments/ as a module, for tests of its functions (the scripts are
run by path, not installed)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def load_script(path: Path, name: str, *, beside: bool = False) -> ModuleType:
    """The script at ``path`` as module ``name``; ``beside``: its folder is importable while
    it loads, for a script that imports the modules next to it."""
    if beside:
        sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if beside:
            sys.path.remove(str(path.parent))
    return module
