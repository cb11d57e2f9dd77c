"""The ``localspec chat`` terminal UI (Textual).

``run_chat(session_factory, params)`` is the entry point: the CLI passes a factory that
opens a ``Session`` and reports loading progress through the callback it is given.
Importing the package loads nothing: ``ChatApp`` and ``run_chat`` load Textual when first
asked for, so that the chat's logic (``tui.controller``) runs without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from localspec.tui.app import ChatApp, run_chat

__all__ = ["ChatApp", "run_chat"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from localspec.tui import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
