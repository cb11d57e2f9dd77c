"""The event stream that the engine yields and every front end consumes.

``SpecDecoder.generate`` yields, in order: one ``PrefillDone``, then for every round one or
more ``TokenEmitted`` followed by one ``RoundCompleted``, possibly ``EngineWarning`` events, and
finally exactly one ``Finished``. Events are frozen dataclasses with plain fields, so they
can be rendered, recorded as JSON (``dataclasses.asdict``) or compared in tests.

A token's ``origin`` is the name of the drafter that proposed it (``"ngram"``, ``"model"``,
``"store"``, or any drafter registered later) or ``TARGET`` for the target's own token, so a
front end colours tokens without knowing every drafter. ``Finished.stats`` is the
generation's ``GenerationStats``, always given; front ends turn it into text or JSON
themselves. ``core.stats`` reads these events, so this module names ``GenerationStats`` for
type checkers only and never imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from localspec.core.stats import GenerationStats

# The origin of the target's own tokens (a correction, a bonus token, or a plain step); a
# drafted token that the target accepted has its drafter's name as its origin.
TARGET = "target"


class FinishReason(StrEnum):
    EOS = "eos"  # an end-of-generation token of the target's template
    LENGTH = "length"  # --max-tokens reached
    STOP = "stop"  # a stop string matched
    CANCELLED = "cancelled"  # the caller asked to stop (Ctrl-C, Escape)
    # A chat answer that ended in tool calls: never the engine's own reason (such an answer
    # ends at eos); a front end that offered tools gives it once it has read the calls.
    TOOL_CALLS = "tool_calls"


@dataclass(frozen=True)
class Restored:
    """A prompt's prefix restored from the prompt cache instead of evaluated."""

    tokens: int  # of the prompt, restored
    tier: str  # where from: "memory" or "disk"
    seconds: float  # the restore's own time (part of the prefill's)
    saved_s: float  # what evaluating those tokens would have cost, less the restore


@dataclass(frozen=True)
class PrefillDone:
    prompt_tokens: int  # tokens in the prompt
    evaluated_tokens: int  # tokens the target had to evaluate (less when its cache was reused)
    seconds: float
    restored: Restored | None = None  # the prefix that came from the prompt cache


@dataclass(frozen=True)
class Logprob:
    """A token's log-probability under the target's own distribution (temperature 1, read
    off the row verification read), and the most likely tokens there with theirs."""

    logprob: float
    piece: bytes = b""  # the token's bytes
    top: tuple[tuple[int, bytes, float], ...] = ()  # (token, its bytes, log-probability)


@dataclass(frozen=True)
class TokenEmitted:
    token_id: int
    text: str  # decoded text for this token ("" while a multi-byte character is incomplete)
    origin: str  # the drafter that proposed it, or TARGET
    index: int  # 0-based position in the generated sequence
    logprob: Logprob | None = None  # where ``GenerationParams.logprobs`` asks for it


@dataclass(frozen=True)
class RoundCompleted:
    index: int  # 0-based round number
    drafter: str | None  # the name of the drafter that drafted; None for a plain target step
    drafted: int  # tokens proposed this round
    accepted: int  # drafted tokens that survived verification
    emitted: int  # tokens emitted this round (accepted + 1, fewer if generation ended)
    seconds: float  # wall time of the round (draft + verify + bookkeeping)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    reason: str = ""  # why the controller chose this drafter and length
    match: int = 0  # n-gram rounds: how many suffix tokens matched the copied occurrence
    branches: int = 1  # branches of the draft tree verified (1: a chain or a plain step)
    # of ``seconds``, the time inside the models' evaluations (llama_decode), where they
    # count it: the rest is the loop's own work (the stats' overhead)
    compute_seconds: float | None = None


@dataclass(frozen=True)
class EngineWarning:
    message: str


@dataclass(frozen=True)
class Finished:
    reason: FinishReason
    text: str
    token_ids: tuple[int, ...]
    stats: GenerationStats
    tail: str = ""  # text no TokenEmitted carried (held back for a stop string): print it


Event = PrefillDone | TokenEmitted | RoundCompleted | EngineWarning | Finished
