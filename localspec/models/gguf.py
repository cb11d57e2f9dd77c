"""The one GGUF header reader: the file check every model goes through, and metadata.

``check_gguf(path)`` is the cheap test that a path is a readable GGUF file (it exists, is a
file, starts with the GGUF magic and is not truncated), raising ``ModelFileError`` with a
hint otherwise. ``read_metadata(path)`` reads every key/value straight from the header,
in tens of milliseconds even for models with large vocabularies, and kept for later reads;
``data_end(path)`` reads the tensors' entries too, for how long the file must be (a shorter
one is truncated).
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from localspec.errors import ModelFileError
from localspec.models import paths
from localspec.statefiles import read_json, write_json

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
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


MAX_ARRAY_DEPTH = 4  # arrays of arrays are legal; deeper nesting is a crafted file
# Arrays of numbers up to this length come back as lists (per-layer head counts); longer
# ones are skipped by their length.
MAX_KEPT_ARRAY = 4096
# Headers read in this process, by file identity: placement, the memory estimate and the
# self-draft all ask for the same few files.
_READ_CACHE: dict[tuple, dict[str, object]] = {}
_READ_CACHE_SIZE = 16
# Headers read before, kept on disk by file identity: a model's header is read at every
# start, and stepping over its vocabulary costs more than reading this file.
HEADER_CACHE = "headers.json"
HEADER_CACHE_ENTRIES = 32


def read_metadata(path: Path, *, fresh: bool = False) -> dict[str, object]:
    """GGUF key/value metadata, read straight from the header.

    Array values come back as ``None`` (per-layer arrays of numbers are kept): the
    vocabulary and merges are skipped by their lengths, never decoded, so a header with a
    150,000-token vocabulary reads in tens of milliseconds. What was read is kept, by the
    file's path, size, times and inode, for the rest of the process and on disk
    (``HEADER_CACHE`` in localspec's home, read no further than a state file's bound) for
    the next ones. ``fresh``: read from the file whatever is kept, and keep that (what
    reports a damaged header reads it so, lest a damaged cache entry be taken for a damaged
    file).
    Raises ``ValueError`` on anything that is not a GGUF v2/v3 header. The header is
    untrusted: every length and count is bounded by the bytes left in the file, so a
    crafted one fails fast instead of allocating or looping without end.
    """
    path = Path(path)
    with open(path, "rb") as fh:
        st = os.fstat(fh.fileno())
        name = str(path.resolve())
        stamp = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        key = (name, *stamp)
        found = None if fresh else _READ_CACHE.get(key)
        if found is None:
            found = None if fresh else _kept(name, stamp)
            if found is None:
                found = _read_header(fh, st.st_size)
                _keep(name, stamp, found)
            _READ_CACHE.pop(key, None)
            if len(_READ_CACHE) >= _READ_CACHE_SIZE:
                _READ_CACHE.pop(next(iter(_READ_CACHE)))
            _READ_CACHE[key] = found
    return dict(found)


def _cache_file() -> Path:
    return paths.cache_root() / HEADER_CACHE


def _load_kept() -> dict[str, object]:
    """The headers kept on disk; nothing when the file is missing, too large, or not a
    JSON object (it is then written anew)."""
    kept, _ = read_json(_cache_file())
    return kept if isinstance(kept, dict) else {}


def _kept(name: str, stamp: list[int]) -> dict[str, object] | None:
    """The header kept on disk for the file ``name`` as ``stamp`` identifies it; None if
    none is, or what is kept is not a header's values (a damaged or edited file)."""
    entry = _load_kept().get(name)
    if not isinstance(entry, dict) or entry.get("stamp") != stamp:
        return None
    values = entry.get("values")
    if not isinstance(values, dict) or not all(_plain(v) for v in values.values()):
        return None
    return values


def _plain(value: object) -> bool:
    """A value the reader gives: a finite number, text, a truth value, None, or finite
    numbers in a list (JSON's Infinity and NaN are an edited file's, never worth keeping)."""
    if isinstance(value, list):
        return all(isinstance(x, int | float) and math.isfinite(x) for x in value)
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or isinstance(value, str | int | bool)


def _keep(name: str, stamp: list[int], values: dict[str, object]) -> None:
    """Keep a header read now for the next process; best effort (a cache that cannot be
    written only costs the next start the read)."""
    kept = _load_kept()
    kept.pop(name, None)  # re-inserted last: the oldest entries are dropped first
    kept[name] = {"stamp": stamp, "values": values}
    write_json(_cache_file(), dict(list(kept.items())[-HEADER_CACHE_ENTRIES:]))


