"""The whole ``localspec bench`` flow, from its typed arguments to its files and exit status.

``run_bench(args, on_progress)`` checks the modes and options before any loading, loads the
pair once, measures the target's ceiling (its best batch of 16, 32 or 64 tokens, after a
short context and again per category where its answers run), runs the shipped prompt sets or
the user's ``--prompts`` file in every mode (see ``runner.py`` for the protocol; ``--cold``,
the default, starts every run with nothing learned and keeps the user's saved learning
untouched, ``--warm`` lets the controllers learn from prompt to prompt; ``--trace`` keeps
each run's rounds; ``--rpc-delay`` reaches the ``--rpc`` workers through a relay that delays
every round trip, ``relay.py``), appends one JSON line per run to ``records.jsonl`` as it
goes, then writes summary.md, summary.json (with where each drafter pays, ``break_even.py``)
and speedup.png and prints the table to stdout. Progress goes to stderr (model loading
through ``on_progress``). Ctrl-C stops after the current run and still summarises what was
measured; the exit status is then ``EXIT_CANCELLED``, else 0. Bad options and inputs raise
the errors of ``localspec.errors``, for the front end to report.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import llama_cpp
import typer
from pydantic import ValidationError

from localspec import __version__
from localspec.backend.llama import default_kernels_environ
from localspec.backend.native import NativeRunner, check_binary
from localspec.bench import report as bench_report
from localspec.bench.args import BenchArgs
from localspec.bench.break_even import break_even
from localspec.bench.ceiling import CEILING_BATCHES, measure_ceiling
from localspec.bench.fresh import FreshRunner, check_modes
from localspec.bench.modes import (
    BASELINE,
    NATIVE_BENCH,
    NATIVE_MODES,
    STORE_MODE,
    BenchMode,
    parse_modes,
)
from localspec.bench.prompts import BenchPrompt, load_prompt_file, load_prompts
from localspec.bench.records import RunRecord
from localspec.bench.relay import DelayRelay, relayed
from localspec.bench.runner import BenchConfig, BenchRunner, spelled_text
from localspec.bench.summary import MIN_RATIO_TOKENS, summarize
from localspec.errors import EXIT_CANCELLED, UsageError
from localspec.models.resources import cpu_name
from localspec.options.bench import BenchChoice
from localspec.options.model import command_line, invalid_value
from localspec.progress import Progress
from localspec.session.open import open_session
from localspec.session.pair import ModelOptions
from localspec.session.session import Session


def _echo(message: str) -> None:
    typer.echo(message, err=True)


def _out_dir(out: Path | None) -> Path:
    path = out or Path("bench-results") / time.strftime("%Y%m%d-%H%M%S")
    if (path / "records.jsonl").exists():
        raise UsageError(
            f"{path} already holds bench results", "pass another --out, or remove that folder"
        )
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"cannot create {path}: {err.strerror}", "pass another --out") from None
    return path


def _progress_line(
    record: RunRecord, done: int, total: int, baseline: dict[tuple[str, str], RunRecord]
) -> str:
    line = (
        f"[{done}/{total}] {record.category}/{record.prompt_id} {record.mode}: "
        f"{record.generated_tokens} tokens, {record.decode_tokens_per_s:.1f} tok/s"
    )
    base = baseline.get(record.key)
    if base and record.mode != BASELINE and base.decode_tokens_per_s > 0:
        line += f" ({record.decode_tokens_per_s / base.decode_tokens_per_s:.2f}x none)"
    if record.acceptance_rate is not None:
        line += f", acceptance {record.acceptance_rate:.0%}"
    return line


def _choose_modes(args: BenchArgs) -> tuple[tuple[BenchMode, ...], list[str]]:
    """The modes to run and the native binary's extra flags, checked before any loading."""
    chosen = parse_modes(args.bench.modes)
    if args.bench.store and STORE_MODE not in chosen:
        chosen = (*chosen, STORE_MODE)
    if STORE_MODE in chosen and not args.bench.store:
        raise UsageError(
            f"mode {STORE_MODE} needs a datastore",
            "pass --store NAME (localspec datastore list)",
        )
    if args.bench.native_bin is not None and not any(m.is_native for m in chosen):
        chosen = (*chosen, *NATIVE_MODES)
    if any(m.is_native for m in chosen) and args.bench.native_bin is None:
        raise UsageError("native modes need the llama.cpp binary", "pass --native-bin PATH")
    if any(m.is_native for m in chosen) and args.pair.rpc:
        raise UsageError("native modes run on this machine only", "leave out --rpc or them")
    try:
        native_args = shlex.split(args.bench.native_flags)
    except ValueError as err:
        raise UsageError(f"invalid --native-flags: {err}", "quote it as for a shell") from None
    if args.bench.native_bin is not None:
        check_binary(args.bench.native_bin, chosen)  # before minutes of model loading
    check_modes(chosen, fresh=args.bench.fresh)
    delay = args.bench.rpc_delay
    if delay is not None and (delay < 0 or not args.pair.rpc):
        raise UsageError(
            f"invalid --rpc-delay {delay:g}: it delays the link to the --rpc workers",
            "pass --rpc HOST:PORT with it, and a delay of 0 ms or more",
        )
    return chosen, native_args


