"""A scripted stand-in for ``localspec.session.session.Session``, for front-end tests.

``FakeSession`` plays a queue of ``ScriptedAnswer``s, one per ``chat`` call, as the engine's
event stream: ``PrefillDone``, then per round its ``TokenEmitted`` and ``RoundCompleted``
(with the fixed seconds of the script, never the clock), then ``Finished`` with the
answer's ``GenerationStats``. It checks the cancel event between tokens; ``hold_after``
makes it stop after that many tokens until cancelled or ``release`` is set, so a test can
press Escape at a known point. It records every prompt it is given in ``calls`` and the
parameters in ``params``.

Tokens count one per whitespace-separated word, plus 4 per message and 2 for the generation
prompt, so tests can build conversations that overflow a small ``n_ctx`` on purpose.
``fake_tokens`` spells those tokens out, and the fake keeps a KV cache of them as the real
models do (``CachedModel.forward``): a call evaluates only what follows the longest common
prefix with the cache (always at least one token, for the logits), and the cache then holds
the prompt and the answer's words. ``evaluated`` lists each call's count.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from localspec.core.cached_model import common_prefix_length
from localspec.core.events import (
    TARGET,
    EngineWarning,
    Event,
    Finished,
    FinishReason,
    PrefillDone,
    RoundCompleted,
    TokenEmitted,
)
from localspec.core.params import GenerationParams
from localspec.core.stats import GenerationStats
from localspec.errors import ContextOverflowError
from localspec.progress import OnProgress, Progress, ProgressKind

STEP = ProgressKind.STEP
HOLD_TIMEOUT_S = 10.0  # a held answer gives up waiting, so a broken test cannot hang


@dataclass
class ScriptedRound:
    tokens: list[tuple[str, str]]  # (text, origin: a drafter's name or TARGET)
    drafter: str | None  # "model", "ngram" or None for a plain target step
    drafted: int
    seconds: float = 0.05
    reason: str = ""

    @property
    def accepted(self) -> int:
        return sum(1 for _, origin in self.tokens if origin != TARGET)


@dataclass
class ScriptedAnswer:
    rounds: list[ScriptedRound]
    finish: FinishReason = FinishReason.EOS
    prefill_seconds: float = 0.1
    warnings: list[str] = field(default_factory=list)  # emitted after the first round
    error: Exception | None = None  # raised after ``error_after`` tokens
    error_after: int = 0

    @classmethod
    def from_tokens(
        cls,
        tokens: Iterable[tuple[str, str, int]],
        drafted: dict[int, int] | None = None,
        drafters: dict[int, str] | None = None,
        seconds: float = 0.05,
        **kwargs: object,
    ) -> ScriptedAnswer:
        """Build from (text, origin, round) triples.

        A round's drafter is the origin of its drafted tokens (or ``drafters[round]`` when
        all its drafts were rejected); it drafted as many tokens as it accepted unless
        ``drafted[round]`` says more.
        """
        grouped: dict[int, list[tuple[str, str]]] = {}
        for text, origin, round_index in tokens:
            grouped.setdefault(round_index, []).append((text, origin))
        rounds = []
        for index in sorted(grouped):
            toks = grouped[index]
            drafter = next((o for _, o in toks if o != TARGET), None)
            drafter = (drafters or {}).get(index, drafter)
            accepted = sum(1 for _, o in toks if o != TARGET)
            n_drafted = (drafted or {}).get(index, accepted)
            rounds.append(ScriptedRound(toks, drafter, n_drafted if drafter else 0, seconds))
        return cls(rounds, **kwargs)  # type: ignore[arg-type]

    @classmethod
    def plain(cls, text: str, seconds: float = 0.05) -> ScriptedAnswer:
        """One target-only round per word."""
        words = text.split(" ")
        pieces = [w if i == 0 else " " + w for i, w in enumerate(words)]
        return cls([ScriptedRound([(p, TARGET)], None, 0, seconds) for p in pieces])


def count_tokens(messages: list[dict[str, str]]) -> int:
    return sum(len(m["content"].split()) + 4 for m in messages) + 2


def fake_tokens(messages: list[dict[str, str]]) -> list[str]:
    """``count_tokens``'s tokens: a message is its role, a newline, its words, an end mark
    and a newline; the generation prompt is the assistant role and a newline, so that an
    answer's words follow it in the cache as they do in the next turn's prompt."""
    tokens: list[str] = []
    for m in messages:
        tokens += [f"<{m['role']}>", "\n", *m["content"].split(), "<end>", "\n"]
    return tokens + ["<assistant>", "\n"]


class FakeSession:
    def __init__(
        self,
        answers: Iterable[ScriptedAnswer] = (),
        *,
        n_ctx: int = 4096,
        target_label: str = "fake-target-1.5b (Q4_K_M)",
        draft_label: str | None = "fake-draft-0.5b (Q8_0)",
        plain_tokens_per_s: float | None = 20.0,
        token_delay: float = 0.0,
        hold_after: int | None = None,
    ) -> None:
        self.answers: deque[ScriptedAnswer] = deque(answers)
        self.n_ctx = n_ctx
        self.target_label = target_label
        self.draft_label = draft_label
        self.draft_summary: str | None = None
        self.plain = plain_tokens_per_s
        self.token_delay = token_delay
        self.hold_after = hold_after
        self.held = threading.Event()  # set when a held answer is waiting
        self.release = threading.Event()
        self.calls: list[list[dict[str, str]]] = []
        self.params: list[GenerationParams] = []
        self.grammars: list[str | None] = []  # the grammar each answer had to match
        self.cached: list[str] = []  # the fake KV cache
        self.evaluated: list[int] = []  # tokens evaluated by each call
        self.target_path: Path | None = Path("/models/fake-target-1.5b.gguf")
        self.draft_path: Path | None = Path("/models/fake-draft-0.5b.gguf")
        self.closed = False
        self.on_lost: Callable[[str], None] | None = None  # what the app gave the factory

    def count_chat_tokens(self, messages: list[dict[str, str]]) -> int:
        return count_tokens(messages)

    def plain_tokens_per_s(self) -> float | None:
        return self.plain

    def plain_tokens(self, text: str) -> list[int]:
        """A text's tokens: one per character here."""
        return [ord(c) for c in text]

    def close(self) -> None:
        self.closed = True

    def chat(
        self,
        messages: list[dict[str, str]],
        params: GenerationParams,
        cancel: threading.Event | None = None,
        *,
        grammar: str | None = None,
    ) -> Iterator[Event]:
        n_tokens = count_tokens(messages)
        if n_tokens > self.n_ctx:
            raise ContextOverflowError(
                f"the prompt needs {n_tokens} tokens", n_tokens=n_tokens, n_ctx=self.n_ctx
            )
        self.calls.append([dict(m) for m in messages])
        self.params.append(params)
        self.grammars.append(grammar)
        prompt = fake_tokens(messages)
        keep = min(common_prefix_length(self.cached, prompt), len(prompt) - 1)
        self.evaluated.append(len(prompt) - keep)
        self.cached = list(prompt)
        answer = self.answers.popleft() if self.answers else ScriptedAnswer.plain("OK.")
        cancel = cancel or threading.Event()
        stats = GenerationStats()

        def emit(event: Event) -> Event:
            stats.observe(event)
            return event

        yield emit(PrefillDone(n_tokens, self.evaluated[-1], answer.prefill_seconds))
        text, ids, emitted = "", [], 0
        reason = answer.finish
        for r, scripted in enumerate(answer.rounds):
            in_round = 0
            for piece, origin in scripted.tokens:
                if answer.error is not None and emitted == answer.error_after:
                    raise answer.error
                if self._should_stop(emitted, cancel):
                    reason = FinishReason.CANCELLED
                    break
                yield emit(TokenEmitted(1000 + emitted, piece, origin, emitted))
                text += piece
                ids.append(1000 + emitted)
                emitted += 1
                in_round += 1
            if in_round:
                accepted = min(scripted.accepted, in_round)
                yield emit(self._round(r, scripted, accepted, in_round))
            if r == 0:
                for message in answer.warnings:
                    yield EngineWarning(message)
            if reason is FinishReason.CANCELLED:
                break
        if answer.error is not None and emitted == answer.error_after:
            raise answer.error
        self.cached = prompt + text.split()
        yield Finished(reason, text, tuple(ids), stats)

    def _should_stop(self, emitted: int, cancel: threading.Event) -> bool:
        if self.token_delay:
            time.sleep(self.token_delay)
        if self.hold_after is not None and emitted == self.hold_after and not cancel.is_set():
            self.held.set()
            deadline = time.monotonic() + HOLD_TIMEOUT_S
            while not (cancel.is_set() or self.release.is_set()) and time.monotonic() < deadline:
                cancel.wait(0.01)
        return cancel.is_set()

    @staticmethod
    def _round(index: int, scripted: ScriptedRound, accepted: int, emitted: int) -> RoundCompleted:
        return RoundCompleted(
            index=index,
            drafter=scripted.drafter,
            drafted=scripted.drafted,
            accepted=accepted,
            emitted=emitted,
            seconds=scripted.seconds,
            draft_seconds=scripted.seconds / 4 if scripted.drafter else 0.0,
            verify_seconds=scripted.seconds / 2,
            reason=scripted.reason,
        )


def fake_factory(
    session: FakeSession,
    progress: Iterable[str | Progress] = ("loading target fake-target-1.5b …", "loading draft …"),
    error: Exception | None = None,
    gate: threading.Event | None = None,
) -> Callable[..., FakeSession]:
    """A session factory as ``run_chat`` takes; ``gate`` holds it after the progress reports
    (a string is a ``STEP``)."""

    def factory(on_progress: OnProgress, on_lost: Callable[[str], None]) -> FakeSession:
        session.on_lost = on_lost
        for report in progress:
            on_progress(report if isinstance(report, Progress) else Progress(STEP, report))
        if gate is not None:
            gate.wait(HOLD_TIMEOUT_S)
        if error is not None:
            raise error
        return session

    return factory
