"""Writing a datastore: ``add_files`` indexes files into a store of a ``Library``, and
``time_lookups`` measures what a lookup in a store costs.

``add_files(library, name, fingerprint, model_file, scan, tokenize)`` tokenizes every file
the scan yields (storage/sources.py), each one document, and writes the store anew from
its old documents (read back from its index, their source paths from ``documents.json``)
and the new ones: a file the store already holds is replaced by its new content, and a file
under an added directory that no longer exists on disk is dropped. The new store is written
into a temporary directory beside the old one and put in its place by renames, so an
interrupted add (Ctrl-C, a full disk) leaves the previous store as it was.

One add at a time per store: a lock file beside it (``.<name>.lock``) is held from the
first read of the old store to the last rename, and a second add of the same store fails at
once, saying so. What one add reads is bounded: it stops with an ``InputError`` as soon as
the files it tokenized pass ``max_tokens`` tokens (``datastore add --max-tokens``), before
anything is written. The store's directory and files are private (0700, 0600).

Errors, all raised before anything is written: ``UsageError`` for an invalid name or a
store built with another tokenizer; ``DatastoreError`` for a damaged store (checked whole,
before any file is read), one that another add is writing, or one that cannot be written;
``InputError`` when no file was indexable, or the files hold more than ``max_tokens``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from filelock import FileLock, Timeout

from localspec.core.drafting.store import EXAMINED
from localspec.errors import DatastoreError, InputError, UsageError
from localspec.progress import OnProgress, tell
from localspec.statefiles import open_private, private_dir, read_json
from localspec.storage.datastore import SEPARATOR, TokenIndex
from localspec.storage.library import (
    DOCUMENTS_FILE,
    FORMAT_VERSION,
    RESERVED,
    STORE_FILE,
    Library,
    check_name,
    damaged,
)
from localspec.storage.sources import Scan

PROGRESS_EVERY_S = 2.0
MAX_ADD_TOKENS = 100_000_000  # about 400 MB of text; the index needs 8-12 bytes a token

Tokenize = Callable[[str], list[int]]
Existing = tuple[dict[str, Any], list[str], TokenIndex]  # manifest, source paths, index


@dataclass
class AddResult:
    name: str
    indexed: int  # files read and tokenized by this add
    replaced: int  # of those, files the store already held
    removed: int  # files gone from disk under an added directory, dropped from the store
    documents: int
    tokens: int
    skipped: Counter[str]


def add_files(
    library: Library,
    name: str,
    fingerprint: str,
    model_file: str,
    scan: Scan,
    tokenize: Tokenize,
    on_progress: OnProgress | None = None,
    max_tokens: int = MAX_ADD_TOKENS,
) -> AddResult:
    """Index the scanned files into store ``name`` (created, or added to), telling
    ``on_progress`` how far it got; see the module docstring."""
    check_name(name)
    with _add_lock(library.root, name):
        return _add(library, name, fingerprint, model_file, scan, tokenize, on_progress,
                    max_tokens)  # fmt: skip


@contextlib.contextmanager
def _add_lock(root: Path, name: str) -> Iterator[None]:
    try:
        private_dir(root, root)
        lock = FileLock(str(root / f".{name}.lock"), timeout=0, mode=0o600)
        lock.acquire()
    except Timeout:
        raise DatastoreError(
            f"another `localspec datastore add` is writing datastore {name!r}",
            "wait for it to finish, then add again",
        ) from None
    except OSError as err:
        raise DatastoreError(
            f"cannot write under {root}: {err.strerror or err}", "check its permissions"
        ) from None
    try:
        yield
    finally:
        lock.release()


def _add(
    library: Library, name: str, fingerprint: str, model_file: str, scan: Scan,
    tokenize: Tokenize, on_progress: OnProgress | None, max_tokens: int,
) -> AddResult:  # fmt: skip
    old = _existing(library, name, fingerprint)
    new = _tokenize_all(scan, tokenize, on_progress, max_tokens)
    if not new:
        skipped = f" (skipped: {describe_skipped(scan.skipped)})" if scan.skipped else ""
        raise InputError(
            f"no indexable file found under {', '.join(map(str, scan.roots))}{skipped}",
            "datastore add indexes UTF-8 text files up to --max-file-size bytes",
        )
    paths, documents, replaced, removed = _merge(old, new, scan.roots)
    now = datetime.now(UTC).isoformat(timespec="seconds")
    before = old[0] if old else {}
    manifest = {
        "format_version": FORMAT_VERSION,
        "name": name,
        "tokenizer": fingerprint,
        "model": model_file,
        "sources": list(dict.fromkeys([*before.get("sources", []), *map(str, scan.roots)])),
        "files": len(paths),
        "tokens": sum(len(d) for d in documents),
        "created": before.get("created", now),
        "updated": now,
    }
    tell(on_progress, f"building the index of {manifest['tokens']:,} tokens")
    _write(library.root, name, manifest, paths, documents)
    return AddResult(
        name, len(new), replaced, removed, len(paths), manifest["tokens"], scan.skipped
    )


def default_name(path: Path) -> str:
    """A store's name from the first path added: its base name, made a valid name."""
    name = "".join(c if c.isascii() and (c.isalnum() or c in "._-") else "-" for c in
                   Path(os.path.abspath(path)).name).lstrip("._-")[:64]  # fmt: skip
    if not name or name in RESERVED:
        raise UsageError(f"cannot name a datastore after {str(path)!r}", "give --name NAME")
    return name


