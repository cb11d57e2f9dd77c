"""Running the bench: every prompt in every mode through a loaded session, and the ceiling.

``BenchRunner.run`` drives a loaded ``Session``:

- ``auto-store`` is ``auto`` with the session's datastores, ``auto-chains`` is ``auto``
  without draft trees (single chains only) and ``auto-without-DRAFTER`` is ``auto`` with that
  drafter left out, so each runs beside ``auto``; ``auto-again`` asks each question again in
  a fresh process (``fresh.py``) and needs ``--fresh``;
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

Each run yields one record (see ``records.py``) with the stats vocabulary of ``stats.py``
plus ``outside_share``: the part of the decode time spent outside llama.cpp
(``1 - compute/decode``, compute being the models' ``compute_seconds`` accumulated during
decoding), ``plain_steps`` and ``plain_step_s`` (how many plain steps the run took, and their
mean seconds: the machine's speed during that run), and with ``trace`` (the engine's
per-round list) when the config asks for it. ``BenchRunner.ceilings`` measures the target's
ceiling (``ceiling.py``) per category at the depth where that category's answers run. No
printing here.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field

from localspec.backend.native import NativeResult, NativeRunner
from localspec.bench.ceiling import measure_ceiling
from localspec.bench.constrained import Constraint, answer_valid
from localspec.bench.fresh import FreshPrompt, FreshRunner, check_modes
from localspec.bench.modes import (
    CHAINS_MODE,
    ENGINE_MODES,
    NATIVE_BENCH,
    PREDICTION_MODE,
    STORE_MODE,
    BenchMode,
)
from localspec.bench.prompts import BenchPrompt
from localspec.bench.records import ENGINE, NATIVE_ENGINE, RunRecord
from localspec.core.engine import run_to_completion
from localspec.core.events import PrefillDone, RoundCompleted, TokenEmitted
from localspec.core.params import GenerationParams
from localspec.core.preflight import PairFacts, check_drafter
from localspec.errors import MissingDraftError, UsageError
from localspec.options.bench import BenchChoice
from localspec.session.session import Session

WARMUP_TOKENS = 16
ANSWER_SLACK = 64  # tokens past its prediction's length an answer that rewrites it may write

# The fields of the stats' JSON (``GenerationStats.to_dict``) an engine run's record carries
# (``trace`` only when the run kept one).
RECORD_STATS = (
    "prompt_tokens", "generated_tokens", "decode_s", "decode_tokens_per_s", "prefill_s",
    "drafted", "accepted", "rounds", "acceptance_rate", "mean_accepted_length", "by_drafter",
    "tokens_by_origin", "trace",
)  # fmt: skip
Measured = dict[str, Any]  # a run's RunRecord fields other than the prompt's and its place
# Per prompt: its tokens, its prediction's tokens, and the most tokens its answer may have.
_Prepared = tuple[list[list[int]], list[list[int]], list[int]]


class BenchConfig(BaseModel):
    """How the bench runs: its modes, the generation settings, and its protocol."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    modes: tuple[BenchMode, ...] = ENGINE_MODES
    max_tokens: int = Field(200, ge=1)
    temperature: float = Field(0.0, ge=0.0)
    seed: int | None = None
    raw: bool = False
    warmup: bool = True
    cold: bool = True  # forget what the controllers learned before every engine run
    fresh: bool = False  # every engine run a fresh ``localspec complete`` process
    trace: bool = False  # keep the engine's per-round trace in each record
    # Runs of every prompt and mode; the summary takes each one's median run, since one run's
    # tok/s moves with what else the machine does (docs/bench.md#localspec-bench).
    repeat: int = Field(1, ge=1, le=20)

    @classmethod
    def of(cls, bench: BenchChoice, modes: tuple[BenchMode, ...]) -> Self:
        """The settings the command's options give, each field read from the option of its
        name; a bad value is pydantic's ``ValidationError``."""
        given = {name: getattr(bench, name) for name in cls.model_fields if name != "modes"}
        return cls(modes=modes, **given)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def run_order(
    prompts: Sequence[BenchPrompt], modes: Sequence[BenchMode], offset: int = 0
) -> list[tuple[int, BenchMode]]:
    """(prompt index, mode) pairs: all modes per prompt, the order rotating by one per prompt
    (and by ``offset`` more)."""
    order: list[tuple[int, BenchMode]] = []
    for i in range(len(prompts)):
        shift = (i + offset) % len(modes)
        order.extend((i, m) for m in [*modes[shift:], *modes[:shift]])
    return order


def _check_mode(pair: PairFacts, mode: BenchMode) -> None:
    """The session's preflight of a mode's drafter (``check_drafter``), in the bench's
    words: each mode is checked once, before any prompt runs."""
    try:
        check_drafter(pair, mode.drafter)
    except MissingDraftError as error:
        if error.derived:
            message = f"mode {mode} drafts with a draft derived from the target"
            hint = "pass --draft self (auto and model then draft with it too)"
            raise error.reworded(message, hint) from None
        message = f"mode {mode} needs a draft model"
        raise error.reworded(message, "drop it from --modes") from None


