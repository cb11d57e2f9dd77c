#!/usr/bin/env python3
"""A question asked again: fresh `localspec complete` processes with the history on.

For every prompt (a JSONL file as `localspec bench --prompts` reads it): plain decoding
(`--drafter none --no-history`, the baseline), then `auto` twice, each a fresh process in a
private LOCALSPEC_HOME (this machine's models linked, its calibration copied, the history
on and empty at the start). The first `auto` answer goes into the history; the second run
asks the same question again, so the history drafts its answer (as a prediction from the
first token). Prints, per prompt and overall (geometric means), the second run's speed
against plain decoding and whether its answer equals the first's, token for token.

    python scripts/repeat_check.py scripts/check_prompts_4.jsonl --limit 20
    python scripts/repeat_check.py scripts/check_prompts_4.jsonl --limit 20 --exact

A benchmark, not a test: one run's tok/s moves by several percent with the machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from complete_check import private_home  # this folder's: run as python scripts/...

from localspec.bench.prompts import load_prompt_file


def complete(prompt: str, extra: list[str], args: argparse.Namespace, home: Path) -> dict:
    cmd = [
        sys.executable, "-m", "localspec", "complete", "--json",
        "--max-tokens", str(args.max_tokens), "--threads", str(args.threads), *extra,
    ]  # fmt: skip
    if args.exact:
        cmd.append("--exact")
    env = {**os.environ, "LOCALSPEC_HOME": str(home), "LOCALSPEC_HISTORY": "1"}
    done = subprocess.run(cmd, input=prompt, capture_output=True, text=True, env=env, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"localspec complete failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def speed(result: dict) -> float:
    return result["stats"]["decode_tokens_per_s"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prompts", type=Path)
    parser.add_argument("--limit", type=int, default=20, help="prompts at most")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--exact", action="store_true", help="every run with --exact")
    parser.add_argument("--out", type=Path, help="write the runs here (JSONL)")
    args = parser.parse_args()
    prompts = load_prompt_file(args.prompts)[: args.limit]
    rows = []
    with tempfile.TemporaryDirectory(prefix="localspec-repeat-") as tmp:
        home = private_home(Path(tmp))
        for prompt in prompts:
            plain = complete(prompt.prompt, ["--drafter", "none", "--no-history"], args, home)
            first = complete(prompt.prompt, ["--drafter", "auto"], args, home)
            again = complete(prompt.prompt, ["--drafter", "auto"], args, home)
            row = {
                "id": prompt.id,
                "tokens": len(again["token_ids"]),
                "plain_tok_s": speed(plain),
                "first_tok_s": speed(first),
                "again_tok_s": speed(again),
                "again_vs_plain": speed(again) / speed(plain),
                "same_answer": again["token_ids"] == first["token_ids"],
                "again_by_origin": again["stats"]["tokens_by_origin"],
            }
            rows.append(row)
            print(f"{prompt.id:28} {row['tokens']:4} tokens  plain {row['plain_tok_s']:5.1f}"
                  f"  again {row['again_tok_s']:5.1f} tok/s  {row['again_vs_plain']:5.2f}x"
                  f"  {'same' if row['same_answer'] else 'DIFFERENT'} answer"
                  f"  {row['again_by_origin']}", flush=True)  # fmt: skip
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    ratios = [r["again_vs_plain"] for r in rows]
    geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
    same = sum(r["same_answer"] for r in rows)
    print(
        f"\n{len(rows)} questions asked again: {geo:.2f}x plain decoding (geometric mean), "
        f"lowest {min(ratios):.2f}x; {same} of {len(rows)} second answers equal the first"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
