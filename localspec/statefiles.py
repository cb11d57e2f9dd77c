"""Small state files: written whole, read without trusting them, kept private.

Every layer above the core writes its files through here; the core does no I/O.

``replacing(path)`` gives a unique temporary file (mode 0600) beside ``path`` to write its
new content into, and puts it in place with one atomic rename when the writing ends without
an error (removing it otherwise), so two processes saving at once never mix their bytes and
a reader sees either the old file or the new one. ``write_file(path, data)`` writes bytes
so, raising ``OSError``; ``write_json(path, data)`` writes JSON so and returns "" or why it
failed (callers treat saving as best effort). ``remove_json(directory)`` deletes every
``*.json`` there.

``read_json(path)`` is the one loader of every state file (calibrations, learned state,
settings, fingerprints, manifests): ``(data, "")``, ``(None, "")`` when there is no file,
or ``(None, why)`` when it cannot be used: unreadable, over ``MAX_STATE_BYTES``, not UTF-8,
not JSON, nested too deep or with a number too long. What a caller then does with the data
can raise only ``STATE_ERRORS`` on crafted values (a number too large for a float, a list
where a mapping belongs): it catches those and ignores the file with a warning.

``private_dir(path, top)`` makes ``path`` and the directories between ``top`` and it
(``top`` included) mode 0700; ``open_private`` opens a file created with mode 0600. What
the datastores and the history hold is the user's text.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, Literal

MAX_STATE_BYTES = 64 << 20  # no state file of localspec comes near this
# What interpreting crafted JSON values can raise (float(10**400) is an OverflowError).
STATE_ERRORS = (ValueError, OverflowError, RecursionError, TypeError, KeyError, AttributeError)


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary file beside ``path`` (``.<stem>.<random>.tmp``, mode 0600, its directory
    made if need be) that replaces ``path`` when the block ends without an error; on an
    error it is removed and ``path`` stays as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_file(path: Path, data: bytes) -> None:
    """``path`` holding ``data``, written whole (``replacing``); raises ``OSError``."""
    with replacing(path) as tmp:
        tmp.write_bytes(data)


def write_json(path: Path, data: Any) -> str:
    try:
        write_file(path, json.dumps(data, indent=1).encode("utf-8"))
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


def read_json(path: Path) -> tuple[Any, str]:
    """A state file's data; see the module docstring."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_STATE_BYTES + 1)
    except FileNotFoundError:
        return None, ""
    except OSError as err:
        return None, f"{path} is unreadable: {err.strerror or err}"
    if len(raw) > MAX_STATE_BYTES:
        return None, f"{path} is over {MAX_STATE_BYTES >> 20} MiB"
    try:
        return json.loads(raw.decode("utf-8")), ""
    except RecursionError:
        return None, f"{path} is not valid JSON: nested too deep"
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, integers too long
        return None, f"{path} is not valid JSON: {err}"


def private_dir(path: Path, top: Path) -> Path:
    """``path`` created if need be, it and every directory from ``top`` down to it mode
    0700 (a looser one of ours is tightened); ``path`` must lie inside ``top``."""
    path, top = Path(path), Path(top)
    chain = [top, *(top / part for part in _parts_below(path, top))]
    for directory in chain:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        _tighten(directory, 0o700)
    return path


def _parts_below(path: Path, top: Path) -> list[str]:
    parts = path.relative_to(top).parts
    return ["/".join(parts[: i + 1]) for i in range(len(parts))]


def open_private(path: Path, mode: Literal["ab", "wb"] = "ab") -> BinaryIO:
    """A binary file opened for writing (``ab`` or ``wb``), created with mode 0600; an
    older file readable by others is tightened first."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if mode == "ab" else os.O_TRUNC)
    fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        _tighten_fd(fd, 0o600)
        return os.fdopen(fd, mode)
    except BaseException:
        os.close(fd)
        raise


def _tighten(path: Path, mode: int) -> None:
    try:
        current = os.stat(path).st_mode & 0o777
        if current & ~mode:
            os.chmod(path, current & mode)
    except OSError:
        pass  # not ours to change: it stays as its owner made it


def _tighten_fd(fd: int, mode: int) -> None:
    try:
        current = os.fstat(fd).st_mode & 0o777
        if current & ~mode:
            os.fchmod(fd, current & mode)
    except OSError:
        pass
