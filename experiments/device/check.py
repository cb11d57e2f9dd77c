"""The device check's measurements: one run, one JSON file and one table under ``--out``.

Run by ``experiments/device/check.sh`` after it has built llama.cpp (``--bin``: its bin folder,
the same build localspec's bindings load through ``LLAMA_CPP_LIB_PATH``). For each pair of
shapes (``PAIRS``: the default pair's 1.5B target with its 0.5B draft, and a target of
Qwen2.5-Coder-7B's shape with the same draft; in ``--mode cpu`` small models of the same
vocabulary stand in for them) it

1. makes random-weight models of those shapes (``shapes.write_f16``, then ``llama-quantize``
   to Q4_K_M);
2. measures the cost profile there (``machine.calibrate.measure_costs``: a plain step,
   verify batches of 2 to 64 tokens, a draft step), with greedy choices on the device;
3. decodes ``--tokens`` tokens after a prompt of ``--depth`` tokens with ``--drafter none``,
   greedy choices on the device and then on the host, beside ``llama-bench`` tg at the same
   depth; the engine's time outside llama.cpp per round is its Python time;
4. decodes with ``--drafter model`` and a draft identical to the target (every draft
   accepted: the loop's cost where it shows most) beside ``llama-speculative-simple
   --spec-type draft-simple`` with the same two files and draft length;
5. runs ``LANES`` lanes of the target (``serve --parallel``, backend/lanes.py), each a
   ``LANE_ROUNDS`` rounds of a five-token verify batch after its own ``--depth`` prompt,
   gathered into one evaluation per round and then in turn: the gathered rounds' speedup.

Every step's wall time is kept too (``seconds``), so a run that nears its lease shows where
the time went. Random weights decode nonsense at the speed real weights would: the costs
are the shapes', not the text's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

# llama.cpp's library before numpy (which shapes imports): the module's docstring says why.
import localspec.backend.library  # noqa: E402, F401, I001
import shapes as shaping  # noqa: E402

# name, target shape, draft shape (files under --shapes, or derived from them)
PAIRS = ("1.5B+0.5B", "7B+0.5B")
QWEN_7B = {"n_embd": 3584, "n_ff": 18944, "n_layer": 28, "n_head": 28, "n_head_kv": 4}
SIZES = (1, 2, 3, 4, 7, 15, 31, 63)  # drafts per verify batch: batches of 2 to 64 tokens
DRAFT_MAX = 16  # --drafter model's draft length, and llama-speculative-simple's
LANES = 4  # generations at once in the lanes step (serve's --parallel on a GPU)
LANE_ROUNDS = 32  # rounds of each lane, each a batch of LANE_BATCH tokens
LANE_BATCH = 5  # a round of four drafts


def _now() -> float:
    return time.perf_counter()


class Run:
    """What the run found, and how long each step took."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.result: dict[str, Any] = {
            "mode": args.mode, "machine": platform.node(), "python": platform.python_version(),
            "depth": args.depth, "tokens": args.tokens, "pairs": {}, "seconds": {},
        }  # fmt: skip
        self.t0 = _now()

    def step(self, name: str, fn: Callable[[], Any]) -> Any:
        start = _now()
        print(f"[{start - self.t0:6.1f} s] {name}", flush=True)
        value = fn()
        self.result["seconds"][name] = round(_now() - start, 2)
        self.save()
        return value

    def save(self) -> None:
        """What was found so far, written after every step: a run stopped at its lease's
        end still brings back every step it finished."""
        self.result["seconds"]["total"] = round(_now() - self.t0, 2)
        (self.args.out / "device_check.json").write_text(json.dumps(self.result, indent=1))


