"""llama.cpp's own tools, run on the bench's prompts for a side-by-side.

``NativeRunner.run(mode, prompt_text, ...)`` runs ``llama-speculative-simple`` once and parses
the timings it prints at the end (``decoded N tokens in S seconds, speed: T t/s`` and the
``n_drafted`` / ``n_accept`` counters) with ``parse_native_output``. Every mode gets the same
``-n``. Modes, each with llama.cpp's defaults for its own settings:

- ``native-draft``: ``--spec-type draft-simple`` with the draft model (``-md``);
- ``native-ngram``: ``--spec-type ngram-simple`` (a 12-token match, 48-token drafts);
- ``native-ngram-map-k``: ``--spec-type ngram-map-k`` (the same sizes, its n-grams looked up
  in a map of the context's n-grams that it keeps up to date);
- ``native-ngram-mod``: ``--spec-type ngram-mod`` (a 24-token match hashed into a table
  shared by the whole run, drafts of 48 to 64 tokens);
- ``native-none``: llama.cpp's plain decoding in the same binary. ``--spec-type none`` is
  accepted by the option parser, but the example then exits with "failed to initialize
  speculative decoding", so this mode runs ``ngram-simple`` pinned to a lookup it cannot
  satisfy (a 1024-token match, drafting 1 token, checked only once the context passes 1026
  tokens): every round verifies the last token alone, as plain decoding does. These flags
  come after ``extra_args`` so ``--native-flags`` cannot turn drafting back on; the record's
  ``drafted`` shows 0.

The binary stops only once it has written *more* than ``-n`` tokens, so a run without an
end-of-generation token writes at least ``-n`` + 1 (the bench records the excess as
``overshoot``). Once ``-n`` - 1 or more are written, the example asks for a draft of at
most 0 tokens, which llama.cpp takes as no limit: an n-gram mode's last round can verify a
whole draft (48 tokens, 64 for ngram-mod) and write that many past ``-n``, and its tok/s
counts them.

``native-bench`` is ``llama-bench`` (the binary beside ``llama-speculative-simple``, see
``llama_bench_path``): ``NativeRunner.run_bench(depth, max_tokens)`` runs
``llama-bench -m TARGET -p 0 -n N -d DEPTH -t THREADS -r 1 -fa on -o json``, plain decoding of
N tokens after a context of DEPTH tokens (the prompt's token count), and
``parse_llama_bench_json`` reads its tokens/s. It decodes random tokens without sampling,
so it is llama.cpp's plain decoding with nothing else in the loop; ``extra_args`` are not
passed to it (its flags are not ``llama-speculative-simple``'s).

The prompt is the bench's own token sequence turned back into text with special tokens
spelled out, so the binary (which tokenizes with special tokens parsed) sees the same chat
template; ``--no-escape`` keeps backslashes in code prompts as they are. The binaries come
from ``scripts/build_native.sh``; they are a separate build of the same llama.cpp sources.
A run given a grammar (GBNF) passes it as ``--grammar-file``: llama.cpp's grammar sampler then
constrains the target's sampling in every mode, plain and speculative alike.
``check_binary`` fails early, with that hint, when a mode's binary is missing or too old.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from localspec.errors import BackendError, UsageError

SPEC_TYPES = {  # the modes run by llama-speculative-simple, and their --spec-type
    "native-draft": "draft-simple",
    "native-ngram": "ngram-simple",
    "native-ngram-map-k": "ngram-map-k",
    "native-ngram-mod": "ngram-mod",
    "native-none": "ngram-simple",  # pinned so that it never drafts: see NO_DRAFT_FLAGS
}
LLAMA_BENCH_MODE = "native-bench"  # run by llama-bench, not by llama-speculative-simple
LLAMA_BENCH = "llama-bench"
# One repetition per run: the bench's --repeat repeats it as every other mode, and takes
# the median run; llama-bench's own -r would multiply its share of the bench's time.
LLAMA_BENCH_REPS = 1
# ngram-simple drafts only after matching the last 1024 tokens (the most it allows) earlier
# in the context, and looks only once the context holds more than 1024 + 1 + 1 tokens.
NO_DRAFT_FLAGS = ("--spec-ngram-simple-size-n", "1024", "--spec-ngram-simple-size-m", "1")
BUILD_HINT = (
    "build it with: scripts/build_native.sh DIR (then pass DIR/build/bin/llama-speculative-simple)"
)
BENCH_HINT = (
    "scripts/build_native.sh DIR builds llama-bench beside llama-speculative-simple; "
    f"or leave {LLAMA_BENCH_MODE} out of --modes"
)

_NUMBER = r"([0-9]+(?:\.[0-9]+)?)"
_ENCODED = re.compile(rf"encoded\s+(\d+) tokens in\s+{_NUMBER} seconds")
_DECODED = re.compile(rf"decoded\s+(\d+) tokens in\s+{_NUMBER} seconds, speed:\s+{_NUMBER} t/s")
_COUNTER = re.compile(r"\b(n_draft|n_predict|n_drafted|n_accept)\s*=\s*(\d+)")


@dataclass(frozen=True)
class NativeResult:
    mode: str
    prompt_tokens: int  # llama-bench: the depth its tokens were generated after
    prefill_s: float | None  # llama-bench does not time its depth: None
    generated_tokens: int
    decode_s: float
    decode_tokens_per_s: float
    drafted: int
    accepted: int
    draft_max: int | None
    samples_tokens_per_s: tuple[float, ...] | None = None  # llama-bench's, one per -r
    wall_s: float | None = None  # the process, from its start to its exit

    @property
    def first_token_s(self) -> float | None:
        """From the process's start to its first token: its wall less its decode time (it
        prints no earlier mark)."""
        if self.wall_s is None:
            return None
        return round(max(self.wall_s - self.decode_s, 0.0), 4)

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    def to_record(self) -> dict[str, Any]:
        record = asdict(self)
        if self.samples_tokens_per_s is None:  # llama-speculative-simple prints no samples
            del record["samples_tokens_per_s"]
        else:
            record["samples_tokens_per_s"] = list(self.samples_tokens_per_s)
        if self.wall_s is None:
            del record["wall_s"]
        else:
            record["first_token_s"] = self.first_token_s
        record.update(
            acceptance_rate=self.acceptance_rate,
            # Rounds are not printed, so tokens per target pass cannot be derived.
            mean_accepted_length=None,
            rounds=None,
            compute_s=None,
            outside_share=None,
            token_ids=None,
        )
        return record


def parse_native_output(output: str, mode: str = "native") -> NativeResult:
    """The timings and counters ``llama-speculative-simple`` prints when it finishes."""
    decoded = _DECODED.search(output)
    if decoded is None:
        raise BackendError(
            "llama-speculative-simple finished without printing its timings",
            "run it by hand with the same flags to see what it printed",
        )
    encoded = _ENCODED.search(output)
    counters = {name: int(value) for name, value in _COUNTER.findall(output)}
    # n_draft is draft-simple's --spec-draft-n-max, printed whatever the type: no n-gram
    # mode's draft length.
    drafts_by_model = SPEC_TYPES.get(mode, "draft-simple") == "draft-simple"
    return NativeResult(
        mode=mode,
        prompt_tokens=int(encoded.group(1)) if encoded else 0,
        prefill_s=float(encoded.group(2)) if encoded else 0.0,
        generated_tokens=int(decoded.group(1)),
        decode_s=float(decoded.group(2)),
        decode_tokens_per_s=float(decoded.group(3)),
        drafted=counters.get("n_drafted", 0),
        accepted=counters.get("n_accept", 0),
        draft_max=counters.get("n_draft") if drafts_by_model else None,
    )


def _generation_test(output: str) -> dict[str, Any]:
    """The one test of ``llama-bench -o json`` output that generated tokens (``n_gen`` > 0)."""
    not_json = BackendError(
        "llama-bench did not print the JSON results it was asked for",
        "run it by hand with the same flags to see what it printed",
    )
    start = output.find("[")  # the array is all it prints to stdout; skip anything before
    try:
        tests, _ = json.JSONDecoder().raw_decode(output, start) if start >= 0 else (None, 0)
    except ValueError:
        raise not_json from None
    if not isinstance(tests, list):
        raise not_json
    generation = [
        t for t in tests if isinstance(t, dict) and isinstance(t.get("n_gen"), int) and t["n_gen"]
    ]
    if len(generation) != 1:
        raise BackendError(
            f"llama-bench printed {len(generation)} generation tests where 1 was asked",
            "run it by hand with the same flags to see what it printed",
        )
    return generation[0]


def parse_llama_bench_json(output: str, mode: str = LLAMA_BENCH_MODE) -> NativeResult:
    """The generation test of ``llama-bench -p 0 -n N -d DEPTH -o json``: N tokens decoded one
    at a time after DEPTH tokens of context. ``avg_ts`` is the mean of the repetitions'
    tokens/s (``samples_ts``); ``avg_ns`` their mean time for the N tokens."""
    test = _generation_test(output)
    try:
        samples = tuple(float(x) for x in test.get("samples_ts") or ())
        return NativeResult(
            mode=mode,
            prompt_tokens=int(test.get("n_depth", 0)),
            prefill_s=None,
            generated_tokens=int(test["n_gen"]),
            decode_s=int(test["avg_ns"]) / 1e9,
            decode_tokens_per_s=float(test["avg_ts"]),
            drafted=0,
            accepted=0,
            draft_max=None,
            samples_tokens_per_s=samples or None,
        )
    except (KeyError, TypeError, ValueError):
        raise BackendError(
            "llama-bench's JSON lacks n_gen, avg_ns or avg_ts",
            "use the llama.cpp version vendored in llama-cpp-python 0.3.36: " + BUILD_HINT,
        ) from None


def llama_bench_path(binary: Path) -> Path:
    """``llama-bench`` beside ``llama-speculative-simple``: both come from the same build."""
    binary = Path(binary)
    return binary.with_name(LLAMA_BENCH + binary.suffix)  # keeps ".exe" on Windows


def _help_text(binary: Path, name: str, hint: str) -> str:
    """What ``binary --help`` prints, once it is known to exist and run."""
    if not binary.is_file():
        raise UsageError(f"{name} not found: {binary}", hint)
    if not os.access(binary, os.X_OK):
        raise UsageError(f"{binary} is not executable", "chmod +x it, or rebuild it")
    try:
        proc = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60)
    except OSError as err:
        raise UsageError(f"cannot run {binary}: {err.strerror}", hint) from None
    except subprocess.TimeoutExpired:
        raise UsageError(f"{binary} --help did not finish", hint) from None
    return proc.stdout + proc.stderr


def _wanted_flags(mode: str) -> list[str]:
    """What llama-speculative-simple's --help must name for ``mode`` to run."""
    needed = [f"--spec-type {SPEC_TYPES[mode]}"]
    if mode == "native-none":
        needed.append(NO_DRAFT_FLAGS[0])
    return needed


