"""What ``auto`` would choose at a measured device's costs, replayed over recorded answers.

    python experiments/device/replay.py --check OUT/device_check.json \\
        --records RUN/records.jsonl --target TARGET.gguf --draft DRAFT.gguf [--out FILE]

``--check`` is the device check's JSON (a cost profile per pair of shapes; ``--costs
FILE.json`` gives one ``CostProfile`` instead). ``--records`` are a ``localspec bench``
run's records: its greedy answers of mode ``none`` (with their prompts, from the shipped
sets or ``--prompts``). With greedy decoding a draft is accepted as far as it agrees with
the answer, so the engine itself replays each answer at each profile's costs
(``core.replay``), the draft model included: the real draft model (``--draft``) reads each
prompt and answer once here, and its greedy choice and confidence after every prefix stand
in for it on the device.

Per profile and category it prints the geometric-mean speedup over plain decoding of:
``auto`` (cold, as a fresh ``localspec complete``), the draft model alone at llama.cpp's
draft-simple policy (``model``: 16 tokens, stopping under 0.75 confidence) and llama.cpp's
``ngram-simple``, replayed the same way, and which drafters ``auto`` drafted with. An
estimate, not a benchmark: the profile's costs are taken as exact, and a larger target's
profile is priced over the 1.5B's answers and the 0.5B's agreement with them (a 7B would
answer otherwise, and agree with the 0.5B less).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any


def profiles(args: argparse.Namespace) -> dict[str, Any]:
    from localspec.core.costs import CostProfile

    if args.costs is not None:
        return {"given": CostProfile.from_dict(json.loads(args.costs.read_text()))}
    check = json.loads(args.check.read_text())
    return {name: CostProfile.from_dict(p["costs"]) for name, p in check["pairs"].items()}


def answers(args: argparse.Namespace, session) -> list[tuple[str, list[int], list[int]]]:
    """(category, prompt tokens, answer tokens) of every first ``none`` run."""
    from localspec.bench.prompts import load_prompt_file, load_prompts

    shipped = load_prompt_file(args.prompts) if args.prompts else load_prompts()
    texts = {(p.category, p.id): p.prompt for p in shipped}
    found = []
    for line in args.records.read_text().splitlines():
        record = json.loads(line)
        if record["mode"] != "none" or record.get("repeat") not in (None, 0):
            continue
        key = (record["category"], record["prompt_id"])
        if key in texts and record.get("token_ids"):
            prompt = session.text_tokens(texts[key], raw=False)
            found.append((key[0], prompt, list(record["token_ids"])))
    return found


def draft_choices(draft, prompt: list[int], answer: list[int], vocab: int):
    """The real draft model's greedy choice and confidence after every prefix."""
    from localspec.core.replay import DraftChoices

    found = draft.greedy([*prompt, *answer], len(answer) + 1, confidence=True, vocab=vocab)
    draft.reset()
    assert found.top_p is not None
    return DraftChoices(found.ids, found.top_p)


def replay_all(args: argparse.Namespace) -> dict[str, Any]:
    from localspec.backend.llama import LlamaModel, LoadOptions
    from localspec.core.params import GenerationParams
    from localspec.core.replay import replay, replay_ngram_simple
    from localspec.session.open import open_session
    from localspec.session.pair import ModelOptions

    options = ModelOptions(target=str(args.target), use_draft=False, calibrate=False, learn=False)
    session = open_session(options)
    ends = session.target.is_eog
    draft = LlamaModel(args.draft, LoadOptions(n_ctx=args.ctx, greedy_confidence=True))
    runs = [(c, p, a, draft_choices(draft, p, a, session.target.n_vocab))
            for c, p, a in answers(args, session)]  # fmt: skip
    draft.close()
    if not runs:
        raise SystemExit("error: no greedy answers of mode none in the records")
    auto = GenerationParams(max_tokens=args.max_tokens)
    fixed = GenerationParams(max_tokens=args.max_tokens, drafter="model")
    result: dict[str, Any] = {}
    for name, costs in profiles(args).items():
        speed: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        mix: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        for category, prompt, answer, choices in runs:
            plain = len(answer) * costs.plain_s
            got = replay(prompt, answer, costs, auto, ends, draft=choices)
            for r in got.rounds:
                mix[category][r.drafter or "plain"] += r.drafted or 1
            speed[category]["auto"].append(plain / got.seconds)
            model = replay(prompt, answer, costs, fixed, ends, draft=choices)
            speed[category]["model"].append(plain / model.seconds)
            simple_s, _, _ = replay_ngram_simple(prompt, answer, costs)
            speed[category]["ngram-simple"].append(plain / simple_s)
        result[name] = {
            c: {**{m: round(_geo(v), 3) for m, v in modes.items()}, "answers": len(modes["auto"]),
                "auto_drafted": dict(mix[c])}
            for c, modes in speed.items()
        }  # fmt: skip
    session.close()
    return result


def _geo(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values))


def table(result: dict[str, Any]) -> str:
    lines = ["| profile | category | answers | auto | model (draft-simple) | ngram-simple "
             "| auto drafted with |", "|" + " --- |" * 7]  # fmt: skip
    for name, categories in result.items():
        for category, r in sorted(categories.items()):
            mix = ", ".join(f"{k} {v}" for k, v in sorted(r["auto_drafted"].items()))
            lines.append(
                f"| {name} | {category} | {r['answers']} | {r['auto']:.2f}x "
                f"| {r['model']:.2f}x | {r['ngram-simple']:.2f}x | {mix} |"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    given = parser.add_mutually_exclusive_group(required=True)
    given.add_argument("--check", type=Path, help="the device check's device_check.json")
    given.add_argument("--costs", type=Path, help="a cost profile (CostProfile JSON)")
    parser.add_argument("--records", type=Path, required=True, help="a bench run's records")
    parser.add_argument("--target", type=Path, required=True, help="the pair the records ran")
    parser.add_argument("--draft", type=Path, required=True)
    parser.add_argument("--prompts", type=Path, help="the JSONL prompts the records ran")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--out", type=Path, help="also write the result as JSON")
    args = parser.parse_args()
    for path in (args.check, args.costs, args.records, args.target, args.draft, args.prompts):
        if path is not None and not path.is_file():
            print(f"error: {path} not found", file=sys.stderr)
            return 2
    result = replay_all(args)
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1))
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
