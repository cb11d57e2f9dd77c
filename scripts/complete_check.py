#!/usr/bin/env python3
"""What a user of `localspec complete` sees: every prompt answered by fresh processes, plain
decoding (`--drafter none`) beside `auto`, one process per prompt and mode, with what `auto`
learned saved by each process and restored by the next, as on a user's machine.

    python scripts/complete_check.py scripts/check_prompts_3.jsonl
    python scripts/complete_check.py --categories code_completion,chat_qa --limit 4

Prompts come from a JSONL file (as `localspec bench --prompts` reads it) or the bench's
shipped sets; they run in a shuffled order (`--seed`), so a prose prompt may follow code
and the other way round, each with the two modes in alternating order. The processes use a
private LOCALSPEC_HOME that links this machine's models and copies its calibration, so
nothing is fetched or measured again and the user's own learning and history stay as they
are; `--no-history` keeps each answer out of later drafts (the history has a bench of its
own). Prints the bench's table (per category, and each prompt's ratio as measured and timed
by each run's own plain steps) and writes records.jsonl and summary.md to `--out`.

A benchmark, not a test: one run's tok/s moves by several percent with the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from localspec.bench import report
from localspec.bench.prompts import BenchPrompt, load_prompt_file, load_prompts
from localspec.bench.summary import summarize
from localspec.models.paths import cache_root

MODES = ("none", "auto")


def private_home(directory: Path) -> Path:
    """A localspec home with this machine's models (linked) and calibration (copied)."""
    real = cache_root()
    home = directory / "home"
    home.mkdir()
    if (real / "models").is_dir():
        (home / "models").symlink_to(real / "models", target_is_directory=True)
    if (real / "calibration").is_dir():
        shutil.copytree(real / "calibration", home / "calibration")
    return home


def run_complete(prompt: str, mode: str, args: argparse.Namespace, home: Path) -> dict:
    cmd = [sys.executable, "-m", "localspec", "complete", "--json", "--trace", "--no-history",
           "--drafter", mode, "--max-tokens", str(args.max_tokens)]  # fmt: skip
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    env = {**os.environ, "LOCALSPEC_HOME": str(home)}
    done = subprocess.run(cmd, input=prompt, capture_output=True, text=True, env=env, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"localspec complete failed ({mode}): {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def record(prompt: BenchPrompt, mode: str, result: dict, run: int) -> dict:
    """One run in the shape of a bench record, so the bench's summary reads it."""
    stats = result["stats"]
    plain = [r["verify_seconds"] for r in stats.get("trace", []) if not r.get("drafted")]
    return {
        "category": prompt.category,
        "prompt_id": prompt.id,
        "mode": mode,
        "run": run,
        "engine": "localspec",
        "generated_tokens": stats["generated_tokens"],
        "decode_s": stats["decode_s"],
        "decode_tokens_per_s": stats["decode_tokens_per_s"],
        "prefill_s": stats["prefill_s"],
        "drafted": stats["drafted"],
        "accepted": stats["accepted"],
        "rounds": stats["rounds"],
        "mean_accepted_length": stats["mean_accepted_length"],
        "plain_steps": len(plain),
        "plain_step_s": statistics.fmean(plain) if plain else None,
        "token_ids": result["token_ids"],
        "trace": stats.get("trace", []),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prompts", nargs="?", type=Path, help="a JSONL file (default: shipped)")
    parser.add_argument("--categories", help="comma-separated categories")
    parser.add_argument("--limit", type=int, help="prompts per category at most")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--seed", type=int, default=0, help="the order of the prompts")
    parser.add_argument("--out", type=Path, default=Path("bench-results/complete-check"))
    args = parser.parse_args()
    categories = args.categories.split(",") if args.categories else None
    if args.prompts:
        prompts = load_prompt_file(args.prompts, categories, args.limit)
    else:
        prompts = load_prompts(categories, args.limit)
    random.Random(args.seed).shuffle(prompts)
    args.out.mkdir(parents=True, exist_ok=True)
    records = []
    with tempfile.TemporaryDirectory(prefix="localspec-check-") as tmp:
        home = private_home(Path(tmp))
        for i, prompt in enumerate(prompts):
            for mode in MODES if i % 2 == 0 else MODES[::-1]:
                rec = record(prompt, mode, run_complete(prompt.prompt, mode, args, home), i)
                records.append(rec)
                print(
                    f"[{len(records)}/{2 * len(prompts)}] {prompt.category}/{prompt.id} "
                    f"{mode}: {rec['generated_tokens']} tokens, "
                    f"{rec['decode_tokens_per_s']:.1f} tok/s, drafted {rec['drafted']}, "
                    f"accepted {rec['accepted']}",
                    file=sys.stderr,
                    flush=True,
                )
    with open(args.out / "records.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    summary = summarize(records, MODES, greedy=True)
    table = report.render_table(summary)
    (args.out / "summary.md").write_text(table + "\n", encoding="utf-8")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
