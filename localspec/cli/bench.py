"""``localspec bench``: the typer command function.

``bench_command`` parses the command's options into a ``BenchArgs`` and hands them to
``localspec.bench.run.run_bench``, which runs the whole bench (see there: the protocol,
the files written, what goes to stdout and stderr). Errors become ``error:`` / ``hint:``
lines and their exit codes; Ctrl-C during a run still summarises what was measured.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from localspec.bench.args import BenchArgs
from localspec.cli.common import cli_errors, echo_progress
from localspec.cli.groups import option_groups
from localspec.session.options import ModelChoice, Temperature, command_line


@option_groups
def bench_command(
    categories: Annotated[
        str | None,
        typer.Option(
            help="comma-separated categories (default: all but repo_code and apply, which "
            "are run when named: apply edits whole files, with the file as the prediction)"
        ),
    ] = None,
    limit: Annotated[int | None, typer.Option(help="prompts per category at most")] = None,
    prompts: Annotated[
        Path | None,
        typer.Option(
            help="your own prompts instead of the shipped sets: JSONL, one object a line with "
            '"prompt" (and optional "id", "category", "source", and "prediction" for mode '
            "auto-prediction)"
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
    fields = dict(locals())  # exactly the options above
    del fields["model"]
    from localspec.bench.run import run_bench  # the engine loads only when the bench runs

    with cli_errors():
        args = BenchArgs(**fields, pair=model.options(spelling=command_line("bench")))
        code = run_bench(args, on_progress=echo_progress)
    raise typer.Exit(code)