class BenchRunner:
    """Runs prompts through a session (and optionally the native binary); yields records."""

    def __init__(
        self,
        session: Session,
        config: BenchConfig,
        native: NativeRunner | None = None,
        fresh: FreshRunner | None = None,
        load_s: float | None = None,
    ) -> None:
        """``fresh``: runs the engine modes as fresh processes (``--fresh``); ``load_s``:
        how long opening ``session`` took, kept in the records of in-process runs."""
        self.session = session
        self.config = config
        self.native = native
        self.fresh = fresh
        self.load_s = load_s
        if any(m.is_native for m in config.modes) and native is None:
            raise UsageError("native modes need the llama.cpp binary", "pass --native-bin PATH")
        for mode in config.modes:
            if not mode.is_native:
                _check_mode(session.facts, mode)
        check_modes(config.modes, fresh=fresh is not None)
        if STORE_MODE in config.modes and not session.store_corpora:
            raise UsageError(
                f"mode {STORE_MODE} needs a datastore",
                "pass --store NAME (see localspec datastore list), or drop it from --modes",
            )

    def _params(
        self, mode: BenchMode | str, max_tokens: int, index: int, prediction: Sequence[int] = ()
    ) -> GenerationParams:
        mode = BenchMode(mode)
        seed = None if self.config.seed is None else self.config.seed + index
        return GenerationParams(
            max_tokens=max_tokens,
            temperature=self.config.temperature,
            seed=seed,
            drafter=mode.drafter,
            trace=self.config.trace,
            trees=mode != CHAINS_MODE,
            prediction=tuple(prediction) if mode == PREDICTION_MODE else (),
            left_out=(mode.left_out,) if mode.left_out else (),
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
        mode: BenchMode | str,
        max_tokens: int,
        index: int,
        prediction: Sequence[int] = (),
        constrained: Constraint | None = None,
    ) -> Measured:
        """One run of the engine from a fresh context (under ``constrained``'s grammar, when
        given): its record's measured fields."""
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
            elif isinstance(event, TokenEmitted) and "first" not in marks:
                marks["first"] = time.perf_counter() - began

        params = self._params(mode, max_tokens, index, prediction)
        began = time.perf_counter()
        grammar = constrained.grammar if constrained is not None else None
        events = self.session.generate(tokens, params, grammar=grammar)
        finished = run_to_completion(events, on_event)
        wall = time.perf_counter() - began
        stats = finished.stats
        start, end = marks.get("start"), self._compute_seconds()
        compute = None if start is None or end is None else end - start
        shown = stats.to_dict()  # the record is JSON: the stats' figures as serialised
        record: Measured = {
            "engine": ENGINE,
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
            "wall_s": round(wall, 4),
            "first_token_s": _rounded(marks.get("first")),
            "load_s": _rounded(self.load_s),
            "fresh": False,
        }
        if constrained is not None:
            record["answer_valid"] = answer_valid(constrained, finished.text)
        if not stats.drafted:
            record["acceptance_rate"] = None  # nothing drafted: no rate, rather than 0%
        return record

    def _native_result(
        self, tokens: list[int], mode: str, max_tokens: int, index: int, grammar: str | None
    ) -> NativeResult:
        native = self.native
        assert native is not None  # the runner refuses native modes without the binary
        if mode == NATIVE_BENCH:  # no text: generation after as many tokens as the prompt's
            return native.run_bench(len(tokens), max_tokens)
        seed = None if self.config.seed is None else self.config.seed + index
        text = native.prompt_text(tokens)
        return native.run(mode, text, max_tokens, self.config.temperature, seed, grammar)

    def run_native(
        self, tokens: list[int], mode: str, max_tokens: int, index: int, grammar: str | None = None
    ) -> Measured:
        """One run of llama.cpp's binaries (under ``grammar``, GBNF, when given): its
        record's measured fields."""
        result = self._native_result(tokens, mode, max_tokens, index, grammar)
        # The binary re-tokenizes the text: a different count means it saw another prompt.
        record = {
            "engine": NATIVE_ENGINE,
            **{name: value for name, value in result.to_record().items() if name != "mode"},
            "same_prompt_tokens": result.prompt_tokens == len(tokens),
        }
        if result.generated_tokens > max_tokens:  # it stops only after passing -n
            record["overshoot"] = result.generated_tokens - max_tokens
        return record

    def run_one(
        self,
        tokens: list[int],
        mode: BenchMode | str,
        max_tokens: int,
        index: int,
        prediction: Sequence[int] = (),
        prompt: BenchPrompt | None = None,
    ) -> Measured:
        """``prompt``: the text ``tokens`` were made from, which a fresh process reads."""
        mode = BenchMode(mode)
        constrained = prompt.constraint if prompt is not None else None
        if mode.is_native:
            grammar = constrained.grammar if constrained is not None else None
            return self.run_native(tokens, mode, max_tokens, index, grammar)
        if self.fresh is not None and prompt is not None:
            seed = None if self.config.seed is None else self.config.seed + index
            return self.fresh.run(
                self._fresh_prompt(prompt, tokens),
                mode,
                max_tokens,
                self.config.temperature,
                seed,
                prompt.predicted() or "",
                prompt.first,
            )
        return self.run_engine(tokens, mode, max_tokens, index, prediction, constrained)

    def _fresh_prompt(self, prompt: BenchPrompt, tokens: list[int]) -> FreshPrompt:
        """What a fresh process is given: the prompt's text, or where tools are shown
        through the chat template (which ``complete`` does not take), the text of its
        tokens with the template's control tokens spelled out, sent raw."""
        constrained = prompt.constraint
        if constrained is None or not constrained.tools:
            return FreshPrompt(prompt.prompt, constrained)
        return FreshPrompt(spelled_text(self.session.target, tokens), constrained, raw=True)

    def _prediction(self, prompt: BenchPrompt) -> list[int]:
        """The tokens of the prediction mode ``auto-prediction`` gives ``prompt`` (which
        also bounds an answer that rewrites it)."""
        text = prompt.predicted()
        return self.session.plain_tokens(text) if text else []

    def warm_up(self, tokens: list[int], prompt: BenchPrompt | None = None) -> None:
        """One short run per mode: first calls allocate buffers and pick kernels (and a
        fresh process's files are read into the page cache)."""
        for mode in self.config.modes:
            length = min(WARMUP_TOKENS, self.config.max_tokens)
            self.run_one(tokens, mode, length, 0, prompt=prompt)

    def _tokens(self, prompt: BenchPrompt) -> list[int]:
        """The prompt's tokens: through the chat template (unless raw), with the functions a
        tool prompt offers shown in it."""
        tools = prompt.constraint.tools if prompt.constraint is not None else ()
        if not tools:
            return self.session.text_tokens(prompt.prompt, raw=self.config.raw)
        if self.config.raw:
            raise UsageError(
                f"{prompt.category}/{prompt.id} offers tools, which the chat template shows "
                "the model, and --raw sends prompts without it",
                "drop --raw, or the prompts with tools",
            )
        return self.session.chat_tokens(
            [{"role": "user", "content": prompt.prompt}], tools=list(tools)
        )

    def _prepared(self, prompts: Sequence[BenchPrompt]) -> _Prepared:
        tokenized = [self._tokens(p) for p in prompts]
        predictions = [self._prediction(p) for p in prompts]
        lengths = [
            len(predicted) + ANSWER_SLACK if p.answer_like_prediction else self.config.max_tokens
            for p, predicted in zip(prompts, predictions, strict=True)
        ]
        return tokenized, predictions, lengths

    def ceilings(self, prompts: Sequence[BenchPrompt]) -> dict[str, dict[str, Any]]:
        """Per category, the target's ceiling (``measure_ceiling``) at the depth where its
        answers run: the median, over its prompts, of the prompt's tokens and half the
        answer it may write. A verify batch costs more the deeper it reads, and more so than
        a plain step, so a ceiling measured after a short context overstates what a
        whole-file edit could reach (measured: docs/bench.md#the-ceiling)."""
        tokenized, _, lengths = self._prepared(prompts)
        by_category: dict[str, list[int]] = {}
        for i, prompt in enumerate(prompts):
            by_category.setdefault(prompt.category, []).append(i)
        out: dict[str, dict[str, Any]] = {}
        for category, members in by_category.items():
            depth = int(statistics.median(len(tokenized[i]) + lengths[i] // 2 for i in members))
            out[category] = measure_ceiling(self.session.target, tokenized[members[0]], depth)
        return out

    def run(
        self,
        prompts: Sequence[BenchPrompt],
        on_record: Callable[[RunRecord, int, int], None] | None = None,
    ) -> list[RunRecord]:
        """Run every prompt in every mode; ``on_record(record, done, total)`` after each."""
        tokenized, predictions, lengths = self._prepared(prompts)
        if self.config.warmup and prompts:
            self.warm_up(tokenized[0], prompts[0])
        # Each repeat is a whole interleaved pass, its modes rotated once more, so slow
        # stretches of the machine fall on every mode alike.
        order = [
            (rep, i, mode)
            for rep in range(self.config.repeat)
            for i, mode in run_order(prompts, self.config.modes, rep)
        ]
        records: list[RunRecord] = []
        for seq, (rep, i, mode) in enumerate(order):
            prompt = prompts[i]
            started = round(time.time(), 3)
            record = RunRecord(
                category=prompt.category,
                prompt_id=prompt.id,
                mode=mode,
                run=seq,
                repeat=rep,
                time=started,
                **self.run_one(tokenized[i], mode, lengths[i], i, predictions[i], prompt),
            )
            records.append(record)
            if on_record is not None:
                on_record(record, seq + 1, len(order))
        return records


def spelled_text(model: Any, tokens: Sequence[int]) -> str:
    """Tokens back to text with their control tokens spelled out (a BOS the tokenizer adds
    left out), as a process that tokenizes with control tokens parsed reads it back."""
    info = model.vocab_info()
    if info.add_bos and tokens and tokens[0] == info.bos:
        tokens = tokens[1:]  # the reader's tokenizer adds it again
    data = b"".join(model.token_bytes(t, special=True) for t in tokens)
    return data.decode("utf-8", errors="replace")


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 4)
