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

import importlib
import os
import sys
from dataclasses import dataclass

import typer


@dataclass(frozen=True)
class Command:
    """A command of the app: the function (or typer group) ``attr`` of ``module``; a group
    is mounted with its ``help``."""

    module: str
    attr: str
    group_help: str | None = None


# In the order ``localspec --help`` lists them.
COMMANDS = {
    "complete": Command("localspec.cli.complete", "complete"),
    "chat": Command("localspec.cli.chat", "chat"),
    "bench": Command("localspec.cli.bench", "bench_command"),
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


def command_named(argv: list[str]) -> str | None:
    """The command a command line runs: its first word, unless that is an option."""
    return argv[0] if argv and not argv[0].startswith("-") else None


def main() -> None:
    """Console entry point."""
    from localspec.cli.common import echo_error

    try:
        build_app(command_named(sys.argv[1:]))(standalone_mode=True)
    except SystemExit:
        raise
    except Exception as err:  # noqa: BLE001 - the last line of defence
        if os.environ.get("LOCALSPEC_DEBUG") == "1":
            raise
        sys.exit(echo_error(err))


if __name__ == "__main__":
    main()
