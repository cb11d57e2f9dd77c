"""``localspec bench``: the typer command function.

``bench_command`` loads the pair once, measures the target's ceiling (its best batch of
16, 32 or 64 tokens), runs the shipped prompt sets or the user's ``--prompts`` file in every
mode (see ``bench/runner.py`` for the protocol; ``--cold``, the default, starts every run with
nothing learned and keeps the user's saved learning untouched, ``--warm`` lets the
controllers learn from prompt to prompt; ``--trace`` keeps each run's rounds), appends one
JSON line per run to ``records.jsonl`` as it goes, then writes summary.md, summary.json and
speedup.png and prints the table to stdout. Progress goes to stderr. Ctrl-C stops after the
current run and still summarises what was measured. Errors become ``error:`` / ``hint:``
lines.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from localspec.cli.common import cli_errors, echo_progress, usage_from
from localspec.cli.groups import option_groups
from localspec.cli.options import ModelChoice, TemperatureOpt
from localspec.errors import EXIT_CANCELLED, UsageError
from localspec.models.resources import cpu_name


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


def _detokenizer(model: Any):
    """Tokens back to text with special tokens spelled out, as the native binary reads it."""
    info = model.vocab_info()

    def detokenize(tokens: list[int]) -> str:
        if info.add_bos and tokens and tokens[0] == info.bos:
            tokens = tokens[1:]  # the binary's tokenizer adds it again
        data = b"".join(model.token_bytes(t, special=True) for t in tokens)
        return data.decode("utf-8", errors="replace")

    return detokenize


def _progress_line(record: dict[str, Any], done: int, total: int, baseline: dict) -> str:
    line = (
        f"[{done}/{total}] {record['category']}/{record['prompt_id']} {record['mode']}: "
        f"{record['generated_tokens']} tokens, {record['decode_tokens_per_s']:.1f} tok/s"
    )
    base = baseline.get((record["category"], record["prompt_id"]))
    if base and record["mode"] != "none" and base["decode_tokens_per_s"] > 0:
        line += f" ({record['decode_tokens_per_s'] / base['decode_tokens_per_s']:.2f}x none)"
    if record.get("acceptance_rate") is not None:
        line += f", acceptance {record['acceptance_rate']:.0%}"
    return line


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
    temperature: TemperatureOpt = 0.0,
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
    fields = {**locals(), **dataclasses.asdict(model)}  # exactly the options above
    del fields["model"]
    args = BenchArgs(**fields)
    with cli_errors():
        code = _bench(args)
    raise typer.Exit(code)


@dataclass(frozen=True)
class BenchArgs:
    """The options of ``localspec bench``, as typed."""

    categories: str | None
    limit: int | None
    prompts: Path | None
    modes: str
    store: list[str] | None
    max_tokens: int
    temperature: float
    seed: int | None
    raw: bool
    cold: bool
    trace: bool
    native_bin: Path | None
    native_flags: str
    repeat: int
    out: Path | None
    chart: bool
    warmup: bool
    target: str | None
    draft: str | None
    threads: int | None
    ctx: int
    gpu_layers: str | None
    draft_gpu_layers: str | None
    rpc: str | None
    rpc_timeout: float
    rpc_split: str | None
    exact: bool


def _choose_modes(args: BenchArgs) -> tuple[tuple[str, ...], list[str]]:
    """The modes to run and the native binary's extra flags, checked before any loading."""
    from localspec.bench import runner as bench

    chosen = bench.parse_modes(args.modes)
    if args.store and bench.STORE_MODE not in chosen:
        chosen = (*chosen, bench.STORE_MODE)
    if bench.STORE_MODE in chosen and not args.store:
        raise UsageError(
            f"mode {bench.STORE_MODE} needs a datastore",
            "pass --store NAME (localspec datastore list)",
        )
    if args.native_bin is not None and not any(m in bench.NATIVE_MODES for m in chosen):
        chosen = (*chosen, *bench.NATIVE_MODES)
    if any(m in bench.NATIVE_MODES for m in chosen) and args.native_bin is None:
        raise UsageError("native modes need the llama.cpp binary", "pass --native-bin PATH")
    if any(m in bench.NATIVE_MODES for m in chosen) and args.rpc:
        raise UsageError("native modes run on this machine only", "leave out --rpc or them")
    try:
        native_args = shlex.split(args.native_flags)
    except ValueError as err:
        raise UsageError(f"invalid --native-flags: {err}", "quote it as for a shell") from None
    if args.native_bin is not None:
        from localspec.backend.native import check_binary

        check_binary(args.native_bin, chosen)  # before minutes of model loading
    return chosen, native_args


def _load_prompts(args: BenchArgs) -> list:
    from localspec.bench import runner as bench

    cats = [c.strip() for c in args.categories.split(",")] if args.categories else None
    if args.prompts is not None:
        return bench.load_prompt_file(args.prompts, cats, args.limit)
    return bench.load_prompts(cats, args.limit)


def _settings(args: BenchArgs, chosen: tuple[str, ...]) -> tuple[Any, Any]:
    from localspec.bench import runner as bench

    try:
        config = bench.BenchConfig(
            modes=chosen,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            seed=args.seed,
            raw=args.raw,
            warmup=args.warmup,
            cold=args.cold,
            trace=args.trace,
            repeat=args.repeat,
        )
        options = ModelChoice.of(args).options(
            command="bench",
            use_draft=any(bench.loads_draft_model(m) for m in chosen),
            # Only auto-store drafts from a store, and only from those named; no bench run
            # adds its answers to the user's history.
            stores=tuple(args.store or ()),
            history=False,
            # Cold runs neither start from the user's saved learning nor overwrite it with
            # what one bench prompt taught.
            learn=not args.cold,
        )
    except ValidationError as err:
        raise usage_from(err, "bench") from None
    return config, options


