"""Known model pairs, and resolution of a model reference to a GGUF file on disk.

Contract:

- ``load_catalog()`` reads ``data/catalog.toml`` (shipped inside this package) into a validated
  ``Catalog``; a missing or malformed file is a ``ModelFileError``.
- ``resolve_model(ref, role)`` is what the rest of localspec calls to get a path. ``ref`` is
  tried as, in order: ``None`` (the catalog default for ``role``); a file path, which is a
  reference with a path separator or ending in ``.gguf`` (returned after a cheap GGUF header
  check; a bare name is never taken for a file in the current directory); a model made on
  this machine by ``localspec models optimize`` (the local registry); a catalog name (the
  verified copy in the cache, else the same file already in the Hugging Face cache, else a
  pull through ``localspec.models.fetch``, sources in catalog order); ``repo_id:filename`` on
  the Hub. Anything else is a ``ModelNotFoundError`` that names the closest catalog names.
- ``offline=True`` means nothing is fetched; ``None`` lets sources decide (the Hub source
  honours ``HF_HUB_OFFLINE``).
- ``locate_model(ref)`` answers the same question without any network: a path or ``None``.
- A file in the cache's ``models/`` dir is complete and verified: downloads only ever reach
  it by an atomic rename after verification, so resolution re-checks the header only.
"""

from __future__ import annotations

import difflib
import functools
import json
import logging
import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from localspec.errors import ModelFileError, ModelNotFoundError, validation_problem
from localspec.models import paths
from localspec.models.gguf import check_gguf
from localspec.models.schema import Catalog, HubSource, ModelEntry, PypiSource, Role
from localspec.statefiles import write_file

if TYPE_CHECKING:
    from types import ModuleType

    from localspec.models.transfer import ShowProgress

__all__ = ["Catalog", "HubSource", "ModelEntry", "PypiSource", "Role", "check_gguf"]

log = logging.getLogger("localspec.models.catalog")

CATALOG_PATH = Path(__file__).resolve().parent / "data" / "catalog.toml"
_HUB_REF = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+):(?P<file>[^:]+\.gguf)$")


@functools.lru_cache(maxsize=4)
def _load(path: str) -> Catalog:
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ModelFileError(
            f"model catalog not found at {path}",
            "reinstall localspec from its source tree (pip install -e .)",
        ) from None
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ModelFileError(f"cannot read the model catalog {path}: {err}") from None
    try:
        return Catalog.model_validate(data)
    except ValidationError as err:
        where, msg = validation_problem(err)
        raise ModelFileError(f"invalid model catalog {path}: {where}: {msg}") from None


def load_catalog(path: Path | None = None) -> Catalog:
    return _load(str(path or CATALOG_PATH))


@dataclass(frozen=True)
class HfCachedFile:
    repo_id: str
    filename: str
    path: Path
    size: int


def find_hf_cache_ggufs() -> list[HfCachedFile]:
    """GGUF files already in the Hugging Face cache; empty if there is no cache."""
    # Imported when asked for: ``localspec --help`` imports this module, and the scanner
    # pulls in huggingface_hub's whole client.
    try:
        from huggingface_hub import scan_cache_dir
    except ImportError:
        return []
    cache = _fetch().hf_cache_dir()
    if not cache.is_dir():
        return []
    try:
        info = scan_cache_dir(cache)
    except Exception:  # noqa: BLE001 - an unreadable cache is the same as no cache here
        return []
    found = []
    for repo in info.repos:
        if repo.repo_type != "model":
            continue
        for revision in repo.revisions:
            for f in revision.files:
                if f.file_name.endswith(".gguf"):
                    name = str(f.file_path.relative_to(revision.snapshot_path))
                    found.append(HfCachedFile(repo.repo_id, name, f.file_path, f.size_on_disk))
    unique = {(f.repo_id, f.filename): f for f in found}
    return sorted(unique.values(), key=lambda f: (f.repo_id, f.filename))


def cached_path(name: str) -> Path:
    """Where a catalog model lives in the cache once pulled (it may not exist yet)."""
    return paths.models_dir() / f"{name}.gguf"


# --- local registry: models made on this machine (``localspec models optimize``) ---


def _registered_file(entry: object) -> Path | None:
    """The file a registry entry names, if the entry is well formed and the file lies in
    the models folder: nothing outside it is ever resolved, let alone deleted, by name."""
    if not isinstance(entry, dict) or not isinstance(entry.get("path"), str) or not entry["path"]:
        return None
    path = Path(entry["path"])
    folder = paths.models_dir().resolve()
    if not path.is_absolute() or path.resolve().parent != folder or path.suffix != ".gguf":
        return None
    return path


