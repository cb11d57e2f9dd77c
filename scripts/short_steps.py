#!/usr/bin/env python3
"""Short steps: localspec's loop where a target step takes a few milliseconds, as on a GPU.

SmolLM2-135M (`smollm2-135m` in the catalog, a few ms a step on a CPU) stands in for a GPU's
short steps. Two measurements, each run as fresh `localspec complete --json` processes (what
users run) in a private LOCALSPEC_HOME that links this machine's models, with the history
off, interleaved with llama.cpp's own tools and repeated (medians):

1. plain decoding (`--drafter none`) on each prompt beside `llama-bench` tg at the prompt's
   depth (`-p 0 -n N -d DEPTH`, N being what localspec generated): per prompt the median of
   each repetition's ratio (its runs follow one another, so they see one machine speed),
   and the geometric mean of those;
2. `--drafter ngram`, and `auto` (which prices each draft by the machine's measured batch
   costs; each process starts with nothing learned), on an editing prompt beside
   `llama-speculative-simple`'s n-gram modes (`--spec-type ngram-simple`, `ngram-map-k`,
   `ngram-mod`, those this build has). `auto` runs through the session API, in a fresh
   process too: `localspec complete` would load the catalog's default draft, whose
   vocabulary is not SmolLM2's.

Both print localspec's Python time per round (the stats' `overhead_per_round_ms`, the decode
time outside llama_decode) and its share of a round.

    python scripts/short_steps.py --llama-bin /work/native/build/bin
    python scripts/short_steps.py --llama-bin DIR --reps 7 --ids js-debounce,houseplants
    python scripts/short_steps.py --llama-bin DIR --also /path/to/another/checkout

`--also SRC` runs a second localspec source tree (another checkout, e.g. before a change)
beside this one, interleaved in the same loop, so that both meet the same machine.

On a shared machine a run of llama.cpp with 2 threads slows down many times over while
another process holds a core (its threads wait for each other), so before every run this
waits (up to `--idle-wait` seconds) for the CPUs to be idle, and records how busy they were.

A benchmark, not a test: one run's tok/s moves by several percent with the machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from localspec.backend.native import parse_native_output
from localspec.models.paths import cache_root

HERE = Path(__file__).resolve().parent
DEFAULT_PROMPTS = HERE / "check_prompts_3.jsonl"
# Prompts the bench does not ship, of every kind, whose SmolLM2 answers run the whole 200
# tokens (many others end within 100), at depths of 55 to 254 tokens.
DEFAULT_IDS = ",".join(
    ("go-word-count", "py-matrix-class", "sql-monthly-revenue", "go-error-wrap",
     "incident-report", "http-caching", "python-gil", "recipe-scaling")
)  # fmt: skip
EDIT_ID = "rename-histogram"  # a code rewrite: the answer copies the prompt with edits
NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-mod")
THIS = "localspec"
MODES = ("ngram", "auto")  # localspec's modes on the editing prompt


def private_home(directory: Path) -> Path:
    """A localspec home that sees this machine's models (linked) and nothing else."""
    home = directory / "home"
    home.mkdir()
    if (cache_root() / "models").is_dir():
        (home / "models").symlink_to(cache_root() / "models", target_is_directory=True)
    return home


