"""Saved prompt states, in memory and on disk, bounded, found by their longest common prefix.

An ``Entry`` is what a pair's models held after a prefix of tokens: the target's tokens and
llama.cpp's bytes of that sequence (``Saved``), and the draft model's where it held them too.
Its ``key`` binds it to what made it (the model files, the runtime recipe, llama.cpp's and
localspec's versions: session/prompt_state.py computes it); its ``draft_key`` does the same
for the draft model's part; an entry is only ever found for the same ``key``, and its draft
part only used for the same ``draft_key``. ``owner`` keeps a server's clients apart: an entry
is found only for the owner that made it.

``PromptCache`` has two tiers, each bounded in bytes, the least recently used entry evicted
first:

- memory (``MemoryTier``): for a running process (a server's lanes, a chat, the API);
- disk (``DiskTier``): ``$LOCALSPEC_HOME/prompt-cache/<key>/<digest>.state``, one file an
  entry, for what outlives the process. Files are 0600 in 0700 folders, written through a
  temporary file and an atomic rename (two processes saving at once never mix bytes); the
  file's modification time is its last use. A file that is truncated, corrupt (a CRC-32 over
  its content), foreign (not this format) or made for another key is skipped with a warning
  and deleted; a write that fails (a full disk, a read-only home) is a warning. Nothing here
  raises for what is on disk.

``find(key, owner, tokens)`` returns the entry sharing the longest prefix with ``tokens``
(``Found``: the tier, the common length), memory first at equal length. ``save`` replaces
the entries of the same key and owner whose tokens the new one extends (a chat's earlier
turns), then evicts down to the bound.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from localspec.storage.store import private_dir

MEMORY = "memory"
DISK = "disk"
MAGIC = b"LSPROMPT"
VERSION = 1
SUFFIX = ".state"
_HEAD = struct.Struct("<8sII")  # magic, format version, header length
MAX_HEADER_BYTES = 1 << 16  # a header names a few numbers: anything larger is not ours


@dataclass(frozen=True)
class Saved:
    """One model's sequence: its tokens, and llama.cpp's bytes of its state after them."""

    tokens: np.ndarray  # int32
    state: bytes

    @property
    def nbytes(self) -> int:
        return len(self.state) + self.tokens.nbytes


@dataclass(frozen=True)
class Entry:
    key: str
    target: Saved
    draft: Saved | None = None
    draft_key: str = ""
    owner: str = ""
    # Seconds a token of this prompt took to evaluate where it was made: what restoring
    # one saves (``PromptState`` weighs it against a read).
    prefill_s: float = 0.0

    @property
    def nbytes(self) -> int:
        return self.target.nbytes + (self.draft.nbytes if self.draft is not None else 0)

    def digest(self) -> str:
        """The entry's name among its key's: its tokens, owner and draft model's part."""
        h = hashlib.sha256(self.target.tokens.astype("<i4").tobytes())
        h.update(f"\0{self.owner}\0{self.draft_key}\0{self.draft is not None}".encode())
        return h.hexdigest()[:32]


@dataclass(frozen=True)
class Found:
    entry: Entry
    tier: str  # MEMORY or DISK
    common: int  # tokens the entry shares with the prompt it was found for


def common_length(a: np.ndarray, b: np.ndarray) -> int:
    """The length of the common prefix of two int32 arrays."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def as_tokens(tokens: object) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int32)


class MemoryTier:
    """Entries in this process, up to ``limit`` bytes, least recently used evicted first."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._entries: OrderedDict[tuple[str, str, str], Entry] = OrderedDict()

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())

    def __len__(self) -> int:
        return len(self._entries)

    def best(self, key: str, owner: str, tokens: np.ndarray) -> tuple[Entry, int] | None:
        best: tuple[Entry, int] | None = None
        for entry in self._entries.values():
            if entry.key != key or entry.owner != owner:
                continue
            common = common_length(entry.target.tokens, tokens)
            if common and (best is None or common > best[1]):
                best = (entry, common)
        if best is not None:
            self._entries.move_to_end((key, owner, best[0].digest()))
        return best

    def holds(self, key: str, owner: str, tokens: np.ndarray) -> bool:
        """Whether an entry holds all of ``tokens`` already."""
        return any(
            e.key == key
            and e.owner == owner
            and common_length(e.target.tokens, tokens) == len(tokens)
            for e in self._entries.values()
        )

    def save(self, entry: Entry) -> None:
        if entry.nbytes > self.limit:
            return
        for name, kept in list(self._entries.items()):
            if kept.key == entry.key and kept.owner == entry.owner and _extends(entry, kept):
                del self._entries[name]
        self._entries[(entry.key, entry.owner, entry.digest())] = entry
        while self.nbytes > self.limit:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()


