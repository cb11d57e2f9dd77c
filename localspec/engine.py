"""The speculative decoding loop: ``SpecDecoder.generate(prompt, params) -> Iterator[Event]``.

Invariant at the start of every round: the target's cache holds ``committed[:-1]`` and the
last committed token is still to be evaluated. A round then

1. asks the controller for a drafter and a draft length k (k = 0 is a plain step);
2. drafts ``d1..dk`` (n-gram lookup, or the draft model on its own cache);
3. evaluates ``[last, d1..dk]`` on the target in one batch, logits for those k+1 positions;
4. verifies (greedy, or exact speculative sampling), emits the accepted drafts plus the
   target's own token, and rolls the target's cache back to the accepted length.

The engine prints nothing and imports no UI: front ends render the events it yields.
Cancellation is cooperative (a ``threading.Event`` checked between rounds).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from localspec.cached_model import CachedModel, common_prefix_length
from localspec.controller import Controller, CostProfile, Plan
from localspec.drafters import MODEL, NGRAM, Draft, ModelDrafter, NgramDrafter
from localspec.errors import ContextOverflowError
from localspec.events import (
    Event,
    Finished,
    FinishReason,
    Origin,
    PrefillDone,
    RoundCompleted,
    TokenEmitted,
    Warning,
)
from localspec.params import GenerationParams
from localspec.sampling import warp
from localspec.stats import GenerationStats
from localspec.text import TextAssembler
from localspec.verify import Verdict, verify_greedy, verify_sampled


@dataclass
class _Run:
    """The state of one generation that rounds extend."""

    committed: list[int]  # prompt + generated
    generated: list[int]
    text: TextAssembler
    params: GenerationParams
    emit: Callable[[Event], Event]


class TargetModel(Protocol):
    """What the engine needs of the target beyond ``CachedModel``."""

    n_ctx: int

    def forward(self, tokens: Sequence[int], n_logits: int) -> np.ndarray: ...
    def token_bytes(self, token: int) -> bytes: ...
    def is_eog(self, token: int) -> bool: ...


# Used when no calibration is given: batch costs typical of a small CPU (see the design note).
DEFAULT_COSTS = CostProfile(
    plain_s=1.0, verify_s={1: 2.3, 3: 2.9, 4: 3.2, 15: 5.8}, draft_step_s=0.5
)

ALLOWED = {"auto": (NGRAM, MODEL), "ngram": (NGRAM,), "model": (MODEL,), "none": ()}
FIXED_MODEL_P_MIN = 0.75  # llama.cpp's default draft confidence cut-off


class SpecDecoder:
    def __init__(
        self,
        target: TargetModel,
        draft: CachedModel | None = None,
        costs: CostProfile | None = None,
    ) -> None:
        self.target = target
        self.draft = ModelDrafter(draft, target.is_eog) if draft is not None else None
        self.costs = costs or DEFAULT_COSTS
        self._controllers: dict[tuple, Controller] = {}

    def controllers(self) -> list[Controller]:
        return list(self._controllers.values())

    def controller_for(self, params: GenerationParams) -> Controller:
        """One controller per mode, kept across calls so acceptance estimates carry over."""
        key = (params.drafter, params.draft_max, params.draft_min, self.draft is not None)
        if key not in self._controllers:
            allow = ALLOWED[params.drafter]
            if self.draft is None:
                allow = tuple(a for a in allow if a != MODEL)
            self._controllers[key] = Controller(
                self.costs,
                allow=allow,
                draft_max=params.draft_max,
                draft_min=params.draft_min,
                fixed=params.drafter in ("ngram", "model"),
            )
        return self._controllers[key]

    def generate(
        self,
        prompt: Sequence[int],
        params: GenerationParams,
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]:
        prompt = list(prompt)
        n_ctx = self.target.n_ctx
        if not prompt:
            raise ValueError("empty prompt")
        if len(prompt) >= n_ctx:
            raise ContextOverflowError(
                f"the prompt has {len(prompt)} tokens but the context holds {n_ctx} "
                f"(at most {n_ctx - 1} prompt tokens, leaving room for one new token)",
                "shorten the input or raise --ctx",
                n_tokens=len(prompt),
                n_ctx=n_ctx,
            )
        if params.drafter == "model" and self.draft is None:
            raise ValueError("the model drafter needs a draft model")
        stats = GenerationStats()

        def emit(event: Event) -> Event:
            stats.observe(event)
            return event

        t0 = time.perf_counter()
        before = getattr(self.target, "evaluated_tokens", 0)
        self.target.forward(prompt[:-1], 0)
        evaluated = getattr(self.target, "evaluated_tokens", 0) - before
        yield emit(PrefillDone(len(prompt), evaluated, time.perf_counter() - t0))

        rng = np.random.default_rng(params.seed)
        controller = self.controller_for(params)
        controller.new_generation()
        ngram = NgramDrafter(params.ngram_min, params.ngram_max)
        ngram.begin(prompt)
        run = _Run(prompt, [], TextAssembler(params.stop), params, emit)
        committed, generated, text = run.committed, run.generated, run.text
        reason: FinishReason | None = None
        round_index = 0
        streak = False  # the last round was an n-gram draft accepted whole
        while reason is None:
            if cancel is not None and cancel.is_set():
                reason = FinishReason.CANCELLED
                break
            room = n_ctx - len(committed)
            if room < 0:
                yield emit(Warning(f"the context of {n_ctx} tokens is full"))
                reason = FinishReason.LENGTH
                break
            t_round = time.perf_counter()
            match = ngram.match()
            plan = controller.plan(
                ngram_n=match.n if match else None,
                ngram_available=match.available if match else 0,
                remaining=min(params.max_tokens - len(generated) - 1, room),
                ngram_streak=streak,
                model_catch_up=self._draft_lag(committed),
            )
            draft = self._draft(plan, committed, params, rng, ngram, match)
            t_verify = time.perf_counter()
            verdict = self._verify_round(committed, draft, params, rng)
            t_done = time.perf_counter()

            outcome = yield from self._emit_round(verdict, draft, run)
            emitted, paused, reason = outcome
            ngram.extend(committed)
            drafter = draft.source if draft.tokens else None
            controller.observe_timing(
                len(draft.tokens), t_done - t_verify, draft.steps, t_verify - t_round
            )
            ngram_n = match.n if match and drafter == NGRAM else None
            controller.observe(drafter, ngram_n, len(draft.tokens), verdict.accepted, streak)
            streak = drafter == NGRAM and verdict.accepted == len(draft.tokens)
            yield emit(
                RoundCompleted(
                    index=round_index,
                    drafter=drafter,
                    drafted=len(draft.tokens),
                    accepted=verdict.accepted,
                    emitted=emitted,
                    seconds=time.perf_counter() - t_round - paused,
                    draft_seconds=t_verify - t_round,
                    verify_seconds=t_done - t_verify,
                    reason=plan.reason,
                )
            )
            round_index += 1
        # Held-back text that never became a stop string is still part of the answer.
        tail = text.finish()
        yield Finished(reason, text.text, tuple(generated), stats.to_dict(), tail=tail)

    def _emit_round(
        self, verdict: Verdict, draft: Draft, run: _Run
    ) -> Generator[Event, None, tuple[int, float, FinishReason | None]]:
        """Emit the round's tokens; return (emitted, seconds the consumer held us, reason)."""
        emitted, paused = 0, 0.0
        for i, tok in enumerate(verdict.tokens(draft.tokens)):
            if self.target.is_eog(tok):
                return emitted, paused, FinishReason.EOS
            origin = Origin(draft.source) if i < verdict.accepted else Origin.TARGET
            piece = run.text.push(self.target.token_bytes(tok))
            run.committed.append(tok)
            run.generated.append(tok)
            emitted += 1
            t_yield = time.perf_counter()
            yield run.emit(TokenEmitted(tok, piece, origin, len(run.generated) - 1))
            paused += time.perf_counter() - t_yield  # the consumer's time is not ours
            if run.text.stopped:
                return emitted, paused, FinishReason.STOP
            if len(run.generated) >= run.params.max_tokens:
                return emitted, paused, FinishReason.LENGTH
        return emitted, paused, None

    def _draft_lag(self, committed: list[int]) -> int:
        """Tokens the draft model would have to evaluate before drafting."""
        if self.draft is None:
            return 0
        return len(committed) - common_prefix_length(self.draft.model.cached, committed)

    def _draft(
        self,
        plan: Plan,
        committed: list[int],
        params: GenerationParams,
        rng: np.random.Generator,
        ngram: NgramDrafter,
        match: object,
    ) -> Draft:
        t0 = time.perf_counter()
        draft: Draft | None = None
        if plan.drafter == NGRAM:
            draft = ngram.propose(plan.k, match)  # type: ignore[arg-type]
        elif plan.drafter == MODEL and self.draft is not None:
            p_min = FIXED_MODEL_P_MIN if params.drafter == "model" else plan.p_min
            draft = self.draft.propose(committed, plan.k, params, rng, p_min)
        if draft is None:
            return Draft(NGRAM, [], None)
        return Draft(draft.source, draft.tokens, draft.probs, time.perf_counter() - t0, draft.steps)

    def _verify_round(
        self,
        committed: list[int],
        draft: Draft,
        params: GenerationParams,
        rng: np.random.Generator,
    ) -> Verdict:
        """Evaluate ``[last, drafts]`` in one target batch, verify, and roll the target's
        cache back so that it holds ``committed[:-1]`` of the next round."""
        rows = self.target.forward(committed + draft.tokens, len(draft.tokens) + 1)
        verdict = self._verify(rows, draft, params, rng)
        self.target.truncate(len(committed) + verdict.accepted)
        return verdict

    @staticmethod
    def _verify(
        rows: np.ndarray, draft: Draft, params: GenerationParams, rng: np.random.Generator
    ) -> Verdict:
        if params.greedy:
            return verify_greedy(rows, draft.tokens)
        warped: dict[int, np.ndarray] = {}

        def target_probs(i: int) -> np.ndarray:
            if i not in warped:
                warped[i] = warp(rows[i], params)
            return warped[i]

        return verify_sampled(target_probs, draft.tokens, draft.probs, rng)


def run_to_completion(
    events: Iterator[Event], on_event: Callable[[Event], None] | None = None
) -> Finished:
    """Drain an event stream, returning its ``Finished`` event."""
    for event in events:
        if on_event is not None:
            on_event(event)
        if isinstance(event, Finished):
            return event
    raise RuntimeError("the event stream ended without a Finished event")
