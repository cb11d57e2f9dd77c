"""Typed errors. The library raises these; only the front ends turn them into text.

Every error carries a one-line ``hint`` that says what to do next, so a front end can show
``message`` and ``hint`` without knowing where the error came from. ``describe`` gives any
exception's message, hint and exit code; ``error_lines`` words them as every front end
writes them (``error:`` and ``hint:`` lines); ``exit_with`` writes those lines and ends the
process at once, for an error met on a thread that cannot hand it to the front end (RPC
workers lost while an evaluation waits on them).

The errors of a request's preflight (``core/preflight.py``) carry their data: the limit
and the value (``ContextOverflowError``), the drafter asked for (``MissingDraftError``),
the options that cannot go together (``ConflictingOptionsError``), and the option each
concerns, by its field name (``n_ctx``, ``drafter``, ``system``). Their own wording names no
front end's options; each front end words them in its own dialect (``reworded``: the same
error, type and data with its text), naming the option as it writes it.
"""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn, Self


class LocalspecError(Exception):
    """Base class: ``str(err)`` is the message, ``err.hint`` the next step (may be empty)."""

    exit_code = 1

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message

    worded = False  # a front end gave it its own words (``reworded``)

    def reworded(self, message: str, hint: str) -> Self:
        """This error as a front end words it: the same type, data and exit code."""
        error = type(self).__new__(type(self), message)  # its data, not its __init__
        error.__dict__.update(self.__dict__)
        error.message, error.hint, error.worded = message, hint, True
        return error


class UsageError(LocalspecError):
    """An option value or argument that cannot work."""

    exit_code = 2


class InputError(LocalspecError):
    """The prompt itself is unusable: empty, not UTF-8, unreadable."""

    exit_code = 2


def empty_input() -> InputError:
    """A prompt with nothing in it: no tokens (the session's preflight), or blank text (where
    text becomes tokens)."""
    return InputError("the input is empty", "give the prompt on stdin or as a file")


class ModelFileError(LocalspecError):
    """A model file is missing, unreadable, not GGUF, truncated or fails to load."""


class ModelNotFoundError(LocalspecError):
    """A model reference names nothing known: not a path, not a catalog name."""


class DownloadError(LocalspecError):
    """A model could not be fetched from any source, or failed verification; or a model
    file (a download, a derived draft) has no room on the disk."""


class IncompatibleModelsError(LocalspecError):
    """Target and draft do not share a vocabulary, so drafts cannot be verified."""


class UnsupportedByModelError(LocalspecError):
    """The loaded model cannot do what was asked (fill-in-the-middle without FIM tokens)."""


class ContextOverflowError(LocalspecError):
    """The prompt (or conversation) does not fit in the context window: ``n_tokens`` of it,
    ``n_ctx`` the tokens the context holds (the ``option`` that sets it)."""

    option = "n_ctx"

    def __init__(
        self, message: str = "", hint: str = "", *, n_tokens: int = 0, n_ctx: int = 0
    ) -> None:
        message = message or (
            f"the prompt has {n_tokens} tokens but the context holds {n_ctx} "
            f"(at most {n_ctx - 1} prompt tokens, leaving room for one new token)"
        )
        super().__init__(message, hint or "shorten the prompt")
        self.n_tokens = n_tokens
        self.n_ctx = n_ctx


class MissingDraftError(UsageError):
    """A drafter that drafts with a draft model the pair does not have: ``drafter`` is the
    value of the ``option`` given; ``derived``: it needs a draft derived from the target's
    own layers, and the pair's draft model (if any) is another."""

    option = "drafter"

    def __init__(self, drafter: str, *, derived: bool = False) -> None:
        if derived:
            message = (
                f"the {drafter} drafter drafts with a draft derived from the target's own "
                "layers, which this pair did not load"
            )
        else:
            message = f"the {drafter} drafter needs a draft model, and this pair has none"
        super().__init__(message, "load the pair with one, or use another drafter")
        self.drafter = drafter
        self.derived = derived


class ConflictingOptionsError(UsageError):
    """Two options given together that cannot go together: ``option`` (given) and ``other``
    (given as ``value``): a system prompt and raw text, a prediction and a drafter that does
    not draft from it."""

    def __init__(self, option: str, other: str, value: Any, message: str) -> None:
        super().__init__(message, f"drop {other} or {option}")
        self.option = option
        self.other = other
        self.value = value


class DatastoreError(LocalspecError):
    """A datastore cannot be used or written: damaged, or its files cannot be read."""


class BackendError(LocalspecError):
    """llama.cpp refused an operation (decode failure, out of memory for the KV cache)."""


class WorkersLostError(LocalspecError):
    """The RPC workers running the target's layers failed mid-evaluation: the evaluation
    waiting on them never returns (see backend/rpc.py)."""

    def __init__(self, message: str, hint: str = "check the worker, then run again") -> None:
        super().__init__(message, hint)


# Exit codes every front end uses.
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 70  # an unexpected exception: a bug
EXIT_CANCELLED = 130  # Ctrl-C, as a shell reports SIGINT

BUG_HINT = "this is a bug in localspec; LOCALSPEC_DEBUG=1 shows the traceback"


def describe(error: BaseException) -> tuple[str, str, int]:
    """``(message, hint, exit code)`` for any exception: a typed error keeps its own; any
    other exception is a bug, named by its type so that no front end shows a traceback."""
    if isinstance(error, LocalspecError):
        return error.message, error.hint, error.exit_code
    text = str(error).strip()
    message = f"internal error: {type(error).__name__}" + (f": {text}" if text else "")
    return message, BUG_HINT, EXIT_INTERNAL


def error_lines(error: BaseException) -> tuple[list[str], int]:
    """The lines a front end writes for ``error`` (``error: message``, then ``hint: hint``
    if there is one) and the exit code."""
    message, hint, code = describe(error)
    return [f"error: {message}", *([f"hint: {hint}"] if hint else [])], code


def exit_with(error: BaseException) -> NoReturn:
    """Write ``error_lines`` on stderr and end the process now, without unwinding: a thread
    still waits on what failed, and the interpreter would wait for it at exit. What was
    written on stdout stays written."""
    lines, code = error_lines(error)
    sys.stdout.flush()
    sys.stderr.write("".join(f"{line}\n" for line in lines))
    sys.stderr.flush()
    os._exit(code)


def validation_problem(error: Any) -> tuple[str, str]:
    """The first problem of a pydantic ``ValidationError``: ``(dotted location, message)``."""
    first = error.errors()[0]
    return ".".join(str(x) for x in first["loc"]), first["msg"]
