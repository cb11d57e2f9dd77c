"""``localspec doctor``: what this machine runs localspec on, in text or ``--json``.

It loads no model. Exit 0 when localspec can run here, 1 with the reasons when it cannot;
what only makes it slower (a GPU the build cannot use, a model that does not fit on the
GPU) is a note, not a failure.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any

import typer

from localspec.cli.common import cli_errors
from localspec.cli.diagnosis import diagnose
from localspec.cli.groups import option_groups
from localspec.errors import EXIT_FAILURE
from localspec.options.model import PairChoice, command_line


@option_groups
def doctor(
    *,
    pair: PairChoice,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object instead")] = False,
) -> None:
    """Check the llama.cpp build, the devices, where each model would run, the models on
    disk and the costs measured here; what a bug report should quote."""
    with cli_errors():
        report = diagnose(pair.options(spelling=command_line("doctor")))
    if json_out:
        typer.echo(json.dumps(report.to_dict(), indent=2))
    else:
        typer.echo(render(report.to_dict()))
    if not report.ok:
        raise typer.Exit(EXIT_FAILURE)


def render(report: dict[str, Any]) -> str:
    """The report as a few aligned sections of text."""
    lines = [f"localspec home   {report['home']}"]
    build = report.get("build")
    if build:
        backends = ", ".join(build["backends"]) or "none"
        lines += [
            f"llama.cpp        llama-cpp-python {build['llama_cpp_python']}; backends {backends}"
            f"; GPU offload {'yes' if build['gpu_offload'] else 'no'}"
            f"; RPC {'yes' if build['rpc'] else 'no'}",
            f"system           {build['system_info']}",
        ]
    for device in report.get("devices", []):
        memory = ""
        if device["total_bytes"]:
            memory = f", {_gib(device['free_bytes'])} free of {_gib(device['total_bytes'])}"
        lines.append(
            f"device           {device['name']} ({device['type']}, {device['backend']}): "
            f"{device['description']}{memory}"
        )
    lines += _pair_lines(report.get("pair") or {})
    verification = report.get("verification")
    if verification:
        where, why = verification["greedy"], verification["why"]
        lines.append(f"verification     greedy on the {where}: {why}")
    for model in report.get("models", []):
        lines.append(f"on disk          {model['name']} ({_gib(model['bytes'])}): {model['path']}")
    for profile in report.get("cost_profiles", []):
        when = datetime.fromtimestamp(profile["measured"]).strftime("%Y-%m-%d %H:%M")
        lines.append(
            f"costs measured   {when}: plain step {profile['plain_step_ms']} ms ({profile['file']})"
        )
    cache = report.get("prompt_cache")
    if cache:
        lines.append(
            f"prompt cache     {cache['entries']} saved prompt(s), {_gib(cache['bytes'])} of "
            f"{_gib(cache['default_disk_bound'])} on disk ({cache['folder']}); memory tier "
            f"{_gib(cache['default_memory_bound'])} (defaults: --prompt-cache-size sets both)"
        )
    lines += [f"note: {note}" for note in report.get("notes", [])]
    lines += [f"problem: {problem}" for problem in report.get("problems", [])]
    lines.append("localspec can run here" if report["ok"] else "localspec cannot run here")
    return "\n".join(lines)


def _pair_lines(pair: dict[str, Any]) -> list[str]:
    lines = []
    for role in ("target", "draft"):
        if role in pair:
            where = pair[role]["path"] or "not on disk yet"
            lines.append(f"{role:<17}{pair[role]['ref']}: {where}")
    placement = pair.get("placement")
    if placement:
        lines.append(f"would run        {placement['summary']} ({placement['reason']})")
        step = pair.get("plain_step_ms")
        lines.append(
            f"costs            {f'plain step {step} ms, measured' if step else 'not measured yet'}"
            " for this pair as placed"
        )
    return lines


def _gib(n: int) -> str:
    return f"{n / 1024**3:.1f} GiB"
