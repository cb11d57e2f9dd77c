"""Small JSON files that must never be half-written: one file per key in a directory.

``write_json(path, data)`` writes through a unique temporary file in the same directory and
an atomic rename, so two processes saving at once never mix their bytes and a reader sees
either the old file or the new one; it returns "" or why it failed (callers treat saving as
best effort). ``remove_json(directory)`` deletes every ``*.json`` there.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def write_json(path: Path, data: Any) -> str:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(data, fh, indent=1)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as err:
        return f"could not write {path}: {err.strerror or err}"
    return ""


def remove_json(directory: Path) -> int:
    """Delete every ``*.json`` in ``directory``; returns how many there were."""
    removed = 0
    for path in directory.glob("*.json") if directory.is_dir() else []:
        path.unlink(missing_ok=True)
        removed += 1
    return removed