def load_prompts(path: Path, ids: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                item = json.loads(line)
                found[item["id"]] = item["prompt"]
    missing = [i for i in ids if i not in found]
    if missing:
        raise SystemExit(f"{path} has no prompt {', '.join(missing)}")
    return {i: found[i] for i in ids}


def busy_share(window: float = 0.5) -> float:
    """The share of all CPUs' time spent busy over ``window`` seconds (/proc/stat)."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat", encoding="ascii") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
        idle = fields[3] + fields[4]  # idle + iowait
        return sum(fields), idle

    total0, idle0 = sample()
    time.sleep(window)
    total1, idle1 = sample()
    return 1.0 - (idle1 - idle0) / max(1, total1 - total0)


def wait_idle(limit: float, threshold: float = 0.1) -> float:
    """Wait until the CPUs are idle (or ``limit`` seconds passed); how busy they were last."""
    if not Path("/proc/stat").is_file():
        return float("nan")
    deadline = time.monotonic() + limit
    busy = busy_share()
    while busy > threshold and time.monotonic() < deadline:
        time.sleep(1.0)
        busy = busy_share()
    return busy


def localspec_complete(
    src: Path | None, prompt: str, mode: str, args: argparse.Namespace, home: Path
) -> dict[str, Any]:
    """One fresh `localspec complete --json` process; its JSON answer. ``src``: a source
    tree to run instead of the installed localspec."""
    cmd = [sys.executable, "-m", "localspec", "complete", "--json", "--no-history",
           "--target", args.target, "--drafter", mode,
           "--max-tokens", str(args.max_tokens), "--threads", str(args.threads)]  # fmt: skip
    env = {**os.environ, "LOCALSPEC_HOME": str(home), "LOCALSPEC_HISTORY": "0"}
    if src is not None:
        env["PYTHONPATH"] = str(src)
    # From the home's folder: `-m` puts the working directory first on sys.path, and a
    # checkout there would win over ``src``.
    done = subprocess.run(
        cmd, input=prompt, capture_output=True, text=True, env=env, timeout=900, cwd=home.parent
    )
    if done.returncode != 0:
        raise SystemExit(f"localspec complete failed ({mode}): {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def llama_bench_tg(args: argparse.Namespace, depth: int, n: int) -> float:
    """llama-bench's tg tokens/s at ``depth`` (one repetition: the script repeats)."""
    cmd = [str(args.llama_bin / "llama-bench"), "-m", str(args.target_path), "-p", "0",
           "-n", str(n), "-d", str(depth), "-t", str(args.threads), "-r", "1",
           "-fa", "on", "-o", "json"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"llama-bench failed: {done.stderr.strip()[-2000:]}")
    (result,) = json.loads(done.stdout)
    return float(result["avg_ts"])


def spec_simple(args: argparse.Namespace, text: str, spec_type: str, n: int) -> dict[str, Any]:
    """One `llama-speculative-simple` run with an n-gram mode; its timings."""
    threads = str(args.threads)
    cmd = [str(args.llama_bin / "llama-speculative-simple"), "-m", str(args.target_path),
           "-p", text, "--no-escape", "-n", str(n), "-c", "4096", "-b", "4096",
           "-t", threads, "-tb", threads, "-fa", "on", "--temp", "0", "--top-k", "1",
           "--spec-type", spec_type]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=900)
    if done.returncode != 0:
        raise SystemExit(f"llama-speculative-simple {spec_type} failed: {done.stderr[-2000:]}")
    result = parse_native_output(done.stderr + "\n" + done.stdout, spec_type)
    return {"tps": result.decode_tokens_per_s, "tokens": result.generated_tokens,
            "drafted": result.drafted, "accepted": result.accepted}  # fmt: skip


def ngram_types(args: argparse.Namespace) -> list[str]:
    """The n-gram spec types this llama-speculative-simple offers."""
    binary = args.llama_bin / "llama-speculative-simple"
    done = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60)
    offered = next(
        (ln for ln in (done.stdout + done.stderr).splitlines() if "--spec-type" in ln), ""
    )
    return [t for t in NGRAM_TYPES if t in offered]


def native_prompt(args: argparse.Namespace, prompt: str) -> tuple[int, str]:
    """The prompt as `localspec complete` tokenizes it (its length), and that token
    sequence as text with special tokens spelled out, as llama.cpp's tools read it."""
    from localspec.session.open import open_session
    from localspec.session.pair import ModelOptions

    options = ModelOptions(
        target=str(args.target_path), use_draft=False, calibrate=False, learn=False,
        stores=(), history=False, threads=args.threads, show_download_progress=False,
    )  # fmt: skip
    session = open_session(options)
    try:
        tokens = session.text_tokens(prompt, raw=False)
        info = session.target.vocab_info()
        body = tokens[1:] if info.add_bos and tokens and tokens[0] == info.bos else tokens
        text = b"".join(session.target.token_bytes(t, special=True) for t in body)
        return len(tokens), text.decode("utf-8", errors="replace")
    finally:
        session.close()


