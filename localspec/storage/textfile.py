"""Reading a user's text file for a front end: bounded, UTF-8, every failure an ``InputError``.

``read_bounded(path, limit, what)`` reads at most ``limit`` + 1 bytes (one more than allowed,
so the caller can tell a file that is too large, and say so in its own terms), naming the
file as ``what`` in its messages; with ``regular`` it refuses anything but a regular file
(a FIFO, ``/dev/stdin``) without waiting on it, for a reader that must not block;
``decode_utf8(data, source)`` decodes, saying where a byte that is not UTF-8 sits.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from localspec.errors import InputError


def read_bounded(path: Path, limit: int, what: str, *, regular: bool = False) -> bytes:
    try:
        if regular:
            return _read_regular(path, limit, what)
        with open(path, "rb") as fh:
            return fh.read(limit + 1)
    except FileNotFoundError:
        raise InputError(f"{what} file not found: {path}", "check the path") from None
    except IsADirectoryError:
        raise InputError(f"{what} is a directory: {path}", "pass a text file") from None
    except OSError as err:
        raise InputError(f"cannot read {path}: {err.strerror}", "check its permissions") from None


def _read_regular(path: Path, limit: int, what: str) -> bytes:
    """A regular file's first bytes; opened without waiting (a FIFO with no writer would
    hold the read for ever), and anything but a regular file refused."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as fh:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(path)
        if not stat.S_ISREG(mode):
            raise InputError(
                f"{what} {path} is not a regular file (a pipe or a device)", "give a file on disk"
            )
        return fh.read(limit + 1)


def decode_utf8(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(
            f"{source} is not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start})",
            "convert it first, e.g. iconv -f latin1 -t utf-8",
        ) from None
