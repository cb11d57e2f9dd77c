"""Replay auto's n-gram choices over recorded greedy answers, to see what they would cost.

A bench run of mode ``none`` with greedy decoding records each answer's token ids
(``records.jsonl``). With greedy decoding a draft is accepted as far as it agrees with that
answer, so the engine itself can be run against it without the target
(``localspec.core.replay``): each round's cost is taken from the pair's calibration (a plain
step, or a verify batch of k drafts). Prints, per prompt and category, the estimated speedup
over plain decoding of a cold engine (as a fresh ``localspec complete`` starts), and beside
it llama.cpp's ``ngram-simple`` replayed over the same answer at the same costs, so the two
policies are compared without the noise of timings or of answers that part.

This is an estimate for tuning the cost model, not a benchmark: it assumes the measured
batch costs hold exactly and leaves the draft model out (auto rarely picks it on a CPU
where a draft step costs half a plain step). Quote ``localspec bench --cold`` instead.

    python scripts/ngram_replay.py bench-results/<run>/records.jsonl [--costs FILE.json]
        [--prompts FILE.jsonl]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from localspec.bench.prompts import load_prompt_file, load_prompts
from localspec.core.controller import SPECULATE_MARGIN
from localspec.core.costs import CostProfile
from localspec.core.params import GenerationParams
from localspec.core.replay import replay as replay_engine
from localspec.core.replay import replay_ngram_simple
from localspec.session.open import open_session
from localspec.session.pair import ModelOptions


def replay(
    prompt: list[int],
    answer: list[int],
    costs: CostProfile,
    max_tokens: int,
    margin: float = SPECULATE_MARGIN,
    ends: Callable[[int], bool] | None = None,
) -> tuple[float, list[tuple[int, int, int]]]:
    """Estimated seconds of a cold auto run (no draft model, no datastore) and its drafts
    (k, accepted, match), from the engine itself; ``ends`` tells end-of-generation tokens,
    as the engine's drafters are told."""
    params = GenerationParams(max_tokens=max_tokens)
    replayed = replay_engine(prompt, answer, costs, params, ends, margin=margin)
    drafts = [(r.drafted, r.accepted, r.match) for r in replayed.rounds if r.drafted]
    return replayed.seconds, drafts


def _geo(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("records", type=Path)
    parser.add_argument("--costs", type=Path, help="a calibration file (default: the pair's)")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--margin", type=float, default=SPECULATE_MARGIN)
    parser.add_argument("--verbose", action="store_true", help="print every prompt's drafts")
    parser.add_argument(
        "--prompts", type=Path, help="the JSONL prompt file the records were run on"
    )
    args = parser.parse_args()

    session = open_session(ModelOptions())
    costs = session.costs
    if args.costs:
        costs = CostProfile.from_dict(json.loads(args.costs.read_text()))
    assert costs is not None
    shipped = load_prompt_file(args.prompts) if args.prompts else load_prompts()
    prompts = {(p.category, p.id): p.prompt for p in shipped}
    by_category: dict[str, list[float]] = defaultdict(list)
    by_simple: dict[str, list[float]] = defaultdict(list)  # auto / ngram-simple, per prompt
    for line in args.records.read_text().splitlines():
        record = json.loads(line)
        if record["mode"] != "none" or record.get("repeat", 0) != 0:
            continue
        key = (record["category"], record["prompt_id"])
        if key not in prompts or len(record["token_ids"]) < 64:
            continue
        prompt = session.text_tokens(prompts[key], raw=False)
        answer = list(record["token_ids"])
        seconds, drafts = replay(
            prompt, answer, costs, args.max_tokens, args.margin, session.target.is_eog
        )
        ratio = len(answer) * costs.plain_s / seconds
        simple_s, _, simple_drafts = replay_ngram_simple(prompt, answer, costs)
        simple = len(answer) * costs.plain_s / simple_s
        by_category[key[0]].append(ratio)
        by_simple[key[0]].append(ratio / simple)
        print(
            f"{key[0]:16} {key[1]:28} {len(answer):4} tokens {ratio:5.2f}x"
            f"  ngram-simple {simple:5.2f}x  auto/simple {ratio / simple:5.2f}",
            end="",
        )
        print(f"\n    auto {drafts}\n    simple {simple_drafts}" if args.verbose else "")
    print()
    for category, ratios in by_category.items():
        print(
            f"{category:16} geo-mean {_geo(ratios):5.3f}x  min {min(ratios):5.3f}x"
            f"  auto/ngram-simple {_geo(by_simple[category]):5.3f}  ({len(ratios)})"
        )
    session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
