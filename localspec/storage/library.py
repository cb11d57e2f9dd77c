"""The user's datastores: token indexes of their own files, and the history of answers.

Everything lives under ``cache_root()/datastores/`` (``Library(root)`` for another place):

- ``<name>/``: one store. ``store.json`` (format version, name, tokenizer fingerprint, the
  model file it was tokenized with, sources as absolute paths, file and token counts,
  created and updated times), ``documents.json`` (each document's source file, in index
  order) and the ``TokenIndex`` files (storage/datastore.py). storage/indexing.py writes
  them.
- ``history/<fingerprint>/``: the answers kept with one tokenizer (storage/history.py):
  answers of another tokenizer are never mixed in, and going back to a model finds its own.
  ``history/<fingerprint>-<client>/``: those of one client of ``localspec serve --history``
  (``client`` names its API key, see serve/access.py), which no other client drafts from.
- ``settings.json`` (``{"history": false}`` once turned off) and ``fingerprints.json``
  (tokenizer fingerprints per model file, see storage/fingerprint.py).

Every directory here is mode 0700 and every file 0600: they hold the user's text. The
history is on unless ``localspec datastore history off`` saved it off or the environment
has ``LOCALSPEC_HISTORY=0``; the setting is read at each use (``history_setting``), so a
running process follows it. A settings file that cannot be read counts as off, with a
warning: failing safe means keeping nothing the user may have asked not to keep. ``open``
opens the named stores (or every one built with the tokenizer); the history is drafted
from through storage/answers.py. Nothing here reads or writes anything but these files.

Errors: a store the user names that does not exist, or was built with another tokenizer,
is a ``UsageError``; a damaged store is a ``DatastoreError`` where it must be read
(``manifest``, ``index``), while ``open`` skips it with a warning and ``record`` returns
why it failed, so that answering never fails because of a store.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localspec.errors import DatastoreError, UsageError
from localspec.models.paths import cache_root
from localspec.statefiles import private_dir, read_json, write_json
from localspec.storage import fingerprint
from localspec.storage.datastore import DamagedIndex, TokenIndex
from localspec.storage.history import History

FORMAT_VERSION = 1
HISTORY = "history"
STORE_FILE = "store.json"
DOCUMENTS_FILE = "documents.json"
SETTINGS_FILE = "settings.json"
FINGERPRINTS_FILE = "fingerprints.json"
HISTORY_ENV = "LOCALSPEC_HISTORY"
NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
FINGERPRINT_PATTERN = re.compile(r"[0-9a-f]{8,64}")
CLIENT_PATTERN = re.compile(r"[0-9a-z]{1,32}")
RESERVED = frozenset({HISTORY, SETTINGS_FILE, FINGERPRINTS_FILE})
LIST_HINT = "`localspec datastore list` shows the stores"


def datastores_dir() -> Path:
    return cache_root() / "datastores"


def vocabulary_fingerprint(model: Any, warn: Callable[[str], None] | None = None) -> str:
    """The fingerprint of ``model``'s tokenizer, cached per model file (fingerprint.py)."""
    return fingerprint.vocabulary_fingerprint(model, datastores_dir() / FINGERPRINTS_FILE, warn)