def _extends(new: Entry, old: Entry) -> bool:
    """Whether ``new`` holds all that ``old`` does: its tokens start with old's, and it
    keeps the draft model's part if old had one."""
    n = len(old.target.tokens)
    if len(new.target.tokens) < n or common_length(new.target.tokens, old.target.tokens) < n:
        return False
    return old.draft is None or new.draft is not None


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
        entry = self._load(found[0], warnings)
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

    def _load(self, head: _Header, warnings: list[str]) -> Entry | None:
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


class PromptCache:
    """The two tiers (either may be None: off) behind one lock, shared by a pair's lanes."""

    def __init__(self, memory: MemoryTier | None, disk: DiskTier | None) -> None:
        self.memory = memory
        self.disk = disk
        self._lock = threading.Lock()
        self.io_rate = DEFAULT_IO_RATE  # bytes a second of the last disk write, measured

    def find(
        self,
        key: str,
        owner: str,
        tokens: object,
        warnings: list[str],
        pays: Callable[[int, int, float], bool] | None = None,
    ) -> Found | None:
        """The entry sharing the longest prefix with ``tokens``. One on disk is read only
        where ``pays(common, nbytes, prefill_s)`` says that reading it is worth it."""
        wanted = as_tokens(tokens)
        with self._lock:
            found = self.memory.best(key, owner, wanted) if self.memory is not None else None
            best = Found(found[0], MEMORY, found[1]) if found is not None else None
            if self.disk is None:
                return best
            head = self.disk.longest(key, owner, wanted, warnings)
            if head is None or (best is not None and head[1] <= best.common):
                return best
            size = head[0].target_bytes + head[0].draft_bytes
            if pays is not None and not pays(head[1], size, head[0].prefill_s):
                return best
            entry = self.disk._load(head[0], warnings)
            return Found(entry, DISK, head[1]) if entry is not None else best

    def known(self, key: str, owner: str, tokens: object) -> int:
        """How long a prefix of ``tokens`` some entry holds already (nothing read but the
        entries' tokens)."""
        wanted = as_tokens(tokens)
        with self._lock:
            found = self.memory.best(key, owner, wanted) if self.memory is not None else None
            head = self.disk.longest(key, owner, wanted, []) if self.disk is not None else None
            return max(found[1] if found else 0, head[1] if head else 0)

    def save(self, entry: Entry, *, memory: bool, disk: bool) -> str:
        """Keep ``entry`` in the tiers asked for that are on; "" or why it was not saved."""
        with self._lock:
            if memory and self.memory is not None:
                self.memory.save(entry)
            if not (disk and self.disk is not None):
                return ""
            t0 = time.perf_counter()
            problem = self.disk.save(entry)
            spent = time.perf_counter() - t0
            if not problem and spent > 0:
                self.io_rate = entry.nbytes / spent
            return problem

    def entries(self) -> Iterator[tuple[str, int]]:
        """(tier, bytes) of every entry, for a summary."""
        if self.memory is not None:
            for entry in list(self.memory._entries.values()):
                yield MEMORY, entry.nbytes
        if self.disk is not None:
            for path in self.disk.files():
                yield DISK, _size(path)


# Until a write is measured, a disk is assumed to move this many bytes a second: a slow
# SSD's, so that the first prompts are saved only where their evaluation clearly costs more.
DEFAULT_IO_RATE = 200e6
