"""Which tokenizer a model has, as a short string: a datastore is only used with its own.

``vocabulary_fingerprint(model)`` hashes (sha256, first 32 hex digits) the vocabulary type,
its size, the BOS/EOS ids and add-BOS/add-EOS flags, and every token's bytes (control
tokens' texts included). Two models get the same fingerprint exactly when these agree: they
turn text into the same ids and ids into the same text.

Hashing a 150k-token vocabulary takes about half a second and happens at every session
start that records or drafts from a store, so the result is cached per model file (resolved
path, size, modification and change times, inode) in a small JSON file: a hit costs a
``stat`` and reading that file. ``cached_fingerprint(path)`` answers from the cache alone
(None when not there).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from localspec.statefiles import read_json, write_json

VERSION = "v1"  # of what is hashed: a new one makes every cached fingerprint stale
CACHE_ENTRIES = 32


class Vocabulary(Protocol):
    n_vocab: int

    def vocab_info(self) -> Any: ...  # backend.vocab.VocabInfo

    def token_bytes(self, token: int, *, special: bool = False) -> bytes: ...


def vocabulary_fingerprint(
    model: Vocabulary, cache: Path | None = None, warn: Callable[[str], None] | None = None
) -> str:
    """The tokenizer's fingerprint; cached in ``cache`` (a JSON file) per model file. A
    cache file that cannot be used is told to ``warn`` and written anew."""
    path = getattr(model, "path", None)  # a model loaded from a file names it
    key = _file_key(Path(path)) if cache is not None and path is not None else None
    if cache is not None and key is not None:
        found = _lookup(cache, key)
        if found is not None:
            return found
    fingerprint = compute(model)
    if cache is not None and key is not None:
        entries, problem = _read_checked(cache)
        if problem and warn is not None:
            warn(f"ignoring the cache of tokenizer fingerprints: {problem}")
        entries.pop(key[0], None)  # re-inserted last: the oldest entries are dropped first
        entries[key[0]] = {"stamp": key[1], "fingerprint": fingerprint}
        write_json(cache, dict(list(entries.items())[-CACHE_ENTRIES:]))  # best effort
    return fingerprint


def cached_fingerprint(path: Path, cache: Path) -> str | None:
    """The fingerprint of the model file at ``path`` if the cache knows it, else None."""
    key = _file_key(path)
    return _lookup(cache, key) if key is not None else None


def _lookup(cache: Path, key: tuple[str, list[int]]) -> str | None:
    found = _read(cache).get(key[0])
    if isinstance(found, dict) and found.get("stamp") == key[1]:
        value = found.get("fingerprint")
        return value if isinstance(value, str) else None
    return None


def compute(model: Vocabulary) -> str:
    info = model.vocab_info()
    head = (VERSION, info.vocab_type, model.n_vocab, info.bos, info.eos)
    parts = [repr((*head, info.add_bos, info.add_eos)).encode()]
    for token in range(model.n_vocab):
        piece = model.token_bytes(token, special=True)
        parts += [len(piece).to_bytes(4, "little"), piece]  # length first: unambiguous
    return hashlib.sha256(b"".join(parts)).hexdigest()[:32]


def _file_key(path: Path) -> tuple[str, list[int]] | None:
    try:
        resolved = path.resolve()
        info = os.stat(resolved)
    except OSError:
        return None
    return str(resolved), [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]


def _read(cache: Path) -> dict[str, Any]:
    return _read_checked(cache)[0]


def _read_checked(cache: Path) -> tuple[dict[str, Any], str]:
    """The cache's entries, and why none could be read; an unusable file is a cache with
    none (computed again and written anew: losing it costs only the time to compute)."""
    data, problem = read_json(cache)
    if data is not None and not isinstance(data, dict):
        return {}, f"{cache} is not a JSON object"
    return data or {}, problem
