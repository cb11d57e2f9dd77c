"""``localspec calibrate``: measure this machine's step costs for a pair again, or forget
what was measured and learned (``--reset``) so the next run starts from nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError

from localspec.cli.common import (
    DEFAULT_RPC_TIMEOUT,
    CtxOpt,
    DraftGpuLayersOpt,
    DraftOpt,
    ExactOpt,
    GpuLayersOpt,
    RpcOpt,
    RpcSplitOpt,
    RpcTimeoutOpt,
    TargetOpt,
    ThreadsOpt,
    cli_errors,
    echo_progress,
    pair_settings,
    usage_from,
)
from localspec.core.costs import CostProfile


def calibrate_command(
    target: TargetOpt = None,
    draft: DraftOpt = None,
    threads: ThreadsOpt = None,
    ctx: CtxOpt = 4096,
    gpu_layers: GpuLayersOpt = None,
    draft_gpu_layers: DraftGpuLayersOpt = None,
    rpc: RpcOpt = None,
    rpc_timeout: RpcTimeoutOpt = DEFAULT_RPC_TIMEOUT,
    rpc_split: RpcSplitOpt = None,
    reset: Annotated[
        bool,
        typer.Option(
            help="first forget every pair's measured costs and learned acceptance on this machine"
        ),
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object instead")] = False,
    exact: ExactOpt = False,
) -> None:
    """Measure this machine's step costs for the pair again (the auto drafter uses them)."""
    with cli_errors():
        from localspec.models.paths import cache_root
        from localspec.session.calibrate import CostCache
        from localspec.session.costcache import cached_costs
        from localspec.session.open import learning_store, open_session
        from localspec.session.pair import ModelOptions

        try:
            options = ModelOptions(
                **pair_settings(
                    target,
                    draft,
                    threads,
                    ctx,
                    gpu_layers,
                    exact,
                    rpc,
                    rpc_timeout,
                    rpc_split,
                    draft_gpu_layers=draft_gpu_layers,
                ),
                recalibrate=True,
            )
        except ValidationError as err:
            raise usage_from(err, "calibrate") from None
        where = cache_root() / "calibration"
        if reset:
            costs_gone = CostCache(where).forget()
            learned_gone = learning_store().forget()
            typer.echo(
                f"forgot {costs_gone} measurement(s) and {learned_gone} learned state(s)", err=True
            )
        session = open_session(options, on_progress=echo_progress)
        costs = session.costs
        # The other kernels' figures, if measured before: exact mode can only be chosen
        # before a process evaluates anything, so one run cannot measure both.
        assert session.placement is not None
        other = cached_costs(
            options.model_copy(update={"exact": not exact}),
            session.placement,
            session.target.path,
            session.draft.path if session.draft is not None else None,
        )
        session.close()
    assert costs is not None  # calibrate=True always measures
    if json_out:
        record = {**costs.to_dict(), "exact": exact, "cache_dir": str(where)}
        record["other_mode"] = {"exact": not exact, **other.to_dict()} if other else None
        typer.echo(json.dumps(record))
        return
    typer.echo(format_costs(costs, where, exact=exact, other=other))


def format_costs(
    costs: CostProfile, where: Path, *, exact: bool = False, other: CostProfile | None = None
) -> str:
    """The measured costs; beside them, ``other`` (the same pair measured with the other
    kernels: exact if ``exact`` is False, and the reverse) as a ratio, when known."""
    plain = costs.plain_s
    mode, other_mode = ("exact", "default") if exact else ("default", "exact")
    lines = [f"kernels: {mode}" + (f" (beside: {other_mode}, measured before)" if other else "")]

    def beside(mine: float, theirs: float | None) -> str:
        if theirs is None:
            return ""
        return f"  | {other_mode}: {theirs * 1000:7.1f} ms ({mine / theirs:.2f}x)"

    lines.append(
        f"plain target step: {plain * 1000:.1f} ms ({1 / plain:.1f} tok/s)"
        + (beside(plain, other.plain_s) if other else "")
    )
    lines.append("verify k drafts (k+1 tokens, logits for every one):")
    for k, s in sorted(costs.verify_s.items()):
        lines.append(
            f"  k={k:2}: {s * 1000:7.1f} ms = {s / plain:5.2f} plain steps "
            f"({(k + 1) / s:.1f} tok/s if all accepted)"
            + (beside(s, other.verify_s.get(k)) if other else "")
        )
    if costs.draft_step_s is not None:
        d = costs.draft_step_s
        lines.append(f"draft step: {d * 1000:.1f} ms = {d / plain:.2f} plain steps")
    if costs.verify_s:
        k, s = max(costs.verify_s.items(), key=lambda item: (item[0] + 1) / item[1])
        ceiling = (k + 1) / s
        lines.append(
            f"ceiling (best batch, {k + 1} tokens): {ceiling:.1f} tok/s = "
            f"{ceiling * plain:.2f}x a plain step"
        )
    lines.append(f"cached in {where} (one file per pair, settings and machine)")
    if other is None:
        flag = "" if exact else " --exact"
        lines.append(f"measure the {other_mode} kernels too with: localspec calibrate{flag}")
    return "\n".join(lines)