def check_binary(binary: Path, modes: Sequence[str]) -> None:
    """Fail early, with a hint, unless the modes' binaries run and know their flags:
    ``binary`` (llama-speculative-simple) for the speculative-simple modes, and the
    ``llama-bench`` beside it for ``native-bench``."""
    binary = Path(binary)
    spec_modes = [m for m in modes if m in SPEC_TYPES]
    if spec_modes:
        help_text = _help_text(binary, "llama.cpp binary", BUILD_HINT)
        for mode in spec_modes:
            for wanted in _wanted_flags(mode):
                if wanted.split()[-1] not in help_text:
                    raise UsageError(
                        f"{binary.name} does not offer {wanted} (needed by {mode})",
                        "use the llama.cpp version vendored in llama-cpp-python 0.3.36: "
                        + BUILD_HINT,
                    )
    if LLAMA_BENCH_MODE in modes:
        bench = llama_bench_path(binary)
        help_text = _help_text(bench, f"{LLAMA_BENCH} (beside --native-bin)", BENCH_HINT)
        if "--n-depth" not in help_text:  # generation after a context came with -d
            raise UsageError(
                f"{bench} does not offer --n-depth (needed by {LLAMA_BENCH_MODE})", BENCH_HINT
            )


def _run(cmd: list[str], name: str, mode: str, timeout_s: float, env: Any) -> tuple[str, str]:
    """Run one native command: its (stdout, stderr), or a BackendError naming it."""
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, errors="replace", timeout=timeout_s, env=env
        )
    except subprocess.TimeoutExpired:
        raise BackendError(
            f"{name} ({mode}) did not finish within {timeout_s:.0f} s",
            "lower --max-tokens, or leave the native modes out",
        ) from None
    except OSError as err:
        raise BackendError(f"cannot run {cmd[0]}: {err.strerror}", BUILD_HINT) from None
    if proc.returncode != 0:
        tail = " | ".join(line for line in proc.stderr.strip().splitlines()[-4:] if line)
        raise BackendError(
            f"{name} ({mode}) failed with exit code {proc.returncode}: {tail}",
            "run it by hand with the same flags to see the whole log",
        )
    return proc.stdout, proc.stderr