def _load_prompts(args: BenchArgs) -> list[BenchPrompt]:
    cats = [c.strip() for c in args.bench.categories.split(",")] if args.bench.categories else None
    if args.bench.prompts is not None:
        return load_prompt_file(args.bench.prompts, cats, args.bench.limit)
    return load_prompts(cats, args.bench.limit)


def _settings(args: BenchArgs, chosen: tuple[BenchMode, ...]) -> tuple[BenchConfig, ModelOptions]:
    try:
        config = BenchConfig.of(args.bench, chosen)
    except ValidationError as err:
        raise invalid_value(err, command_line("bench")) from None
    # The pair's options were checked by the command; what the bench sets is its own.
    options = args.pair.model_copy(
        update={
            "use_draft": any(m.loads_draft_model for m in config.modes),
            # Loaded at once where a mode cannot run without it; else as auto would.
            "draft_on_demand": not any(m.needs_draft_model for m in config.modes),
            # Only auto-store drafts from a store, and only from those named; no bench run
            # adds its answers to the user's history.
            "stores": tuple(args.bench.store or ()),
            "history": False,
            # Cold runs neither start from the user's saved learning nor overwrite it with
            # what one bench prompt taught.
            "learn": not args.bench.cold,
        }
    )
    return config, options


def _native_runner(
    args: BenchArgs, session: Session, chosen: tuple[BenchMode, ...], native_args: list[str]
) -> NativeRunner | None:
    if args.bench.native_bin is None:
        return None
    native = NativeRunner(
        args.bench.native_bin,
        session.target.path,
        session.draft_path,
        functools.partial(spelled_text, session.target),
        threads=args.pair.threads,
        n_ctx=args.pair.n_ctx,
        extra_args=native_args,
        env=default_kernels_environ(),
    )
    native.check(chosen)
    return native


def _fresh_runner(
    options: ModelOptions, session: Session, config: BenchConfig
) -> FreshRunner | None:
    """With ``--fresh``: the runner of fresh ``complete`` processes over the same pair."""
    if not config.fresh:
        return None
    return FreshRunner(
        options,
        session.target.path,
        session.draft_path,
        cold=config.cold,
        raw=config.raw,
        trace=config.trace,
    )


def _ceiling(session: Session, prompt: str, raw: bool) -> dict[str, Any]:
    sizes = ", ".join(map(str, CEILING_BATCHES))
    _echo(f"measuring the target's ceiling (batches of {sizes} tokens, within the context)")
    ceiling = measure_ceiling(session.target, session.text_tokens(prompt, raw=raw))
    verify_s = session.costs.verify_s if session.costs is not None else {}
    if verify_s:
        k = max(verify_s)  # k drafts: a batch of k + 1 tokens
        ceiling["calibrated_batch"] = k + 1
        ceiling["calibrated_tokens_per_s"] = round((k + 1) / verify_s[k], 3)
    return ceiling


