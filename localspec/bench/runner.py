"""Benchmark: plain and speculative decoding over prompt sets, run by category.

``load_prompts`` reads the shipped sets (``prompts/<category>.jsonl``, one
``{"id", "prompt", "source"}`` per line). ``BenchRunner.run`` drives a loaded ``Session``:

- every prompt is run in every mode before the next prompt starts (interleaved), and the
  mode order rotates from one prompt to the next, so drift on a busy machine (thermal,
  other work) falls on all modes alike instead of on whichever ran last;
- every run starts from empty KV caches (target and draft are reset), so no run reuses
  another's prompt evaluation; a short warm-up run per mode comes first and is not recorded;
- the engine's per-mode controller keeps its acceptance estimates from prompt to prompt, as
  it does in a session;
- ``native-draft`` / ``native-ngram`` run llama.cpp's ``llama-speculative-simple`` on the
  same prompt text and models (see ``native.py``).

Each run yields one record (a plain dict, written as a JSONL line by the caller) with the
stats vocabulary of ``stats.py`` plus ``outside_share``: the part of the decode time spent
outside llama.cpp (``1 - compute/decode``, compute being the models' ``compute_seconds``
accumulated during decoding). ``summarize`` turns records into per-category and overall
figures: decode tokens/s, the geometric mean of per-prompt ratios to ``none`` (paired on the
same prompt), acceptance, mean accepted length, outside share, and greedy agreement with
``none`` (identical token ids, common-prefix length). No printing here.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field

from localspec.core.cached_model import common_prefix_length
from localspec.core.engine import run_to_completion
from localspec.core.events import PrefillDone
from localspec.core.params import DrafterMode, GenerationParams
from localspec.errors import InputError, UsageError

CATEGORIES = (
    "code_completion",
    "code_rewrite",
    "chat_qa",
    "summarization",
    "translation",
    "math",
)
ENGINE_MODES = ("none", "ngram", "model", "auto")
NATIVE_MODES = ("native-draft", "native-ngram")
BASELINE = "none"
WARMUP_TOKENS = 16
CEILING_BATCH = 16

Record = dict[str, Any]


@dataclass(frozen=True)
class BenchPrompt:
    category: str
    id: str
    prompt: str
    source: str


def _prompt_file(category: str, directory: Path | None) -> Any:
    if directory is not None:
        return directory / f"{category}.jsonl"
    return resources.files("localspec.bench") / "prompts" / f"{category}.jsonl"


def load_prompts(
    categories: Sequence[str] | None = None,
    limit: int | None = None,
    directory: Path | None = None,
) -> list[BenchPrompt]:
    """The prompts of ``categories`` (all by default), at most ``limit`` per category."""
    chosen = list(categories) if categories else list(CATEGORIES)
    unknown = [c for c in chosen if c not in CATEGORIES]
    if unknown:
        raise UsageError(
            f"unknown categor{'y' if len(unknown) == 1 else 'ies'}: {', '.join(unknown)}",
            f"choose among {', '.join(CATEGORIES)}",
        )
    if limit is not None and limit < 1:
        raise UsageError(f"invalid --limit {limit}: must be at least 1", "e.g. --limit 3")
    prompts: list[BenchPrompt] = []
    for category in chosen:
        path = _prompt_file(category, directory)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as err:
            raise InputError(
                f"cannot read the prompt set {path}: {err.strerror}", "reinstall localspec"
            ) from None
        rows = []
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                rows.append(BenchPrompt(category, str(row["id"]), row["prompt"], row["source"]))
            except (ValueError, KeyError, TypeError):
                raise InputError(
                    f"{path}, line {n}: not a JSON object with id, prompt and source",
                    "fix or reinstall the prompt set",
                ) from None
        prompts.extend(rows[:limit])
    return prompts


class BenchConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    modes: tuple[str, ...] = ENGINE_MODES
    max_tokens: int = Field(200, ge=1)
    temperature: float = Field(0.0, ge=0.0)
    seed: int | None = None
    raw: bool = False
    warmup: bool = True

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def parse_modes(text: str) -> tuple[str, ...]:
    """``"none,ngram"`` -> ``("none", "ngram")``; ``none`` is always included, first."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    valid = ENGINE_MODES + NATIVE_MODES
    bad = [m for m in modes if m not in valid]
    if bad or not modes:
        raise UsageError(
            f"invalid --modes {text!r}" + (f": unknown {', '.join(bad)}" if bad else ""),
            f"use a comma-separated list of {', '.join(valid)}",
        )
    # Ratios are paired against `none` on the same prompt, so it is always run.
    return tuple(dict.fromkeys([BASELINE, *modes]))