def geomean(values: list[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else float("nan")


def engines(args: argparse.Namespace) -> list[tuple[str, Path | None]]:
    """This localspec, and the other source tree given with --also."""
    return [(THIS, None)] + ([("also", args.also)] if args.also else [])


def plain_part(args: argparse.Namespace, prompts: dict[str, str], home: Path) -> dict:
    """Plain decoding beside llama-bench tg at the prompt's depth, per prompt."""
    runs: dict[str, dict[str, list[dict]]] = {pid: {} for pid in prompts}
    n_gen: dict[str, int] = {}
    depth = {pid: native_prompt(args, text)[0] for pid, text in prompts.items()}
    rng = random.Random(args.seed)
    for rep in range(args.reps):
        for pid, text in prompts.items():
            jobs = [*engines(args), ("llama-bench", None)]
            rng.shuffle(jobs)
            for name, src in jobs:
                busy = wait_idle(args.idle_wait)
                if name == "llama-bench":
                    # As many tokens as localspec wrote (an answer may end early).
                    n = n_gen.get(pid, args.max_tokens)
                    rec = {"tps": llama_bench_tg(args, depth[pid], n), "tokens": n}
                else:
                    out = localspec_complete(src, text, "none", args, home)
                    stats = out["stats"]
                    n_gen.setdefault(pid, stats["generated_tokens"])
                    rec = {
                        "tps": stats["decode_tokens_per_s"],
                        "tokens": stats["generated_tokens"],
                        "overhead_ms": stats.get("overhead_per_round_ms"),
                        "round_ms": 1e3 * stats["decode_s"] / max(1, stats["rounds"]),
                    }
                rec["busy"] = round(busy, 3)
                runs[pid].setdefault(name, []).append(rec)
                _progress(f"plain rep {rep + 1}/{args.reps} {pid} {name}", rec)
    return {"depth": depth, "runs": runs}


def ngram_part(args: argparse.Namespace, prompt: str, home: Path) -> dict:
    """`--drafter ngram` and `auto` on the editing prompt beside llama.cpp's n-gram modes."""
    _, text = native_prompt(args, prompt)
    types = ngram_types(args)
    runs: dict[str, list[dict]] = {}
    rng = random.Random(args.seed + 1)
    runners = [(f"{name} {mode}", src, mode) for name, src in engines(args) for mode in MODES]
    for rep in range(args.reps):
        jobs: list[tuple[str, Any, str]] = [*runners, *((t, None, "") for t in types)]
        rng.shuffle(jobs)
        for name, src, mode in jobs:
            busy = wait_idle(args.idle_wait)
            if name in types:
                rec = spec_simple(args, text, name, args.max_tokens)
            else:
                stats = localspec_complete(src, prompt, mode, args, home)["stats"]
                rec = {
                    "tps": stats["decode_tokens_per_s"],
                    "tokens": stats["generated_tokens"],
                    "drafted": stats["drafted"],
                    "accepted": stats["accepted"],
                    "rounds": stats["rounds"],
                    "overhead_ms": stats.get("overhead_per_round_ms"),
                    "round_ms": 1e3 * stats["decode_s"] / max(1, stats["rounds"]),
                }
            rec["busy"] = round(busy, 3)
            runs.setdefault(name, []).append(rec)
            _progress(f"ngram rep {rep + 1}/{args.reps} {name}", rec)
    return {"types": types, "runs": runs, "localspec": [name for name, _, _ in runners]}


RECORDS: list[Path] = []  # where each run is appended as it finishes (--out), if anywhere


def _progress(label: str, rec: dict) -> None:
    for path in RECORDS:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"run": label, **rec}) + "\n")
    extra = f", overhead {rec['overhead_ms']:.3f} ms/round" if rec.get("overhead_ms") else ""
    print(f"{label}: {rec['tps']:.1f} tok/s ({rec['tokens']} tokens, cpu busy "
          f"{rec['busy']:.0%} before){extra}", file=sys.stderr, flush=True)  # fmt: skip


def median(recs: list[dict], key: str = "tps") -> float:
    values = [r[key] for r in recs if r.get(key) is not None]
    return statistics.median(values) if values else float("nan")


def spread(recs: list[dict]) -> str:
    values = [r["tps"] for r in recs]
    return f"{min(values):.1f}-{max(values):.1f}"