def _native_runner(args: BenchArgs, session: Any, chosen: tuple, native_args: list) -> Any:
    if args.native_bin is None:
        return None
    from localspec.backend.llama import default_kernels_environ
    from localspec.backend.native import NativeRunner

    native = NativeRunner(
        args.native_bin,
        session.target.path,
        session.draft.path if session.draft is not None else None,
        _detokenizer(session.target),
        threads=args.threads,
        n_ctx=args.ctx,
        extra_args=native_args,
        env=default_kernels_environ(),
    )
    native.check(chosen)
    return native


def _ceiling(session: Any, prompt: str, raw: bool) -> dict[str, Any]:
    from localspec.bench import runner as bench

    sizes = ", ".join(map(str, bench.CEILING_BATCHES))
    _echo(f"measuring the target's ceiling (batches of {sizes} tokens, within the context)")
    ceiling = bench.measure_ceiling(session.target, session.text_tokens(prompt, raw=raw))
    verify_s = session.costs.verify_s if session.costs is not None else {}
    if verify_s:
        k = max(verify_s)  # k drafts: a batch of k + 1 tokens
        ceiling["calibrated_batch"] = k + 1
        ceiling["calibrated_tokens_per_s"] = round((k + 1) / verify_s[k], 3)
    return ceiling


def _bench(args: BenchArgs) -> int:
    from localspec.bench import report as bench_report
    from localspec.bench import runner as bench
    from localspec.session.open import open_session

    chosen, native_args = _choose_modes(args)
    prompts = _load_prompts(args)
    config, options = _settings(args, chosen)
    if args.chart:
        bench_report.require_matplotlib()
    out_dir = _out_dir(args.out)
    session = open_session(options, on_progress=echo_progress)
    try:
        native = _native_runner(args, session, chosen, native_args)
        runner = bench.BenchRunner(session, config, native)
        ceiling = _ceiling(session, prompts[0].prompt, args.raw)
        records, code = _run(runner, prompts, out_dir, len(chosen), config.repeat)
        meta = _meta(session, config, args, native, len(prompts))
    finally:
        session.close()
    summary = bench.summarize(records, chosen, config.greedy)
    summary["meta"] = meta
    summary["ceiling"] = ceiling
    md, js = bench_report.write_summary(summary, out_dir)
    typer.echo(bench_report.render_table(summary))
    written = [str(out_dir / "records.jsonl"), str(md), str(js)]
    if args.chart and records:
        written.append(str(bench_report.write_chart(summary, out_dir / "speedup.png")))
    _echo("wrote " + ", ".join(written))
    return code


def _run(runner: Any, prompts: list, out_dir: Path, n_modes: int, repeat: int) -> tuple[list, int]:
    records: list[dict[str, Any]] = []
    baseline: dict[tuple[str, str], dict[str, Any]] = {}
    times = f" x {repeat} runs" if repeat > 1 else ""
    _echo(f"running {len(prompts)} prompts x {n_modes} modes{times} (Ctrl-C stops and summarises)")
    with (out_dir / "records.jsonl").open("w", encoding="utf-8") as fh:

        def on_record(record: dict[str, Any], done: int, total: int) -> None:
            fh.write(json.dumps(record) + "\n")
            fh.flush()
            records.append(record)
            if record["mode"] == "none":
                baseline[(record["category"], record["prompt_id"])] = record
            _echo(_progress_line(record, done, total, baseline))

        try:
            runner.run(prompts, on_record)
        except KeyboardInterrupt:
            _echo(f"\ninterrupted: summarising the {len(records)} runs completed")
            return records, EXIT_CANCELLED
    return records, 0


def _meta(
    session: Any, config: Any, args: BenchArgs, native: Any, n_prompts: int
) -> dict[str, Any]:
    import llama_cpp

    from localspec import __version__
    from localspec.bench import runner as bench

    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "target": session.target_label,
        "draft": session.draft_label,
        "cpu": cpu_name(),
        "threads": args.threads or os.cpu_count(),
        "context": args.ctx,
        "prompts": n_prompts,
        "prompt_file": str(args.prompts) if args.prompts is not None else "shipped sets",
        "modes": ", ".join(config.modes),
        "max_tokens": config.max_tokens,
        "temperature": config.temperature,
        "seed": config.seed,
        "chat_template": not config.raw,
        "cold": config.cold,
        "repeat": config.repeat,
        "exact": args.exact,
        "rpc": [str(e) for e in session.rpc.endpoints] if session.rpc is not None else [],
        "min_ratio_tokens": bench.MIN_RATIO_TOKENS,
        # The costs the cost model started from (scripts/break_even.py prices drafters by them).
        "costs": session.costs.to_dict() if session.costs is not None else None,
        "localspec": __version__,
        "llama_cpp_python": getattr(llama_cpp, "__version__", "?"),
    }
    if native is not None:
        meta["native_binary"] = str(native.binary)
        if bench.NATIVE_BENCH in config.modes:
            meta["native_bench_binary"] = str(native.bench_binary)
        for mode in config.modes:
            if mode in bench.NATIVE_MODES:
                meta[f"{mode} flags"] = native.describe(mode, config.max_tokens, config.temperature)
    return meta
