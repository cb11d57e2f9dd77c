"""The record of one bench run, typed, and its JSON form.

``RunRecord`` holds what the runner measured of one prompt in one mode: which prompt and
mode, its place in the run order (``run``, ``repeat``) and start ``time``, the engine that
ran it (``localspec`` or ``llama.cpp``), and the stats of that run. ``to_dict`` gives the
JSON object written as a line of ``records.jsonl`` (the keys and their order as the bench
has always written them: an engine run's and a native run's have their own keys, and
``trace``, ``samples_tokens_per_s``, ``overshoot``, ``same_as_first``, ``answer_valid``, the
prompt cache's figures and the timings of what a user waits for appear only when set);
``from_dict`` reads such an object back (records of earlier bench results, or the smaller
objects scripts and tests build), leaving what it lacks as None and what it does not know
out.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

ENGINE = "localspec"
NATIVE_ENGINE = "llama.cpp"

_HEAD = ("category", "prompt_id", "mode", "run", "repeat", "time", "engine")
# The keys of an engine run's record, in the order written: the stats' figures as
# ``GenerationStats.to_dict`` serialises them, then the bench's own.
ENGINE_KEYS = (
    *_HEAD, "finish_reason", "prompt_tokens", "generated_tokens", "decode_s",
    "decode_tokens_per_s", "prefill_s", "drafted", "accepted", "rounds", "acceptance_rate",
    "mean_accepted_length", "by_drafter", "tokens_by_origin", "trace", "compute_s",
    "outside_share", "plain_steps", "plain_step_s", "token_ids", "wall_s", "first_token_s",
    "load_s", "fresh", "same_as_first", "restored_tokens", "cold_first_token_s", "same_as_cold",
    "answer_valid",
)  # fmt: skip
# The keys of a native run's record: ``NativeResult.to_record``'s, then the bench's own.
NATIVE_KEYS = (
    *_HEAD, "prompt_tokens", "prefill_s", "generated_tokens", "decode_s",
    "decode_tokens_per_s", "drafted", "accepted", "draft_max", "samples_tokens_per_s",
    "acceptance_rate", "mean_accepted_length", "rounds", "compute_s", "outside_share",
    "token_ids", "same_prompt_tokens", "overshoot", "wall_s", "first_token_s",
)  # fmt: skip
# Written only when the run has them.
OPTIONAL_KEYS = frozenset(
    {"trace", "samples_tokens_per_s", "overshoot", "wall_s", "first_token_s", "load_s", "fresh",
     "same_as_first", "restored_tokens", "cold_first_token_s", "same_as_cold", "answer_valid"}
)  # fmt: skip


@dataclass(frozen=True)
class RunRecord:
    """One prompt run in one mode: what the runner measured (see ``runner.py``)."""

    category: str
    prompt_id: str
    mode: str  # a BenchMode's name
    generated_tokens: int
    decode_s: float
    decode_tokens_per_s: float
    run: int | None = None  # place in the run order, from 0
    repeat: int | None = None  # which of the --repeat passes, from 0
    time: float | None = None  # when the run started (Unix seconds)
    engine: str | None = None  # ENGINE or NATIVE_ENGINE
    prompt_tokens: int | None = None  # native-bench: the depth its tokens followed
    prefill_s: float | None = None
    drafted: int | None = None
    accepted: int | None = None
    rounds: int | None = None  # None for native runs: llama.cpp does not print them
    acceptance_rate: float | None = None  # None when nothing was drafted
    mean_accepted_length: float | None = None
    compute_s: float | None = None  # the models' compute time while decoding
    outside_share: float | None = None  # of the decode time, spent outside llama.cpp
    token_ids: list[int] | None = None
    # Engine runs only.
    finish_reason: str | None = None
    by_drafter: dict[str, Any] | None = None
    tokens_by_origin: dict[str, int] | None = None
    trace: list[dict[str, Any]] | None = None  # every round, when the config asks for it
    plain_steps: int | None = None  # how many plain steps the run took
    plain_step_s: float | None = None  # their mean seconds: the machine's speed then
    # What a user waits for. ``wall_s``: a fresh process's (or a native binary's) whole
    # life, else the run from its prompt to its last token; ``first_token_s``: from the
    # same start to the first token (a native run's: its wall less its decode time);
    # ``load_s``: opening the session (resolving, loading, costs).
    wall_s: float | None = None
    first_token_s: float | None = None
    load_s: float | None = None
    fresh: bool | None = None  # an engine run in a fresh ``localspec complete`` process
    # auto-again: whether the answer is the one the same question got the first time.
    same_as_first: bool | None = None
    # Of the prompt, restored from the prompt cache; auto-warm: the first token of the cold
    # process before it, and whether the warm answer is the cold one.
    restored_tokens: int | None = None
    cold_first_token_s: float | None = None
    same_as_cold: bool | None = None
    # Under a constraint: whether the answer is what it asks for (``constrained.answer_valid``).
    answer_valid: bool | None = None
    # Native runs only.
    draft_max: int | None = None
    samples_tokens_per_s: list[float] | None = None  # llama-bench's, one per repetition
    same_prompt_tokens: bool | None = None  # the binary's tokenizer saw as many tokens
    overshoot: int | None = None  # tokens written beyond those asked for

    @property
    def key(self) -> tuple[str, str]:
        """The prompt it ran: ids are unique within a category."""
        return self.category, self.prompt_id

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of a ``records.jsonl`` line."""
        keys = NATIVE_KEYS if self.engine == NATIVE_ENGINE else ENGINE_KEYS
        return {
            key: getattr(self, key)
            for key in keys
            if key not in OPTIONAL_KEYS or getattr(self, key) is not None
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunRecord:
        """A record read back from its JSON object."""
        return cls(**{name: data[name] for name in _FIELDS if name in data})


_FIELDS = tuple(f.name for f in fields(RunRecord))


def as_record(record: RunRecord | dict[str, Any]) -> RunRecord:
    """A record as typed, whether it was measured here or read back from JSON."""
    return record if isinstance(record, RunRecord) else RunRecord.from_dict(record)
