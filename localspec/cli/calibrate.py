"""``localspec calibrate``: measure this machine's step costs for a pair again, or forget
what was measured and learned (``--reset``) so the next run starts from nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from localspec.cli.common import cli_errors, echo_progress
from localspec.cli.groups import option_groups
from localspec.core.costs import CostProfile
from localspec.models.paths import cache_root
from localspec.options.model import ModelChoice, command_line

# The session module loads llama.cpp, and the cost cache numpy, so they are imported only
# when a pair is measured or forgotten: ``localspec --help`` and the other commands start
# without them.


@option_groups
def calibrate_command(
    *,
    model: ModelChoice,
    reset: Annotated[
        bool,
        typer.Option(
            help="first forget every pair's measured costs and learned acceptance on this machine"
        ),
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object instead")] = False,
) -> None:
    """Measure this machine's step costs for the pair again (the auto drafter uses them)."""
    with cli_errors():
        options = model.options(spelling=command_line("calibrate"), recalibrate=True)
        where = cache_root() / "calibration"
        if reset:
            forget(where)
        costs, other = measure(options)
    if json_out:
        record = {**costs.to_dict(), "exact": model.exact, "cache_dir": str(where)}
        record["other_mode"] = {"exact": not model.exact, **other.to_dict()} if other else None
        typer.echo(json.dumps(record))
        return
    typer.echo(format_costs(costs, where, exact=model.exact, other=other))


def forget(where: Path) -> None:
    """Forget every pair's measured costs (kept in ``where``) and learned acceptance."""
    from localspec.machine.calibrate import CostCache
    from localspec.session.open import learning_store

    costs_gone = CostCache(where).forget()
    learned_gone = learning_store().forget()
    typer.echo(f"forgot {costs_gone} measurement(s) and {learned_gone} learned state(s)", err=True)


def measure(options: Any) -> tuple[CostProfile, CostProfile | None]:
    """The pair's costs measured now, and those measured before with the other kernels
    (exact or not) if any: exact mode can only be chosen before a process evaluates
    anything, so one run cannot measure both."""
    from localspec.machine.costcache import cached_costs
    from localspec.session.open import open_session

    session = open_session(options, on_progress=echo_progress)
    try:
        costs = session.costs
        assert session.placement is not None
        other = cached_costs(
            options.model_copy(update={"exact": not options.exact}),
            session.placement,
            session.target.path,
            session.draft_path,
        )
    finally:
        session.close()
    assert costs is not None  # calibrate=True always measures
    return costs, other


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
