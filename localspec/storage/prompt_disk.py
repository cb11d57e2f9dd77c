"""The prompt cache's disk tier: one file an entry, found by its tokens, bounded.

``DiskTier(root, limit)`` keeps entries (storage/prompt_cache.py) as
``root/<key>/<digest>.state``: a magic, a format version and a JSON header (the key, the
owner, the draft model's key, the counts and sizes of the parts, a CRC-32 of them, the
prefill time a token took where the entry was made), then the target's tokens, the draft
model's, and their states. ``longest`` reads only headers and tokens to find the entry
sharing the longest prefix with a prompt; ``load`` reads the rest and checks its CRC.
``save`` writes through a temporary file (mode 0600, in 0700 folders) and a rename,
deletes the entries of the same owner that the new one extends, then ``evict``s the least
recently used files (a file's modification time is its last use) down to ``limit`` bytes.
A file that is truncated, corrupt, foreign or of another format version is skipped with a
warning and deleted; a write that fails is a warning. Nothing here raises for what is on
disk.
"""

from __future__ import annotations

import json
import os
import struct
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from localspec.statefiles import private_dir
from localspec.storage.prompt_entries import Entry, Saved, common_length

MAGIC = b"LSPROMPT"
VERSION = 1
SUFFIX = ".state"
_HEAD = struct.Struct("<8sII")  # magic, format version, header length
MAX_HEADER_BYTES = 1 << 16  # a header names a few numbers: anything larger is not ours


@dataclass
class _Header:
    path: Path
    key: str
    owner: str
    draft_key: str
    n_target: int
    n_draft: int
    target_bytes: int
    draft_bytes: int
    crc: int
    prefill_s: float
    body: int  # offset of the first token
    tokens: np.ndarray = field(default_factory=lambda: np.empty(0, np.int32))


@dataclass(frozen=True)
class Listed:
    """One file of the disk tier, as ``localspec prompt-cache list`` shows it."""

    path: Path
    tokens: int
    draft_tokens: int
    nbytes: int
    used: float  # the last use, seconds since the epoch
    owner: str


