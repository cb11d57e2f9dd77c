"""``localspec bench`` and ``localspec bench replay DIR``: the typer group.

``bench_command`` (the group's own command, run when no subcommand is named) takes the
bench's options (``options.bench.BenchChoice``) and the pair's, and hands them as a
``BenchArgs`` to ``localspec.bench.run.run_bench``,
which runs the whole bench (see there: the protocol, the files written, what goes to stdout
and stderr). ``replay_command`` replays a bench run's greedy answers at a machine's costs
(``localspec.bench.replay``) and prints the table, or with ``--json`` every answer's row;
``costs_command`` measures this machine's costs and writes them as a cost profile
(``localspec.bench.costs``).
Errors become ``error:`` / ``hint:`` lines and their exit codes; Ctrl-C during a run still
summarises what was measured.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from localspec.bench.args import BenchArgs
from localspec.cli.common import cli_errors, echo_progress
from localspec.cli.groups import option_groups
from localspec.errors import InputError
from localspec.options.bench import BenchChoice
from localspec.options.model import ModelChoice, command_line


@option_groups
def bench_command(
    context: typer.Context,
    *,
    bench: BenchChoice,
    model: ModelChoice,
) -> None:
    """Measure plain and speculative decoding by prompt category, side by side."""
    if context.invoked_subcommand is not None:
        return  # ``bench replay``: its own options
    from localspec.bench.run import run_bench  # the engine loads only when the bench runs

    with cli_errors():
        args = BenchArgs(bench, model.options(spelling=command_line("bench")))
        code = run_bench(args, on_progress=echo_progress)
    raise typer.Exit(code)


@option_groups
def replay_command(
    directory: Annotated[
        Path,
        typer.Argument(
            metavar="DIR", help="a folder that localspec bench --out wrote (greedy runs)"
        ),
    ],
    costs: Annotated[
        Path | None,
        typer.Option(
            help="the costs to replay at: a cost profile's JSON, or the device check's "
            "device_check.json (one profile per pair of shapes); default: the run's own"
        ),
    ] = None,
    prompts: Annotated[
        Path | None,
        typer.Option(help="the prompt file the bench ran (default: the one its run names)"),
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="print every answer's replay as JSON")
    ] = False,
    *,
    model: ModelChoice,
) -> None:
    """Replay a bench run's answers: auto's choices and estimated speedups at given costs."""
    from localspec.bench.replay import render, replay_dir

    with cli_errors():
        options = model.options(spelling=command_line("bench"))
        result, missing = replay_dir(
            directory, options, costs=costs, prompts=prompts, on_progress=echo_progress
        )
    if missing:
        typer.echo(f"{missing} answers left out: their prompts were not found", err=True)
    typer.echo(json.dumps(result, indent=1) if as_json else render(result))


@option_groups
def costs_command(
    out: Annotated[
        Path | None,
        typer.Option(
            help="write the profile to this file (what bench replay --costs reads); "
            "default: print it"
        ),
    ] = None,
    *,
    model: ModelChoice,
) -> None:
    """Measure this machine's costs for the pair now and keep them as a cost profile."""
    from localspec.bench.costs import capture

    with cli_errors():
        if out is not None and not out.parent.is_dir():  # before minutes of measuring
            raise InputError(f"cannot write {out}: no folder {out.parent}", "pass --out FILE")
        profile = capture(model.options(spelling=command_line("bench")), echo_progress)
        text = json.dumps(profile, indent=1) + "\n"
        if out is None:
            typer.echo(text, nl=False)
            return
        try:
            out.write_text(text, encoding="utf-8")
        except OSError as err:
            raise InputError(f"cannot write {out}: {err.strerror}", "pass --out FILE") from None
    typer.echo(f"wrote {out}: {profile['machine']}", err=True)


bench_app = typer.Typer(add_completion=False)
bench_app.callback(invoke_without_command=True)(bench_command)
bench_app.command("replay")(replay_command)
bench_app.command("costs")(costs_command)
