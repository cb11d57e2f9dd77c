"""The first token of a long prompt, cold and warm, in fresh processes: `localspec complete`
beside llama.cpp's `llama-completion --prompt-cache FILE` from the same sources.

For each prompt file (a long file with a question after it), in a private home whose models
are this machine's (linked) and whose prompt cache starts empty:

- localspec cold: the prompt cache emptied, one `complete --raw --max-tokens 1` process;
- localspec warm: the same prompt again, in a new process (it restores the prompt from disk);
- localspec other question (with `--other`): the same file with the last line replaced by
  another question, in a new process (it restores the file's prefix);
- llama.cpp cold and warm: `llama-completion -no-cnv -n 1 --prompt-cache FILE` with the file
  deleted first, then kept.

With `--serve`, it measures a server instead: `localspec serve --parallel 1` started in the
private home, then requests A, B, A (the first two prompt files as chat messages, streamed,
one new token each); the figure is each request's time to its first token, and A's second
over its first.

Every figure is a whole process's wall time from its start to its exit (a one-token answer:
its first token's time and its exit are a few milliseconds apart), the median of `--reps`
runs; the ratios are warm over cold and localspec warm over llama.cpp warm. Nothing else
should run on the machine meanwhile.

    python experiments/prompt_cache.py PROMPT.txt [...] --native-bin DIR/build/bin \\
        [--other "Which functions does it define?"] [--reps 3] [--exact]
    python experiments/prompt_cache.py A.txt B.txt --serve [--port 8089]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from localspec.models.catalog import resolve_model
from localspec.models.paths import cache_root


def timed(cmd: list[str], env: dict[str, str], stdin: str | None = None) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd[:4])}... failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return wall, proc.stdout


def private_home(directory: Path) -> Path:
    home = directory / "home"
    home.mkdir()
    (home / "models").symlink_to(cache_root() / "models")
    calibration = cache_root() / "calibration"
    if calibration.is_dir():
        shutil.copytree(calibration, home / "calibration")
    return home


def localspec_run(prompt: str, home: Path, args: argparse.Namespace) -> dict:
    env = {**os.environ, "LOCALSPEC_HOME": str(home), "LOCALSPEC_HISTORY": "0"}
    cmd = [sys.executable, "-m", "localspec", "complete", "--raw", "--json", "--max-tokens", "1",
           "--threads", str(args.threads), *(["--exact"] if args.exact else [])]  # fmt: skip
    wall, out = timed(cmd, env, prompt)
    record = json.loads(out)
    return {
        "wall_s": round(wall, 3),
        "first_token_s": record["timing"]["first_token_s"],
        "restored": record["stats"]["prompt_cache"]["restored_tokens"],
        "prompt_tokens": record["stats"]["prompt_tokens"],
    }


def native_run(prompt_file: Path, cache_file: Path, target: Path, args: argparse.Namespace):
    cmd = [str(Path(args.native_bin) / "llama-completion"), "-m", str(target), "-f",
           str(prompt_file), "-n", "1", "-no-cnv", "--prompt-cache", str(cache_file),
           "-t", str(args.threads), "-c", "4096", "--no-warmup"]  # fmt: skip
    wall, _ = timed(cmd, dict(os.environ))
    return {"wall_s": round(wall, 3)}


def median(runs: list[dict], key: str = "wall_s") -> float:
    return statistics.median(run[key] for run in runs)


def measure(prompt_file: Path, target: Path, args: argparse.Namespace) -> dict:
    prompt = prompt_file.read_text(encoding="utf-8")
    other = prompt.rstrip("\n").rsplit("\n", 1)[0] + "\n" + args.other if args.other else None
    runs: dict[str, list[dict]] = {k: [] for k in ("cold", "warm", "other", "native_cold",
                                                     "native_warm")}  # fmt: skip
    for _ in range(args.reps):
        with tempfile.TemporaryDirectory() as tmp:
            home = private_home(Path(tmp))
            runs["cold"].append(localspec_run(prompt, home, args))
            runs["warm"].append(localspec_run(prompt, home, args))
            if other is not None:
                runs["other"].append(localspec_run(other, home, args))
            cache_file = Path(tmp) / "native.cache"
            runs["native_cold"].append(native_run(prompt_file, cache_file, target, args))
            runs["native_warm"].append(native_run(prompt_file, cache_file, target, args))
    result: dict = {"prompt": prompt_file.name, "runs": runs}
    figures = {k: median(v) for k, v in runs.items() if v}
    result["median_wall_s"] = figures
    result["warm_over_cold"] = round(figures["warm"] / figures["cold"], 3)
    if "other" in figures:
        result["other_over_cold"] = round(figures["other"] / figures["cold"], 3)
    result["warm_over_native_warm"] = round(figures["warm"] / figures["native_warm"], 3)
    result["native_warm_over_cold"] = round(figures["native_warm"] / figures["native_cold"], 3)
    return result


def first_token_s(url: str, text: str) -> float:
    import httpx

    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 1, "stream": True}
    t0 = time.perf_counter()
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=3600) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                return time.perf_counter() - t0
    raise SystemExit(f"no token came back from {url}")


def measure_serve(a: Path, b: Path, args: argparse.Namespace) -> dict:
    import httpx

    with tempfile.TemporaryDirectory() as tmp:
        home = private_home(Path(tmp))
        env = {**os.environ, "LOCALSPEC_HOME": str(home), "LOCALSPEC_HISTORY": "0"}
        url = f"http://127.0.0.1:{args.port}"
        server = subprocess.Popen(
            [sys.executable, "-m", "localspec", "serve", "--parallel", "1", "--port",
             str(args.port), "--threads", str(args.threads)],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.time() + 600
            while time.time() < deadline:
                try:
                    if httpx.get(f"{url}/health", timeout=2).json().get("status") == "ok":
                        break
                except (httpx.HTTPError, ValueError):
                    pass
                time.sleep(0.5)
            texts = {"A": a.read_text(encoding="utf-8"), "B": b.read_text(encoding="utf-8")}
            times = [(name, round(first_token_s(url, texts[name]), 3)) for name in "ABA"]
        finally:
            server.terminate()
            server.wait(60)
    return {"first_token_s": times, "a_again_over_a": round(times[2][1] / times[0][1], 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prompts", nargs="+", type=Path)
    parser.add_argument("--native-bin", help="where llama-completion is")
    parser.add_argument("--serve", action="store_true", help="time A, B, A on a server")
    parser.add_argument("--port", type=int, default=8089)
    parser.add_argument("--other", help="another question to put after the same file")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--exact", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.serve:
        if len(args.prompts) != 2:
            parser.error("--serve takes two prompt files, A and B")
        print(json.dumps(measure_serve(*args.prompts, args)))
        return
    if not args.native_bin:
        parser.error("--native-bin is needed (scripts/build_native.sh DIR: DIR/build/bin)")
    target = resolve_model(None, "target", progress=False)
    results = [measure(p, target, args) for p in args.prompts]
    text = json.dumps(results, indent=1)
    if args.out:
        args.out.write_text(text)
    for r in results:
        print(
            f"{r['prompt']}: {r['median_wall_s']}; warm/cold {r['warm_over_cold']}"
            + (f", other/cold {r['other_over_cold']}" if "other_over_cold" in r else "")
            + f", warm/llama.cpp warm {r['warm_over_native_warm']}"
        )


if __name__ == "__main__":
    main()
