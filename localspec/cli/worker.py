"""``localspec worker``: lend this machine's CPU to a target run elsewhere with ``--rpc``.

It runs llama.cpp's RPC server from the installed llama.cpp (the same library localspec
loads models with), so a helper machine needs only localspec's set-up. The RPC protocol has
no authentication and no encryption: the worker binds 127.0.0.1 unless ``--allow-remote``
lets it listen on another address, and then warns. Ctrl-C stops it.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Annotated

import typer

from localspec.backend.rpc import DEFAULT_PORT, serve_worker
from localspec.cli.common import cli_errors, is_loopback
from localspec.errors import EXIT_CANCELLED, UsageError

WARNING = (
    "warning: llama.cpp's RPC protocol has no authentication and no encryption: anyone who "
    "can reach {where} can run code on this machine's memory and read what it computes. "
    "Only listen on a private network you trust."
)


def worker(
    host: Annotated[str, typer.Option(help="address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to listen on", min=1, max=65535)] = DEFAULT_PORT,
    threads: Annotated[
        int | None, typer.Option(help="CPU threads for the layers run here (default: all cores)")
    ] = None,
    allow_remote: Annotated[
        bool,
        typer.Option(
            "--allow-remote", help="listen on an address other machines can reach (see the warning)"
        ),
    ] = False,
) -> None:
    """Run llama.cpp's RPC server here, for a target split across machines (--rpc)."""
    with cli_errors():
        if threads is not None and threads < 1:
            raise UsageError("--threads must be at least 1", "")
        if not is_loopback(host) and not allow_remote:
            raise UsageError(
                f"refusing to listen on {host}: the RPC protocol has no authentication",
                "add --allow-remote to listen on a network you trust",
            )
        if not is_loopback(host):
            typer.echo(WARNING.format(where=f"{host}:{port}"), err=True)
        # llama.cpp's server blocks in C, where Python never sees Ctrl-C: it runs in a
        # thread, and the main thread waits for the signal.
        failure: list[BaseException] = []

        def run() -> None:
            try:
                serve_worker(host, port, threads or os.cpu_count() or 1)
            except BaseException as err:  # noqa: BLE001 - handed to the main thread
                failure.append(err)

        thread = threading.Thread(target=run, name="rpc server", daemon=True)
        thread.start()
        try:
            while thread.is_alive():
                thread.join(0.2)
        except KeyboardInterrupt:
            typer.echo("worker stopped", err=True)
            sys.stdout.flush()
            os._exit(EXIT_CANCELLED)  # the server thread cannot be joined
        if failure:
            raise failure[0]