def shapes_wanted(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Each model's shape by name: the real ones, or small stand-ins in ``--mode cpu``."""
    base = shaping.load(args.shapes / "qwen2.5-coder-1.5b.json.gz")
    small = shaping.load(args.shapes / "qwen2.5-coder-0.5b.json.gz")
    if args.mode == "cpu":
        return {
            "target-1.5B": shaping.tiny(base, "tiny 1.5B stand-in", n_layer=4),
            "target-7B": shaping.tiny(base, "tiny 7B stand-in", n_layer=6, n_embd=512),
            "draft-0.5B": shaping.tiny(small, "tiny 0.5B stand-in", n_layer=2),
        }
    return {
        "target-1.5B": base,
        "target-7B": shaping.scaled(base, "Qwen2.5-Coder-7B shape", **QWEN_7B),
        "draft-0.5B": small,
    }


def make_model(run: Run, name: str, shape: dict[str, Any]) -> Path:
    """One model's file, quantized to Q4_K_M by the build's llama-quantize."""
    args = run.args
    f16 = args.work / f"{name}-f16.gguf"
    out = args.work / f"{name}-q4_k_m.gguf"
    run.step(f"write {name} ({shaping.parameters(shape) / 1e9:.2f}B)",
             lambda: shaping.write_f16(shape, f16))  # fmt: skip
    run.step(f"quantize {name}", lambda: _quantize(args, f16, out))
    f16.unlink()
    return out


def _quantize(args: argparse.Namespace, src: Path, dst: Path) -> None:
    tool = args.bin / "llama-quantize"
    subprocess.run([str(tool), str(src), str(dst), "Q4_K_M", str(args.threads)],
                   check=True, capture_output=True)  # fmt: skip


def _load(
    path: Path, args: argparse.Namespace, *, device: bool, draft: bool = False, lanes: int = 1
):
    from localspec.backend.llama import LlamaModel, LoadOptions

    options = LoadOptions(
        n_ctx=args.ctx, n_threads=args.threads,
        n_gpu_layers=999 if args.mode == "cuda" else 0, device_greedy=device,
        greedy_confidence=draft, lanes=lanes,
    )  # fmt: skip
    return LlamaModel(path, options)


def _prompt(n_vocab: int, depth: int) -> list[int]:
    """A prompt of ``depth`` ordinary tokens (no special ones: ids below 150,000)."""
    return [(977 * i + 31) % min(n_vocab, 150_000) for i in range(depth)]


def _decode(target, draft, args: argparse.Namespace, drafter: str, costs) -> dict[str, Any]:
    """One cold generation: tokens/s, rounds, Python's time per round, acceptance."""
    from localspec.core.engine import SpecDecoder, run_to_completion
    from localspec.core.params import GenerationParams

    params = GenerationParams(
        max_tokens=args.tokens, drafter=drafter, draft_max=DRAFT_MAX, p_min=0.0
    )
    decoder = SpecDecoder(target, draft, costs)
    finished = run_to_completion(decoder.generate(_prompt(target.n_vocab, args.depth), params))
    stats = finished.stats
    target.reset()
    if draft is not None:
        draft.reset()
    return {
        "tokens": len(finished.token_ids),
        "tokens_per_s": round(len(finished.token_ids) / stats.decode_s, 2),
        "rounds": stats.rounds,
        "python_ms_per_round": stats.overhead_per_round_ms,
        "acceptance": stats.acceptance_rate,
        "verification": target.greedy_where,
    }


def lanes_speedup(model, rounds: int = LANE_ROUNDS, depth: int = 512) -> dict[str, Any]:
    """``model``'s lanes (all of them) each running ``rounds`` rounds of a ``LANE_BATCH``-token
    greedy batch after a prompt of ``depth`` tokens of its own, in threads taking turns:
    the rounds' seconds in turn and gathered, and the speedup."""
    out: dict[str, Any] = {"lanes": model.lanes, "rounds": rounds, "batch": LANE_BATCH}
    out["in_turn_s"], _ = _time_lanes(model, False, rounds, depth)
    out["gathered_s"], out["evaluations"] = _time_lanes(model, True, rounds, depth)
    out["speedup"] = round(out["in_turn_s"] / out["gathered_s"], 3)
    return out


def _time_lanes(model, gather: bool, rounds: int, depth: int) -> tuple[float, int]:
    """Seconds of every lane's rounds (after their prompts), and the gathered evaluations."""
    import threading

    turns = model.shared.scheduler  # the lanes' scheduler (backend/lanes.py)
    before = turns.evaluations
    lanes = [model.lane(i) for i in range(model.lanes)]
    ready = threading.Barrier(len(lanes) + 1)
    prompts = threading.Lock()
    vocab = min(model.n_vocab, 150_000)  # ordinary tokens (see _prompt)

    def run(i: int) -> None:
        lane = lanes[i]
        tokens = _prompt(model.n_vocab, depth + i)[i:]
        # One lane at a time, before the turns begin (not timed: only the rounds are): a
        # lane's rollback and prompt use the context, which another lane's evaluation holds.
        with prompts:
            lane.reset()
            lane.greedy(tokens, 1)
        ready.wait()
        with lane.turn(gather=gather) as turn:
            for r in range(rounds):
                tokens += [(31 * (r + 1) * (j + 7) + i) % vocab for j in range(LANE_BATCH)]
                lane.greedy(tokens, LANE_BATCH)
                turn.pass_on()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(lanes))]
    for thread in threads:
        thread.start()
    with turns.turn():  # every lane's prompt read and its rounds queued before the first
        ready.wait()
        while turns.waiting < len(lanes):
            time.sleep(0.001)
        t0 = _now()
    for thread in threads:
        thread.join()
    seconds = round(_now() - t0, 4)
    return seconds, turns.evaluations - before


