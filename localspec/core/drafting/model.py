"""The draft model: a small model that shares the target's vocabulary, run autoregressively.

``ModelDrafter`` drafts on the draft model's own KV cache (only tokens it lacks are
evaluated, in one catch-up batch timed apart from the one-token steps), greedy when decoding
is greedy (asking the model for its greedy token and that token's probability, not for a
logits row), otherwise sampling from its warped q (returned for exact verification). It stops
early after an end-of-generation token, or when its confidence falls below ``p_min``: in
a fixed policy llama.cpp's 0.75, else the confidence below which one more draft token does
not pay at this machine's costs.

Its offers are priced by itself: the expected accepted tokens from its learned acceptance
per draft position (``AcceptanceEstimate``), and the seconds drafting takes from its own
timings (``DraftCosts``): the first pass (one step, or the catch-up batch when it lags) and
a step per further token. Its acceptance is learned only from its own drafts, so its offers
may be probed after a long idle stretch (``Offer.probe``).

Reading the prompt. A draft model that has not read the prompt must catch up on all of it
in its first draft, a cost no single round repays, so it would never be chosen, and never
read the prompt. Where a draft could pay on this machine at all (``could_pay``: verify
batches that cost little more than a step, as on a GPU), ``begin`` has it read the prompt
with the target, as llama.cpp's speculative examples do; where none could (a small CPU),
the prompt's time is not spent on it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from localspec.core.acceptance import OPTIMISTIC_ALPHA, AcceptanceEstimate, TextCount
from localspec.core.cached_model import CachedModel, common_prefix_length
from localspec.core.costs import CostProfile, Ema, LiveCosts, could_pay
from localspec.core.drafting.base import Branching, Draft, Offer, Outcome, Resources
from localspec.core.params import GenerationParams
from localspec.core.sampling import sample, warp

NAME = "model"
PRIOR = 0.6  # acceptance per position before any evidence
FIXED_P_MIN = 0.75  # llama.cpp's default draft confidence cut-off


class DraftCosts:
    """The draft model's step and catch-up costs: calibrated, then as its passes take.

    Until it has been timed enough (``LiveCosts.min_obs``), a step costs its calibrated
    time scaled as the target's batches are (``LiveCosts.scale``): a machine that got busier
    is busier for both."""

    def __init__(self, costs: LiveCosts) -> None:
        self.costs = costs
        self._step = Ema()
        self._catch_up = Ema()  # seconds per token of a catch-up pass

    @property
    def step_s(self) -> float:
        base = self.costs.base.draft_step_s or 0.0
        if self._step.count >= self.costs.min_obs:
            return self._step.value
        return base * self.costs.scale()

    def catch_up(self, tokens: int) -> float:
        """Seconds for the first pass over ``tokens`` it lacks, in one batch."""
        base = self.costs.base
        if tokens <= 0 or base.draft_step_s is None:
            return 0.0
        if self._catch_up.count >= self.costs.min_obs:
            return tokens * self._catch_up.value
        per_token = base.draft_prefill_s or base.draft_step_s / 4
        return max(tokens * per_token, base.draft_step_s) * self.costs.scale()

    def observe(self, steps: int, seconds: float, catch_up: int, catch_up_s: float) -> None:
        weight = self.costs.weight
        if steps > 0:
            self._step.add(seconds / steps, weight, self.step_s)
        if catch_up > 0:
            self._catch_up.add(catch_up_s / catch_up, weight, self.catch_up(catch_up) / catch_up)


class ModelDrafter:
    """Autoregressive drafting with a small model that shares the target's vocabulary."""

    branching: Branching | None = None  # it drafts one continuation: chains only

    def __init__(
        self,
        model: CachedModel,
        is_eog: Callable[[int], bool],
        vocab: int | None = None,
        *,
        costs: LiveCosts,
        limit: int = 16,
        fixed: bool = False,
        clock: Callable[[], float] = time.perf_counter,
        name: str = NAME,
    ) -> None:
        """``name``: how its drafts are labelled (``self`` for a draft derived from the
        target's layers). ``vocab``: the target's vocabulary size; ids at or past it are
        never drafted (vocabularies may differ in size by up to 128 tokens). ``fixed``: a
        fixed policy (``--drafter model``), which stops at llama.cpp's confidence cut-off."""
        self.name = name
        self.model = model
        self.is_eog = is_eog
        self.vocab = vocab
        self.costs = costs
        self.timing = DraftCosts(costs)
        self.limit = limit
        self.fixed = fixed
        self.clock = clock
        self.estimate = AcceptanceEstimate(prior=PRIOR)
        self._texts = TextCount()
        self._timed: tuple[int, float, int, float] | None = None  # the last draft's passes

    def begin(self, prompt: Sequence[int], params: GenerationParams | None = None) -> None:
        keep = self._texts.begin()
        if keep is not None:
            self.estimate.shrink(keep)
        if self.could_pay():
            # All but the last token, as the target holds: the first round then drafts
            # with one step. The cache keeps whatever prefix it shares with the prompt.
            self.model.forward(prompt[:-1], 0)

    def could_pay(self) -> bool:
        """Whether a draft of some length could beat a plain step here if its tokens were
        accepted at ``OPTIMISTIC_ALPHA`` each, not counting catching up on the text."""
        return could_pay(self.costs, self.limit, OPTIMISTIC_ALPHA, self.timing.step_s)

    def lag(self, committed: Sequence[int]) -> int:
        """Tokens the draft model would have to evaluate before drafting."""
        return len(committed) - common_prefix_length(self.model.cached, committed)

    def offer(self, committed: Sequence[int], limit: int) -> Offer | None:
        if limit <= 0:
            return None
        lag = self.lag(committed)
        catch_up = lag if lag > 1 else 0

        def seconds(k: int) -> float:
            step = self.timing.step_s
            first = self.timing.catch_up(catch_up) if catch_up else step
            return first + (k - 1) * step

        return Offer(self.name, limit, self.estimate.expected_accepted, seconds, probe=True)

    def p_min(self) -> float:
        """Draft confidence below which one more draft token does not pay: it costs a draft
        step and a longer verify batch, and pays only when its acceptance chance times a
        plain step's worth of time exceeds that cost."""
        if self.fixed:
            return FIXED_P_MIN
        c = self.costs
        marginal = self.timing.step_s + max(c.verify(2) - c.verify(1), 0.0)
        return min(0.95, max(0.05, marginal / (marginal + c.plain_s)))

    def propose(
        self,
        committed: Sequence[int],
        k: int,
        params: GenerationParams,
        rng: np.random.Generator,
    ) -> Draft:
        p_min = self.p_min() if params.p_min is None else params.p_min
        context = list(committed)
        # With a lag, the first pass evaluates everything the model lacks in one batch and
        # yields the first draft token: timed as catch-up, apart from the one-token steps.
        catch_up = self.lag(context) if self.lag(context) > 1 else 0
        t_catch = 0.0
        drafted: list[int] = []
        probs: list[np.ndarray] = []
        steps, t_steps = 0, 0.0
        for i in range(k):
            t0 = self.clock()
            if params.greedy:  # the draft model's greedy choice and its probability only
                found = self.model.greedy(context, 1, confidence=True, vocab=self.vocab or 0)
            else:
                logits = self.model.forward(context, 1)[0][: self.vocab]
            if i == 0 and catch_up:
                t_catch = self.clock() - t0
            else:
                t_steps += self.clock() - t0
                steps += 1
            if params.greedy:
                assert found.top_p is not None
                if i > 0 and p_min > 0.0 and found.top_p[0] < p_min:
                    break
                tok = found.ids[0]
            else:
                q = warp(logits, params)
                if i > 0 and p_min > 0.0 and float(q.max()) < p_min:
                    break
                tok = sample(q, rng)
                probs.append(q)
            drafted.append(tok)
            context.append(tok)
            if self.is_eog(tok):
                break
        self._timed = (steps, t_steps, catch_up, t_catch)
        return Draft(self.name, drafted, None if params.greedy else probs)

    def observe(self, committed: Sequence[int], outcome: Outcome) -> None:
        # Its cache is rolled forward or back by the next ``forward``.
        if self._timed is not None:
            self.timing.observe(*self._timed)
            self._timed = None
        if outcome.chosen and outcome.drafted > 0:
            self.estimate.observe(outcome.drafted, outcome.accepted)

    def learned(self) -> dict[str, Any]:
        return self.estimate.to_dict()

    def restore(self, data: Any, keep: float) -> None:
        estimate = AcceptanceEstimate(prior=PRIOR)
        estimate.load(data, keep)
        self.estimate = estimate


def could_pay_at(costs: CostProfile, limit: int) -> bool:
    """Whether, at a pair's measured costs, a draft of the draft model of up to ``limit``
    tokens could pay (as ``ModelDrafter.could_pay`` judges before it times its own steps);
    False when no draft step was measured. A session reads it before loading the draft."""
    if costs.draft_step_s is None:
        return False
    return could_pay(costs, limit, OPTIMISTIC_ALPHA, costs.draft_step_s)


def build(params: GenerationParams, resources: Resources) -> ModelDrafter | None:
    """None without a draft model, or without its measured step cost to price it with."""
    draft, costs = resources.draft_model, resources.costs
    if draft is None or costs.base.draft_step_s is None:
        return None
    return ModelDrafter(
        draft,
        resources.target.is_eog,
        resources.target.n_vocab,
        costs=costs,
        limit=params.draft_max,
        fixed=resources.policy.fixed,
        clock=resources.clock,
        name=resources.draft_name,
    )