def describe_skipped(skipped: Counter[str]) -> str:
    return ", ".join(f"{n} {reason}" for reason, n in skipped.most_common())


def _existing(library: Library, name: str, fingerprint: str) -> Existing | None:
    """The store to add to (checked whole, before any file is read), or None."""
    if not (library.root / name).is_dir():
        return None
    manifest = library.manifest(name)
    if manifest["tokenizer"] != fingerprint:
        raise UsageError(
            f"datastore {name!r} was built with another tokenizer than this target's "
            f"(it was tokenized with {manifest.get('model')})",
            "pass that model as --target, or choose another --name",
        )
    index = library.index(name, verify=True)  # read whole: its documents are kept
    data, problem = read_json(library.root / name / DOCUMENTS_FILE)
    paths = data.get("paths") if isinstance(data, dict) else None
    if problem:
        raise damaged(name, problem)
    if not isinstance(paths, list) or len(paths) != index.documents:
        raise damaged(name, f"{DOCUMENTS_FILE} does not list the index's documents")
    return manifest, [str(p) for p in paths], index


def _tokenize_all(
    scan: Scan, tokenize: Tokenize, on_progress: OnProgress | None, max_tokens: int
) -> dict[str, np.ndarray]:
    new: dict[str, np.ndarray] = {}
    tokens, last = 0, time.monotonic()
    for source in scan:
        ids = np.asarray(tokenize(source.text), dtype=np.int32)
        if ids.size:
            new[source.path] = ids
            tokens += ids.size
        if tokens > max_tokens:  # stop reading: the rest would be thrown away too
            raise InputError(
                f"the files hold more than {max_tokens:,} tokens ({len(new):,} files read "
                f"so far); nothing was written",
                "add fewer or smaller paths, or raise the limit with --max-tokens N",
            )
        if on_progress is not None and time.monotonic() - last >= PROGRESS_EVERY_S:
            last = time.monotonic()
            tell(on_progress, f"tokenized {len(new):,} files ({tokens:,} tokens)")
    return new


def _merge(
    old: Existing | None, new: dict[str, np.ndarray], roots: list[Path]
) -> tuple[list[str], list[np.ndarray], int, int]:
    """The store's documents after an add: the old ones minus those replaced or deleted
    from disk under an added directory, then the new ones. -> paths, documents, replaced,
    removed."""
    paths: list[str] = []
    documents: list[np.ndarray] = []
    replaced = removed = 0
    walked = [root for root in roots if root.is_dir()]
    if old is not None:
        for path, document in zip(old[1], old[2].iter_documents(), strict=True):
            if path in new:
                replaced += 1
            elif any(Path(path).is_relative_to(r) for r in walked) and not os.path.exists(path):
                removed += 1
            else:
                paths.append(path)
                documents.append(document)
    return paths + list(new), documents + list(new.values()), replaced, removed


def _write(
    root: Path, name: str, manifest: dict, paths: list[str], documents: list[np.ndarray]
) -> None:
    try:
        private_dir(root, root)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", suffix=".tmp", dir=root))
    except OSError as err:
        raise DatastoreError(
            f"cannot write under {root}: {err.strerror or err}", "check its permissions"
        ) from None
    try:
        TokenIndex.build(documents).save(tmp)
        _dump(tmp / DOCUMENTS_FILE, {"paths": paths})
        _dump(tmp / STORE_FILE, manifest)  # last: a directory without it is no store
        _swap(tmp, root / name)
    except OSError as err:
        raise DatastoreError(
            f"could not write datastore {name!r}: {err.strerror or err}",
            "check the free disk space; the previous store is unchanged",
        ) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _dump(path: Path, data: Any) -> None:
    with open_private(path, "wb") as fh:
        fh.write(json.dumps(data, indent=1).encode())
        fh.flush()
        os.fsync(fh.fileno())


def _swap(new: Path, final: Path) -> None:
    """Put directory ``new`` in place of ``final``; on any failure ``final`` is as it was."""
    if not final.exists():
        os.rename(new, final)
        return
    old = final.with_name(f".{final.name}.{os.getpid()}.old")
    os.rename(final, old)
    try:
        os.rename(new, final)
    except BaseException:
        os.rename(old, final)
        raise
    shutil.rmtree(old, ignore_errors=True)


def time_lookups(
    index: TokenIndex, n: int = 1000, seed: int = 0, n_max: int = 32, k: int = 16
) -> list[float]:
    """Seconds of ``n`` lookups (``longest_match``, then ``continuations`` of ``k`` tokens
    over the drafter's sample of occurrences) of contexts taken at random positions of the
    store itself, as a drafter would make them."""
    stream = index.stream
    if len(index) == 0:
        return []
    rng = np.random.default_rng(seed)
    times: list[float] = []
    while len(times) < n:
        end = int(rng.integers(2, len(stream)))
        context = stream[max(0, end - n_max) : end].tolist()
        if SEPARATOR in context:  # keep it within one document
            context = context[len(context) - context[::-1].index(SEPARATOR) :]
        if not context:
            continue
        start = time.perf_counter()
        match = index.longest_match(context, n_max, 1)
        if match is not None:
            index.continuations(match, k, EXAMINED)
        times.append(time.perf_counter() - start)
    return times
