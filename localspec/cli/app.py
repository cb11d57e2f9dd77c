"""The ``localspec`` typer app: mounts the commands and runs one (``main``).

Commands live one group per module (``complete``, ``chat``, ``models``, ``datastore``,
``bench``, ...), listed in ``COMMANDS`` by name, module and attribute. ``build_app(name)``
mounts only the command named (its module alone is imported, so ``localspec complete``
starts without the server's, the chat's or the bench's imports); without a known name
(``--help``, a typo) every command is mounted, so the listing and click's "no such command"
read as they always did. Errors become messages in ``common``. ``main`` is the last line of
defence: an unexpected exception is a bug, said in one line (the traceback only with
``LOCALSPEC_DEBUG=1``), exit code 70.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from dataclasses import dataclass
from typing import NoReturn

import typer

from localspec.cli import PROCESS


@dataclass(frozen=True)
class Command:
    """A command of the app: the function (or typer group) ``attr`` of ``module``; a group
    is mounted with its ``help``."""

    module: str
    attr: str
    group_help: str | None = None
    # A one-shot command: the process ends as soon as it returns (see ``main``).
    quick_exit: bool = False


# In the order ``localspec --help`` lists them.
COMMANDS = {
    "complete": Command("localspec.cli.complete", "complete", quick_exit=True),
    "chat": Command("localspec.cli.chat", "chat"),
    "bench": Command(
        "localspec.cli.bench",
        "bench_app",
        "Measure plain and speculative decoding by prompt category, side by side.",
    ),
    "calibrate": Command("localspec.cli.calibrate", "calibrate_command"),
    "serve": Command("localspec.cli.serve", "serve"),
    "worker": Command("localspec.cli.worker", "worker"),
    "doctor": Command("localspec.cli.doctor", "doctor"),
    "models": Command(
        "localspec.cli.models", "models_app", "list, pull, check and optimize models"
    ),
    "datastore": Command(
        "localspec.cli.datastore",
        "datastore_app",
        "index your files and keep your answers to draft from",
    ),
    "prompt-cache": Command(
        "localspec.cli.prompt_cache",
        "prompt_cache_app",
        "list or clear the prompts kept on disk",
    ),
}


def build_app(only: str | None = None) -> typer.Typer:
    """The app with the command ``only`` mounted, or every command when ``only`` is None or
    names none."""
    app = typer.Typer(
        name="localspec",
        help="Local speculative decoding: a GGUF target's exact output, faster.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )
    names = [only] if only in COMMANDS else list(COMMANDS)
    if len(names) == 1:
        # A typer app of one command would run it as the app itself: the callback keeps
        # ``localspec NAME ...`` a command of a group, parsed and helped as with them all.
        app.callback()(_group)
    for name in names:
        command = COMMANDS[name]
        target = getattr(importlib.import_module(command.module), command.attr)
        if command.group_help is None:
            app.command(name)(target)
        else:
            app.add_typer(target, name=name, help=command.group_help)
    return app


def _group() -> None:
    """Local speculative decoding: a GGUF target's exact output, faster."""


def __getattr__(name: str) -> typer.Typer:
    """``app``: the whole app with every command, for callers that drive it themselves (a
    test's ``CliRunner``); built when first asked for."""
    if name == "app":
        return build_app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _end_now(code: object) -> NoReturn:
    """End the process with ``code`` (as ``SystemExit`` reads it) once stdout and stderr
    are flushed."""
    status = code if isinstance(code, int) else (0 if code is None else 1)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(status)


def command_named(argv: list[str]) -> str | None:
    """The command a command line runs: its first word, unless that is an option."""
    return argv[0] if argv and not argv[0].startswith("-") else None


def main() -> None:
    """Console entry point. A one-shot command (``Command.quick_exit``) ends the process as
    soon as it returns, its output flushed: the models it loaded are left to the operating
    system, which reclaims a process's memory at once (llama.cpp freeing a 1.5B model takes
    a tenth of a second), and Python's teardown of every module is skipped."""
    name = command_named(sys.argv[1:])
    command = COMMANDS.get(name or "")
    if command is not None:  # a command may load models: llama.cpp's library before numpy
        importlib.import_module("localspec.backend.library")
    from localspec.cli.common import echo_error
    from localspec.session.switching import fast_switching

    PROCESS.ends_with_command = command is not None and command.quick_exit
    try:
        with fast_switching():  # this process is the command's: a load may shorten it
            build_app(name)(standalone_mode=True)
    except SystemExit as done:
        if PROCESS.ends_with_command:
            _end_now(done.code)
        raise
    except Exception as err:  # noqa: BLE001 - the last line of defence
        if os.environ.get("LOCALSPEC_DEBUG") == "1":
            raise
        sys.exit(echo_error(err))


if __name__ == "__main__":
    main()
