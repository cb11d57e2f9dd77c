"""``localspec bench`` and ``localspec bench replay DIR``: the typer group.

``bench_command`` (the group's own command, run when no subcommand is named) parses the
command's options into a ``BenchArgs`` and hands them to ``localspec.bench.run.run_bench``,
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
from localspec.options.generation import Temperature
from localspec.options.model import ModelChoice, command_line


@option_groups
def bench_command(
    context: typer.Context,
    categories: Annotated[
        str | None,
        typer.Option(
            help="comma-separated categories (default: all but repo_code, apply and the check "
            "sets, which are run when named: apply edits whole files, with the file as the "
            "prediction; check3, check4, check3_unrelated and history_followup are prompts "
            "the bench was not tuned on)"
        ),
    ] = None,
    limit: Annotated[int | None, typer.Option(help="prompts per category at most")] = None,
    prompts: Annotated[
        Path | None,
        typer.Option(
            help="your own prompts instead of the shipped sets: JSONL, one object a line with "
            '"prompt" (and optional "id", "category", "source", "prediction" for mode '
            'auto-prediction and "first" for mode auto-again)'
        ),
    ] = None,
    modes: Annotated[
        str,
        typer.Option(
            help="comma-separated: none, ngram, model, auto, auto-store, auto-chains (auto "
            "without draft trees), auto-prediction (auto with the prompt's prediction, else "
            "its first code block), native-draft, native-ngram (ngram-simple), "
            "native-ngram-map-k, native-ngram-mod, native-none (llama.cpp's plain decoding), "
            "native-bench (llama-bench at the prompt's depth)"
        ),
    ] = "none,ngram,model,auto",
    store: Annotated[
        list[str] | None,
        typer.Option(
            "--store",
            metavar="NAME",
            help="a datastore for mode auto-store (repeatable; adds that mode); the other "
            "modes draft from none",
        ),
    ] = None,
    max_tokens: Annotated[int, typer.Option(help="new tokens per run at most")] = 200,
    temperature: Temperature = 0.0,
    seed: Annotated[int | None, typer.Option(help="sampling seed (prompt i uses seed+i)")] = None,
    raw: Annotated[bool, typer.Option(help="send prompts without the chat template")] = False,
    cold: Annotated[
        bool,
        typer.Option(
            "--cold/--warm",
            help="cold: every run starts with nothing learned, as a fresh process; warm: "
            "the controllers keep learning from prompt to prompt",
        ),
    ] = True,
    fresh: Annotated[
        bool,
        typer.Option(
            help="run each engine mode as a fresh localspec complete process, timed from its "
            "start to its exit as a user waits for it (llama.cpp's modes always are)"
        ),
    ] = False,
    rpc_delay: Annotated[
        float | None,
        typer.Option(
            metavar="MS",
            help="reach the --rpc workers through a relay on 127.0.0.1 that adds MS "
            "milliseconds to every round trip, as a slower network would",
        ),
    ] = None,
    trace: Annotated[
        bool,
        typer.Option(help="keep every round (drafter, draft, accepted, timings) in records.jsonl"),
    ] = False,
    native_bin: Annotated[
        Path | None,
        typer.Option(
            help="llama-speculative-simple to compare with; native-bench runs the llama-bench "
            "beside it (adds all native modes unless --modes names some)"
        ),
    ] = None,
    native_flags: Annotated[
        str,
        typer.Option(
            help="extra flags for llama-speculative-simple (not llama-bench), e.g. "
            "'--spec-draft-n-max 8'"
        ),
    ] = "",
    repeat: Annotated[
        int,
        typer.Option(
            help="runs of every prompt and mode, interleaved; the summary takes each one's "
            "median run (as llama-bench's -r)"
        ),
    ] = 1,
    out: Annotated[
        Path | None, typer.Option(help="output folder (default: ./bench-results/<timestamp>)")
    ] = None,
    chart: Annotated[bool, typer.Option(help="draw speedup.png (needs matplotlib)")] = True,
    warmup: Annotated[bool, typer.Option(help="one short unrecorded run per mode first")] = True,
    *,
    model: ModelChoice,
) -> None:
    """Measure plain and speculative decoding by prompt category, side by side."""
    if context.invoked_subcommand is not None:
        return  # ``bench replay``: its own options
    fields = dict(locals())  # exactly the options above
    del fields["model"], fields["context"]
    from localspec.bench.run import run_bench  # the engine loads only when the bench runs

    with cli_errors():
        args = BenchArgs(**fields, pair=model.options(spelling=command_line("bench")))
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