class NativeRunner:
    def __init__(
        self,
        binary: Path,
        target: Path,
        draft: Path | None,
        detokenize: Callable[[Sequence[int]], str],
        *,
        threads: int | None = None,
        n_ctx: int = 4096,
        timeout_s: float = 900.0,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.binary = Path(binary)
        self.bench_binary = llama_bench_path(self.binary)
        self.target = Path(target)
        self.draft = Path(draft) if draft is not None else None
        self.detokenize = detokenize
        self.threads = threads or os.cpu_count() or 1
        self.n_ctx = n_ctx
        self.timeout_s = timeout_s
        self.extra_args = list(extra_args)  # appended last, so they override the defaults
        self.env = dict(env) if env is not None else None  # None: this process's environment

    def check(self, modes: Sequence[str]) -> None:
        check_binary(self.binary, modes)
        if "native-draft" in modes and self.draft is None:
            raise UsageError("native-draft needs a draft model", "drop it from --modes")

    def prompt_text(self, tokens: Sequence[int]) -> str:
        return self.detokenize(tokens)

    def command(
        self,
        mode: str,
        prompt: str,
        max_tokens: int,
        temperature: float,
        seed: int | None,
        grammar_file: Path | None = None,
    ) -> list[str]:
        threads = str(self.threads)
        cmd = [
            str(self.binary),
            "-m", str(self.target),
            "-p", prompt,
            "--no-escape",
            "-n", str(max_tokens),
            "-c", str(self.n_ctx),
            "-b", str(self.n_ctx),  # the example needs the whole prompt in one batch
            "-t", threads,
            "-tb", threads,
            "-fa", "on",  # as localspec loads its models
            "--temp", str(temperature),
        ]  # fmt: skip
        if temperature == 0.0:
            cmd += ["--top-k", "1"]
        if seed is not None:
            cmd += ["--seed", str(seed)]
        if grammar_file is not None:
            cmd += ["--grammar-file", str(grammar_file)]
        cmd += ["--spec-type", SPEC_TYPES[mode]]
        if mode == "native-draft":
            cmd += ["-md", str(self.draft), "-td", threads, "-tbd", threads]
        cmd += self.extra_args
        if mode == "native-none":
            cmd += NO_DRAFT_FLAGS  # after the extra flags, so they cannot enable drafting
        return cmd

    def bench_command(self, depth: int, max_tokens: int) -> list[str]:
        """llama-bench's plain decoding of ``max_tokens`` tokens after ``depth`` tokens."""
        return [
            str(self.bench_binary),
            "-m", str(self.target),
            "-p", "0",  # no prompt-processing test: generation only
            "-n", str(max_tokens),
            "-d", str(depth),
            "-t", str(self.threads),
            "-r", str(LLAMA_BENCH_REPS),
            "-fa", "on",  # as localspec and llama-speculative-simple run
            "-o", "json",
        ]  # fmt: skip

    def describe(self, mode: str, max_tokens: int, temperature: float) -> str:
        """``mode``'s flags, with PROMPT and DEPTH where each prompt puts its own."""
        if mode != LLAMA_BENCH_MODE:
            return " ".join(self.command(mode, "PROMPT", max_tokens, temperature, None)[1:])
        cmd = self.bench_command(0, max_tokens)
        cmd[cmd.index("-d") + 1] = "DEPTH"
        return " ".join(cmd[1:])

    def run(
        self,
        mode: str,
        prompt: str,
        max_tokens: int,
        temperature: float,
        seed: int | None,
        grammar: str | None = None,
    ) -> NativeResult:
        """One run; ``grammar``: GBNF the answer must match (``--grammar-file``)."""
        with tempfile.TemporaryDirectory(prefix="localspec-native-") as folder:
            grammar_file = None
            if grammar is not None:
                grammar_file = Path(folder) / "answer.gbnf"
                grammar_file.write_text(grammar, encoding="utf-8")
            cmd = self.command(mode, prompt, max_tokens, temperature, seed, grammar_file)
            started = time.perf_counter()
            stdout, stderr = _run(cmd, self.binary.name, mode, self.timeout_s, self.env)
            wall = round(time.perf_counter() - started, 4)
        result = parse_native_output(stderr + "\n" + stdout, mode)  # the timings are logged
        return replace(result, wall_s=wall)

    def run_bench(self, depth: int, max_tokens: int) -> NativeResult:
        """``native-bench``: llama-bench at the depth of the prompt's ``depth`` tokens."""
        cmd = self.bench_command(depth, max_tokens)
        stdout, _ = _run(cmd, self.bench_binary.name, LLAMA_BENCH_MODE, self.timeout_s, self.env)
        return parse_llama_bench_json(stdout)  # -o json prints to stdout; its log to stderr
