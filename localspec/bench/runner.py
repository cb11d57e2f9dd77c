"""Benchmark: plain and speculative decoding over prompt sets, run by category.

``load_prompts`` reads the shipped sets (``prompts/<category>.jsonl``, one
``{"id", "prompt", "source"}`` per line; the ``apply`` set is built by ``bench.apply``);
``load_prompt_file`` reads a user's own JSONL file (``prompt`` required; ``id``,
``category``, ``source`` default to ``line-N``, the file's stem and its path; an optional
``prediction`` is what mode ``auto-prediction`` drafts from). ``BenchRunner.run`` drives a
loaded ``Session``:

- ``auto-store`` is ``auto`` with the session's datastores and ``auto-chains`` is ``auto``
  without draft trees (single chains only), so each runs beside ``auto``;
- every prompt is run in every mode before the next prompt starts (interleaved), and the
  mode order rotates from one prompt to the next, so drift on a busy machine (thermal,
  other work) falls on all modes alike instead of on whichever ran last;
- every run starts from empty KV caches (target and draft are reset), so no run reuses
  another's prompt evaluation; a short warm-up run per mode comes first and is not recorded;
- cold (the default): every engine run, warm-up included, starts with
  ``session.forget_learning()``, so each prompt meets a controller that has learned nothing,
  as a fresh ``localspec complete`` without saved state does; warm: the per-mode controller
  keeps its acceptance estimates from prompt to prompt, as it does in a session;
- ``native-draft`` / ``native-ngram`` / ``native-ngram-map-k`` / ``native-ngram-mod`` /
  ``native-none`` run llama.cpp's ``llama-speculative-simple`` on the same prompt text and
  models with the same ``-n`` (see ``backend/native.py``); a native run that wrote more
  tokens than asked keeps its record and gets ``overshoot`` (the tokens beyond
  ``max_tokens``). ``native-bench`` runs ``llama-bench``: plain decoding of ``max_tokens``
  tokens after a context as long as the prompt's tokens (``prompt_tokens`` is that depth).

Each run yields one record (a plain dict, written as a JSONL line by the caller) with the
stats vocabulary of ``stats.py`` plus ``outside_share``: the part of the decode time spent
outside llama.cpp (``1 - compute/decode``, compute being the models' ``compute_seconds``
accumulated during decoding), ``plain_steps`` and ``plain_step_s`` (how many plain steps the
run took, and their mean seconds: the machine's speed during that run), and with ``trace``
(the engine's per-round list) when the config asks for it. ``summarize`` turns records into
per-category and overall figures: decode tokens/s, mean tokens per run, the geometric mean
of per-prompt ratios to ``none`` (paired on the same prompt; runs of fewer than
``MIN_RATIO_TOKENS`` tokens, or whose reference run is that short, are left out and counted
as ``short_runs``), for the engine's modes the ratio to the fastest speculative native run
of each prompt (``ratio_to_best_native``, over all four speculative native modes), for
``none`` the ratios to ``native-none`` and to ``native-bench`` (``ratio_to_native_none``,
``ratio_to_native_bench``), for the speculative native modes their ratio to ``native-none``
(llama.cpp's speedup over its own plain decoding) and for ``native-none`` its ratio to
``native-bench``,
acceptance, mean accepted length, outside share, greedy agreement with ``none`` (identical
token ids, common-prefix length), for speculative modes the lowest per-prompt ratio to
``none`` and the same ratios timed by each run's own plain steps (``_steady``), and the list
of native runs that overshot. ``measure_ceiling`` times the target's best batch throughput.
No printing here.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from localspec.bench.apply import apply_prompt, first_code_block, parse_line
from localspec.core.cached_model import common_prefix_length
from localspec.core.engine import run_to_completion
from localspec.core.events import PrefillDone, RoundCompleted
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
# Prompts whose answers may reuse a corpus: run only when asked for by name, beside a store
# of that corpus (``repo_code``: this project's own source, ``localspec datastore add``).
STORE_CATEGORIES = ("repo_code",)
# Edits of whole files with the file as the prediction (``bench.apply``): answers of a
# thousand tokens and more, so run only when asked for by name.
PREDICTION_CATEGORIES = ("apply",)
ENGINE_MODES = ("none", "ngram", "model", "auto")
# Drafters that need no second model, run when named: lookahead (the target's own rows), and
# self, the draft model when it was derived from the target (``--draft self``).
SELF_MODE, LOOKAHEAD_MODE = "self", "lookahead"
MORE_ENGINE_MODES = (SELF_MODE, LOOKAHEAD_MODE)
STORE_MODE = "auto-store"  # auto with the session's datastores (``--store``); auto has none
CHAINS_MODE = "auto-chains"  # auto without draft trees: single draft chains only
# auto with each prompt's prediction: the one it gives, else its first code block
PREDICTION_MODE = "auto-prediction"
AUTO_MODES = ("auto", STORE_MODE, CHAINS_MODE, PREDICTION_MODE)  # the cost model's modes
# llama-speculative-simple's speculative types; "best native" is the fastest of them all.
NATIVE_DRAFT = "native-draft"  # llama.cpp with the draft model
NATIVE_SPEC_MODES = (NATIVE_DRAFT, "native-ngram", "native-ngram-map-k", "native-ngram-mod")
NATIVE_PLAIN = "native-none"  # llama.cpp without speculation: compared with `none`
NATIVE_BENCH = "native-bench"  # llama-bench's plain decoding at the prompt's depth
NATIVE_MODES = (*NATIVE_SPEC_MODES, NATIVE_PLAIN, NATIVE_BENCH)
BASELINE = "none"
WARMUP_TOKENS = 16
CEILING_BATCHES = (16, 32, 64)  # up to the longest draft worth verifying (n-gram copies)
CEILING_CONTEXT = 256  # sample context the ceiling batches are verified after
MIN_RATIO_TOKENS = 64  # shorter runs give noisy tok/s: left out of the ratio means
# A run's own clock: the mean time of its plain steps, once it took this many (see ``_steady``).
MIN_PLAIN_STEPS = 16
ANSWER_SLACK = 64  # tokens past its prediction's length an answer that rewrites it may write

Record = dict[str, Any]
# The fields of the stats' JSON (``GenerationStats.to_dict``) an engine run's record carries
# (``trace`` only when the run kept one).
RECORD_STATS = (
    "prompt_tokens", "generated_tokens", "decode_s", "decode_tokens_per_s", "prefill_s",
    "drafted", "accepted", "rounds", "acceptance_rate", "mean_accepted_length", "by_drafter",
    "tokens_by_origin", "trace",
)  # fmt: skip
PROMPT_FILE_HINT = 'one JSON object per line, e.g. {"prompt": "...", "category": "mine"}'


@dataclass(frozen=True)
class BenchPrompt:
    category: str
    id: str
    prompt: str
    source: str
    prediction: str | None = None  # what the answer will mostly be (mode auto-prediction)
    # The answer is the prediction rewritten: it may run as long as the prediction and
    # ``ANSWER_SLACK`` tokens more, whatever --max-tokens says.
    answer_like_prediction: bool = False

    def predicted(self) -> str | None:
        """The prediction mode ``auto-prediction`` gives: the prompt's own, else the text
        of its first code block (the function a rewrite prompt quotes)."""
        return self.prediction if self.prediction is not None else first_code_block(self.prompt)


def _prompt_file(category: str, directory: Path | None) -> Any:
    if directory is not None:
        return directory / f"{category}.jsonl"
    return resources.files("localspec.bench") / "prompts" / f"{category}.jsonl"


def _check_limit(limit: int | None) -> None:
    if limit is not None and limit < 1:
        raise UsageError(f"invalid --limit {limit}: must be at least 1", "e.g. --limit 3")


def load_prompts(
    categories: Sequence[str] | None = None,
    limit: int | None = None,
    directory: Path | None = None,
) -> list[BenchPrompt]:
    """The prompts of ``categories`` (all by default), at most ``limit`` per category."""
    chosen = list(categories) if categories else list(CATEGORIES)
    known = CATEGORIES + STORE_CATEGORIES + PREDICTION_CATEGORIES
    unknown = [c for c in chosen if c not in known]
    if unknown:
        raise UsageError(
            f"unknown categor{'y' if len(unknown) == 1 else 'ies'}: {', '.join(unknown)}",
            f"choose among {', '.join(known)}",
        )
    _check_limit(limit)
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
            if category in PREDICTION_CATEGORIES:
                made = apply_prompt(parse_line(line, f"{path}, line {n}"), f"{path}, line {n}")
                if made is not None:
                    prompt_id, text, prediction, source = made
                    rows.append(BenchPrompt(category, prompt_id, text, source, prediction, True))
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


def _file_prompt(path: Path, n: int, line: str) -> BenchPrompt:
    """Line ``n`` of a user's prompt file, with the defaults filled in."""
    try:
        row = json.loads(line)
    except ValueError as err:
        raise InputError(f"{path}, line {n}: not JSON ({err})", PROMPT_FILE_HINT) from None
    if not isinstance(row, dict):
        raise InputError(f"{path}, line {n}: not a JSON object", PROMPT_FILE_HINT)
    prompt = row.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise InputError(f'{path}, line {n}: no non-empty string "prompt"', PROMPT_FILE_HINT)
    category = row.get("category", path.stem)
    if not isinstance(category, str) or not category.strip():
        raise InputError(
            f'{path}, line {n}: "category" must be a non-empty string', PROMPT_FILE_HINT
        )
    prediction = row.get("prediction")
    if prediction is not None and not isinstance(prediction, str):
        raise InputError(f'{path}, line {n}: "prediction" must be a string', PROMPT_FILE_HINT)
    return BenchPrompt(
        category=category,
        id=str(row.get("id", f"line-{n}")),
        prompt=prompt,
        source=str(row.get("source", path)),
        prediction=prediction,
    )


