"""``localspec bench`` and ``localspec calibrate``: typer command functions.

``bench_command`` loads the pair once, measures the target's batch-16 ceiling, runs the
prompt sets in every mode (see ``bench.py`` for the protocol), appends one JSON line per run
to ``records.jsonl`` as it goes, then writes summary.md, summary.json and speedup.png and
prints the table to stdout. Progress goes to stderr. Ctrl-C stops after the current run and
still summarises what was measured. ``calibrate_command`` measures this machine's step
costs for the pair again and prints them. Errors become ``error:`` / ``hint:`` lines.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from localspec.cli.common import (
    CtxOpt,
    DraftOpt,
    GpuLayersOpt,
    TargetOpt,
    TemperatureOpt,
    ThreadsOpt,
    cli_errors,
    usage_from,
)
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


def bench_command(
    categories: Annotated[
        str | None, typer.Option(help="comma-separated categories (default: all)")
    ] = None,
    limit: Annotated[int | None, typer.Option(help="prompts per category at most")] = None,
    modes: Annotated[
        str,
        typer.Option(help="comma-separated: none, ngram, model, auto, native-draft, native-ngram"),
    ] = "none,ngram,model,auto",
    max_tokens: Annotated[int, typer.Option(help="new tokens per run at most")] = 200,
    temperature: TemperatureOpt = 0.0,
    seed: Annotated[int | None, typer.Option(help="sampling seed (prompt i uses seed+i)")] = None,
    raw: Annotated[bool, typer.Option(help="send prompts without the chat template")] = False,
    native_bin: Annotated[
        Path | None,
        typer.Option(help="llama-speculative-simple to compare with (adds the native modes)"),
    ] = None,
    native_flags: Annotated[
        str,
        typer.Option(help="extra flags for the native binary, e.g. '--spec-draft-n-max 8'"),
    ] = "",
    out: Annotated[
        Path | None, typer.Option(help="output folder (default: ./bench-results/<timestamp>)")
    ] = None,
    chart: Annotated[bool, typer.Option(help="draw speedup.png (needs matplotlib)")] = True,
    warmup: Annotated[bool, typer.Option(help="one short unrecorded run per mode first")] = True,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    threads: ThreadsOpt = None,
    ctx: CtxOpt = 4096,
) -> None:
    """Measure plain and speculative decoding by prompt category, side by side."""
    with cli_errors():
        code = _bench(
            categories=categories,
            limit=limit,
            modes=modes,
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
            raw=raw,
            native_bin=native_bin,
            native_flags=native_flags,
            out=out,
            chart=chart,
            warmup=warmup,
            target=target,
            draft=draft,
            threads=threads,
            ctx=ctx,
        )
    raise typer.Exit(code)


def _bench(
    *,
    categories: Any,
    limit: Any,
    modes: Any,
    max_tokens: Any,
    temperature: Any,
    seed: Any,
    raw: Any,
    native_bin: Any,
    native_flags: Any,
    out: Any,
    chart: Any,
    warmup: Any,
    target: Any,
    draft: Any,
    threads: Any,
    ctx: Any,
) -> int:
    from localspec.bench import report as bench_report
    from localspec.bench import runner as bench
    from localspec.session.session import ModelOptions, open_session

    chosen = bench.parse_modes(modes)
    if native_bin is not None and not any(m in bench.NATIVE_MODES for m in chosen):
        chosen = (*chosen, *bench.NATIVE_MODES)
    if any(m in bench.NATIVE_MODES for m in chosen) and native_bin is None:
        raise UsageError("native modes need the llama.cpp binary", "pass --native-bin PATH")
    try:
        native_args = shlex.split(native_flags)
    except ValueError as err:
        raise UsageError(f"invalid --native-flags: {err}", "quote it as for a shell") from None
    if native_bin is not None:
        from localspec.backend.native import check_binary

        check_binary(native_bin, chosen)  # before minutes of model loading
    cats = [c.strip() for c in categories.split(",")] if categories else None
    prompts = bench.load_prompts(cats, limit)
    try:
        config = bench.BenchConfig(
            modes=chosen,
            max_tokens=max_tokens,
            temperature=temperature,
            seed=seed,
            raw=raw,
            warmup=warmup,
        )
        options = ModelOptions(
            target=target,
            draft=draft,
            threads=threads,
            n_ctx=ctx,
            use_draft=any(m in chosen for m in ("model", "auto", "native-draft")),
        )
    except ValidationError as err:
        raise usage_from(err, "bench") from None
    if chart:
        bench_report.require_matplotlib()
    out_dir = _out_dir(out)
    session = open_session(options, on_progress=_echo)
    try:
        native = None
        if native_bin is not None:
            from localspec.backend.native import NativeRunner

            native = NativeRunner(
                native_bin,
                session.target.path,
                session.draft.path if session.draft is not None else None,
                _detokenizer(session.target),
                threads=threads,
                n_ctx=ctx,
                extra_args=native_args,
            )
            native.check(chosen)
        runner = bench.BenchRunner(session, config, native)
        _echo("measuring the target's ceiling (a batch of 16 tokens)")
        ceiling = bench.measure_ceiling(
            session.target, session.text_tokens(prompts[0].prompt, raw=raw)
        )
        if session.costs is not None and 15 in session.costs.verify_s:
            ceiling["calibrated_tokens_per_s"] = round(16 / session.costs.verify_s[15], 3)
        records, code = _run(runner, prompts, out_dir, len(chosen))
        meta = _meta(session, config, threads, ctx, native, len(prompts))
    finally:
        session.close()
    summary = bench.summarize(records, chosen, config.greedy)
    summary["meta"] = meta
    summary["ceiling"] = ceiling
    md, js = bench_report.write_summary(summary, out_dir)
    typer.echo(bench_report.render_table(summary))
    written = [str(out_dir / "records.jsonl"), str(md), str(js)]
    if chart and records:
        written.append(str(bench_report.write_chart(summary, out_dir / "speedup.png")))
    _echo("wrote " + ", ".join(written))
    return code


def _run(runner: Any, prompts: list, out_dir: Path, n_modes: int) -> tuple[list, int]:
    records: list[dict[str, Any]] = []
    baseline: dict[tuple[str, str], dict[str, Any]] = {}
    _echo(f"running {len(prompts)} prompts x {n_modes} modes (Ctrl-C stops and summarises)")
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
    session: Any, config: Any, threads: int | None, ctx: int, native: Any, n_prompts: int
) -> dict[str, Any]:
    import llama_cpp

    from localspec import __version__
    from localspec.bench import runner as bench

    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "target": session.target_label,
        "draft": session.draft_label,
        "cpu": cpu_name(),
        "threads": threads or os.cpu_count(),
        "context": ctx,
        "prompts": n_prompts,
        "modes": ", ".join(config.modes),
        "max_tokens": config.max_tokens,
        "temperature": config.temperature,
        "seed": config.seed,
        "chat_template": not config.raw,
        "localspec": __version__,
        "llama_cpp_python": getattr(llama_cpp, "__version__", "?"),
    }
    if native is not None:
        meta["native_binary"] = str(native.binary)
        for mode in config.modes:
            if mode in bench.NATIVE_MODES:
                cmd = native.command(mode, "PROMPT", config.max_tokens, config.temperature, None)
                meta[f"{mode} flags"] = " ".join(cmd[1:])
    return meta


def calibrate_command(
    target: TargetOpt = None,
    draft: DraftOpt = None,
    threads: ThreadsOpt = None,
    ctx: CtxOpt = 4096,
    gpu_layers: GpuLayersOpt = 0,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object instead")] = False,
) -> None:
    """Measure this machine's step costs for the pair again (the auto drafter uses them)."""
    with cli_errors():
        from localspec.models.paths import cache_root
        from localspec.session.session import ModelOptions, open_session

        try:
            options = ModelOptions(
                target=target,
                draft=draft,
                threads=threads,
                n_ctx=ctx,
                n_gpu_layers=gpu_layers,
                recalibrate=True,
            )
        except ValidationError as err:
            raise usage_from(err, "calibrate") from None
        session = open_session(options, on_progress=_echo)
        costs = session.costs
        session.close()
        where = cache_root() / "calibration"
    assert costs is not None  # calibrate=True always measures
    if json_out:
        typer.echo(json.dumps({**costs.to_dict(), "cache_dir": str(where)}))
        return
    typer.echo(format_costs(costs, where))


def format_costs(costs: Any, where: Path) -> str:
    plain = costs.plain_s
    lines = [f"plain target step: {plain * 1000:.1f} ms ({1 / plain:.1f} tok/s)"]
    lines.append("verify k drafts (k+1 tokens, logits for every one):")
    for k, s in sorted(costs.verify_s.items()):
        lines.append(
            f"  k={k:2}: {s * 1000:7.1f} ms = {s / plain:5.2f} plain steps "
            f"({(k + 1) / s:.1f} tok/s if all accepted)"
        )
    if costs.draft_step_s is not None:
        d = costs.draft_step_s
        lines.append(f"draft step: {d * 1000:.1f} ms = {d / plain:.2f} plain steps")
    if 15 in costs.verify_s:
        ceiling = 16 / costs.verify_s[15]
        lines.append(
            f"ceiling at a batch of 16: {ceiling:.1f} tok/s = {ceiling * plain:.2f}x a plain step"
        )
    lines.append(f"cached in {where} (one file per pair, settings and machine)")
    return "\n".join(lines)
