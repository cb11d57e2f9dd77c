"""How often a self-draft's greedy token is the target's, over the bench's prompts.

For each bench category, the target writes its greedy continuation of each prompt (the
prompt's text as is, ``--tokens`` tokens), and each layer subset (the one
``localspec models derive-draft`` chose for the target, the first half of the layers,
every other layer, and any given with ``--layers``) is derived, loaded and read over the
same text; its agreement is the share of continuation positions where its argmax is the
target's token: the greedy acceptance rate of each drafted token.

    python experiments/self_draft_agreement.py [--target REF] [--limit 3] [--tokens 96]
        [--layers 0-6,21-27 ...] [--markdown]
"""

from __future__ import annotations

import argparse
import sys

from localspec.bench.prompts import CATEGORIES, load_prompts
from localspec.errors import LocalspecError
from localspec.models.catalog import resolve_model
from localspec.models.derive import compact_layers, parse_layers
from localspec.models.layerchoice import candidate_subsets, choose_layers
from localspec.models.selfdraft import block_count, cached_derived


def subsets(target, extra: list[str]) -> list[tuple[str, tuple[int, ...]]]:
    """The chosen subset (if the target has one), first half, every other, and ``extra``."""
    fixed = dict((label, layers) for label, layers in candidate_subsets(block_count(target)))
    chosen = cached_derived(target)
    out = [("chosen", tuple(chosen.layers))] if chosen is not None else []
    out += [(label, tuple(fixed[label])) for label in ("first half", "every other")]
    out += [(f"layers {text}", tuple(parse_layers(text))) for text in extra]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=None, help="target: path or catalog name")
    parser.add_argument("--limit", type=int, default=3, help="prompts per category")
    parser.add_argument("--tokens", type=int, default=96, help="continuation per prompt")
    parser.add_argument("--layers", action="append", default=[], help="another subset")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    try:
        target = resolve_model(args.target, "target", progress=False)
        pool = subsets(target, args.layers)
        table: dict[str, dict[str, float]] = {}
        for category in CATEGORIES:
            prompts = [p.prompt for p in load_prompts([category], args.limit)]
            print(f"{category}: {len(prompts)} prompts", file=sys.stderr)
            choice = choose_layers(
                target, threads=args.threads, subsets=pool, prompts=prompts,
                calibration_tokens=args.tokens,
            )  # fmt: skip
            for c in choice.candidates:
                table.setdefault(f"{c.label} ({compact_layers(c.layers)})", {})[category] = (
                    c.agreement
                )
    except LocalspecError as err:
        print(f"error: {err}\n  hint: {err.hint}", file=sys.stderr)
        return 2
    header = ["subset", *CATEGORIES, "mean"]
    rows = [
        [name, *(f"{by[c]:.0%}" for c in CATEGORIES), f"{sum(by.values()) / len(by):.0%}"]
        for name, by in table.items()
    ]
    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("| --- |" + " ---: |" * (len(header) - 1))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        for row in [header, *rows]:
            print("  ".join(cell.ljust(12) for cell in row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