def _read_prompt_file(path: Path) -> list[BenchPrompt]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise InputError(
            f"cannot read the prompt file {path}: {err.strerror}", "check the --prompts path"
        ) from None
    except UnicodeDecodeError:
        raise InputError(f"{path} is not UTF-8 text", PROMPT_FILE_HINT) from None
    prompts: list[BenchPrompt] = []
    seen: dict[tuple[str, str], int] = {}
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        prompt = _file_prompt(path, n, line)
        key = (prompt.category, prompt.id)
        if key in seen:  # runs are paired by (category, id): a repeat would mix two prompts
            raise InputError(
                f"{path}, line {n}: id {prompt.id!r} repeats line {seen[key]} "
                f"in category {prompt.category!r}",
                "give every prompt of a category its own id",
            )
        seen[key] = n
        prompts.append(prompt)
    if not prompts:
        raise InputError(f"{path} holds no prompts", PROMPT_FILE_HINT)
    return prompts


def load_prompt_file(
    path: Path, categories: Sequence[str] | None = None, limit: int | None = None
) -> list[BenchPrompt]:
    """A user's own prompts (JSONL), in file order; ``categories`` filters by the file's
    categories, ``limit`` keeps at most that many per category."""
    _check_limit(limit)
    prompts = _read_prompt_file(Path(path))
    present = list(dict.fromkeys(p.category for p in prompts))
    if categories:
        unknown = [c for c in categories if c not in present]
        if unknown:
            raise UsageError(
                f"{path} has no prompts in categor{'y' if len(unknown) == 1 else 'ies'} "
                f"{', '.join(unknown)}",
                f"its categories: {', '.join(present)}",
            )
        prompts = [p for p in prompts if p.category in categories]
    kept: list[BenchPrompt] = []
    counts: dict[str, int] = {}
    for p in prompts:
        counts[p.category] = counts.get(p.category, 0) + 1
        if limit is None or counts[p.category] <= limit:
            kept.append(p)
    return kept