def _drafting_costs():
    """Costs under which a draft model reads the prompt with the target, as
    llama-speculative-simple's does (the fixed ``model`` policy is not priced by them)."""
    from localspec.core.costs import CostProfile

    return CostProfile(plain_s=1.0, verify_s={1: 1.0, 16: 1.0}, draft_step_s=0.01)


def measure_pair(run: Run, name: str, target_path: Path, draft_path: Path) -> dict[str, Any]:
    from localspec.machine.calibrate import measure_costs

    args = run.args
    out: dict[str, Any] = {"target": target_path.name, "draft": draft_path.name}
    run.result["pairs"][name] = out  # filled step by step, saved after each
    target = run.step(f"{name}: load", lambda: _load(target_path, args, device=True))
    draft = _load(draft_path, args, device=True, draft=True)
    context = _prompt(target.n_vocab, 64)
    costs = run.step(
        f"{name}: costs", lambda: measure_costs(target, draft, context, sizes=SIZES, sweeps=2)
    )
    out["costs"] = costs.to_dict()
    out["none_device"] = run.step(
        f"{name}: none, device", lambda: _decode(target, None, args, "none", costs)
    )
    draft.close()
    same = _load(target_path, args, device=True, draft=True)  # the target as its own draft
    out["model_same"] = run.step(
        f"{name}: model = target", lambda: _decode(target, same, args, "model", _drafting_costs())
    )
    same.close()
    target.close()
    host = _load(target_path, args, device=False)
    out["none_host"] = run.step(
        f"{name}: none, host", lambda: _decode(host, None, args, "none", costs)
    )
    host.close()
    laned = _load(target_path, args, device=True, lanes=LANES)
    out["lanes"] = run.step(
        f"{name}: {LANES} lanes", lambda: lanes_speedup(laned, depth=args.depth)
    )
    laned.close()
    out["llama_bench_tg"] = run.step(
        f"{name}: llama-bench", lambda: _llama_bench(args, target_path)
    )
    out["spec_simple"] = run.step(
        f"{name}: speculative-simple", lambda: _spec_simple(args, target_path)
    )
    return out


