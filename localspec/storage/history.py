"""The answers kept for one tokenizer: an append-only log, and a token index built from it.

One directory (``Library`` picks one per tokenizer fingerprint) holds:

- ``log.bin``: records of little-endian 32-bit words, ``length, crc32, token * length``.
  ``append`` adds one record in one write, so keeping an answer never rebuilds an index.
  Before it writes, it cuts away a torn record at the log's end (a write the disk ran out
  of room for, a crash): appended after it, every later answer would be hidden behind it
  and dropped by the next compaction. A write that fails is cut away at once.
- The ``TokenIndex`` files (storage/datastore.py) of the log's first ``log_bytes`` bytes,
  and ``state.json``: that size, the log file's inode, and the index's document count.

``open()`` returns the corpora to draft from: the saved index and, when answers were
appended since it was built (at most ``tail_tokens`` tokens), a small index of those built
in memory. Otherwise (more appended, the log replaced, the index damaged or missing) it
rebuilds: it reads the log's valid records (a torn or damaged record ends the log there),
keeps the newest ``max_tokens`` tokens, writes the log back compacted (temporary file and
atomic rename) when anything was dropped, and saves a new index. A file lock keeps one
process from appending while another compacts. Files are created mode 0600 (the caller
makes the directory private: storage/library.py). Failures are ``OSError`` or
``filelock.Timeout``, for the caller to report; damage is repaired, never raised.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from filelock import FileLock

from localspec.statefiles import open_private, read_json, write_json
from localspec.storage.datastore import MAX_TOKEN, DamagedIndex, TokenIndex

FORMAT_VERSION = 1
LOG_FILE = "log.bin"
STATE_FILE = "state.json"
LOCK_FILE = ".lock"
MAX_TOKENS = 2_000_000  # the newest tokens kept
TAIL_TOKENS = 50_000  # appended tokens indexed in memory before the saved index is rebuilt
LOCK_TIMEOUT_S = 10.0


class History:
    """One tokenizer's history; see the module docstring."""

    def __init__(
        self, directory: Path, max_tokens: int = MAX_TOKENS, tail_tokens: int = TAIL_TOKENS
    ) -> None:
        self.directory = Path(directory)
        self.log = self.directory / LOG_FILE
        self.max_tokens = max_tokens
        self.tail_tokens = tail_tokens

    def _lock(self) -> FileLock:
        return FileLock(str(self.directory / LOCK_FILE), timeout=LOCK_TIMEOUT_S, mode=0o600)

    def append(self, document: Sequence[int]) -> None:
        """Add one document to the log. ``ValueError`` for an id outside ``[0, 2**31 - 1]``."""
        ids = np.asarray(document, dtype=np.int64).reshape(-1)
        if ids.size == 0:
            return
        if ids.min() < 0 or ids.max() > MAX_TOKEN:
            raise ValueError(f"token ids must be in [0, {MAX_TOKEN}]")
        record = _record(ids.astype("<i4"))
        self.directory.mkdir(parents=True, exist_ok=True)
        with self._lock(), open_private(self.log, "ab") as fh:
            size = os.fstat(fh.fileno()).st_size
            end = self._valid_end(size)
            if end != size:  # a torn record: what follows it would never be read
                os.ftruncate(fh.fileno(), end)
            try:
                fh.write(record)
                fh.flush()
            except OSError:
                os.ftruncate(fh.fileno(), end)  # no torn record of ours is left behind
                raise

    def _valid_end(self, size: int) -> int:
        """Where the log's valid records end: read from the end of what the saved index
        covers (checked when it was built), or from the start."""
        state = self._state()
        start = 0
        if state is not None and 0 <= state["log_bytes"] <= size:
            try:
                if state["log_inode"] == self.log.stat().st_ino:
                    start = state["log_bytes"]
            except OSError:
                pass
        if start == size:
            return size
        return read_records(self.log, start)[1]

    def open(self) -> list[TokenIndex]:
        """The index of the log, and one of what was appended since (see the docstring)."""
        if not self.log.is_file():
            return []
        with self._lock():
            info = self.log.stat()
            state = self._state()
            index = self._saved_index(state, info)
            if index is not None and state is not None:  # an index is saved with its state
                start = state["log_bytes"]
                if (info.st_size - start) // 4 <= self.tail_tokens:
                    tail, end = read_records(self.log, start)
                    if end == info.st_size:
                        corpora = [index, TokenIndex.build(tail)] if tail else [index]
                        return [corpus for corpus in corpora if len(corpus)]
            index = self._rebuild()
        return [index] if len(index) else []

    def summary(self) -> tuple[int, int]:
        """Documents and tokens in the log (what ``open`` would keep, before any cap)."""
        if not self.log.is_file():
            return 0, 0
        records, _ = read_records(self.log)
        return len(records), sum(len(r) for r in records)

    def _state(self) -> dict[str, Any] | None:
        state, _ = read_json(self.directory / STATE_FILE)  # unusable: rebuilt
        if not isinstance(state, dict) or state.get("format_version") != FORMAT_VERSION:
            return None
        if not all(type(state.get(k)) is int for k in ("log_bytes", "log_inode", "documents")):
            return None
        return state

    def _saved_index(self, state: dict[str, Any] | None, info: os.stat_result) -> TokenIndex | None:
        """The saved index if it still describes the start of this very log file."""
        if state is None or state["log_inode"] != info.st_ino:
            return None  # never built, or the log was replaced since
        if not 0 <= state["log_bytes"] <= info.st_size:
            return None
        try:
            index = TokenIndex.load(self.directory)
        except DamagedIndex:
            return None
        return index if index.documents == state["documents"] else None

    def _rebuild(self) -> TokenIndex:
        records, end = read_records(self.log)
        kept = newest(records, self.max_tokens)
        dropped = sum(map(len, records)) - sum(map(len, kept))
        if dropped or end != self.log.stat().st_size:
            self._rewrite(kept)
        index = TokenIndex.build(kept)
        index.save(self.directory)
        info = self.log.stat()
        state = {
            "format_version": FORMAT_VERSION,
            "log_bytes": info.st_size,
            "log_inode": info.st_ino,
            "documents": index.documents,
            "tokens": len(index),
        }
        write_json(self.directory / STATE_FILE, state)  # unwritten: rebuilt again next time
        return index

    def _rewrite(self, records: list[np.ndarray]) -> None:
        tmp = self.directory / f".{LOG_FILE}.{os.getpid()}.tmp"
        try:
            with open_private(tmp, "wb") as fh:
                for record in records:
                    fh.write(_record(record))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.log)
        finally:
            tmp.unlink(missing_ok=True)


