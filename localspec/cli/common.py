"""What every command shares: the one place where errors become ``error:`` / ``hint:``
lines on stderr and an exit code (``fail``, ``cli_errors``), how progress reports
(``localspec.progress``) are printed on stderr (``progress_line``), ``--system``, and
``signals_interrupt`` for work that must unwind on SIGTERM and SIGHUP as on Ctrl-C.
The options several commands share are declared once, in ``options``, and shown
through ``cli.groups``."""

from __future__ import annotations

import contextlib
import ipaddress
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from localspec.errors import (
    EXIT_CANCELLED,
    ConflictingOptionsError,
    ContextOverflowError,
    InputError,
    LocalspecError,
    MissingDraftError,
    error_lines,
)
from localspec.options.model import COMMAND_LINE
from localspec.progress import Progress, ProgressKind


def worded(error: BaseException) -> BaseException:
    """A request's refusal (``core.preflight``) in the command line's words: its options
    as ``--ctx``, ``--drafter``, ``--raw``; any other error as it is."""
    if not isinstance(error, LocalspecError) or error.worded:
        return error
    if isinstance(error, ContextOverflowError):
        hint = f"shorten the input or raise {COMMAND_LINE.option(error.option)}"
        return error.reworded(error.message, hint)
    if isinstance(error, MissingDraftError):
        drafter = COMMAND_LINE.setting(error.option, error.drafter)
        if error.derived:
            message = f"{drafter} drafts with a draft derived from the target's own layers"
            return error.reworded(message, "pass --draft self, or leave out --draft")
        message = f"{drafter} needs a draft model, and none is loaded"
        return error.reworded(message, "pass --draft REF, or use --drafter ngram")
    if isinstance(error, ConflictingOptionsError):
        given, other = COMMAND_LINE.option(error.option), COMMAND_LINE.option(error.other)
        if error.option == "prediction":
            message = f"{given} is drafted from by {other} auto, not {error.value}"
            return error.reworded(message, f"drop {other}, or {given}")
        return error.reworded(error.message, f"drop {other} or {given}")
    return error


def echo_error(error: BaseException) -> int:
    """Print ``error:`` and ``hint:`` lines on stderr, worded for the command line
    (``worded``); return the exit code to use."""
    lines, code = error_lines(worded(error))
    for line in lines:
        typer.echo(line, err=True)
    return code


def progress_line(progress: Progress) -> str:
    """A progress report as a line: ``warning: text`` for a warning, the text and the share
    done of a download that knows it, the text otherwise."""
    if progress.kind is ProgressKind.WARNING:
        return f"warning: {progress.text}"
    if progress.fraction is not None:
        return f"{progress.text} {progress.fraction:.0%}"
    return progress.text


def echo_progress(progress: Progress) -> None:
    """Every progress report, on stderr (the commands that show their loading)."""
    typer.echo(progress_line(progress), err=True)


def fail(error: LocalspecError) -> typer.Exit:
    return typer.Exit(echo_error(error))


@contextlib.contextmanager
def cli_errors(interrupted: str = "\ninterrupted") -> Iterator[None]:
    """Typed errors become messages and exit codes; Ctrl-C says ``interrupted`` and exits 130."""
    try:
        yield
    except LocalspecError as err:
        raise fail(err) from None
    except KeyboardInterrupt:
        typer.echo(interrupted, err=True)
        raise typer.Exit(EXIT_CANCELLED) from None


@contextlib.contextmanager
def signals_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP (a closed terminal) as Ctrl-C while inside: the work unwinds,
    removing what it was writing, and ``cli_errors`` says ``interrupted``."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    caught = [signal.SIGTERM, *([signal.SIGHUP] if hasattr(signal, "SIGHUP") else [])]
    previous = {sig: signal.signal(sig, interrupt) for sig in caught}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


SystemOpt = Annotated[
    str | None, typer.Option("--system", help="system prompt, or @FILE to read it from a file")
]


def read_system(value: str | None) -> str | None:
    """``--system``'s text: as given, or the UTF-8 contents of ``@FILE``; blank is none."""
    if value is None:
        return None
    if value.startswith("@"):
        path = Path(value[1:]).expanduser()
        try:
            value = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InputError(f"system prompt file not found: {path}", "check the path") from None
        except UnicodeDecodeError:
            raise InputError(
                f"system prompt file {path} is not UTF-8 text", "convert it to UTF-8"
            ) from None
        except OSError as err:
            raise InputError(
                f"cannot read the system prompt file {path}: {err.strerror or err}",
                "check the path and its permissions",
            ) from None
    return value if value.strip() else None


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine only (servers bind it unless told otherwise)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
