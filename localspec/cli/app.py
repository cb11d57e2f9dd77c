"""The ``localspec`` typer app: mounts every command and runs it (``main``).

Commands live one group per module (``complete``, ``chat``, ``models``, ``datastore``,
``bench``); errors become messages in ``common``. ``main`` is the last line of defence: an
unexpected exception is a bug, said in one line (the traceback only with
``LOCALSPEC_DEBUG=1``), exit code 70.
"""

from __future__ import annotations

import os
import sys

import typer

from localspec.cli.bench import bench_command
from localspec.cli.calibrate import calibrate_command
from localspec.cli.chat import chat
from localspec.cli.common import echo_error
from localspec.cli.complete import complete
from localspec.cli.datastore import datastore_app
from localspec.cli.doctor import doctor
from localspec.cli.models import models_app
from localspec.cli.serve import serve
from localspec.cli.worker import worker

app = typer.Typer(
    name="localspec",
    help="Local speculative decoding: a GGUF target's exact output, faster.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command()(complete)
app.command()(chat)
app.command("bench")(bench_command)
app.command("calibrate")(calibrate_command)
app.command()(serve)
app.command()(worker)
app.command()(doctor)
app.add_typer(models_app, name="models", help="list, pull, check and optimize models")
app.add_typer(
    datastore_app, name="datastore", help="index your files and keep your answers to draft from"
)


def main() -> None:
    """Console entry point."""
    try:
        app(standalone_mode=True)
    except SystemExit:
        raise
    except Exception as err:  # noqa: BLE001 - the last line of defence
        if os.environ.get("LOCALSPEC_DEBUG") == "1":
            raise
        sys.exit(echo_error(err))


if __name__ == "__main__":
    main()
