"""llama.cpp's own ``llama-speculative-simple``, run on the bench's prompts for a side-by-side.

``NativeRunner.run(mode, prompt_text, ...)`` runs the binary once and parses the timings it
prints at the end (``decoded N tokens in S seconds, speed: T t/s`` and the ``n_drafted`` /
``n_accept`` counters) with ``parse_native_output``. Every mode gets the same ``-n``. Modes:

- ``native-draft``: ``--spec-type draft-simple`` with the draft model (``-md``), its defaults
  for draft length and confidence;
- ``native-ngram``: ``--spec-type ngram-simple``, no draft model;
- ``native-none``: llama.cpp's plain decoding in the same binary. ``--spec-type none`` is
  accepted by the option parser, but the example then exits with "failed to initialize
  speculative decoding", so this mode runs ``ngram-simple`` pinned to a lookup it cannot
  satisfy (a 1024-token match, drafting 1 token, checked only once the context passes 1026
  tokens): every round verifies the last token alone, as plain decoding does. These flags
  come after ``extra_args`` so ``--native-flags`` cannot turn drafting back on; the record's
  ``drafted`` shows 0.

The binary stops only once it has written *more* than ``-n`` tokens, so a run without an
end-of-generation token writes at least ``-n`` + 1 (the bench records the excess as
``overshoot``).

The prompt is the bench's own token sequence turned back into text with special tokens
spelled out, so the binary (which tokenizes with special tokens parsed) sees the same chat
template; ``--no-escape`` keeps backslashes in code prompts as they are. The binary comes
from ``scripts/build_native.sh``; it is a separate build of the same llama.cpp sources.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from localspec.errors import BackendError, UsageError

SPEC_TYPES = {
    "native-draft": "draft-simple",
    "native-ngram": "ngram-simple",
    "native-none": "ngram-simple",  # pinned so that it never drafts: see NO_DRAFT_FLAGS
}
# ngram-simple drafts only after matching the last 1024 tokens (the most it allows) earlier
# in the context, and looks only once the context holds more than 1024 + 1 + 1 tokens.
NO_DRAFT_FLAGS = ("--spec-ngram-simple-size-n", "1024", "--spec-ngram-simple-size-m", "1")
BUILD_HINT = (
    "build it with: scripts/build_native.sh DIR (then pass DIR/bin/llama-speculative-simple)"
)

_NUMBER = r"([0-9]+(?:\.[0-9]+)?)"
_ENCODED = re.compile(rf"encoded\s+(\d+) tokens in\s+{_NUMBER} seconds")
_DECODED = re.compile(rf"decoded\s+(\d+) tokens in\s+{_NUMBER} seconds, speed:\s+{_NUMBER} t/s")
_COUNTER = re.compile(r"\b(n_draft|n_predict|n_drafted|n_accept)\s*=\s*(\d+)")


@dataclass(frozen=True)
class NativeResult:
    mode: str
    prompt_tokens: int
    prefill_s: float
    generated_tokens: int
    decode_s: float
    decode_tokens_per_s: float
    drafted: int
    accepted: int
    draft_max: int | None

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    def to_record(self) -> dict[str, Any]:
        record = asdict(self)
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
    return NativeResult(
        mode=mode,
        prompt_tokens=int(encoded.group(1)) if encoded else 0,
        prefill_s=float(encoded.group(2)) if encoded else 0.0,
        generated_tokens=int(decoded.group(1)),
        decode_s=float(decoded.group(2)),
        decode_tokens_per_s=float(decoded.group(3)),
        drafted=counters.get("n_drafted", 0),
        accepted=counters.get("n_accept", 0),
        draft_max=counters.get("n_draft"),
    )


def check_binary(binary: Path, modes: Sequence[str]) -> None:
    """Fail early, with a hint, unless the binary runs and knows the modes' spec types."""
    binary = Path(binary)
    if not binary.is_file():
        raise UsageError(f"llama.cpp binary not found: {binary}", BUILD_HINT)
    if not os.access(binary, os.X_OK):
        raise UsageError(f"{binary} is not executable", "chmod +x it, or rebuild it")
    try:
        proc = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60)
    except OSError as err:
        raise UsageError(f"cannot run {binary}: {err.strerror}", BUILD_HINT) from None
    except subprocess.TimeoutExpired:
        raise UsageError(f"{binary} --help did not finish", BUILD_HINT) from None
    help_text = proc.stdout + proc.stderr
    for mode in modes:
        needed = [f"--spec-type {SPEC_TYPES[mode]}"] if mode in SPEC_TYPES else []
        if mode == "native-none":
            needed.append(NO_DRAFT_FLAGS[0])
        for wanted in needed:
            if wanted.split()[-1] not in help_text:
                raise UsageError(
                    f"{binary.name} does not offer {wanted} (needed by {mode})",
                    "use the llama.cpp version vendored in llama-cpp-python 0.3.36: " + BUILD_HINT,
                )


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
        self, mode: str, prompt: str, max_tokens: int, temperature: float, seed: int | None
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
        cmd += ["--spec-type", SPEC_TYPES[mode]]
        if mode == "native-draft":
            cmd += ["-md", str(self.draft), "-td", threads, "-tbd", threads]
        cmd += self.extra_args
        if mode == "native-none":
            cmd += NO_DRAFT_FLAGS  # after the extra flags, so they cannot enable drafting
        return cmd

    def run(
        self, mode: str, prompt: str, max_tokens: int, temperature: float, seed: int | None
    ) -> NativeResult:
        cmd = self.command(mode, prompt, max_tokens, temperature, seed)
        try:
            proc = subprocess.run(
                cmd,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=self.timeout_s,
                env=self.env,
            )
        except subprocess.TimeoutExpired:
            raise BackendError(
                f"{self.binary.name} ({mode}) did not finish within {self.timeout_s:.0f} s",
                "lower --max-tokens, or leave the native modes out",
            ) from None
        except OSError as err:
            raise BackendError(f"cannot run {self.binary}: {err.strerror}", BUILD_HINT) from None
        if proc.returncode != 0:
            tail = " | ".join(line for line in proc.stderr.strip().splitlines()[-4:] if line)
            raise BackendError(
                f"{self.binary.name} ({mode}) failed with exit code {proc.returncode}: {tail}",
                "run it by hand with the same flags to see the whole log",
            )
        return parse_native_output(proc.stderr + "\n" + proc.stdout, mode)
