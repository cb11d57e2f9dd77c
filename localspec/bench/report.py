"""Render a bench summary: a Markdown table, summary.md / summary.json, and a speedup chart.

``summary`` is the dict ``localspec.bench.summary.summarize`` returns, extended by the caller with
``meta`` (models, machine, settings), ``ceiling`` (``ceiling.measure_ceiling``),
``ceilings`` (the same per category, at its answers' depth: ``BenchRunner.ceilings``) and
``break_even`` (``break_even.break_even``).
``render_table`` gives the text printed to stdout and saved as summary.md: one row per
category and mode (``vs none`` notes the short runs it left out; ``of ceiling`` is a mode's
ratio to ``none`` over its category's ceiling; ``vs best native``, ``vs native-none`` and
``vs llama-bench`` appear only when the llama.cpp modes they compare with ran; ``wall s``,
``first token s``, ``wall / none`` and ``wall / first native`` when the runs were timed so),
a per-prompt table (each speculative mode's lowest prompt against ``none``, as measured and
timed by each run's own plain steps), where each drafter pays (the verify cost under which
its drafting rounds beat plain steps, beside this machine's), then notes on native runs that
wrote more tokens than asked and the ceiling lines. ``write_chart`` draws the ratio to
``none`` per category and mode with matplotlib (Agg backend, imported only here and only
when asked for, so the rest of the bench runs without it).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from localspec.bench.summary import MIN_PLAIN_STEPS, MIN_RATIO_TOKENS
from localspec.errors import UsageError

OVERALL = "all (geo-mean)"
OVERSHOOT_LISTED = 6  # runs named per mode in the overshoot note; the rest are counted


def _fmt(value: Any, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def _ratio(value: float | None) -> str:
    return _fmt(value, ".2f") + ("x" if value is not None else "")


def _vs_none(g: dict[str, Any]) -> str:
    short = g.get("short_runs") or 0
    return _ratio(g["ratio_to_none"]) + (f" ({short} short left out)" if short else "")


def _common_prefix(g: dict[str, Any]) -> str:
    agreement = g.get("agreement") or {}
    return _fmt(agreement.get("mean_common_prefix"), ".0f") + (
        f"/{agreement['mean_baseline_length']:.0f}" if agreement else ""
    )


def _identical(g: dict[str, Any]) -> str:
    return _fmt((g.get("agreement") or {}).get("identical"), ".0%")


Column = tuple[str, Callable[[dict[str, Any]], str]]  # title, cell (right-aligned)

COLUMNS_BEFORE: list[Column] = [
    ("prompts", lambda g: str(g["prompts"])),
    ("tokens/run", lambda g: _fmt(g.get("mean_tokens"), ".0f")),
    ("decode tok/s", lambda g: _fmt(g["decode_tokens_per_s"], ".1f")),
    ("vs none", _vs_none),
]
NATIVE_COLUMNS: dict[str, Column] = {
    "ratio_to_best_native": ("vs best native", lambda g: _ratio(g.get("ratio_to_best_native"))),
    "ratio_to_native_none": ("vs native-none", lambda g: _ratio(g.get("ratio_to_native_none"))),
    "ratio_to_native_bench": ("vs llama-bench", lambda g: _ratio(g.get("ratio_to_native_bench"))),
}
COLUMNS_AFTER: list[Column] = [
    ("acceptance", lambda g: _fmt(g["acceptance_rate"], ".0%")),
    ("tokens/pass", lambda g: _fmt(g["mean_accepted_length"], ".2f")),
    ("outside llama.cpp", lambda g: _fmt(g["outside_share"], ".1%")),
    ("identical to none", _identical),
    ("common prefix", _common_prefix),
]


OF_CEILING: Column = ("of ceiling", lambda g: _fmt(g.get("of_ceiling"), ".2f"))
SAME_AS_FIRST: Column = ("same as first", lambda g: _fmt(g.get("same_as_first"), ".0%"))
ANSWERS_VALID: Column = ("valid answers", lambda g: _fmt(g.get("answers_valid"), ".0%"))
# What a user waits for (seconds; the ratios are of wall times: below 1, sooner).
WAIT_COLUMNS: dict[str, Column] = {
    "wall_s": ("wall s", lambda g: _fmt(g.get("wall_s"), ".2f")),
    "first_token_s": ("first token s", lambda g: _fmt(g.get("first_token_s"), ".2f")),
    "wall_to_none": ("wall / none", lambda g: _ratio(g.get("wall_to_none"))),
    "wall_to_first_native": (
        "wall / first native",
        lambda g: _ratio(g.get("wall_to_first_native")),
    ),
    # auto-warm: the first token after a restored prompt against the cold one's
    "warm_to_cold_first_token": (
        "first token warm / cold",
        lambda g: _ratio(g.get("warm_to_cold_first_token")),
    ),
    "same_as_cold": ("same as cold", lambda g: _fmt(g.get("same_as_cold"), ".0%")),
}


def _columns(summary: dict[str, Any]) -> list[Column]:
    """The table's columns; the native ratios, the share of the ceiling, the wait figures
    , auto-again's answers the same as the first and the constrained answers' validity only
    when some group has them."""
    present = {key for g in summary["overall"].values() for key in g}
    native = [column for key, column in NATIVE_COLUMNS.items() if key in present]
    ceiling = [OF_CEILING] if "of_ceiling" in present else []
    waits = [column for key, column in WAIT_COLUMNS.items() if key in present]
    again = [SAME_AS_FIRST] if "same_as_first" in present else []
    valid = [ANSWERS_VALID] if "answers_valid" in present else []
    return [*COLUMNS_BEFORE, *ceiling, *native, *waits, *COLUMNS_AFTER, *again, *valid]


def _row(name: str, mode: str, g: dict[str, Any], columns: list[Column]) -> str:
    return "| " + " | ".join([name, mode, *(cell(g) for _, cell in columns)]) + " |"


def _header(columns: list[Column]) -> str:
    titles = ["category", "mode", *(title for title, _ in columns)]
    aligns = ["---", "---", *("---:" for _ in columns)]
    return "| " + " | ".join(titles) + " |\n| " + " | ".join(aligns) + " |"


def _overshoot_note(summary: dict[str, Any]) -> list[str]:
    """Which runs wrote more tokens than asked, per mode (records.jsonl has them all)."""
    runs = summary.get("overshoot") or []
    by_mode: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_mode.setdefault(run["mode"], []).append(run)
    parts = []
    for mode, mine in by_mode.items():
        total = (summary["overall"].get(mode) or {}).get("prompts", len(mine))
        extra = sorted({r["overshoot"] for r in mine})
        span = f"+{extra[0]}" + (f" to +{extra[-1]}" if len(extra) > 1 else "")
        if len(mine) == total:
            parts.append(f"{mode}: all {total} runs ({span})")
            continue
        names = [f"{r['category']}/{r['prompt_id']}" for r in mine[:OVERSHOOT_LISTED]]
        more = len(mine) - len(names)
        listed = ", ".join(names) + (f" and {more} more" if more else "")
        parts.append(f"{mode}: {len(mine)} of {total} runs ({span}): {listed}")
    if not parts:
        return []
    asked = runs[0]["generated_tokens"] - runs[0]["overshoot"]
    return [
        "",
        f"Note: runs that wrote more tokens than the {asked} asked (their tok/s counts the "
        "extra tokens; records.jsonl marks each with overshoot): " + "; ".join(parts) + ".",
    ]


def _ceiling_lines(ceiling: dict[str, Any]) -> list[str]:
    others = [b for b in ceiling.get("by_batch", []) if b["batch"] != ceiling["batch"]]
    tried = "".join(f", {b['tokens_per_s']:.1f} at {b['batch']}" for b in others)
    lines = [
        "",
        f"Ceiling of this machine for the target: {ceiling['tokens_per_s']:.1f} tok/s at a "
        f"batch of {ceiling['batch']} with logits for every position "
        f"({ceiling['batch_s'] * 1000:.0f} ms a batch{tried}), against "
        f"{ceiling['plain_tokens_per_s']:.1f} tok/s for a plain step: "
        f"{ceiling['ceiling_ratio']:.2f}x is the most any lossless method can reach here.",
    ]
    if ceiling.get("calibrated_tokens_per_s"):
        at = ceiling.get("calibrated_batch")
        lines.append(
            f"(The cached calibration says {ceiling['calibrated_tokens_per_s']:.1f} tok/s "
            + (f"at a batch of {at}.)" if at else "at that batch.)")
        )
    return lines


def _depth_lines(ceilings: dict[str, dict[str, Any]]) -> list[str]:
    """The ceiling again per category, at the depth where its answers run (``of ceiling``
    in the table divides by these)."""
    lines = ["", "The ceiling where each category's answers run (a batch reads the whole context):"]
    for category, c in ceilings.items():
        lines.append(
            f"- {category}: {c['ceiling_ratio']:.2f}x after {c['depth']} tokens of context "
            f"(a batch of {c['batch']} in {c['batch_s'] * 1000:.0f} ms, "
            f"{c['plain_tokens_per_s']:.1f} tok/s for a plain step)"
        )
    return lines


def _lowest(g: dict[str, Any], key: str, overall: bool) -> str:
    low = g.get(key)
    if not low:
        return "-"
    name = f"{low['category']}/{low['prompt_id']}" if overall else low["prompt_id"]
    return f"{_ratio(low['ratio'])} ({name})"


def _steady(g: dict[str, Any]) -> str:
    n = g.get("steady_prompts") or 0
    return f"{_ratio(g['steady_ratio_to_none'])} ({n} of {g['prompts']})" if n else "-"


def _per_prompt_table(summary: dict[str, Any]) -> list[str]:
    """Per category, each speculative mode's lowest prompt against ``none``, as measured and
    timed by each run's own plain steps (``summary._steady``)."""
    groups = [
        (name, mode, g, name == OVERALL)
        for name, modes in [*summary["categories"].items(), (OVERALL, summary["overall"])]
        for mode, g in modes.items()
        if "lowest_ratio_to_none" in g
    ]
    if not groups:
        return []
    lines = [
        "",
        "| category | mode | lowest vs none | vs none, steady | lowest steady |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for name, mode, g, overall in groups:
        cells = [
            _lowest(g, "lowest_ratio_to_none", overall),
            _steady(g),
            _lowest(g, "lowest_steady_ratio_to_none", overall),
        ]
        lines.append("| " + " | ".join([name, mode, *cells]) + " |")
    return lines


def _break_even_table(rows: list[dict[str, Any]]) -> list[str]:
    """Where each drafter pays (``break_even.break_even``'s rows)."""
    if not rows:
        return []
    lines = [
        "",
        "Where each drafter pays: a drafting round brings T tokens for verifying k drafts and "
        "k c plain steps of drafting, so it pays where verifying k drafts costs less than "
        "T - k c plain steps (verify here: what it costs on this machine).",
        "",
        "| mode | category | drafter | drafting rounds | mean draft k | tokens/pass T "
        "| draft step c | pays below | verify here |",
        "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        cells = [r["mode"], r["category"], r["drafter"], str(r["rounds"]),
                 f"{r['mean_draft']:.1f}", f"{r['tokens_per_pass']:.2f}",
                 f"{r['draft_step']:.2f}", f"{r['pays_below']:.2f}",
                 _fmt(r["verify_here"], ".2f")]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def render_table(summary: dict[str, Any]) -> str:
    """The per-category table, overall geometric-mean rows last, the per-prompt table,
    where each drafter pays, then the notes and the ceiling."""
    columns = _columns(summary)
    lines = [_header(columns)]
    for category, modes in summary["categories"].items():
        lines += [_row(category, mode, g, columns) for mode, g in modes.items()]
    lines += [_row(OVERALL, mode, g, columns) for mode, g in summary["overall"].items()]
    lines += _per_prompt_table(summary)
    lines += _break_even_table(summary.get("break_even") or [])
    lines += _overshoot_note(summary)
    if summary.get("ceiling"):
        lines += _ceiling_lines(summary["ceiling"])
    if summary.get("ceilings"):
        lines += _depth_lines(summary["ceilings"])
    return "\n".join(lines)


def render_markdown(summary: dict[str, Any]) -> str:
    meta = summary.get("meta", {})
    lines = ["# localspec bench", ""]
    for key, value in meta.items():
        if not isinstance(value, dict):  # the measured costs stay in summary.json
            lines.append(f"- {key}: {value}")
    lines += [
        "",
        "tokens/run: generated tokens per run. decode tok/s: generated tokens over decode "
        "time (prefill excluded), all prompts of the group pooled. vs none: geometric mean of "
        "per-prompt ratios to plain decoding of the same prompt; a run of fewer than "
        f"{MIN_RATIO_TOKENS} tokens, or whose reference run is that short, is left out of "
        "every ratio (its tok/s is mostly noise); vs none counts them as short. "
        "vs best native: the "
        "same, against the fastest of llama.cpp's speculative modes (native-draft, "
        "native-ngram, native-ngram-map-k, native-ngram-mod, those that ran) on each prompt. "
        "vs native-none: plain decoding against llama.cpp's plain decoding in "
        "llama-speculative-simple; for llama.cpp's speculative modes, their speedup over it. "
        "vs llama-bench: plain decoding (and native-none) against llama-bench's plain "
        "decoding of as many tokens after a context as long as the prompt. tokens/pass: "
        "mean accepted length, bonus included. outside llama.cpp: share of decode time spent "
        "outside llama_decode and the logits copy. identical / common prefix: greedy "
        "agreement of the token ids with plain decoding (tokens). lowest vs none: the "
        "speculative mode's lowest per-prompt ratio. steady: the same ratios with each run "
        "timed by its own clock, its decode time in units of the mean plain step it took, "
        "so that a stretch of the machine running slower during one of the two runs does not "
        "count as the mode's gain or loss; only prompts whose two runs both took at least "
        f"{MIN_PLAIN_STEPS} plain steps (a run that drafts nearly every round has no clock "
        "of its own)."
        + (
            f" Every prompt ran {meta['repeat']} times in every mode, interleaved; each figure "
            "comes from its median run (by decode tok/s)."
            if meta.get("repeat", 1) > 1
            else ""
        ),
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
