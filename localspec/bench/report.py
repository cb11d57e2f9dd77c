"""Render a bench summary: a Markdown table, summary.md / summary.json, and a speedup chart.

``summary`` is the dict ``localspec.bench.runner.summarize`` returns, extended by the caller with
``meta`` (models, machine, settings) and ``ceiling`` (``bench.measure_ceiling``).
``render_table`` gives the text printed to stdout and saved as summary.md; ``write_chart``
draws the ratio to ``none`` per category and mode with matplotlib (Agg backend, imported
only here and only when asked for, so the rest of the bench runs without it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from localspec.errors import UsageError

OVERALL = "all (geo-mean)"


def _fmt(value: Any, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def _row(name: str, mode: str, g: dict[str, Any]) -> str:
    agreement = g.get("agreement") or {}
    cells = [
        name,
        mode,
        str(g["prompts"]),
        _fmt(g["decode_tokens_per_s"], ".1f"),
        _fmt(g["ratio_to_none"], ".2f") + ("x" if g["ratio_to_none"] is not None else ""),
        _fmt(g["acceptance_rate"], ".0%"),
        _fmt(g["mean_accepted_length"], ".2f"),
        _fmt(g["outside_share"], ".1%"),
        _fmt(agreement.get("identical"), ".0%"),
        _fmt(agreement.get("mean_common_prefix"), ".0f")
        + (f"/{agreement['mean_baseline_length']:.0f}" if agreement else ""),
    ]
    return "| " + " | ".join(cells) + " |"


HEADER = (
    "| category | mode | prompts | decode tok/s | vs none | acceptance | tokens/pass "
    "| outside llama.cpp | identical to none | common prefix |\n"
    "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
)


def render_table(summary: dict[str, Any]) -> str:
    """The per-category table, overall geometric-mean rows last, then the ceiling."""
    lines = [HEADER]
    for category, modes in summary["categories"].items():
        lines += [_row(category, mode, g) for mode, g in modes.items()]
    lines += [_row(OVERALL, mode, g) for mode, g in summary["overall"].items()]
    ceiling = summary.get("ceiling")
    if ceiling:
        lines.append("")
        lines.append(
            f"Ceiling of this machine for the target: {ceiling['tokens_per_s']:.1f} tok/s at a "
            f"batch of {ceiling['batch']} with logits for every position "
            f"({ceiling['batch_s'] * 1000:.0f} ms a batch), against "
            f"{ceiling['plain_tokens_per_s']:.1f} tok/s for a plain step: "
            f"{ceiling['ceiling_ratio']:.2f}x is the most any lossless method can reach here."
        )
        if ceiling.get("calibrated_tokens_per_s"):
            lines.append(
                f"(The cached calibration says {ceiling['calibrated_tokens_per_s']:.1f} tok/s "
                "at that batch.)"
            )
    return "\n".join(lines)


def render_markdown(summary: dict[str, Any]) -> str:
    meta = summary.get("meta", {})
    lines = ["# localspec bench", ""]
    for key, value in meta.items():
        lines.append(f"- {key}: {value}")
    lines += [
        "",
        "decode tok/s: generated tokens over decode time (prefill excluded), all prompts of the "
        "group pooled. vs none: geometric mean of per-prompt ratios to plain decoding of the "
        "same prompt. tokens/pass: mean accepted length, bonus included. outside llama.cpp: "
        "share of decode time spent outside llama_decode and the logits copy. identical / "
        "common prefix: greedy agreement of the token ids with plain decoding (tokens).",
        "",
        render_table(summary),
        "",
    ]
    return "\n".join(lines)


def write_summary(summary: dict[str, Any], out_dir: Path) -> tuple[Path, Path]:
    md = out_dir / "summary.md"
    js = out_dir / "summary.json"
    md.write_text(render_markdown(summary), encoding="utf-8")
    js.write_text(json.dumps(summary, indent=1), encoding="utf-8")
    return md, js


def require_matplotlib() -> Any:
    """pyplot on the Agg backend, or a clear error; callers check before a long run."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError(
            "the chart needs matplotlib, which is not installed",
            "pip install 'localspec[bench]' (or matplotlib), or pass --no-chart",
        ) from None
    return plt


def write_chart(summary: dict[str, Any], path: Path) -> Path:
    """A grouped bar chart of the ratio to ``none``, per category and mode."""
    plt = require_matplotlib()
    groups = {**summary["categories"], OVERALL: summary["overall"]}
    modes = list(dict.fromkeys(m for g in groups.values() for m in g))
    width = 0.8 / max(len(modes), 1)
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(groups)), 4.8))
    for j, mode in enumerate(modes):
        xs = [i + (j - (len(modes) - 1) / 2) * width for i in range(len(groups))]
        ys = [(g.get(mode) or {}).get("ratio_to_none") or 0.0 for g in groups.values()]
        bars = ax.bar(xs, ys, width, label=mode)
        ax.bar_label(bars, labels=[f"{y:.2f}" if y else "" for y in ys], fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ceiling = summary.get("ceiling")
    if ceiling:
        ax.axhline(
            ceiling["ceiling_ratio"],
            color="grey",
            linestyle="--",
            linewidth=0.8,
            label=f"ceiling (batch {ceiling['batch']})",
        )
    ax.set_xticks(range(len(groups)), list(groups), rotation=20, ha="right")
    ax.set_ylabel("decode speed relative to plain decoding")
    ax.set_title(summary.get("meta", {}).get("target", "localspec bench"), fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
