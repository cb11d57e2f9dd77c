"""Engine runs as a user runs them: one fresh ``localspec complete --json`` process per run.

``FreshRunner.run`` starts ``python -m localspec complete --json`` with the prompt on stdin
and the bench's pair and settings as options (the RPC workers included), times the process
from its start to its exit (``wall_s``), reads the wall-clock time of its first token from
its ``timing`` to give the time to first token from the process's start (``first_token_s``,
interpreter start and imports included), and its own ``load_s`` (opening the session:
resolving, loading, costs). The rest of its record is the child's stats, as an in-process
run records them; its ``outside_share`` is the stats' overhead (the decode time outside the
models' evaluations) over its decode time.

The processes share a private home (``private_home``): this machine's calibration copied in,
so none measures it again, and nothing else of the user's: no history, no datastores, no
learned state. Cold (the default) empties the learned state before every run, as a first
``localspec complete`` on a machine meets it; warm lets each process start from what the
previous one saved, as a user's successive calls do. No process restores a prompt another
saved (``--no-prompt-cache``) but in mode ``auto-warm``, which runs two processes with the
prompt cache on and emptied before the first: the second, recorded, restores the prompt the
first evaluated (its ``restored_tokens``). Mode ``auto-again`` runs two processes
with the history on, emptied before the first: the first answers the prompt's ``first``
question (else the prompt itself), the second, recorded, asks the prompt, so the history
drafts from the first answer; ``same_as_first`` says whether the two answers to the same
question are the same, token for token. A ``FreshPrompt`` may carry a constraint (its grammar
passed as ``--grammar``; the record says whether the answer is valid) and be raw text
(``--raw --parse-special``: a prompt already through the chat template, tools and all).

``check_modes`` refuses, before anything loads, the modes the chosen runner cannot run.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from localspec.bench.constrained import Constraint, answer_valid
from localspec.bench.modes import (
    AGAIN_MODE,
    CHAINS_MODE,
    PREDICTION_MODE,
    SELF_MODE,
    STORE_MODE,
    TWICE_MODES,
    WARM_MODE,
    BenchMode,
)
from localspec.bench.records import ENGINE
from localspec.errors import BackendError, UsageError
from localspec.models.paths import ENV_HOME, cache_root, prompt_cache_dir
from localspec.session.pair import ModelOptions
from localspec.storage.library import HISTORY, HISTORY_ENV, datastores_dir

# Modes a fresh process cannot run as the bench does: they need the user's stores or
# derived drafts, which the private home does not hold.
NOT_FRESH = (STORE_MODE, SELF_MODE)
TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class FreshPrompt:
    """What a fresh process reads: the text, what its answer must match, and whether the
    text is sent raw with its control tokens parsed."""

    text: str
    constraint: Constraint | None = None
    raw: bool = False


def check_modes(modes: Sequence[BenchMode], *, fresh: bool) -> None:
    """Refuse what the runner cannot run: with ``fresh``, modes that need the user's stores
    or derived drafts and ``auto-without-DRAFTER`` (``complete`` drafts with every drafter
    of auto); without, ``auto-again`` and ``auto-warm`` (each asks its question again in
    another process)."""
    if not fresh:
        twice = [m for m in TWICE_MODES if m in modes]
        if twice:
            raise UsageError(
                f"mode {twice[0]} asks each question again in a fresh process",
                "add --fresh",
            )
        return
    refused = [m for m in map(BenchMode, modes) if m in NOT_FRESH or m.left_out is not None]
    if refused:
        raise UsageError(
            f"--fresh runs each mode as a new localspec complete process, which cannot "
            f"run {', '.join(refused)} here",
            "drop them from --modes, or run without --fresh",
        )


def private_home(directory: Path) -> Path:
    """A localspec home under ``directory`` with this machine's calibration copied in."""
    home = directory / "home"
    home.mkdir()
    calibration = cache_root() / "calibration"
    if calibration.is_dir():
        shutil.copytree(calibration, home / "calibration")
    return home