def report_plain(plain: dict, names: list[str]) -> list[str]:
    lines = ["## Plain decoding (--drafter none) / llama-bench tg at the prompt's depth", ""]
    head = "| prompt | depth | llama-bench tok/s |"
    rule = "| --- | ---: | ---: |"
    for name in names:
        head += f" {name} tok/s | ratio | overhead ms/round | share of a round |"
        rule += " ---: | ---: | ---: | ---: |"
    lines += [head, rule]
    ratios: dict[str, list[float]] = {name: [] for name in names}
    for pid, runs in plain["runs"].items():
        ref = median(runs["llama-bench"])
        row = f"| {pid} | {plain['depth'][pid]} | {ref:.1f} ({spread(runs['llama-bench'])}) |"
        for name in names:
            tps, over, step = (
                median(runs[name]),
                median(runs[name], "overhead_ms"),
                median(runs[name], "round_ms"),
            )
            # Each repetition's runs follow one another: their ratio sees one machine speed.
            pairs = zip(runs[name], runs["llama-bench"], strict=True)
            paired = [a["tps"] / b["tps"] for a, b in pairs]
            ratio = statistics.median(paired)
            ratios[name].append(ratio)
            row += f" {tps:.1f} ({spread(runs[name])}) | {ratio:.3f} | {over:.3f} |"
            row += f" {over / step:.1%} |"
        lines.append(row)
    lines.append("")
    for name in names:
        lines.append(f"- {name}: geometric mean of the ratio {geomean(ratios[name]):.3f}")
    return lines


def report_ngram(ngram: dict, prompt_id: str) -> list[str]:
    lines = ["", f"## --drafter ngram and auto on {prompt_id} / llama-speculative-simple", ""]
    lines += ["| run | tok/s (median, range) | tokens | drafted | accepted | overhead ms/round |"]
    lines += ["| --- | ---: | ---: | ---: | ---: | ---: |"]
    names = ngram["localspec"]
    for name in [*names, *ngram["types"]]:
        recs = ngram["runs"][name]
        over = median(recs, "overhead_ms")
        lines.append(
            f"| {name} | {median(recs):.1f} ({spread(recs)}) | {recs[0]['tokens']} | "
            f"{recs[0].get('drafted', '')} | {recs[0].get('accepted', '')} | "
            + (f"{over:.3f} |" if not math.isnan(over) else "|")
        )
    best = max(ngram["types"], key=lambda t: median(ngram["runs"][t]), default=None)
    if best is not None:
        for name in names:
            ratio = median(ngram["runs"][name]) / median(ngram["runs"][best])
            lines.append(f"\n- {name} / llama.cpp's best n-gram mode ({best}): {ratio:.3f}")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-bin", type=Path, required=True, help="llama.cpp's bin folder")
    parser.add_argument("--target", default="smollm2-135m", help="catalog name or .gguf path")
    parser.add_argument("--prompts", type=Path, default=DEFAULT_PROMPTS)
    parser.add_argument("--ids", default=DEFAULT_IDS, help="comma-separated prompt ids")
    parser.add_argument("--edit-id", default=EDIT_ID, help="the editing prompt for ngram")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0, help="the order of the runs")
    parser.add_argument("--also", type=Path, help="another localspec source tree, beside")
    parser.add_argument("--idle-wait", type=float, default=120.0, help="seconds at most")
    parser.add_argument("--skip", choices=("plain", "ngram"), help="leave one part out")
    parser.add_argument("--out", type=Path, help="write the runs (JSONL, JSON) and table here")
    args = parser.parse_args()

    from localspec.models.catalog import resolve_model

    args.target_path = resolve_model(args.target, "target")
    if Path(args.target).expanduser().is_file():  # the processes run from another folder
        args.target = str(args.target_path)
    ids = [i for i in args.ids.split(",") if i]
    prompts = load_prompts(args.prompts, ids)
    edit = load_prompts(args.prompts, [args.edit_id])[args.edit_id]
    names = [name for name, _ in engines(args)]
    if args.out:  # every run as it finishes, so an interrupted measurement keeps its runs
        args.out.mkdir(parents=True, exist_ok=True)
        RECORDS.append(args.out / "runs.jsonl")
        RECORDS[0].write_text("")
    results: dict[str, Any] = {"target": str(args.target_path), "args": vars(args).copy()}
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="localspec-short-") as tmp:
        home = private_home(Path(tmp))
        if args.skip != "plain":
            results["plain"] = plain_part(args, prompts, home)
            lines += report_plain(results["plain"], names)
        if args.skip != "ngram":
            results["ngram"] = ngram_part(args, edit, home)
            lines += report_ngram(results["ngram"], args.edit_id)
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        results["args"] = {k: str(v) for k, v in results["args"].items()}
        (args.out / "short_steps.json").write_text(json.dumps(results, indent=1) + "\n")
        (args.out / "short_steps.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