@dataclass
class Opened:
    """The stores to draft from, as ``(name, index)``, and what was skipped and why."""

    stores: list[tuple[str, TokenIndex]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class StoreInfo:
    name: str
    manifest: dict[str, Any] | None  # None when unreadable
    problem: str  # "" or why the store cannot be used
    bytes: int  # on disk


class Library:
    """The datastores under one directory; see the module docstring."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else datastores_dir()

    # -- what exists ------------------------------------------------------------------------

    def names(self) -> list[str]:
        """The stores' names (the history is not one of them), sorted."""
        if not self.root.is_dir():
            return []
        return sorted(
            p.name
            for p in self.root.iterdir()
            if p.is_dir() and NAME_PATTERN.fullmatch(p.name) and p.name not in RESERVED
        )

    def has_stores(self) -> bool:
        """Whether any store or history exists (cheap: lists one or two directories)."""
        return bool(self.names()) or bool(self.histories())

    def histories(self) -> list[tuple[str, str, History]]:
        """Every history: ``(fingerprint, client, History)``, client "" for the user's own."""
        where = self.root / HISTORY
        if not where.is_dir():
            return []
        found = []
        for path in sorted(where.iterdir()):
            fingerprint, _, client = path.name.partition("-")
            if path.is_dir() and FINGERPRINT_PATTERN.fullmatch(fingerprint):
                found.append((fingerprint, client, History(path)))
        return found

    def history_enabled(self) -> bool:
        return self.history_setting()[0]

    def history_setting(self) -> tuple[bool, str]:
        """Whether answers are kept and drafted from now, and a warning when the settings
        file cannot be read (then off: see the module docstring)."""
        if os.environ.get(HISTORY_ENV, "").strip().lower() in ("0", "false", "off", "no"):
            return False, ""
        settings, problem = self._settings()
        if problem:
            return False, (
                f"the history of answers is off: {problem} "
                "(`localspec datastore history on` or `off` writes it again)"
            )
        return settings.get("history", True) is not False, ""

    def set_history(self, on: bool) -> str:
        """Keep answers (or stop); returns "" or why the setting could not be saved."""
        settings, _ = self._settings()  # an unreadable file is replaced
        try:
            private_dir(self.root, self.root)
        except OSError as err:
            return f"could not write {self.root}: {err.strerror or err}"
        return write_json(self.root / SETTINGS_FILE, {**settings, "history": on})

    def _settings(self) -> tuple[dict[str, Any], str]:
        data, problem = read_json(self.root / SETTINGS_FILE)
        if data is not None and not isinstance(data, dict):
            return {}, f"{self.root / SETTINGS_FILE} is not a JSON object"
        return data or {}, problem

    def manifest(self, name: str) -> dict[str, Any]:
        """``store.json`` of a store: ``UsageError`` if there is none by that name,
        ``DatastoreError`` if it is unreadable."""
        directory = self._store_dir(name)
        data, problem = read_json(directory / STORE_FILE)
        if data is None:
            raise damaged(name, problem or f"{STORE_FILE} is missing")
        if (
            not isinstance(data, dict)
            or data.get("format_version") != FORMAT_VERSION
            or not isinstance(data.get("tokenizer"), str)
        ):
            raise damaged(name, f"{STORE_FILE} is not a datastore manifest of this version")
        return data

    def index(self, name: str, verify: bool = False) -> TokenIndex:
        """A store's index (``verify`` checks every byte's checksum)."""
        self.manifest(name)
        try:
            return TokenIndex.load(self.root / name, verify=verify)
        except DamagedIndex as err:
            raise damaged(name, str(err)) from None

    def infos(self) -> list[StoreInfo]:
        found = []
        for name in self.names():
            try:
                manifest, problem = self.manifest(name), ""
            except DatastoreError as err:
                manifest, problem = None, err.message
            found.append(StoreInfo(name, manifest, problem, disk_bytes(self.root / name)))
        return found

    def check_exist(self, names: tuple[str, ...]) -> None:
        """``UsageError`` naming the first of these stores that does not exist (cheap: a
        session checks its ``--store`` names before loading a model)."""
        for name in names:
            if name != HISTORY:
                self._store_dir(name)

    def _store_dir(self, name: str) -> Path:
        if not NAME_PATTERN.fullmatch(name) or name in RESERVED or not (self.root / name).is_dir():
            raise UsageError(f"no datastore named {name!r}", LIST_HINT)
        return self.root / name

    # -- drafting and the history -----------------------------------------------------------

    def open(self, fingerprint: str, names: tuple[str, ...] | None = None) -> Opened:
        """The stores built with this tokenizer (``names``: those; None: every one). A
        named store that does not exist or has another tokenizer is a ``UsageError``; a
        damaged one is skipped with a warning. ``history`` among ``names`` is left to
        storage/answers.py, which drafts from the history."""
        opened = Opened()
        chosen = self.names() if names is None else [n for n in dict.fromkeys(names)
                                                    if n != HISTORY]  # fmt: skip
        if names is not None:
            for name in chosen:  # all checked before any is loaded
                self._check_named(name, fingerprint)
        for name in chosen:
            self._open_store(name, fingerprint, opened)
        return opened

    def _check_named(self, name: str, fingerprint: str) -> None:
        self._store_dir(name)  # UsageError when there is none
        try:
            manifest = self.manifest(name)
        except DatastoreError:
            return  # damaged: left out with a warning when opened
        if manifest["tokenizer"] != fingerprint:
            raise UsageError(
                f"datastore {name!r} was built with another tokenizer than this target's "
                f"(it was tokenized with {manifest.get('model')})",
                f"use that model as --target, or add its files again under another name; "
                f"{LIST_HINT}",
            )

    def _open_store(self, name: str, fingerprint: str, opened: Opened) -> None:
        try:
            if self.manifest(name).get("tokenizer") != fingerprint:
                return  # another model's store: not for this one
            index = self.index(name)
        except DatastoreError as err:
            opened.warnings.append(
                f"{err.message}; it was left out (remove it with: localspec datastore rm {name})"
            )
            return
        if len(index):
            opened.stores.append((name, index))

    def history_dir(self, fingerprint: str, client: str = "") -> Path:
        """Where a tokenizer's history is kept (``client``: a server client's own)."""
        if not FINGERPRINT_PATTERN.fullmatch(fingerprint):
            raise ValueError(f"not a tokenizer fingerprint: {fingerprint!r}")
        if client and not CLIENT_PATTERN.fullmatch(client):
            raise ValueError(f"not a client name: {client!r}")
        return self.root / HISTORY / (f"{fingerprint}-{client}" if client else fingerprint)

    def record(self, fingerprint: str, document: Sequence[int], client: str = "") -> str:
        """Append an answer to this tokenizer's (and client's) history: "" or why it could
        not be kept."""
        try:
            directory = private_dir(self.history_dir(fingerprint, client), self.root)
            History(directory).append(document)
        except (OSError, ValueError) as err:  # filelock.Timeout is an OSError
            return f"the answer was not kept in the history: {err}"
        return ""

    # -- changing stores --------------------------------------------------------------------

    def remove(self, name: str) -> bool:
        """Delete a store (``history``: every tokenizer's history; False if there was none).
        ``UsageError`` for an unknown store."""
        if name == HISTORY:
            where = self.root / HISTORY
            existed = where.is_dir()
            shutil.rmtree(where, ignore_errors=True)
            return existed
        try:
            shutil.rmtree(self._store_dir(name))
        except OSError as err:
            raise DatastoreError(
                f"could not delete datastore {name!r}: {err.strerror or err}",
                f"check the permissions of {self.root / name}",
            ) from None
        return True


def check_name(name: str) -> None:
    if not NAME_PATTERN.fullmatch(name) or name in RESERVED:
        raise UsageError(
            f"invalid datastore name {name!r}",
            "use up to 64 letters, digits, '.', '_' or '-', starting with a letter or digit "
            f"(not {HISTORY!r}, the answers' store)",
        )


def disk_bytes(directory: Path) -> int:
    total = 0
    for path in directory.rglob("*"):
        with contextlib.suppress(OSError):  # a file replaced while we look
            total += path.stat().st_size if path.is_file() else 0
    return total


def damaged(name: str, why: str) -> DatastoreError:
    return DatastoreError(
        f"datastore {name!r} is damaged: {why}",
        f"remove it with `localspec datastore rm {name}` and add its files again",
    )