class DiskTier:
    """Entries under ``root``, up to ``limit`` bytes (see the module docstring)."""

    def __init__(self, root: Path, limit: int) -> None:
        self.root = Path(root)
        self.limit = limit

    def files(self) -> list[Path]:
        try:
            return [p for p in self.root.glob(f"*/*{SUFFIX}") if p.is_file()]
        except OSError:
            return []

    @property
    def nbytes(self) -> int:
        return sum(_size(p) for p in self.files())

    def longest(
        self, key: str, owner: str, tokens: np.ndarray, warnings: list[str]
    ) -> tuple[_Header, int] | None:
        """The header of the entry sharing the longest prefix with ``tokens``, and its
        length; only headers and tokens are read."""
        best: tuple[_Header, int] | None = None
        for path in self._folder(key).glob(f"*{SUFFIX}"):
            head = self._header(path, warnings, with_tokens=True)
            if head is None or head.key != key or head.owner != owner:
                continue
            common = common_length(head.tokens, tokens)
            if common and (best is None or common > best[1]):
                best = (head, common)
        return best

    def best(
        self, key: str, owner: str, tokens: np.ndarray, warnings: list[str]
    ) -> tuple[Entry, int] | None:
        found = self.longest(key, owner, tokens, warnings)
        if found is None:
            return None
        entry = self.load(found[0], warnings)
        return (entry, found[1]) if entry is not None else None

    def save(self, entry: Entry) -> str:
        """Write ``entry`` (replacing those it extends, then evicting); "" or why not."""
        if entry.nbytes > self.limit:
            return ""
        folder = self._folder(entry.key)
        try:
            private_dir(folder, self.root)
            self._write(folder / f"{entry.digest()}{SUFFIX}", entry)
        except OSError as err:
            return f"could not save the prompt in {self.root}: {err.strerror or err}"
        for path in folder.glob(f"*{SUFFIX}"):
            if path.name == f"{entry.digest()}{SUFFIX}":
                continue
            head = self._header(path, [], with_tokens=True)
            if head is not None and head.owner == entry.owner and self._extended(entry, head):
                path.unlink(missing_ok=True)
        self.evict()
        return ""

    @staticmethod
    def _extended(new: Entry, head: _Header) -> bool:
        n = head.n_target
        if len(new.target.tokens) < n or common_length(new.target.tokens, head.tokens) < n:
            return False
        return head.n_draft == 0 or new.draft is not None

    def evict(self) -> int:
        """Delete the least recently used files until the tier fits its limit; how many."""
        files = []
        for path in self.files():
            try:
                st = path.stat()
            except OSError:
                continue
            files.append((st.st_mtime_ns, st.st_size, path))
        files.sort()
        total = sum(size for _, size, _ in files)
        removed = 0
        for _, size, path in files:
            if total <= self.limit:
                break
            path.unlink(missing_ok=True)
            total -= size
            removed += 1
        return removed

    def listing(self) -> list[Listed]:
        """Every entry's summary, the most recently used first (damaged files skipped)."""
        listed: list[Listed] = []
        for path in self.files():
            head = self._header(path, [], with_tokens=False)
            try:
                st = path.stat()
            except OSError:
                continue
            if head is not None:
                listed.append(
                    Listed(path, head.n_target, head.n_draft, st.st_size, st.st_mtime, head.owner)
                )
        return sorted(listed, key=lambda item: -item.used)

    def clear(self) -> int:
        removed = 0
        for path in self.files():
            path.unlink(missing_ok=True)
            removed += 1
        return removed

    def _folder(self, key: str) -> Path:
        return self.root / key[:32]

    def _write(self, path: Path, entry: Entry) -> None:
        draft = entry.draft
        parts = [
            entry.target.tokens.astype("<i4").tobytes(),
            draft.tokens.astype("<i4").tobytes() if draft is not None else b"",
            entry.target.state,
            draft.state if draft is not None else b"",
        ]
        crc = 0
        for part in parts:
            crc = zlib.crc32(part, crc)
        header = json.dumps(
            {
                "key": entry.key,
                "owner": entry.owner,
                "draft_key": entry.draft_key,
                "n_target": len(entry.target.tokens),
                "n_draft": len(draft.tokens) if draft is not None else 0,
                "target_bytes": len(entry.target.state),
                "draft_bytes": len(draft.state) if draft is not None else 0,
                "crc": crc,
                "prefill_s": entry.prefill_s,
            }  # fmt: skip
        ).encode()
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:  # mkstemp's file is 0600
                fh.write(_HEAD.pack(MAGIC, VERSION, len(header)))
                fh.write(header)
                for part in parts:
                    fh.write(part)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _header(self, path: Path, warnings: list[str], *, with_tokens: bool) -> _Header | None:
        try:
            with open(path, "rb") as fh:
                head = _parse_header(path, fh.read(_HEAD.size), fh)
                if head is not None and with_tokens:
                    raw = fh.read(4 * head.n_target)
                    if len(raw) != 4 * head.n_target:
                        head = None
                    else:
                        head.tokens = np.frombuffer(raw, dtype="<i4").astype(np.int32)
        except OSError:
            return None  # gone since it was listed (another process evicted it)
        except (ValueError, KeyError, TypeError):
            head = None
        if head is None:
            self._drop(path, "not a prompt state of this localspec", warnings)
        return head

    def load(self, head: _Header, warnings: list[str]) -> Entry | None:
        try:
            with open(head.path, "rb") as fh:
                fh.seek(head.body)
                sizes = (4 * head.n_target, 4 * head.n_draft, head.target_bytes, head.draft_bytes)
                parts = [fh.read(n) for n in sizes]
                extra = fh.read(1)
        except OSError:
            return None
        if any(len(p) != n for p, n in zip(parts, sizes, strict=True)) or extra:
            self._drop(head.path, "truncated", warnings)
            return None
        crc = 0
        for part in parts:
            crc = zlib.crc32(part, crc)
        if crc != head.crc:
            self._drop(head.path, "corrupt", warnings)
            return None
        with _quiet():
            os.utime(head.path)  # its last use, for the eviction order
        target = Saved(np.frombuffer(parts[0], dtype="<i4").astype(np.int32), parts[2])
        draft = None
        if head.n_draft:
            draft = Saved(np.frombuffer(parts[1], dtype="<i4").astype(np.int32), parts[3])
        return Entry(head.key, target, draft, head.draft_key, head.owner, head.prefill_s)

    @staticmethod
    def _drop(path: Path, why: str, warnings: list[str]) -> None:
        warnings.append(f"a saved prompt state was skipped ({why}): {path.name}")
        with _quiet():
            path.unlink()


def _parse_header(path: Path, first: bytes, fh) -> _Header | None:
    if len(first) != _HEAD.size:
        return None
    magic, version, length = _HEAD.unpack(first)
    if magic != MAGIC or version != VERSION or not 0 < length <= MAX_HEADER_BYTES:
        return None
    raw = fh.read(length)
    data = json.loads(raw.decode("utf-8"))
    counts = [int(data[k]) for k in ("n_target", "n_draft", "target_bytes", "draft_bytes")]
    if any(n < 0 for n in counts) or counts[0] == 0:
        return None
    n_target, n_draft, target_bytes, draft_bytes = counts
    return _Header(
        path, str(data["key"]), str(data["owner"]), str(data["draft_key"]), n_target, n_draft,
        target_bytes, draft_bytes, int(data["crc"]), max(0.0, float(data["prefill_s"])),
        _HEAD.size + length,
    )  # fmt: skip


class _quiet:
    """Ignore an ``OSError`` (a file another process removed or a read-only folder)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, value, tb) -> bool:
        return kind is not None and issubclass(kind, OSError)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
