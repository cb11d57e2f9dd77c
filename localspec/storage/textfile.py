"""Reading a user's text file for a front end: bounded, UTF-8, every failure an ``InputError``.

``read_bounded(path, limit, what)`` reads at most ``limit`` + 1 bytes (one more than allowed,
so the caller can tell a file that is too large, and say so in its own terms), naming the
file as ``what`` in its messages; ``decode_utf8(data, source)`` decodes, saying where a
byte that is not UTF-8 sits.
"""

from __future__ import annotations

from pathlib import Path

from localspec.errors import InputError


def read_bounded(path: Path, limit: int, what: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read(limit + 1)
    except FileNotFoundError:
        raise InputError(f"{what} file not found: {path}", "check the path") from None
    except IsADirectoryError:
        raise InputError(f"{what} is a directory: {path}", "pass a text file") from None
    except OSError as err:
        raise InputError(f"cannot read {path}: {err.strerror}", "check its permissions") from None


def decode_utf8(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(
            f"{source} is not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start})",
            "convert it first, e.g. iconv -f latin1 -t utf-8",
        ) from None