class BenchConfig(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    modes: tuple[str, ...] = ENGINE_MODES
    max_tokens: int = Field(200, ge=1)
    temperature: float = Field(0.0, ge=0.0)
    seed: int | None = None
    raw: bool = False
    warmup: bool = True
    cold: bool = True  # forget what the controllers learned before every engine run
    trace: bool = False  # keep the engine's per-round trace in each record
    # Runs of every prompt and mode; the summary takes each one's median run. One run's tok/s
    # moves by 10% and more with what else the machine does.
    repeat: int = Field(1, ge=1, le=20)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def drafter_mode(mode: str) -> DrafterMode:
    """The engine's drafter mode one of the engine's bench modes runs (auto's variants run
    auto)."""
    return DrafterMode.AUTO if mode in AUTO_MODES else DrafterMode(mode)


def loads_draft_model(mode: str) -> bool:
    """Whether a bench mode runs the draft model when there is one (so it is loaded)."""
    if mode in NATIVE_MODES:
        return mode == NATIVE_DRAFT
    return drafter_mode(mode).loads_draft_model


def parse_modes(text: str) -> tuple[str, ...]:
    """``"none,ngram"`` -> ``("none", "ngram")``; ``none`` is always included, first."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    valid = (
        *ENGINE_MODES, *MORE_ENGINE_MODES, STORE_MODE, CHAINS_MODE, PREDICTION_MODE,
        *NATIVE_MODES,
    )  # fmt: skip
    bad = [m for m in modes if m not in valid]
    if bad or not modes:
        raise UsageError(
            f"invalid --modes {text!r}" + (f": unknown {', '.join(bad)}" if bad else ""),
            f"use a comma-separated list of {', '.join(valid)}",
        )
    # Ratios are paired against `none` on the same prompt, so it is always run.
    return tuple(dict.fromkeys([BASELINE, *modes]))


def run_order(
    prompts: Sequence[BenchPrompt], modes: Sequence[str], offset: int = 0
) -> list[tuple[int, str]]:
    """(prompt index, mode) pairs: all modes per prompt, the order rotating by one per prompt
    (and by ``offset`` more)."""
    order: list[tuple[int, str]] = []
    for i in range(len(prompts)):
        shift = (i + offset) % len(modes)
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
        for mode in config.modes:
            engine = mode not in NATIVE_MODES
            if engine and drafter_mode(mode).needs_draft_model and session.draft is None:
                raise UsageError(f"mode {mode} needs a draft model", "drop it from --modes")
        if SELF_MODE in config.modes and session.decoder.draft_name != SELF_MODE:
            raise UsageError(
                f"mode {SELF_MODE} drafts with a draft derived from the target",
                "pass --draft self (auto and model then draft with it too)",
            )
        if STORE_MODE in config.modes and not session.store_corpora:
            raise UsageError(
                f"mode {STORE_MODE} needs a datastore",
                "pass --store NAME (see localspec datastore list), or drop it from --modes",
            )

    def _params(
        self, mode: str, max_tokens: int, index: int, prediction: Sequence[int] = ()
    ) -> GenerationParams:
        seed = None if self.config.seed is None else self.config.seed + index
        return GenerationParams(
            max_tokens=max_tokens,
            temperature=self.config.temperature,
            seed=seed,
            drafter=drafter_mode(mode),
            trace=self.config.trace,
            trees=mode != CHAINS_MODE,
            prediction=tuple(prediction) if mode == PREDICTION_MODE else (),
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

    def run_engine(
        self,
        tokens: list[int],
        mode: str,
        max_tokens: int,
        index: int,
        prediction: Sequence[int] = (),
    ) -> Record:
        for model in self._models():
            model.reset()  # a fresh context: nothing carried over from the previous run
        if self.config.cold:
            self.session.forget_learning()  # nothing learned from earlier prompts or runs
        self.session.use_stores(mode == STORE_MODE)
        marks: dict[str, float | None] = {}
        plain: list[float] = []  # seconds of each plain step: the machine's speed in this run

        def on_event(event: object) -> None:
            if isinstance(event, PrefillDone):  # decode compute starts counting here
                marks["start"] = self._compute_seconds()
            elif isinstance(event, RoundCompleted) and event.drafted == 0:
                plain.append(event.verify_seconds)

        params = self._params(mode, max_tokens, index, prediction)
        finished = run_to_completion(self.session.generate(tokens, params), on_event)
        stats = finished.stats
        start, end = marks.get("start"), self._compute_seconds()
        compute = None if start is None or end is None else end - start
        shown = stats.to_dict()  # the record is JSON: the stats' figures as serialised
        record: Record = {
            "engine": "localspec",
            "finish_reason": finished.reason.value,
            **{name: shown[name] for name in RECORD_STATS if name in shown},
            "compute_s": None if compute is None else round(compute, 6),
            "outside_share": (
                None
                if compute is None or stats.decode_s <= 0
                else round(1 - compute / stats.decode_s, 4)
            ),
            "plain_steps": len(plain),
            "plain_step_s": round(statistics.fmean(plain), 6) if plain else None,
            "token_ids": list(finished.token_ids),
        }
        if not stats.drafted:
            record["acceptance_rate"] = None  # nothing drafted: no rate, rather than 0%
        return record

    def _native_result(self, tokens: list[int], mode: str, max_tokens: int, index: int) -> Any:
        if mode == NATIVE_BENCH:  # no text: generation after as many tokens as the prompt's
            return self.native.run_bench(len(tokens), max_tokens)
        seed = None if self.config.seed is None else self.config.seed + index
        return self.native.run(
            mode, self.native.prompt_text(tokens), max_tokens, self.config.temperature, seed
        )

    def run_native(self, tokens: list[int], mode: str, max_tokens: int, index: int) -> Record:
        result = self._native_result(tokens, mode, max_tokens, index)
        # The binary re-tokenizes the text: a different count means it saw another prompt.
        record = {
            "engine": "llama.cpp",
            **result.to_record(),
            "same_prompt_tokens": result.prompt_tokens == len(tokens),
        }
        if result.generated_tokens > max_tokens:  # it stops only after passing -n
            record["overshoot"] = result.generated_tokens - max_tokens
        return record

    def run_one(
        self,
        tokens: list[int],
        mode: str,
        max_tokens: int,
        index: int,
        prediction: Sequence[int] = (),
    ) -> Record:
        if mode in NATIVE_MODES:
            return self.run_native(tokens, mode, max_tokens, index)
        return self.run_engine(tokens, mode, max_tokens, index, prediction)

    def _prediction(self, prompt: BenchPrompt) -> list[int]:
        """The tokens of the prediction mode ``auto-prediction`` gives ``prompt`` (which
        also bounds an answer that rewrites it)."""
        text = prompt.predicted()
        return self.session.plain_tokens(text) if text else []

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
        predictions = [self._prediction(p) for p in prompts]
        lengths = [
            len(predicted) + ANSWER_SLACK if p.answer_like_prediction else self.config.max_tokens
            for p, predicted in zip(prompts, predictions, strict=True)
        ]
        if self.config.warmup and prompts:
            self.warm_up(tokenized[0])
        # Each repeat is a whole interleaved pass, its modes rotated once more, so slow
        # stretches of the machine fall on every mode alike.
        order = [
            (rep, i, mode)
            for rep in range(self.config.repeat)
            for i, mode in run_order(prompts, self.config.modes, rep)
        ]
        records: list[Record] = []
        for seq, (rep, i, mode) in enumerate(order):
            prompt = prompts[i]
            record = {
                "category": prompt.category,
                "prompt_id": prompt.id,
                "mode": mode,
                "run": seq,
                "repeat": rep,
                "time": round(time.time(), 3),
                **self.run_one(tokenized[i], mode, lengths[i], i, predictions[i]),
            }
            records.append(record)
            if on_record is not None:
                on_record(record, seq + 1, len(order))
        return records


def ceiling_batches(n_ctx: int, context_tokens: int) -> list[int]:
    """The batch sizes ``measure_ceiling`` times: ``CEILING_BATCHES`` capped at the room the
    sample context leaves."""
    room = max(1, n_ctx - context_tokens)
    return list(dict.fromkeys(min(b, room) for b in CEILING_BATCHES))


def measure_ceiling(model: Any, context: Sequence[int], reps: int = 3) -> dict[str, Any]:
    """The target's best throughput over batches of 16, 32 and 64 tokens with logits for
    every position (each the fastest of ``reps`` after a warm-up), vs a plain step.

    This bounds any lossless speculative method on this machine: no round can emit more
    than the batch it verified, and no batch worth verifying is cheaper per token than the
    best one here. ``batch`` is the size that gave the best tokens/s; ``by_batch`` lists all.
    """
    base = list(context)[: max(1, min(CEILING_CONTEXT, model.n_ctx - CEILING_BATCHES[0]))]
    sizes = ceiling_batches(model.n_ctx, len(base))
    extra = (base * (max(sizes) // len(base) + 2))[: max(sizes)]

    def timed(n: int) -> float:
        model.forward(base, 0)
        t0 = time.perf_counter()
        model.forward(base + extra[:n], n)
        return time.perf_counter() - t0

    def fastest(n: int) -> float:
        timed(n)  # warm-up
        return min(timed(n) for _ in range(reps))

    timings = [(size, fastest(size)) for size in sizes]
    plain_s = fastest(1)
    model.reset()
    batch, batch_s = max(timings, key=lambda t: t[0] / t[1])
    return {
        "batch": batch,
        "batch_s": round(batch_s, 6),
        "tokens_per_s": round(batch / batch_s, 3),
        "plain_tokens_per_s": round(1 / plain_s, 3),
        "ceiling_ratio": round(batch * plain_s / batch_s, 3),
        "by_batch": [
            {"batch": n, "batch_s": round(s, 6), "tokens_per_s": round(n / s, 3)}
            for n, s in timings
        ],
    }


# -- summary -------------------------------------------------------------------------------


def geometric_mean(values: Iterable[float]) -> float | None:
    vals = [v for v in values if v > 0]
    return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else None


Key = tuple[str, str]


def _key(record: Record) -> Key:
    return record["category"], record["prompt_id"]  # ids are unique within a category


@dataclass(frozen=True)
class _References:
    """Per prompt, the runs others are compared with."""

    baseline: dict[Key, Record]  # localspec's `none`
    best_native: dict[Key, Record]  # the fastest of the NATIVE_SPEC_MODES
    native_none: dict[Key, Record]
    native_bench: dict[Key, Record]


def _references(records: list[Record]) -> _References:
    best: dict[Key, Record] = {}
    for r in records:
        if r["mode"] in NATIVE_SPEC_MODES:
            held = best.get(_key(r))
            if held is None or r["decode_tokens_per_s"] > held["decode_tokens_per_s"]:
                best[_key(r)] = r
    return _References(
        baseline={_key(r): r for r in records if r["mode"] == BASELINE},
        best_native=best,
        native_none={_key(r): r for r in records if r["mode"] == NATIVE_PLAIN},
        native_bench={_key(r): r for r in records if r["mode"] == NATIVE_BENCH},
    )


def paired_runs(
    records: list[Record], reference: dict[Key, Record]
) -> tuple[list[tuple[Record, Record]], int]:
    """Each record with the reference run of the same prompt, and how many pairs were left
    out because one of the two runs is shorter than ``MIN_RATIO_TOKENS`` (too few tokens
    for a steady rate) or the reference has no rate."""
    pairs: list[tuple[Record, Record]] = []
    short = 0
    for r in records:
        ref = reference.get(_key(r))
        if ref is None:
            continue
        if min(r["generated_tokens"], ref["generated_tokens"]) < MIN_RATIO_TOKENS:
            short += 1
        elif ref["decode_tokens_per_s"] > 0:
            pairs.append((r, ref))
    return pairs, short


def _ratio(r: Record, ref: Record) -> float:
    return r["decode_tokens_per_s"] / ref["decode_tokens_per_s"]


def paired_ratios(records: list[Record], reference: dict[Key, Record]) -> tuple[list[float], int]:
    """Per-prompt tok/s ratios of ``records`` to the reference run of the same prompt, and
    how many pairs ``paired_runs`` left out as short."""
    pairs, short = paired_runs(records, reference)
    return [_ratio(r, ref) for r, ref in pairs], short


def _steady(r: Record, ref: Record) -> float | None:
    """The ratio of ``r`` to ``ref`` with each run timed by its own clock: its tok/s times
    the mean time of its own plain steps. A machine that ran slower during one of the two
    runs (another program, a busy host) slows its plain steps and its verify batches
    alike, so this leaves what the mode's choices did. None unless both runs took at least
    ``MIN_PLAIN_STEPS`` plain steps (a run that speculates nearly every round has no clock
    of its own)."""
    if min(r.get("plain_steps") or 0, ref.get("plain_steps") or 0) < MIN_PLAIN_STEPS:
        return None
    return _ratio(r, ref) * r["plain_step_s"] / ref["plain_step_s"]


def _lowest(pairs: list[tuple[Key, float]]) -> dict[str, Any] | None:
    if not pairs:
        return None
    (category, prompt), ratio = min(pairs, key=lambda p: p[1])
    return {"category": category, "prompt_id": prompt, "ratio": round(ratio, 4)}


def _per_prompt(records: list[Record], baseline: dict[Key, Record]) -> dict[str, Any]:
    """A speculative mode's worst prompt against ``none``, as measured and as its own
    clock sees it (``_steady``), and the geometric mean of the steady ratios."""
    pairs, _ = paired_runs(records, baseline)
    raw = [(_key(r), _ratio(r, ref)) for r, ref in pairs]
    steady = [(_key(r), x) for r, ref in pairs if (x := _steady(r, ref)) is not None]
    return {
        "lowest_ratio_to_none": _lowest(raw),
        "steady_ratio_to_none": _round(geometric_mean(x for _, x in steady), 4),
        "steady_prompts": len(steady),
        "lowest_steady_ratio_to_none": _lowest(steady),
    }


def _agreement(pairs: list[tuple[list[int], list[int]]]) -> dict[str, float]:
    return {
        "identical": round(sum(a == b for a, b in pairs) / len(pairs), 4),
        "mean_common_prefix": round(
            sum(common_prefix_length(a, b) for a, b in pairs) / len(pairs), 2
        ),
        "mean_baseline_length": round(sum(len(b) for _, b in pairs) / len(pairs), 2),
    }


def _ratio_to(records: list[Record], reference: dict[Key, Record]) -> float | None:
    return _round(geometric_mean(paired_ratios(records, reference)[0]), 4)


def _native_ratios(mode: str, records: list[Record], refs: _References) -> dict[str, Any]:
    """A mode against llama.cpp, for the references that ran: the engine's modes against
    the best speculative native run; ``none`` against llama.cpp's plain decoding in
    llama-speculative-simple (native-none) and in llama-bench (native-bench); the native
    speculative modes against native-none (their speedup in llama.cpp's own terms), and
    native-none against native-bench (what the example's loop costs over bare decoding)."""
    out: dict[str, Any] = {}
    engine = mode in ENGINE_MODES or mode in MORE_ENGINE_MODES or mode in AUTO_MODES
    if engine and refs.best_native:
        out["ratio_to_best_native"] = _ratio_to(records, refs.best_native)
    if (mode == BASELINE or mode in NATIVE_SPEC_MODES) and refs.native_none:
        out["ratio_to_native_none"] = _ratio_to(records, refs.native_none)
    if mode in (BASELINE, NATIVE_PLAIN) and refs.native_bench:
        out["ratio_to_native_bench"] = _ratio_to(records, refs.native_bench)
    return out


def _group(mode: str, records: list[Record], refs: _References, greedy: bool) -> dict[str, Any]:
    tokens = sum(r["generated_tokens"] for r in records)
    decode = sum(r["decode_s"] for r in records)
    drafted = sum(r.get("drafted") or 0 for r in records)
    accepted = sum(r.get("accepted") or 0 for r in records)
    with_rounds = [r for r in records if r.get("rounds")]
    with_compute = [r for r in records if r.get("compute_s") is not None]
    ratios, short = paired_ratios(records, refs.baseline)
    rounds = sum(r["rounds"] for r in with_rounds)
    compute_decode = sum(r["decode_s"] for r in with_compute)
    compute = sum(r["compute_s"] for r in with_compute)
    out: dict[str, Any] = {
        "prompts": len(records),
        "generated_tokens": tokens,
        "mean_tokens": round(tokens / len(records), 2),
        "decode_s": round(decode, 6),
        "decode_tokens_per_s": _round(tokens / decode if decode else None, 3),
        "ratio_to_none": _round(geometric_mean(ratios), 4),
        "short_runs": short,
        **_native_ratios(mode, records, refs),
        "acceptance_rate": _round(accepted / drafted if drafted else None, 4),
        "mean_accepted_length": _round(
            1 + sum(r["accepted"] for r in with_rounds) / rounds if rounds else None, 4
        ),
        "outside_share": _round(1 - compute / compute_decode if compute_decode else None, 4),
        "agreement": None,
    }
    if mode != BASELINE and mode not in NATIVE_MODES and refs.baseline:
        out.update(_per_prompt(records, refs.baseline))
    pairs = [
        (r["token_ids"], refs.baseline[_key(r)]["token_ids"])
        for r in records
        if _key(r) in refs.baseline and r.get("token_ids") is not None
    ]
    if greedy and pairs:
        out["agreement"] = _agreement(pairs)
    return out


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def overshoots(records: list[Record]) -> list[dict[str, Any]]:
    """The runs that wrote more tokens than asked, in run order."""
    return [
        {
            "mode": r["mode"],
            "category": r["category"],
            "prompt_id": r["prompt_id"],
            "generated_tokens": r["generated_tokens"],
            "overshoot": r["overshoot"],
        }
        for r in records
        if r.get("overshoot")
    ]


def median_runs(records: list[Record]) -> list[Record]:
    """One record per prompt and mode: of repeated runs, the one with the median tok/s (the
    lower of the two middle ones for an even count), so every figure comes from one real run."""
    runs: dict[tuple[str, str, str], list[Record]] = {}
    for r in records:
        runs.setdefault((*_key(r), r["mode"]), []).append(r)
    chosen = []
    for same in runs.values():  # in the order of each one's first run
        ranked = sorted(same, key=lambda r: r["decode_tokens_per_s"])
        chosen.append(ranked[(len(ranked) - 1) // 2])
    return chosen


def summarize(records: list[Record], modes: Sequence[str], greedy: bool) -> dict[str, Any]:
    """Per category and overall, per mode; ratios are paired with ``none`` per prompt.
    Repeated runs count once each, by their median run (``median_runs``)."""
    records = median_runs(records)
    refs = _references(records)
    categories = list(dict.fromkeys(r["category"] for r in records))
    by_cat: dict[str, dict[str, Any]] = {}
    for cat in categories:
        runs = [r for r in records if r["category"] == cat]
        by_cat[cat] = {
            mode: _group(mode, mine, refs, greedy)
            for mode in modes
            if (mine := [r for r in runs if r["mode"] == mode])
        }
    overall = {
        mode: _group(mode, mine, refs, greedy)
        for mode in modes
        if (mine := [r for r in records if r["mode"] == mode])
    }
    return {"categories": by_cat, "overall": overall, "overshoot": overshoots(records)}