def _llama_bench(args: argparse.Namespace, model: Path) -> float:
    from localspec.backend.native import parse_llama_bench_json

    cmd = [str(args.bin / "llama-bench"), "-m", str(model), "-p", "0", "-n", str(args.tokens),
           "-d", str(args.depth), "-t", str(args.threads), "-r", "2", "-fa", "on", "-o", "json",
           "-ngl", "999" if args.mode == "cuda" else "0"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return round(parse_llama_bench_json(proc.stdout).decode_tokens_per_s, 2)


def _spec_simple(args: argparse.Namespace, model: Path) -> dict[str, Any]:
    """llama-speculative-simple's draft-simple with the target as its own draft."""
    from localspec.backend.native import parse_native_output

    ngl = "999" if args.mode == "cuda" else "0"
    prompt = " ".join(["def f(x): return x + 1"] * max(1, args.depth // 10))
    cmd = [str(args.bin / "llama-speculative-simple"), "-m", str(model), "-md", str(model),
           "--spec-type", "draft-simple", "--spec-draft-n-max", str(DRAFT_MAX),
           "--spec-draft-p-min", "0", "-p", prompt, "-n", str(args.tokens), "-c", str(args.ctx),
           "-b", str(args.ctx), "-t", str(args.threads), "-td", str(args.threads), "-fa", "on",
           "--temp", "0", "--top-k", "1", "-ngl", ngl, "-ngld", ngl]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    found = parse_native_output(proc.stderr + "\n" + proc.stdout, "native-draft")
    return {
        "tokens_per_s": round(found.decode_tokens_per_s, 2),
        "acceptance": found.acceptance_rate,
    }


def table(result: dict[str, Any]) -> str:
    """The run as a Markdown table: one row per pair."""
    head = (
        "| pair | plain step ms | verify 16 / 64 (x plain) | draft step ms | none device tok/s "
        "| none host tok/s | llama-bench tg | none / tg | Python ms/round | model=target tok/s "
        "| spec-simple tok/s | model / spec-simple | lanes gathered / in turn |"
    )
    lines = [head, "|" + " --- |" * 13]
    for name, p in result["pairs"].items():
        c = p["costs"]
        verify = c["verify_s"]
        v16, v64 = verify.get("15"), verify.get("63")
        dev, host, tg = p["none_device"], p["none_host"], p["llama_bench_tg"]
        same, simple = p["model_same"], p["spec_simple"]
        lines.append(
            f"| {name} | {c['plain_s'] * 1e3:.2f} "
            f"| {_ratio(v16, c['plain_s'])} / {_ratio(v64, c['plain_s'])} "
            f"| {(c['draft_step_s'] or 0) * 1e3:.2f} | {dev['tokens_per_s']} "
            f"| {host['tokens_per_s']} | {tg} | {dev['tokens_per_s'] / tg:.3f} "
            f"| {dev['python_ms_per_round']:.3f} | {same['tokens_per_s']} "
            f"| {simple['tokens_per_s']} | {same['tokens_per_s'] / simple['tokens_per_s']:.3f} "
            f"| {p['lanes']['speedup']:.3f}x |"
        )
    return "\n".join(lines)


def _ratio(x: float | None, plain: float) -> str:
    return f"{x / plain:.2f}" if x else "-"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("cuda", "cpu"), required=True)
    parser.add_argument("--bin", type=Path, required=True, help="llama.cpp's build/bin")
    parser.add_argument("--shapes", type=Path, required=True, help="the carried shapes")
    parser.add_argument("--work", type=Path, required=True, help="where models are written")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--depth", type=int, default=512)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--ctx", type=int, default=2048)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    run = Run(args)
    wanted = shapes_wanted(args)
    draft = make_model(run, "draft-0.5B", wanted["draft-0.5B"])
    # Each pair's target is made just before it is measured, the default pair's first, so
    # a run cut short still measured the pair that matters most.
    for name, target_name in zip(PAIRS, ("target-1.5B", "target-7B"), strict=True):
        target = make_model(run, target_name, wanted[target_name])
        measure_pair(run, name, target, draft)
        target.unlink()
    run.save()
    text = table(run.result)
    (args.out / "device_check.md").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