def run_order(prompts: Sequence[BenchPrompt], modes: Sequence[str]) -> list[tuple[int, str]]:
    """(prompt index, mode) pairs: all modes per prompt, the order rotating by one per prompt."""
    order: list[tuple[int, str]] = []
    for i in range(len(prompts)):
        shift = i % len(modes)
        order.extend((i, m) for m in [*modes[shift:], *modes[:shift]])
    return order


class BenchRunner:
    """Runs prompts through a session (and optionally the native binary); yields records."""

    def __init__(self, session: Any, config: BenchConfig, native: Any = None) -> None:
        self.session = session
        self.config = config
        self.native = native
        if any(m in NATIVE_MODES for m in config.modes) and native is None:
            raise UsageError("native modes need the llama.cpp binary", "pass --native-bin PATH")
        if "model" in config.modes and session.draft is None:
            raise UsageError("mode model needs a draft model", "drop it from --modes")

    def _params(self, mode: str, max_tokens: int, index: int) -> GenerationParams:
        seed = None if self.config.seed is None else self.config.seed + index
        return GenerationParams(
            max_tokens=max_tokens,
            temperature=self.config.temperature,
            seed=seed,
            drafter=cast(DrafterMode, mode),
        )

    def _models(self) -> list[Any]:
        return [m for m in (self.session.target, self.session.draft) if m is not None]

    def _compute_seconds(self) -> float | None:
        total = 0.0
        for model in self._models():
            seconds = getattr(model, "compute_seconds", None)
            if seconds is None:  # a backend without the counter: no outside share
                return None
            total += seconds
        return total

    def run_engine(self, tokens: list[int], mode: str, max_tokens: int, index: int) -> Record:
        for model in self._models():
            model.reset()  # a fresh context: nothing carried over from the previous run
        marks: dict[str, float | None] = {}

        def on_event(event: object) -> None:
            if isinstance(event, PrefillDone):  # decode compute starts counting here
                marks["start"] = self._compute_seconds()

        finished = run_to_completion(
            self.session.generate(tokens, self._params(mode, max_tokens, index)), on_event
        )
        stats = finished.stats
        start, end = marks.get("start"), self._compute_seconds()
        compute = None if start is None or end is None else end - start
        decode_s = stats["decode_s"]
        drafted = stats["drafted"]
        return {
            "engine": "localspec",
            "prompt_tokens": stats["prompt_tokens"],
            "generated_tokens": stats["generated_tokens"],
            "finish_reason": finished.reason.value,
            "decode_s": decode_s,
            "decode_tokens_per_s": stats["decode_tokens_per_s"],
            "prefill_s": stats["prefill_s"],
            "drafted": drafted,
            "accepted": stats["accepted"],
            "rounds": stats["rounds"],
            "acceptance_rate": stats["acceptance_rate"] if drafted else None,
            "mean_accepted_length": stats["mean_accepted_length"],
            "by_drafter": stats["by_drafter"],
            "tokens_by_origin": stats["tokens_by_origin"],
            "compute_s": None if compute is None else round(compute, 6),
            "outside_share": (
                None if compute is None or decode_s <= 0 else round(1 - compute / decode_s, 4)
            ),
            "token_ids": list(finished.token_ids),
        }

    def run_native(self, tokens: list[int], mode: str, max_tokens: int, index: int) -> Record:
        seed = None if self.config.seed is None else self.config.seed + index
        result = self.native.run(
            mode, self.native.prompt_text(tokens), max_tokens, self.config.temperature, seed
        )
        # The binary re-tokenizes the text: a different count means it saw another prompt.
        return {
            "engine": "llama.cpp",
            **result.to_record(),
            "same_prompt_tokens": result.prompt_tokens == len(tokens),
        }

    def run_one(self, tokens: list[int], mode: str, max_tokens: int, index: int) -> Record:
        if mode in NATIVE_MODES:
            return self.run_native(tokens, mode, max_tokens, index)
        return self.run_engine(tokens, mode, max_tokens, index)

    def warm_up(self, tokens: list[int]) -> None:
        """One short run per mode: first calls allocate buffers and pick kernels."""
        for mode in self.config.modes:
            self.run_one(tokens, mode, min(WARMUP_TOKENS, self.config.max_tokens), 0)

    def run(
        self,
        prompts: Sequence[BenchPrompt],
        on_record: Callable[[Record, int, int], None] | None = None,
    ) -> list[Record]:
        """Run every prompt in every mode; ``on_record(record, done, total)`` after each."""
        tokenized = [self.session.text_tokens(p.prompt, raw=self.config.raw) for p in prompts]
        if self.config.warmup and prompts:
            self.warm_up(tokenized[0])
        order = run_order(prompts, self.config.modes)
        records: list[Record] = []
        for seq, (i, mode) in enumerate(order):
            prompt = prompts[i]
            record = {
                "category": prompt.category,
                "prompt_id": prompt.id,
                "mode": mode,
                "run": seq,
                "time": round(time.time(), 3),
                **self.run_one(tokenized[i], mode, self.config.max_tokens, i),
            }
            records.append(record)
            if on_record is not None:
                on_record(record, seq + 1, len(order))
        return records


