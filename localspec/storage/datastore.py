"""An immutable on-disk index of token ids that finds where the end of a text occurred before.

A ``TokenIndex`` holds one corpus made of documents (token id lists). Given the last tokens
of a text, ``longest_match`` finds the longest suffix of them that occurs inside one document
of the corpus, and ``continuations`` says which tokens followed those occurrences and how
often: what a retrieval drafter proposes.

Stored in one directory:

- ``tokens.npy``: int32, every document preceded and followed by ``SEPARATOR`` (-1), so the
  array is ``SEP doc0 SEP doc1 SEP ... SEP``, of length tokens + documents + 1. Token ids
  are in ``[0, 2**31 - 1]``; no match contains a separator, so none runs across documents.
- ``suffixes.npy``: the suffix array of the *reversed* token stream, restricted to
  non-separator positions. Row ``r`` holds a position ``p`` of ``tokens.npy``, and rows are
  sorted by ``tokens[p], tokens[p - 1], tokens[p - 2], ...``: the text read backwards from
  ``p``. Read this way, lengthening the suffix of a context by one token narrows a range of
  rows, so a lookup costs O(n_max * log N) token comparisons. int32, or int64 past 2**31
  positions; one row per token.
- ``manifest.json``: format version, token and document counts, and per array its size in
  bytes, a CRC-32 of its first and last MiB (the whole file when smaller) and a CRC-32 of
  the whole file.

``save`` writes each file under a temporary name and moves it in place with ``os.replace``,
the manifest last, so a reader sees whole files; a save cut short leaves arrays that
disagree with the manifest, which ``load`` reports. ``load`` maps the arrays
(``mmap_mode="r"``) and checks every value a lookup will use: token ids in
``[-1, 2**31 - 1]`` and every suffix row a position of a token inside the stream, so a store
whose checksums match but whose contents do not (crafted, or written by a bug) is refused
rather than read out of bounds; that reads both arrays once (about 10 ms per million
tokens), and checksums only samples. It raises ``DamagedIndex`` and no other exception when
a file is missing or unreadable, the format version is not ``FORMAT_VERSION``, an array's
dtype, shape, size or values disagree with the manifest, or a checksum differs. By default
only the sampled CRC is checked, so damage in the middle of an array larger than 2 MiB that
leaves its values in range is found only with ``load(..., verify=True)``, which checks
every byte. Files are written mode 0600.
"""

from __future__ import annotations

import json
import os
import zlib
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydivsufsort import divsufsort

from localspec.statefiles import open_private, read_json

FORMAT_VERSION = 1
SEPARATOR = -1
MAX_TOKEN = np.iinfo(np.int32).max

TOKENS_FILE = "tokens.npy"
SUFFIXES_FILE = "suffixes.npy"
MANIFEST_FILE = "manifest.json"

_SAMPLE_BYTES = 1 << 20
_CHUNK_BYTES = 4 << 20


class DamagedIndex(Exception):
    """An index directory that cannot be used as it is; the message says what is wrong."""


@dataclass(frozen=True)
class Match:
    """``n`` last tokens of a context occur ``count`` times: rows ``[lo, hi)`` of the index."""

    n: int
    lo: int
    hi: int
    count: int


