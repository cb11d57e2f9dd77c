"""The one GGUF header reader: the file check every model goes through, and metadata.

``check_gguf(path)`` is the cheap test that a path is a readable GGUF file (it exists, is a
file, starts with the GGUF magic and is not truncated), raising ``ModelFileError`` with a
hint otherwise. ``read_metadata(path, wanted)`` reads key/values straight from the header,
in well under a second even for models with large vocabularies; ``data_end(path)`` reads
the tensors' entries too, for how long the file must be (a shorter one is truncated).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import BinaryIO

from localspec.errors import ModelFileError

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32  # of the tensor data, unless general.alignment says otherwise
MAX_RANK = 4  # ggml's GGML_MAX_DIMS
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
    with open(path, "rb") as fh:
        return _read_kvs(_Header(fh, os.fstat(fh.fileno()).st_size), wanted)[0]


def _read_kvs(header: _Header, wanted: set[str] | None) -> tuple[dict[str, object], int]:
    """The key/values (up to every ``wanted`` one) and the tensor count."""
    out: dict[str, object] = {}
    if header.fh.read(4) != GGUF_MAGIC or header.take("<I") < 2:
        raise ValueError("not a GGUF v2/v3 file")
    n_tensors = header.take("<Q")
    # Each key/value pair takes at least a key length, a type and a value.
    for _ in range(header.count("key/value count", 8 + 4 + 1)):
        key = header.string()
        out[key] = header.value(header.take("<I"))
        if wanted is not None and wanted <= out.keys():
            break
    return out, n_tensors


def data_end(path: Path) -> tuple[int, int]:
    """``(bytes the tensors need the file to have, the file's size)``: a file shorter than
    its tensors is truncated. Reads the whole header (``ValueError`` as ``read_metadata``)."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        header = _Header(fh, size)
        meta, n_tensors = _read_kvs(header, None)
        align = meta.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(align, int) or align < 1:
            raise ValueError(f"GGUF alignment of {align!r}")
        end = 0
        # Each tensor's entry takes at least a name length, a rank, a type and an offset.
        if n_tensors * (8 + 4 + 4 + 8) > header.left():
            raise ValueError(f"GGUF tensor count of {n_tensors} runs past the end of the file")
        for _ in range(n_tensors):
            header.string()
            dims = [header.take("<Q") for _ in range(min(header.take("<I"), MAX_RANK + 1))]
            if len(dims) > MAX_RANK:
                raise ValueError("a GGUF tensor of more than 4 dimensions")
            kind, offset = header.take("<I"), header.take("<Q")
            end = max(end, offset + _tensor_bytes(kind, dims))
        start = -(-fh.tell() // align) * align
        return start + end, size


def _tensor_bytes(kind: int, dims: list[int]) -> int:
    # The gguf package (numpy with it) is imported here: this module is on every start's path.
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
    except (ValueError, KeyError):
        raise ValueError(f"unknown GGUF tensor type {kind}") from None
    count = 1
    for dim in dims:
        count *= dim
    return count // block * block_bytes


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
