"""The one GGUF header reader: the file check every model goes through, and metadata.

``check_gguf(path)`` is the cheap test that a path is a readable GGUF file (it exists, is a
file, starts with the GGUF magic and is not truncated), raising ``ModelFileError`` with a
hint otherwise. ``read_metadata(path, wanted)`` reads key/values straight from the header,
in well under a second even for models with large vocabularies.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import BinaryIO

from localspec.errors import ModelFileError

GGUF_MAGIC = b"GGUF"
# A GGUF header plus one tensor is already more than this; anything smaller is truncated.
MIN_GGUF_BYTES = 64


def check_gguf(path: Path) -> Path:
    """Cheap check that ``path`` is a readable GGUF file; raises ``ModelFileError``."""
    path = Path(path).expanduser()
    if not path.exists():
        raise ModelFileError(
            f"model file not found: {path}", "check the path, or use a catalog name"
        )
    if not path.is_file():
        raise ModelFileError(f"not a file: {path}", "give the path of a .gguf file")
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as err:
        raise ModelFileError(f"cannot read {path}: {err.strerror or err}") from None
    if magic != GGUF_MAGIC:
        raise ModelFileError(
            f"{path} is not a GGUF file (it starts with {magic!r})",
            "llama.cpp models are .gguf files; convert other formats with llama.cpp's tools",
        )
    if size < MIN_GGUF_BYTES:
        raise ModelFileError(f"{path} is truncated ({size} bytes)", "download it again")
    return path


_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9


MAX_ARRAY_DEPTH = 4  # arrays of arrays are legal; deeper nesting is a crafted file


def read_metadata(path: Path, wanted: set[str] | None = None) -> dict[str, object]:
    """GGUF key/value metadata, read straight from the header.

    Much faster than ``gguf.GGUFReader`` on real models (which builds every tensor and
    token entry): stops as soon as every ``wanted`` key is found, and skips array values
    (they come back as ``None``; per-layer arrays of numbers are kept).
    Raises ``ValueError`` on anything that is not a GGUF v2/v3 header. The header is
    untrusted: every length and count is bounded by the bytes left in the file, so a
    crafted one fails fast instead of allocating or looping without end.
    """
    out: dict[str, object] = {}
    with open(path, "rb") as fh:
        header = _Header(fh, os.fstat(fh.fileno()).st_size)
        if fh.read(4) != GGUF_MAGIC or header.take("<I") < 2:
            raise ValueError("not a GGUF v2/v3 file")
        header.take("<Q")  # tensor count
        # Each key/value pair takes at least a key length, a type and a value.
        for _ in range(header.count("key/value count", 8 + 4 + 1)):
            key = header.string()
            out[key] = header.value(header.take("<I"))
            if wanted is not None and wanted <= out.keys():
                break
    return out


class _Header:
    """Reads a GGUF header's values from ``fh``, a file of ``end`` bytes, bounding every
    length and count by what is left of it."""

    def __init__(self, fh: BinaryIO, end: int) -> None:
        self.fh, self.end = fh, end

    def left(self) -> int:
        return self.end - self.fh.tell()

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        data = self.fh.read(size)
        if len(data) != size:
            raise ValueError("truncated GGUF header")
        return struct.unpack(fmt, data)[0]

    def count(self, what: str, item_size: int = 1) -> int:
        n = self.take("<Q")
        if n * item_size > self.left():
            raise ValueError(f"GGUF {what} of {n} runs past the end of the file")
        return n

    def string(self) -> str:
        return self.fh.read(self.count("string length")).decode("utf-8", errors="replace")

    def value(self, vtype: int, depth: int = 0):
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            raise ValueError(f"unknown GGUF value type {vtype}")
        if depth >= MAX_ARRAY_DEPTH:
            raise ValueError("GGUF arrays nested too deep")
        itype = self.take("<I")
        if itype in _SCALARS:
            size = struct.calcsize(_SCALARS[itype])
            n = self.count("array length", size)
            if n <= 4096:
                return [self.take(_SCALARS[itype]) for _ in range(n)]
            self.fh.seek(n * size, 1)
            return None
        # Every string or array element takes at least its 8-byte length.
        for _ in range(self.count("array length", 8 if itype in (_STRING, _ARRAY) else 1)):
            self.value(itype, depth + 1)
        return None