def _ceilings(
    session: Session, runner: BenchRunner, prompts: list[BenchPrompt], bench: BenchChoice
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """The target's ceiling, and again per category at its answers' depth (none with
    ``--no-ceiling``)."""
    if not bench.ceiling:
        return {}, {}
    ceiling = _ceiling(session, prompts[0].prompt, bench.raw)
    _echo("measuring it again at the depth where each category's answers run")
    return ceiling, runner.ceilings(prompts)


def run_bench(args: BenchArgs, on_progress: Callable[[Progress], None] | None = None) -> int:
    """Run ``localspec bench`` with these arguments; the exit status (see the module)."""
    chosen, native_args = _choose_modes(args)
    prompts = _load_prompts(args)
    config, options = _settings(args, chosen)
    if args.bench.chart:
        bench_report.require_matplotlib()
    out_dir = _out_dir(args.bench.out)
    with contextlib.ExitStack() as closing:
        if args.bench.rpc_delay is not None:  # every run reaches the workers through a slower link
            relays = relayed(options.rpc, args.bench.rpc_delay)
            closing.callback(_close, relays)
            options = options.model_copy(update={"rpc": tuple(r.address for r in relays)})
        opening = time.perf_counter()
        session = open_session(options, on_progress=on_progress)
        load_s = time.perf_counter() - opening
        closing.callback(session.close)
        native = _native_runner(args, session, chosen, native_args)
        fresh = _fresh_runner(options, session, config)
        if fresh is not None:
            closing.callback(fresh.close)
        runner = BenchRunner(session, config, native, fresh, load_s)
        ceiling, ceilings = _ceilings(session, runner, prompts, args.bench)
        records, code = _run(runner, prompts, out_dir, len(chosen), config.repeat)
        meta = _meta(session, config, args, native, len(prompts))
    summary = summarize(records, chosen, config.greedy, ceilings)
    summary["break_even"] = break_even(records, session.costs)
    summary["meta"] = meta
    summary["ceiling"] = ceiling
    summary["ceilings"] = ceilings
    md, js = bench_report.write_summary(summary, out_dir)
    typer.echo(bench_report.render_table(summary))
    written = [str(out_dir / "records.jsonl"), str(md), str(js)]
    if args.bench.chart and records:
        written.append(str(bench_report.write_chart(summary, out_dir / "speedup.png")))
    _echo("wrote " + ", ".join(written))
    return code


def _close(relays: list[DelayRelay]) -> None:
    for relay in relays:
        relay.close()


def _run(
    runner: BenchRunner, prompts: list[BenchPrompt], out_dir: Path, n_modes: int, repeat: int
) -> tuple[list[RunRecord], int]:
    """Every run, each written to records.jsonl as it ends; Ctrl-C ends early."""
    records: list[RunRecord] = []
    baseline: dict[tuple[str, str], RunRecord] = {}
    times = f" x {repeat} runs" if repeat > 1 else ""
    _echo(f"running {len(prompts)} prompts x {n_modes} modes{times} (Ctrl-C stops and summarises)")
    with (out_dir / "records.jsonl").open("w", encoding="utf-8") as fh:

        def on_record(record: RunRecord, done: int, total: int) -> None:
            fh.write(json.dumps(record.to_dict()) + "\n")
            fh.flush()
            records.append(record)
            if record.mode == BASELINE:
                baseline[record.key] = record
            _echo(_progress_line(record, done, total, baseline))

        try:
            runner.run(prompts, on_record)
        except KeyboardInterrupt:
            _echo(f"\ninterrupted: summarising the {len(records)} runs completed")
            return records, EXIT_CANCELLED
    return records, 0


def _meta(
    session: Session,
    config: BenchConfig,
    args: BenchArgs,
    native: NativeRunner | None,
    n_prompts: int,
) -> dict[str, Any]:
    """The models, machine and settings of the run, as summary.md lists them."""
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "target": session.target_label,
        "draft": session.draft_label,
        "cpu": cpu_name(),
        "threads": args.pair.threads or os.cpu_count(),
        "context": args.pair.n_ctx,
        "prompts": n_prompts,
        "prompt_file": str(args.bench.prompts)
        if args.bench.prompts is not None
        else "shipped sets",
        "categories": args.bench.categories or "default",
        "modes": ", ".join(config.modes),
        "max_tokens": config.max_tokens,
        "temperature": config.temperature,
        "seed": config.seed,
        "chat_template": not config.raw,
        "cold": config.cold,
        "fresh": config.fresh,
        "repeat": config.repeat,
        "exact": args.pair.exact,
        "verification": session.verification,
        "rpc": list(args.pair.rpc),
        "min_ratio_tokens": MIN_RATIO_TOKENS,
        # The costs the cost model started from (the break-even and the replays use them).
        "costs": session.costs.to_dict() if session.costs is not None else None,
        "localspec": __version__,
        "llama_cpp_python": getattr(llama_cpp, "__version__", "?"),
    }
    if args.bench.rpc_delay is not None:
        meta["rpc_delay_ms"] = args.bench.rpc_delay
    if native is not None:
        meta["native_binary"] = str(native.binary)
        if NATIVE_BENCH in config.modes:
            meta["native_bench_binary"] = str(native.bench_binary)
        for mode in config.modes:
            if mode.is_native:
                meta[f"{mode} flags"] = native.describe(mode, config.max_tokens, config.temperature)
    return meta
