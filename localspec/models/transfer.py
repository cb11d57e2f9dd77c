"""What every source of a pull shares: how it shows progress, how it fails, and how a file
it wrote is checked before it is used.

Contract: a source that cannot deliver raises ``SourceFailed`` (the pull moves on to the
next source); a full disk is ``disk_full``'s ``DownloadError``, which stops the pull.
``verify`` deletes a file whose size or sha256 on disk is not the expected one.
``new_partial`` names a file no other writer shares. ``note``, ``Share`` and
``progress_bar`` show a pull's steps, shares and bars as ``ShowProgress`` says (see
models/fetch.py); notes shown to nobody go to the ``localspec.models.fetch`` logger.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

from rich.console import Console

from localspec.errors import DownloadError
from localspec.progress import OnProgress, Progress, ProgressKind

log = logging.getLogger("localspec.models.fetch")
CHUNK = 1 << 20


# How a pull shows what it does (see models/fetch.py): rich on stderr, nothing, or
# reports to a front end's callback.
ShowProgress = bool | OnProgress


class SourceFailed(Exception):
    """One source could not deliver; ``pull`` moves on to the next."""


def note(message: str, progress: ShowProgress) -> None:
    if callable(progress):
        progress(Progress(ProgressKind.STEP, message))
    elif progress:
        Console(stderr=True, highlight=False, soft_wrap=True).print(message, markup=False)
    else:
        log.info(message)


class Share:
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


def verify(path: Path, size: int | None, sha256: str | None) -> None:
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


def disk_full(name: str, where: Path) -> DownloadError:
    free = shutil.disk_usage(where).free if where.exists() else 0
    return DownloadError(
        f"the disk is full: {name} could not be written to {where} ({free / 1e6:.0f} MB free)",
        "free some space (or point LOCALSPEC_HOME at a larger disk) and run the command "
        "again; the parts already downloaded are kept",
    )


def new_partial(dest: Path) -> Path:
    """A uniquely named temporary file beside ``dest``: never shared by two writers."""
    fd, name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.stem}.", suffix=".gguf.partial")
    os.close(fd)
    return Path(name)


def progress_bar(progress: ShowProgress):
    # rich.progress is imported when a pull draws bars: ``localspec --help`` imports this
    # module, and rich.progress is not otherwise loaded by then.
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
