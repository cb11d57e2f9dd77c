"""Derived self-drafts on disk, read and tidied without loading llama.cpp.

Contract:

- ``derived_dir(target)`` is ``cache_root()/derived/<target stem>-<hash of its size, mtime,
  ctime and inode>``: a changed target gets a folder of its own. ``private_dir`` makes it (0700).
- ``locked(directory, on_progress)`` holds the folder's lock (waiting, and saying so, while
  another process derives there). Under it, ``remove_leftovers`` deletes what an
  interrupted derivation left (a candidate or the draft being written, a record being
  saved): nothing else writes there while the lock is held.
- ``read_record(directory)`` is ``choice.json``'s data, or None when there is none or it is
  damaged: at most ``MAX_CHOICE_BYTES``, and crafted JSON (nesting too deep, numbers too
  long) fails as one of ``STATE_ERRORS``, the errors ``statefiles`` names for state
  files.
- ``derived_folders()`` lists every folder with its target as recorded, its size and its
  ``state``: ``current``, ``target changed`` (the target's size, times or inode differ: its
  drafts are derived again), ``target gone``, or ``unfinished`` (no record: an interrupted first
  derivation). ``remove_derived(name)`` deletes one folder, under its lock;
  ``ModelNotFoundError`` when there is no such folder, ``UsageError`` while it is in use.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from localspec.errors import ModelNotFoundError, UsageError
from localspec.models.paths import cache_root
from localspec.progress import OnProgress, ProgressKind, tell
from localspec.statefiles import STATE_ERRORS

CHOICE_FILE = "choice.json"
LOCK_FILE = ".lock"
MAX_CHOICE_BYTES = 1 << 20  # a record of a few candidates' numbers is a few KiB
# What a derivation writes before renaming it into place: ``.<name>.<random>.tmp`` files
# (the derived draft, the record) and ``selfdraft-<random>`` folders (the candidates).
LEFTOVERS = (".*.tmp", "selfdraft-*")


def derived_root() -> Path:
    return cache_root() / "derived"


def derived_dir(target: Path) -> Path:
    """The cache folder of ``target``'s derived drafts (it may not exist yet)."""
    st = Path(target).stat()
    # As the header cache's stamp: a file swapped in place with its mtime put back still
    # has another inode or change time.
    stamp = f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"
    digest = hashlib.sha256(stamp.encode()).hexdigest()[:12]
    return derived_root() / f"{Path(target).stem}-{digest}"


def private_dir(directory: Path) -> None:
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)


@contextlib.contextmanager
def locked(directory: Path, on_progress: OnProgress | None = None) -> Iterator[None]:
    lock = FileLock(str(directory / LOCK_FILE), mode=0o600)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        tell(on_progress, "waiting for another localspec deriving this draft", ProgressKind.WAIT)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def remove_leftovers(directory: Path) -> int:
    """Delete what interrupted derivations left in ``directory`` (hold its lock); the bytes
    freed."""
    freed = 0
    for pattern in LEFTOVERS:
        for path in directory.glob(pattern):
            freed += _size(path)
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
    return freed


def read_record(directory: Path) -> dict[str, Any] | None:
    """``choice.json``'s data; None when absent, unreadable, too large or not an object."""
    try:
        with open(directory / CHOICE_FILE, "rb") as fh:
            raw = fh.read(MAX_CHOICE_BYTES + 1)
        data = json.loads(raw) if len(raw) <= MAX_CHOICE_BYTES else None
    except (OSError, *STATE_ERRORS):
        return None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True)
class DerivedFolder:
    name: str
    path: Path
    target: str | None  # as recorded (None: no record)
    bytes: int
    state: str  # current, target changed, target gone, unfinished


def derived_folders() -> list[DerivedFolder]:
    """Every folder of derived drafts, by name (module docstring)."""
    root = derived_root()
    folders = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    return [_folder(path) for path in folders]


def _folder(path: Path) -> DerivedFolder:
    record = read_record(path)
    target = record.get("target") if record else None
    target = target if isinstance(target, str) else None
    if target is None:
        state = "unfinished"
    elif not Path(target).is_file():
        state = "target gone"
    elif derived_dir(Path(target)).name != path.name:
        state = "target changed"
    else:
        state = "current"
    return DerivedFolder(path.name, path, target, _size(path), state)


def remove_derived(name: str) -> DerivedFolder:
    """Delete the folder ``name`` of ``derived_folders``; what it was."""
    found = next((f for f in derived_folders() if f.name == name), None)
    if found is None:
        raise ModelNotFoundError(
            f"no derived self-draft named {name}", "`localspec models list` shows them"
        )
    lock = FileLock(str(found.path / LOCK_FILE), mode=0o600)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise UsageError(
            f"{name} is being derived now", "run this again once the derivation is over"
        ) from None
    try:
        for path in found.path.iterdir():
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            elif path.name != LOCK_FILE:
                path.unlink()
    finally:
        lock.release()
    shutil.rmtree(found.path, ignore_errors=True)
    return found


def _size(path: Path) -> int:
    """The bytes of a file, or of every file below a folder."""
    try:
        if not path.is_dir() or path.is_symlink():
            return path.lstat().st_size
        return sum(p.lstat().st_size for p in path.rglob("*") if not p.is_dir())
    except OSError:
        return 0