class TokenIndex:
    """Lookups over one corpus of token ids; see the module docstring for the layout."""

    __slots__ = ("_tokens", "_ends", "_documents")

    def __init__(self, tokens: np.ndarray, ends: np.ndarray, documents: int) -> None:
        self._tokens = tokens
        self._ends = ends
        self._documents = documents

    @classmethod
    def build(cls, documents: Iterable[Sequence[int] | np.ndarray]) -> TokenIndex:
        """Index ``documents`` (token ids, as a list or an array each) in memory. Raises
        ``ValueError`` for an id outside ``[0, 2**31 - 1]``."""
        parts = [np.full(1, SEPARATOR, dtype=np.int32)]
        for doc in documents:
            ids = np.asarray(doc, dtype=np.int64).reshape(-1)
            if ids.size and (ids.min() < 0 or ids.max() > MAX_TOKEN):
                raise ValueError(f"token ids must be in [0, {MAX_TOKEN}]")
            parts += [ids.astype(np.int32), parts[0]]
        tokens = np.concatenate(parts)
        n_docs = (len(parts) - 1) // 2
        dtype = _positions_dtype(len(tokens))
        if len(tokens) == n_docs + 1:
            ends = np.zeros(0, dtype=dtype)
        else:
            # Sorting the reversed stream orders positions by the text read backwards.
            rev_starts = divsufsort(np.ascontiguousarray(tokens[::-1]))
            ends = (len(tokens) - 1 - rev_starts).astype(dtype)
            ends = ends[tokens[ends] != SEPARATOR]
        tokens.flags.writeable = False
        ends.flags.writeable = False
        return cls(tokens, ends, n_docs)

    def __len__(self) -> int:
        return len(self._ends)

    @property
    def documents(self) -> int:
        return self._documents

    @property
    def stream(self) -> np.ndarray:
        """The read-only token stream ``SEP doc0 SEP doc1 SEP ... SEP`` (``tokens.npy``)."""
        return self._tokens

    def iter_documents(self) -> Iterator[np.ndarray]:
        """Each document's tokens, in the order they were built (read-only int32 views)."""
        seps = np.flatnonzero(self._tokens == SEPARATOR)
        for start, end in zip(seps[:-1].tolist(), seps[1:].tolist(), strict=True):
            yield self._tokens[start + 1 : end]

    def longest_match(
        self, context: Sequence[int], n_max: int = 32, n_min: int = 2
    ) -> Match | None:
        """The longest suffix of ``context``, ``n_min`` to ``n_max`` tokens, that occurs in one
        document, or None. An id outside ``[0, 2**31 - 1]`` ends the suffix there."""
        if n_min < 1 or n_max < n_min:
            raise ValueError("need 1 <= n_min <= n_max")
        tokens, ends = self._tokens, self._ends
        lo, hi, n = 0, len(ends), 0
        for j, tok in enumerate(int(t) for t in reversed(context[-n_max:])):
            if not 0 <= tok <= MAX_TOKEN:
                break

            # Every row in [lo, hi) reads the same j tokens backwards, so the (j+1)-th is sorted;
            # the leading separator keeps p - j inside the array.
            def key(p: int, j: int = j) -> int:
                return tokens[p - j]

            new_lo = bisect_left(ends, tok, lo, hi, key=key)
            new_hi = bisect_right(ends, tok, new_lo, hi, key=key)
            if new_lo == new_hi:
                break
            lo, hi, n = new_lo, new_hi, j + 1
        return Match(n, lo, hi, hi - lo) if n >= n_min else None

    def continuations(
        self, match: Match, k: int, limit: int = 64
    ) -> list[tuple[tuple[int, ...], int]]:
        """Distinct runs of up to ``k`` tokens that follow the occurrences of a match from this
        index, each with how many of the examined occurrences it follows; most frequent first,
        then longer first, then by token ids. A run stops at the end of its document, and an
        occurrence that ends a document adds nothing. When the match has more than ``limit``
        occurrences, ``limit`` rows spread evenly over ``[lo, hi)`` are examined: rows are
        ordered by the text before the match, so the first rows would favour one context."""
        if k < 1 or limit < 1:
            raise ValueError("need k >= 1 and limit >= 1")
        if match.count <= limit:
            rows = np.arange(match.lo, match.hi)
        else:
            rows = np.linspace(match.lo, match.hi - 1, limit).astype(np.int64)
        counts: Counter[tuple[int, ...]] = Counter()
        for p in self._ends[rows].tolist():
            # The trailing separator ends every slice inside its document.
            run = self._tokens[p + 1 : p + 1 + k].tolist()
            if SEPARATOR in run:
                run = run[: run.index(SEPARATOR)]
            if run:
                counts[tuple(run)] += 1
        return sorted(counts.items(), key=lambda item: (-item[1], -len(item[0]), item[0]))

    def save(self, directory: Path) -> None:
        """Write the index into ``directory`` (created if needed), replacing one saved there."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        files: dict[str, Any] = {}
        moves = []
        try:
            for name, array in ((TOKENS_FILE, self._tokens), (SUFFIXES_FILE, self._ends)):
                tmp = directory / f".{name}.{os.getpid()}.tmp"
                moves.append((tmp, directory / name))
                with open_private(tmp, "wb") as fh:
                    np.save(fh, np.asarray(array), allow_pickle=False)
                    fh.flush()
                    os.fsync(fh.fileno())
                size = tmp.stat().st_size
                files[name] = {
                    "bytes": size,
                    "sample_crc32": _sample_crc(tmp, size),
                    "crc32": _full_crc(tmp),
                }
            manifest = {
                "format_version": FORMAT_VERSION,
                "tokens": len(self),
                "documents": self._documents,
                "separator": SEPARATOR,
                "files": files,
            }
            tmp = directory / f".{MANIFEST_FILE}.{os.getpid()}.tmp"
            moves.append((tmp, directory / MANIFEST_FILE))
            with open_private(tmp, "wb") as fh:
                fh.write(json.dumps(manifest, indent=1).encode())
                fh.flush()
                os.fsync(fh.fileno())
            for src, dst in moves:
                os.replace(src, dst)
        finally:
            for src, _ in moves:
                src.unlink(missing_ok=True)

    @classmethod
    def load(cls, directory: Path, verify: bool = False) -> TokenIndex:
        """Map a saved index; ``verify`` also checks the CRC of every byte. Raises
        ``DamagedIndex``."""
        directory = Path(directory)
        manifest, problem = read_json(directory / MANIFEST_FILE)
        if manifest is None:
            raise DamagedIndex(problem or f"{directory / MANIFEST_FILE}: missing")
        if not isinstance(manifest, dict):
            raise DamagedIndex(f"{directory / MANIFEST_FILE}: not a JSON object")
        version = manifest.get("format_version")
        if version != FORMAT_VERSION:
            raise DamagedIndex(f"format version {version!r}, expected {FORMAT_VERSION}")
        n_tokens = _count(manifest, "tokens")
        n_docs = _count(manifest, "documents")
        files = manifest.get("files")
        if not isinstance(files, dict):
            raise DamagedIndex("manifest has no 'files' object")
        n_positions = n_tokens + n_docs + 1
        tokens = _open_array(
            directory / TOKENS_FILE, files.get(TOKENS_FILE), np.int32, n_positions, verify
        )
        ends = _open_array(
            directory / SUFFIXES_FILE,
            files.get(SUFFIXES_FILE),
            _positions_dtype(n_positions),
            n_tokens,
            verify,
        )
        _check_values(tokens, ends, n_docs)
        return cls(tokens, ends, n_docs)


def _check_values(tokens: np.ndarray, ends: np.ndarray, n_docs: int) -> None:
    """``DamagedIndex`` unless the arrays are what ``build`` writes, as far as a lookup
    relies on it: a stream framed by separators, one between documents, ids no lower than
    the separator, and suffix rows naming only positions of tokens (never a separator's,
    nor one past either end)."""
    if tokens[0] != SEPARATOR or tokens[-1] != SEPARATOR:
        raise DamagedIndex(f"{TOKENS_FILE}: does not start and end with a separator")
    if int(np.count_nonzero(tokens == SEPARATOR)) != n_docs + 1 or int(tokens.min()) < SEPARATOR:
        raise DamagedIndex(f"{TOKENS_FILE}: its separators or token ids are out of order")
    if len(ends) == 0:
        return
    if int(ends.min()) < 1 or int(ends.max()) > len(tokens) - 2:
        raise DamagedIndex(f"{SUFFIXES_FILE}: positions outside the token stream")
    if bool((tokens[ends] == SEPARATOR).any()):
        raise DamagedIndex(f"{SUFFIXES_FILE}: positions of separators")


def _positions_dtype(n_positions: int) -> type[np.signedinteger]:
    return np.int32 if n_positions <= MAX_TOKEN else np.int64


def _count(manifest: dict[str, Any], field: str) -> int:
    value = manifest.get(field)
    if type(value) is not int or value < 0:
        raise DamagedIndex(f"manifest field {field!r} is {value!r}, not a count")
    return value


def _open_array(path: Path, entry: Any, dtype: type, length: int, verify: bool) -> np.ndarray:
    if not isinstance(entry, dict):
        raise DamagedIndex(f"manifest does not describe {path.name}")
    try:
        size = path.stat().st_size
        if size != entry.get("bytes"):
            raise DamagedIndex(f"{path}: {size} bytes, manifest says {entry.get('bytes')!r}")
        if _sample_crc(path, size) != entry.get("sample_crc32") or (
            verify and _full_crc(path) != entry.get("crc32")
        ):
            raise DamagedIndex(f"{path}: checksum differs from the manifest")
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, TypeError, EOFError) as err:
        raise DamagedIndex(f"{path}: unreadable: {err}") from err
    if array.dtype != np.dtype(dtype) or array.shape != (length,):
        raise DamagedIndex(
            f"{path}: {array.dtype} {array.shape}, manifest implies {np.dtype(dtype)} ({length},)"
        )
    # A plain ndarray view of the map: same pages, without np.memmap's slower indexing.
    return array.view(np.ndarray)


def _sample_crc(path: Path, size: int) -> int:
    with open(path, "rb") as fh:
        if size <= 2 * _SAMPLE_BYTES:
            return zlib.crc32(fh.read())
        crc = zlib.crc32(fh.read(_SAMPLE_BYTES))
        fh.seek(size - _SAMPLE_BYTES)
        return zlib.crc32(fh.read(_SAMPLE_BYTES), crc)


def _full_crc(path: Path) -> int:
    crc = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK_BYTES):
            crc = zlib.crc32(chunk, crc)
    return crc