def measure_ceiling(model: Any, context: Sequence[int], reps: int = 3) -> dict[str, float]:
    """Target throughput at a batch of 16 with logits for every position, vs a plain step.

    This bounds any lossless speculative method on this machine: no round can emit more
    than the batch it verified, and a batch is never cheaper per token than here.
    """
    base = list(context)[:256]
    extra = (base * (CEILING_BATCH // max(len(base), 1) + 2))[:CEILING_BATCH]

    def timed(n: int) -> float:
        model.forward(base, 0)
        t0 = time.perf_counter()
        model.forward(base + extra[:n], n)
        return time.perf_counter() - t0

    timed(CEILING_BATCH)  # warm-up
    batch_s = min(timed(CEILING_BATCH) for _ in range(reps))
    plain_s = min(timed(1) for _ in range(reps))
    model.reset()
    return {
        "batch": CEILING_BATCH,
        "batch_s": round(batch_s, 6),
        "tokens_per_s": round(CEILING_BATCH / batch_s, 3),
        "plain_tokens_per_s": round(1 / plain_s, 3),
        "ceiling_ratio": round(plain_s * CEILING_BATCH / batch_s, 3),
    }


# -- summary -------------------------------------------------------------------------------


def geometric_mean(values: Iterable[float]) -> float | None:
    vals = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


def _key(record: Record) -> tuple[str, str]:
    return record["category"], record["prompt_id"]  # ids are unique within a category


def _group(
    records: list[Record], baseline: dict[tuple[str, str], Record], greedy: bool
) -> dict[str, Any]:
    tokens = sum(r["generated_tokens"] for r in records)
    decode = sum(r["decode_s"] for r in records)
    drafted = sum(r.get("drafted") or 0 for r in records)
    accepted = sum(r.get("accepted") or 0 for r in records)
    with_rounds = [r for r in records if r.get("rounds")]
    with_compute = [r for r in records if r.get("compute_s") is not None]
    paired = [(r, baseline[_key(r)]) for r in records if _key(r) in baseline]
    ratios = [
        r["decode_tokens_per_s"] / b["decode_tokens_per_s"]
        for r, b in paired
        if b["decode_tokens_per_s"] > 0
    ]
    rounds = sum(r["rounds"] for r in with_rounds)
    compute_decode = sum(r["decode_s"] for r in with_compute)
    compute = sum(r["compute_s"] for r in with_compute)
    out: dict[str, Any] = {
        "prompts": len(records),
        "generated_tokens": tokens,
        "decode_s": round(decode, 6),
        "decode_tokens_per_s": _round(tokens / decode if decode else None, 3),
        "ratio_to_none": _round(geometric_mean(ratios), 4),
        "acceptance_rate": _round(accepted / drafted if drafted else None, 4),
        "mean_accepted_length": _round(
            1 + sum(r["accepted"] for r in with_rounds) / rounds if rounds else None, 4
        ),
        "outside_share": _round(1 - compute / compute_decode if compute_decode else None, 4),
        "agreement": None,
    }
    pairs = [(r["token_ids"], b["token_ids"]) for r, b in paired if r.get("token_ids") is not None]
    if greedy and pairs:
        out["agreement"] = {
            "identical": round(sum(a == b for a, b in pairs) / len(pairs), 4),
            "mean_common_prefix": round(
                sum(common_prefix_length(a, b) for a, b in pairs) / len(pairs), 2
            ),
            "mean_baseline_length": round(sum(len(b) for _, b in pairs) / len(pairs), 2),
        }
    return out


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def summarize(records: list[Record], modes: Sequence[str], greedy: bool) -> dict[str, Any]:
    """Per category and overall, per mode; ratios are paired with ``none`` per prompt."""
    baseline = {_key(r): r for r in records if r["mode"] == BASELINE}
    categories = list(dict.fromkeys(r["category"] for r in records))
    by_cat: dict[str, dict[str, Any]] = {}
    for cat in categories:
        runs = [r for r in records if r["category"] == cat]
        by_cat[cat] = {
            mode: _group(mine, baseline, greedy)
            for mode in modes
            if (mine := [r for r in runs if r["mode"] == mode])
        }
    overall = {
        mode: _group(mine, baseline, greedy)
        for mode in modes
        if (mine := [r for r in records if r["mode"] == mode])
    }
    return {"categories": by_cat, "overall": overall}