def _record(tokens: np.ndarray) -> bytes:
    body = np.ascontiguousarray(tokens, dtype="<i4").tobytes()
    return np.array([len(tokens), zlib.crc32(body)], dtype="<u4").tobytes() + body


def read_records(path: Path, offset: int = 0) -> tuple[list[np.ndarray], int]:
    """The valid records from byte ``offset`` on, and the byte where they end: a record cut
    short or whose checksum differs ends the log there."""
    words = np.fromfile(path, dtype="<u4", offset=offset)
    records = []
    i, n = 0, len(words)
    while i + 2 <= n:
        length, crc = int(words[i]), int(words[i + 1])
        body = words[i + 2 : i + 2 + length]
        if i + 2 + length > n or zlib.crc32(body.tobytes()) != crc:
            break
        records.append(body.view("<i4"))
        i += 2 + length
    return records, offset + 4 * i


def newest(records: list[np.ndarray], max_tokens: int) -> list[np.ndarray]:
    """The newest records holding at most ``max_tokens`` tokens, oldest first; when the
    newest alone is longer, its last ``max_tokens`` tokens."""
    kept: list[np.ndarray] = []
    total = 0
    for record in reversed(records):
        if total + len(record) > max_tokens:
            if not kept:
                kept.append(record[len(record) - max_tokens :])
            break
        kept.append(record)
        total += len(record)
    return kept[::-1]
