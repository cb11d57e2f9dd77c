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
- disk (``DiskTier``, storage/prompt_disk.py): ``$LOCALSPEC_HOME/prompt-cache/``, one file
  an entry, for what outlives the process; private, written atomically, and a damaged file
  or a failed write a warning, never an exception.

``find(key, owner, tokens)`` returns the entry sharing the longest prefix with ``tokens``
(``Found``: the tier, the common length), memory first at equal length. ``save`` replaces
the entries of the same key and owner whose tokens the new one extends (a chat's earlier
turns), then evicts down to the bound.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from localspec.storage.prompt_disk import DiskTier
from localspec.storage.prompt_entries import Entry, Saved, as_tokens, common_length

__all__ = ["DISK", "MEMORY", "DiskTier", "Entry", "Found", "MemoryTier", "PromptCache", "Saved",
           "as_tokens", "common_length"]  # fmt: skip

MEMORY = "memory"
DISK = "disk"


@dataclass(frozen=True)
class Found:
    entry: Entry
    tier: str  # MEMORY or DISK
    common: int  # tokens the entry shares with the prompt it was found for


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
            entry = self.disk.load(head[0], warnings)
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


# Until a write is measured, a disk is assumed to move this many bytes a second: a slow
# SSD's, so that the first prompts are saved only where their evaluation clearly costs more.
DEFAULT_IO_RATE = 200e6