def _layers(value: int | None) -> list[str]:
    return [] if value is None else ["all" if value == -1 else str(value)]


def pair_flags(pair: ModelOptions, target: Path, draft: Path | None) -> list[str]:
    """``complete``'s options for the bench's pair, as loaded."""
    flags = ["--target", str(target), "--ctx", str(pair.n_ctx)]
    if draft is not None:
        flags += ["--draft", str(draft)]
    if pair.threads:
        flags += ["--threads", str(pair.threads)]
    if layers := _layers(pair.n_gpu_layers):
        flags += ["--gpu-layers", *layers]
    if layers := _layers(pair.draft_gpu_layers):
        flags += ["--draft-gpu-layers", *layers]
    if pair.rpc:
        flags += ["--rpc", ",".join(pair.rpc), "--rpc-timeout", str(pair.rpc_timeout)]
    if pair.rpc_split:
        flags += ["--rpc-split", ",".join(map(str, pair.rpc_split))]
    if pair.exact:
        flags.append("--exact")
    return flags


class FreshRunner:
    """Runs engine modes as fresh ``complete`` processes; see the module docstring."""

    def __init__(
        self,
        pair: ModelOptions,
        target: Path,
        draft: Path | None,
        *,
        cold: bool = True,
        raw: bool = False,
        trace: bool = False,
    ) -> None:
        self.flags = pair_flags(pair, target, draft)
        self.cold, self.raw, self.trace = cold, raw, trace
        self._tmp = tempfile.TemporaryDirectory(prefix="localspec-fresh-")
        self.home = private_home(Path(self._tmp.name))

    def command(
        self,
        mode: BenchMode,
        max_tokens: int,
        temperature: float,
        seed: int | None,
        prediction: Path | None,
        grammar: Path | None = None,
        raw: bool = False,
    ) -> list[str]:
        # Each mode evaluates its prompt as a first run does: none restores what another
        # mode's process saved of the same prompt.
        cmd = [sys.executable, "-m", "localspec", "complete", "--json"]
        if mode != WARM_MODE:
            cmd.append("--no-prompt-cache")
        if mode != AGAIN_MODE:  # the history keeps no answer of the others
            cmd.append("--no-history")
        cmd += ["--drafter", mode.drafter.value, "--max-tokens", str(max_tokens)]
        cmd += ["--temperature", str(temperature), *self.flags]
        if seed is not None:
            cmd += ["--seed", str(seed)]
        if self.raw or raw:
            cmd.append("--raw")
        if raw:
            cmd.append("--parse-special")
        if grammar is not None:
            cmd += ["--grammar", str(grammar)]
        if mode == CHAINS_MODE:
            cmd.append("--no-trees")
        if mode == PREDICTION_MODE and prediction is not None:
            cmd += ["--prediction", str(prediction)]
        # Always traced: its plain steps' times are the run's own clock (``plain_step_s``).
        return [*cmd, "--trace"]

    def run(
        self,
        prompt: str | FreshPrompt,
        mode: BenchMode,
        max_tokens: int,
        temperature: float,
        seed: int | None,
        prediction: str = "",
        first: str | None = None,
    ) -> dict[str, Any]:
        """One fresh process (two for ``auto-again``): its record's measured fields."""
        given = prompt if isinstance(prompt, FreshPrompt) else FreshPrompt(prompt)
        prompt = given.text
        if self.cold:
            shutil.rmtree(self.home / "learning", ignore_errors=True)
        predicted = grammar = None
        if mode == PREDICTION_MODE and prediction:
            predicted = self.home / "prediction.txt"
            predicted.write_text(prediction, encoding="utf-8")
        if given.constraint is not None:
            grammar = self.home / "grammar.gbnf"
            grammar.write_text(given.constraint.grammar, encoding="utf-8")
        cmd = self.command(mode, max_tokens, temperature, seed, predicted, grammar, given.raw)
        if mode == WARM_MODE:
            return self._warm(cmd, prompt, mode)
        if mode != AGAIN_MODE:
            return self._process(cmd, prompt, mode, given.constraint)
        self._forget_history()
        try:
            earlier = self._process(cmd, prompt if first is None else first, mode)
            record = self._process(cmd, prompt, mode)
        finally:
            self._forget_history()
        if first is None or first == prompt:
            record["same_as_first"] = record["token_ids"] == earlier["token_ids"]
        return record

    def _warm(self, cmd: list[str], prompt: str, mode: BenchMode) -> dict[str, Any]:
        """The prompt evaluated by one process, then answered by a second that restores it:
        the second's record, with the first's first token beside it."""
        cache = self.home / prompt_cache_dir().relative_to(cache_root())
        shutil.rmtree(cache, ignore_errors=True)
        try:
            cold = self._process(cmd, prompt, mode)
            record = self._process(cmd, prompt, mode)
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        record["cold_first_token_s"] = cold["first_token_s"]
        record["same_as_cold"] = record["token_ids"] == cold["token_ids"]
        return record

    def _forget_history(self) -> None:
        history = datastores_dir().relative_to(cache_root()) / HISTORY
        shutil.rmtree(self.home / history, ignore_errors=True)

    def _process(
        self, cmd: list[str], prompt: str, mode: BenchMode, constrained: Constraint | None = None
    ) -> dict[str, Any]:
        """One ``complete`` process, timed; the history on for ``auto-again`` only."""
        history = "1" if mode == AGAIN_MODE else "0"
        env = {**os.environ, ENV_HOME: str(self.home), HISTORY_ENV: history}
        spawned, t0 = time.time(), time.perf_counter()
        done = subprocess.run(
            cmd, input=prompt, capture_output=True, text=True, env=env, timeout=TIMEOUT_S
        )
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            tail = " | ".join(done.stderr.strip().splitlines()[-3:])
            raise BackendError(
                f"localspec complete ({mode}) failed with exit code {done.returncode}: {tail}",
                "run it by hand with the same options to see why",
            )
        result = json.loads(done.stdout.strip().splitlines()[-1])
        record = self._record(result, spawned, wall)
        if constrained is not None:
            record["answer_valid"] = answer_valid(constrained, result.get("text", ""))
        return record

    def _record(self, result: dict[str, Any], spawned: float, wall: float) -> dict[str, Any]:
        stats, timing = result["stats"], result.get("timing") or {}
        trace = stats.get("trace") or []
        plain = [r["verify_seconds"] for r in trace if not r.get("drafted")]
        first = timing.get("first_token_unix")
        overhead, decode = stats.get("overhead_s"), stats.get("decode_s")
        timed = overhead is not None and bool(decode)
        record = {
            "engine": ENGINE,
            "finish_reason": result["finish_reason"],
            **{k: stats[k] for k in _STATS if k in stats},
            "compute_s": round(decode - overhead, 6) if timed else None,
            "outside_share": round(overhead / decode, 4) if timed else None,
            "plain_steps": len(plain),
            "plain_step_s": round(statistics.fmean(plain), 6) if plain else None,
            "token_ids": result["token_ids"],
            "wall_s": round(wall, 4),
            "first_token_s": None if first is None else round(first - spawned, 4),
            "load_s": timing.get("load_s"),
            "restored_tokens": (stats.get("prompt_cache") or {}).get("restored_tokens", 0),
            "fresh": True,
        }
        if self.trace:
            record["trace"] = trace
        if not stats.get("drafted"):
            record["acceptance_rate"] = None
        return record

    def close(self) -> None:
        self._tmp.cleanup()


# The stats a fresh process reports that its record carries, as an in-process run's does.
_STATS = (
    "prompt_tokens", "generated_tokens", "decode_s", "decode_tokens_per_s", "prefill_s",
    "drafted", "accepted", "rounds", "acceptance_rate", "mean_accepted_length", "by_drafter",
    "tokens_by_origin",
)  # fmt: skip
