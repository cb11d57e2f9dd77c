"""The environment variables that change how a loaded pair runs, each read once, at a front
end's edge (into the options it builds, or its command's own settings), never below it.

``switch(name, hint)`` reads a variable that is ``auto`` (unset too: None), ``1`` (True) or
``0`` (False); any other value is a ``UsageError`` that names it, with ``hint``.
``device_verification()`` and ``gathering()`` are the two such variables.
"""

from __future__ import annotations

import os

from localspec.errors import UsageError

DEVICE_VERIFY = "LOCALSPEC_DEVICE_VERIFY"
GATHER = "LOCALSPEC_GATHER"


def switch(name: str, hint: str) -> bool | None:
    """``name``'s value: None for ``auto`` (the default), else whether it is ``1``."""
    value = os.environ.get(name, "auto").strip().lower()
    if value not in ("auto", "0", "1"):
        raise UsageError(f"{name}={value!r} is neither auto, 0 nor 1", hint)
    return None if value == "auto" else value == "1"


def device_verification() -> bool | None:
    """Where greedy choices are made (``LOCALSPEC_DEVICE_VERIFY``): ``auto``, the default
    (None: on the device where the output layer is offloaded, else from rows on the host),
    ``1`` (always on the device, the CPU's backend included) or ``0`` (always on the host)."""
    return switch(DEVICE_VERIFY, f"set {DEVICE_VERIFY}=0 to verify on the host, or unset it")


def gathering() -> bool | None:
    """Whether a server's lanes have their rounds gathered into one evaluation
    (``LOCALSPEC_GATHER``): ``auto``, the default (None: where this machine's measured costs
    say it pays), ``1`` (always) or ``0`` (never: the lanes evaluate in turn)."""
    return switch(GATHER, f"unset {GATHER}")
