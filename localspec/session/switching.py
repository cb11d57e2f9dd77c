"""The interpreter's switch interval while a model loads beside other work, where the
process's entry allows it (``fast_switching``).

llama.cpp reports each step of a load through a Python callback, which must take the
interpreter's lock from the thread importing beside it: a short switch interval
(``LOADING_SWITCH_S``) hands it over at once instead of after the default 5 ms. The interval
is the process's, so only the process's entry (the command line's ``main``) may shorten
it: within ``fast_switching()``, the interval is short while at least one load runs
(``load_begins`` to ``load_ends``), and once the last one ends, as it was before the
first. Elsewhere (the Python API, in a process someone else owns) a load leaves it alone.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

LOADING_SWITCH_S = 0.0002  # the interpreter's switch interval while a load runs beside


class _Switching:
    """Loads under way, and whether the entry allows the short interval: the first load to
    begin saves the process's own interval, the last to end puts it back (loads that overlap
    would otherwise save each other's short one and leave it for good)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._allowed = 0  # fast_switching scopes open
        self._running = 0  # loads shortening the interval now
        self._saved = 0.0

    def begin(self) -> bool:
        """A load begins; whether it shortened the interval (then ``end`` once it ends)."""
        with self._lock:
            if not self._allowed:
                return False
            if self._running == 0:
                self._saved = sys.getswitchinterval()
                sys.setswitchinterval(LOADING_SWITCH_S)
            self._running += 1
            return True

    def end(self) -> None:
        with self._lock:
            self._running -= 1
            if self._running == 0:
                sys.setswitchinterval(self._saved)

    @contextlib.contextmanager
    def allowed(self) -> Iterator[None]:
        with self._lock:
            self._allowed += 1
        try:
            yield
        finally:
            with self._lock:
                self._allowed -= 1


_SWITCHING = _Switching()


def fast_switching() -> contextlib.AbstractContextManager[None]:
    """The process's entry allows loads to shorten the switch interval while they run."""
    return _SWITCHING.allowed()


def load_begins() -> bool:
    """A load begins beside other work: the interval is short until it ends, where the
    entry allows it; whether it was shortened (then ``load_ends`` once the load ends)."""
    return _SWITCHING.begin()


def load_ends() -> None:
    """A load that ``load_begins`` shortened the interval for has ended."""
    _SWITCHING.end()