def load_registry() -> dict[str, dict]:
    """Models made on this machine, by name. A damaged file counts as empty and a malformed
    entry as absent, each with a warning: the registry only ever adds names."""
    try:
        data = json.loads(paths.registry_path().read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        log.warning(
            "warning: ignoring the damaged local model registry %s (%s); "
            "run `localspec models optimize` again for the models you need",
            paths.registry_path(),
            err,
        )
        return {}
    if not isinstance(data, dict):
        log.warning(
            "warning: ignoring the local model registry %s: not a JSON object",
            paths.registry_path(),
        )
        return {}
    valid = {}
    for name, entry in data.items():
        if _registered_file(entry) is None:
            log.warning(
                "warning: ignoring registry entry %r: it must name a .gguf file in %s",
                name,
                paths.models_dir(),
            )
            continue
        valid[name] = entry
    return valid


def _write_registry(registry: dict[str, dict]) -> None:
    target = paths.registry_path()
    paths.ensure_dir(target.parent)
    write_file(target, (json.dumps(registry, indent=2, sort_keys=True) + "\n").encode())


def register_local(name: str, path: Path, *, base: str, quant: str) -> None:
    registry = load_registry()
    registry[name] = {"path": str(Path(path).resolve()), "base": base, "quant": quant}
    _write_registry(registry)


def unregister_local(name: str) -> None:
    registry = load_registry()
    if registry.pop(name, None) is not None:
        _write_registry(registry)


# --- resolution ---


def default_name(role: Role) -> str:
    return getattr(load_catalog().defaults, role)


def pair_for(target_name: str) -> str | None:
    """The catalog's recommended draft for a target name (or a model optimized from one)."""
    catalog = load_catalog()
    entry = catalog.get(target_name)
    if entry is None:
        base = load_registry().get(target_name, {}).get("base")
        entry = catalog.get(base) if isinstance(base, str) else None
    return entry.draft if entry is not None else None


def suggestions(ref: str, n: int = 3) -> list[str]:
    names = list(load_catalog().models) + list(load_registry())
    close = difflib.get_close_matches(ref.lower(), names, n=n, cutoff=0.4)
    # Substring matches ("coder-7b") are often closer to intent than edit distance.
    close += [m for m in names if ref.lower() in m and m not in close]
    return close[:n]


def not_found(ref: str) -> ModelNotFoundError:
    close = suggestions(ref)
    msg = f"unknown model {ref!r}: not a file, not a catalog name, not repo_id:file.gguf"
    if close:
        msg += f"; did you mean {', '.join(close)}?"
    return ModelNotFoundError(msg, "`localspec models list` shows the catalog")


def looks_like_path(ref: str) -> bool:
    """A reference is a file only when it says so (a separator, or the .gguf suffix): a file
    in the current directory that happens to be called like a catalog model never replaces
    it."""
    if _HUB_REF.match(ref):
        return False
    return ref.endswith(".gguf") or any(sep and sep in ref for sep in ("/", os.sep, os.altsep))


def _fetch() -> ModuleType:
    """The downloading module, imported where a model is fetched or looked for in the Hub's
    cache: it brings the download client and progress bars, which a model already in
    localspec's own cache does not need."""
    from localspec.models import fetch

    return fetch


def locate_model(ref: str | None, role: Role = "target") -> Path | None:
    """The file ``ref`` names if it is already on this machine; never touches the network."""
    ref = ref or default_name(role)
    if looks_like_path(ref):
        candidate = Path(ref).expanduser()
        return candidate if candidate.is_file() else None
    local = load_registry().get(ref)
    if local is not None:
        path = Path(local.get("path", ""))
        return path if path.is_file() else None
    entry = load_catalog().get(ref)
    if entry is not None:
        if cached_path(entry.name).is_file():
            return cached_path(entry.name)
        return _fetch().find_in_hf_cache(entry)
    match = _HUB_REF.match(ref)
    if match:
        return _fetch().hub_cached_file(match["repo"], match["file"])
    return None


def resolve_model(
    ref: str | None,
    role: Role,
    *,
    progress: ShowProgress = True,
    offline: bool | None = None,
) -> Path:
    """Return a local GGUF path for ``ref`` (see the module docstring), pulling if needed;
    ``progress`` says how a pull shows what it does (``transfer.ShowProgress``)."""
    ref = (ref or "").strip() or default_name(role)
    if looks_like_path(ref):
        return check_gguf(Path(ref).expanduser())

    local = load_registry().get(ref)
    if local is not None:
        path = Path(local.get("path", ""))
        if not path.is_file():
            raise ModelFileError(
                f"{ref} was optimized on this machine but its file {path} is gone",
                f"run `localspec models optimize {local.get('base', '?')}` again",
            )
        return check_gguf(path)

    entry = load_catalog().get(ref)
    if entry is not None:
        found = locate_model(entry.name)
        if found is not None:
            return check_gguf(found)
        return check_gguf(_fetch().pull(entry, progress=progress, offline=bool(offline)))

    match = _HUB_REF.match(ref)
    if match:
        path = _fetch().pull_hub_file(
            match["repo"], match["file"], progress=progress, offline=bool(offline)
        )
        return check_gguf(path)
    raise not_found(ref)
