"""Where each drafter would pay: the verify cost under which its drafts beat plain steps.

Reads a bench's output folder (``localspec bench --out DIR``: records.jsonl, and the
machine's measured costs in summary.json's meta) and prints, per mode and category, for
every drafter that drafted:

- tokens per drafting pass ``T`` (accepted drafts + the target's own token, per round that
  drafted) and the mean draft length ``k``;
- the break-even verify cost: a drafting round costs verifying ``k`` drafts plus drafting
  them (``k * c`` plain steps for a drafter that runs a model, ``c`` = its step over the
  target's; copies and lookahead draft for free) and brings ``T`` tokens, so it pays where
  verifying ``k`` drafts costs less than ``T - k * c`` plain steps;
- this machine's verify cost for ``k`` drafts, in plain steps, beside it.

A machine whose verify batches cost less than the break-even (a GPU's, where a batch of 16
costs little more than one step) gains from the drafter; one whose cost more does not.

    python scripts/break_even.py OUT_DIR [--markdown]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from localspec.core.costs import CostProfile

MODEL_DRAFTERS = ("model", "self")  # drafters that pay for a model step per drafted token


def load(out: Path) -> tuple[list[dict], CostProfile | None]:
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    meta = json.loads((out / "summary.json").read_text()).get("meta", {})
    costs = CostProfile.from_dict(meta["costs"]) if meta.get("costs") else None
    return records, costs


def rows(records: list[dict], costs: CostProfile | None) -> list[dict]:
    pooled: dict[tuple[str, str, str], list[float]] = defaultdict(lambda: [0, 0, 0])
    for record in records:
        for drafter, stats in (record.get("by_drafter") or {}).items():
            if drafter == "none" or not stats.get("drafted"):
                continue
            key = (record["mode"], record["category"], drafter)
            pooled[key][0] += stats["rounds"]
            pooled[key][1] += stats["drafted"]
            pooled[key][2] += stats["accepted"]
    out = []
    for (mode, category, drafter), (rounds, drafted, accepted) in sorted(pooled.items()):
        k = drafted / rounds
        tokens = 1.0 + accepted / rounds
        step = 0.0
        if drafter in MODEL_DRAFTERS and costs is not None and costs.draft_step_s:
            step = costs.draft_step_s / costs.plain_s
        here = None
        if costs is not None:
            lo = max(1, int(k))
            w = k - lo  # between the lengths around the mean
            here = ((1 - w) * costs.verify(lo) + w * costs.verify(lo + 1)) / costs.plain_s
        out.append({
            "mode": mode, "category": category, "drafter": drafter, "rounds": rounds,
            "mean_draft": k, "tokens_per_pass": tokens, "draft_step": step,
            "break_even": tokens - k * step, "verify_here": here,
        })  # fmt: skip
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="a bench's --out folder")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table")
    args = parser.parse_args()
    try:
        records, costs = load(args.out)
    except (OSError, ValueError, KeyError) as err:
        print(f"error: cannot read the bench output in {args.out}: {err}", file=sys.stderr)
        return 2
    header = ["mode", "category", "drafter", "drafting rounds", "mean draft",
              "tokens per drafting pass", "draft step", "pays below (plain steps)",
              "verify here (plain steps)"]  # fmt: skip
    table = [
        [r["mode"], r["category"], r["drafter"], str(r["rounds"]), f"{r['mean_draft']:.1f}",
         f"{r['tokens_per_pass']:.2f}", f"{r['draft_step']:.2f}", f"{r['break_even']:.2f}",
         "?" if r["verify_here"] is None else f"{r['verify_here']:.2f}"]
        for r in rows(records, costs)
    ]  # fmt: skip
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("| " + " | ".join("---" if i < 3 else "---:" for i in range(len(header))) + " |")
        for line in table:
            print("| " + " | ".join(line) + " |")
    else:
        widths = [max(len(h), *(len(r[i]) for r in table)) for i, h in enumerate(header)]
        for line in [header, *table]:
            print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
