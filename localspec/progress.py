"""What a long operation tells the person waiting, as values: every layer may report them.

Loading a pair, fetching a model and indexing files report ``Progress(kind, text,
fraction)`` to the ``OnProgress`` callback their caller gives (or to nobody); how it shows
is the front end's business:

- ``STEP``: a step begins (locating the target, loading the draft). A quiet front end may
  leave it out.
- ``WAIT``: a step that makes the user wait noticeably and happens once (measuring this
  machine's step costs): even a quiet front end says it, so the wait is explained.
- ``WARNING``: something the user should know; the operation goes on. The text has no
  ``warning:`` prefix: a front end that prints it writes one itself. This is how warnings
  of loading and setting up travel, as they come before any generation; once a generation
  runs, every warning is an ``EngineWarning`` among its events (``core.events``), whether
  the engine or the session (a history or learning save that failed) met it.
- ``DOWNLOAD``: a transfer or a copy of a model; ``fraction`` is the share done (0 to 1)
  when it is known. It is reported again with the same kind and text and a new fraction,
  so a front end can replace its line instead of adding one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum


class ProgressKind(StrEnum):
    STEP = "step"
    WAIT = "wait"
    WARNING = "warning"
    DOWNLOAD = "download"


@dataclass(frozen=True)
class Progress:
    kind: ProgressKind
    text: str
    fraction: float | None = None  # of a DOWNLOAD, the share done when known

    def same_line(self, other: Progress) -> bool:
        """Whether ``other`` reports on the same thing (a new fraction of one download)."""
        return self.kind == other.kind and self.text == other.text


OnProgress = Callable[[Progress], None]


def tell(callback: OnProgress | None, text: str, kind: ProgressKind = ProgressKind.STEP) -> None:
    """Tell ``callback``, if there is one."""
    if callback is not None:
        callback(Progress(kind, text))