def _read_header(fh: BinaryIO, size: int) -> dict[str, object]:
    with _mapped(fh, size) as header:
        return _read_kvs(header)[0]


@contextlib.contextmanager
def _mapped(fh: BinaryIO, size: int) -> Iterator[_Header]:
    """A reader over ``fh``'s bytes, mapped into memory."""
    if size < 24:
        raise ValueError("truncated GGUF header")
    with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        header = _Header(memoryview(mm), size)
        try:
            yield header
        finally:
            header.release()


def _read_kvs(header: _Header) -> tuple[dict[str, object], int]:
    """The key/values and the tensor count."""
    if header.bytes(4) != GGUF_MAGIC or header.take(_U32) < 2:
        raise ValueError("not a GGUF v2/v3 file")
    n_tensors = header.take(_U64)
    out: dict[str, object] = {}
    # Each key/value pair takes at least a key length, a type and a value.
    for _ in range(header.count("key/value count", 8 + 4 + 1)):
        key = header.string()
        out[key] = header.value(header.take(_U32))
    return out, n_tensors


def data_end(path: Path) -> tuple[int, int]:
    """``(bytes the tensors need the file to have, the file's size)``: a file shorter than
    its tensors is truncated. Reads the whole header (``ValueError`` as ``read_metadata``)."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        with _mapped(fh, size) as header:
            meta, n_tensors = _read_kvs(header)
            align = meta.get("general.alignment", DEFAULT_ALIGNMENT)
            if not isinstance(align, int) or align < 1:
                raise ValueError(f"GGUF alignment of {align!r}")
            # Each tensor's entry takes at least a name length, a rank, a type and an offset.
            if n_tensors * (8 + 4 + 4 + 8) > header.left():
                raise ValueError(f"GGUF tensor count of {n_tensors} runs past the end of the file")
            end = 0
            for _ in range(n_tensors):
                header.string()
                dims = [header.take(_U64) for _ in range(min(header.take(_U32), MAX_RANK + 1))]
                if len(dims) > MAX_RANK:
                    raise ValueError("a GGUF tensor of more than 4 dimensions")
                kind, offset = header.take(_U32), header.take(_U64)
                end = max(end, offset + _tensor_bytes(kind, dims))
            start = -(-header.at // align) * align
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
    """Reads a GGUF header's values from ``data``, a file of ``end`` bytes mapped into
    memory, bounding every length and count by what is left of it."""

    def __init__(self, data: memoryview, end: int) -> None:
        self.data, self.end, self.at = data, end, 0

    def release(self) -> None:
        self.data.release()

    def left(self) -> int:
        return self.end - self.at

    def bytes(self, n: int) -> bytes:
        if n > self.left():
            raise ValueError("truncated GGUF header")
        self.at += n
        return bytes(self.data[self.at - n : self.at])

    def take(self, fmt: struct.Struct | str):
        fmt = fmt if isinstance(fmt, struct.Struct) else struct.Struct(fmt)
        if fmt.size > self.left():
            raise ValueError("truncated GGUF header")
        value = fmt.unpack_from(self.data, self.at)[0]
        self.at += fmt.size
        return value

    def count(self, what: str, item_size: int = 1) -> int:
        n = self.take(_U64)
        if n * item_size > self.left():
            raise ValueError(f"GGUF {what} of {n} runs past the end of the file")
        return n

    def string(self) -> str:
        return self.bytes(self.count("string length")).decode("utf-8", errors="replace")

    def value(self, vtype: int, depth: int = 0):
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            raise ValueError(f"unknown GGUF value type {vtype}")
        if depth >= MAX_ARRAY_DEPTH:
            raise ValueError("GGUF arrays nested too deep")
        itype = self.take(_U32)
        if itype in _SCALARS:
            size = struct.calcsize(_SCALARS[itype])
            n = self.count("array length", size)
            if n <= MAX_KEPT_ARRAY:
                return [self.take(_SCALARS[itype]) for _ in range(n)]
            self.at += n * size
            return None
        if itype == _STRING:
            self._skip_strings(self.count("array length", 8))
            return None
        # Every array element takes at least its 8-byte length.
        for _ in range(self.count("array length", 8 if itype == _ARRAY else 1)):
            self.value(itype, depth + 1)
        return None

    def _skip_strings(self, n: int) -> None:
        """Step over ``n`` length-prefixed strings without decoding them."""
        unpack, data, at, end = _U64.unpack_from, self.data, self.at, self.end
        for _ in range(n):
            if at + 8 > end:
                raise ValueError("truncated GGUF header")
            at += 8 + unpack(data, at)[0]
        if at > end:
            raise ValueError("GGUF string array runs past the end of the file")
        self.at = at
