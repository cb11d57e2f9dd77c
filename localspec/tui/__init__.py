"""The ``localspec chat`` terminal UI (Textual).

``run_chat(session_factory, params)`` is the entry point: the CLI passes a factory that
opens a ``Session`` and reports loading progress through the callback it is given.
"""

from localspec.tui.app import ChatApp, run_chat

__all__ = ["ChatApp", "run_chat"]
