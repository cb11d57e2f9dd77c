"""Two bench runs side by side: device against host verification (or any two runs).

    localspec bench --modes none,auto --cold --out bench-device
    LOCALSPEC_DEVICE_VERIFY=0 localspec bench --modes none,auto --cold --out bench-host
    python experiments/device/compare.py bench-device bench-host

For every mode and category: the geometric mean over its prompts of the first run's decode
tokens/s over the second's (>= 0.99 is the issue's goal for device over host), and whether
every greedy answer is token for token the same in both runs. Exits 1 when an answer
differs.
"""

from __future__ import annotations

import json
import math
import sys
from collections import defaultdict
from pathlib import Path


def records(run: Path) -> dict[tuple[str, str, str], dict]:
    """First-repeat records of ``run``'s records.jsonl by (mode, category, prompt id)."""
    found = {}
    for line in (run / "records.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("repeat") in (None, 0):
            found[(r["mode"], r["category"], r["prompt_id"])] = r
    return found


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    first, second = (records(Path(arg)) for arg in sys.argv[1:])
    ratios: dict[tuple[str, str], list[float]] = defaultdict(list)
    differ: list[tuple[str, str, str]] = []
    for key, a in sorted(first.items()):
        b = second.get(key)
        if b is None:
            continue
        ratios[key[:2]].append(a["decode_tokens_per_s"] / b["decode_tokens_per_s"])
        if a.get("token_ids") != b.get("token_ids"):
            differ.append(key)
    by_mode: dict[str, list[float]] = defaultdict(list)
    print("| mode | category | prompts | tokens/s, first / second |")
    print("| --- | --- | --- | --- |")
    for (mode, category), values in sorted(ratios.items()):
        geo = math.exp(sum(map(math.log, values)) / len(values))
        by_mode[mode].append(geo)
        print(f"| {mode} | {category} | {len(values)} | {geo:.3f} |")
    for mode, geos in sorted(by_mode.items()):
        mean = math.exp(sum(map(math.log, geos)) / len(geos))
        print(f"{mode}: geometric mean over categories {mean:.3f}")
    print(f"answers that differ: {len(differ)}" + "".join(f"\n  {k}" for k in differ))
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
