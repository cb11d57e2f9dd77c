"""The speculative decoding loop: ``SpecDecoder.generate(prompt, params) -> Iterator[Event]``.

Invariant at the start of every round: the target's cache holds ``committed[:-1]`` and the
last committed token is still to be evaluated. A round (``_round``) then

1. asks every drafter what it could draft (each prices its own offer) and the controller
   which offer to take and how far (k = 0 is a plain step);
2. drafts ``d1..dk`` with the chosen drafter;
3. evaluates ``[last, d1..dk]`` on the target in one batch: its greedy choices after those
   k+1 positions (greedy decoding), or their logits rows (sampling);
4. verifies (greedy, or exact speculative sampling), rolls the target's cache back to the
   accepted length, and emits the accepted drafts plus the target's own token;
5. tells the controller what verifying took, every drafter how the round went (each learns
   from its own verdict), and the controller the round's balance.

Steps 1 to 4 are ``core.rounds``; this module strings them together and keeps the books.

The drafters of a mode are built by the registry (``core.drafting.registry``) and kept with
their controller across generations (a ``Planner`` per mode and limits, a bounded number of
them: ``core.planner``), so what they learn carries from answer to answer; ``learned`` and
``restore`` carry it across processes. A generation's end, however it comes, ends its
planner's drafters (``Planner.end``).

A tree round (greedy decoding only, when the controller plans one) drafts the competing
continuations of the chosen drafter's sources (its ``branching`` capability), verifies them
in one target pass (``core.tree_round``), and from there on is the chain round of the
branch the target took (``take``): the same tokens emitted, the same bookkeeping. Its stats
count every node of the tree as drafted.

The engine prints nothing and imports no UI: front ends render the events it yields.
It runs prompts the session's preflight (``core.preflight``) let through: 1 to
``n_ctx - 1`` tokens, and the draft model the drafter needs.
Cancellation is cooperative (a ``threading.Event`` checked between rounds). After a round,
drafters with the ``Warns`` capability (``drafting.base``) have their warnings yielded as
``EngineWarning`` events. Drafters that draft from the target's own choices (``Watching``, the
lookahead drafter) are shown the target's greedy choice after every position of every pass,
chain or tree.

Short steps. On a GPU a target step takes a few milliseconds, so a round's own work must
not grow with the context: the target is given only the round's new tokens while its cache
is as the last round left it (``CachedModel.changes``), greedy decoding asks it for token
ids only (a backend that picks them on the device copies no logits row to the host), rows
for sampling are borrowed, not copied (consumed before the next evaluation), and each
round reports the time it spent
outside the models' evaluations (``RoundCompleted.compute_seconds``, the stats' overhead).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from localspec.core.cached_model import CachedModel, PendingModel, TargetModel
from localspec.core.controller import PLAIN_STEP, Controller
from localspec.core.costs import CostProfile, LiveCosts
from localspec.core.drafting.base import (
    NOT_CHOSEN,
    Corpus,
    Drafter,
    Outcome,
    Resources,
)
from localspec.core.drafting.grammar import GrammarDrafter
from localspec.core.drafting.registry import build_drafters
from localspec.core.events import (
    EngineWarning,
    Event,
    Finished,
    FinishReason,
    PrefillDone,
    Restored,
    RoundCompleted,
)
from localspec.core.grammar import Grammar
from localspec.core.params import DrafterMode, GenerationParams
from localspec.core.planner import RESTORE_KEEP, Planner, Planners, restore_drafters
from localspec.core.rounds import Run, chain_round, emit_tokens, offers, tree_round
from localspec.core.stats import GenerationStats
from localspec.core.text import TextAssembler
from localspec.core.tree_round import tree_shape

Corpora = Sequence[tuple[str, Corpus]]  # named corpora the datastore drafter looks up

# Used when no calibration is given: batch costs typical of a small CPU (see the design note).
DEFAULT_COSTS = CostProfile(
    plain_s=1.0,
    verify_s={1: 2.3, 3: 2.9, 4: 3.2, 15: 5.8, 31: 11.0, 47: 14.0, 63: 17.0},
    draft_step_s=0.5,
)


class SpecDecoder:
    def __init__(
        self,
        target: TargetModel,
        draft: CachedModel | None = None,
        costs: CostProfile | None = None,
        *,
        clock: Callable[[], float] | None = None,
        pending_draft: PendingModel | None = None,
        draft_name: str = "model",
        corpora: Corpora | Callable[[], Corpora] = (),
        restored: dict | None = None,
        round_ended: Callable[[], None] | None = None,
    ) -> None:
        """``clock``: what rounds are timed with (default ``time.perf_counter``); a replay
        gives a virtual one that its models advance by what their evaluations cost.
        ``pending_draft``: a draft model still loading, taken up once it is there (see
        ``join_draft``). ``draft_name``: the draft model's drafter, ``self`` for a draft
        derived from the target's own layers. ``corpora``: the named corpora the datastore
        drafter looks up, or what gives them as each answer begins (a session's stores and
        history). ``restored``: learned state (``learned``) every new planner starts from.
        ``round_ended``: called as each round ends (the prefill's too), once its event was
        handed on and before anything else is evaluated: where a generation running beside
        others lets them have their round."""
        self.target = target
        self.draft = draft
        self.pending_draft = pending_draft
        self.clock = clock or time.perf_counter
        self.costs = costs or DEFAULT_COSTS
        self.planners = Planners(self._planner)
        self.restored = restored
        self.corpora = corpora if callable(corpora) else lambda: corpora
        self.draft_name = draft_name
        self.round_ended = round_ended or _nothing
        # Kept across answers, so that what it learns of its acceptance carries over.
        self.grammar_drafter = GrammarDrafter(
            target.n_vocab,
            target.token_bytes,
            target.is_eog,
            lambda text: target.tokenize(text, add_special=False, parse_special=False),
        )

    def controllers(self) -> list[Controller]:
        return [planner.controller for planner in self.planners]

    def forget_learning(self, *, keep_restored: bool = False) -> None:
        """Start the next generation as a fresh process would with no saved state: new
        controllers and drafters, nothing restored (the machine's measured costs are kept);
        ``keep_restored``: as this decoder was built, from its ``restored`` state."""
        self.planners.clear()
        if not keep_restored:
            self.restored = None

    def _resources(self, costs: LiveCosts) -> Resources:
        return Resources(costs, self.target, self.draft, self.corpora, self.clock, self.draft_name)

    def _drafters(self, params: GenerationParams, costs: LiveCosts) -> dict[str, Drafter]:
        return build_drafters(params, self._resources(costs))

    def planner_for(self, params: GenerationParams) -> Planner:
        """One controller and its drafters per mode and limits, kept across calls so what
        they learn carries over (``core.planner.Planners``: a bounded number of them)."""
        return self.planners.get(params)

    def _planner(self, params: GenerationParams) -> Planner:
        """A new planner for ``params``. Draft trees are on when asked for and the target
        can verify them; they are planned for greedy rounds only."""
        controller = Controller(
            self.costs, draft_min=params.draft_min, fixed=params.drafter.policy.fixed,
            trees=params.trees and self.target.supports_trees,
            max_branches=tree_shape(self.target)[0],
        )  # fmt: skip
        planner = Planner(controller, self._drafters(params, controller.costs), params)
        if self.restored is not None and params.drafter.learns:
            restore_drafters(planner.drafters, self.restored, RESTORE_KEEP)
        return planner

    def join_draft(self, *, wait: bool = False) -> list[str]:
        """Take up the draft model of ``pending_draft`` once its load has ended (``wait``:
        wait for that; a failed load then raises its error): the planners whose mode drafts
        with it gain its drafters, weighed after their others, restored from what was
        learned before. Returns the names of the drafters added (none while it loads)."""
        pending = self.pending_draft
        if pending is None or not (wait or pending.settled):
            return []
        model = pending.wait() if wait else pending.ready()
        self.pending_draft = None
        if model is None:
            return []
        self.draft = model
        added: list[str] = []
        for planner in self.planners:
            fresh = build_drafters(
                planner.params,
                self._resources(planner.controller.costs),
                draft_model_only=True,
            )
            if self.restored is not None and planner.params.drafter.learns:
                restore_drafters(fresh, self.restored, RESTORE_KEEP)
            planner.drafters.update(fresh)
            added += [name for name in fresh if name not in added]
        return added

    def learned(self, params: GenerationParams) -> dict[str, Any]:
        """What the drafters of ``params``' mode learned (for ``restored``, another time)."""
        return self.planner_for(params).learned()

    def generate(
        self,
        prompt: Sequence[int],
        params: GenerationParams,
        cancel: threading.Event | None = None,
        restored: Restored | None = None,
        *,
        grammar: Grammar | None = None,
    ) -> Iterator[Event]:
        """The events of ``prompt``'s answer. The prompt is one the pair can run: 1 to
        ``n_ctx - 1`` tokens, with the draft model its drafter needs (the session's
        preflight refuses any other before it asks). A drafter that cannot run without the
        draft model waits here for a load under way (a failed load raises its error).
        ``restored``: the prefix the caller restored into the target's cache from a prompt
        cache, told in ``PrefillDone``. ``grammar``: what the answer must match, at its
        start (this answer's own: the engine advances it); every drafter drafts under it,
        and the tokens it admits alone are offered by the grammar drafter as well (but in
        plain decoding, ``none``)."""
        prompt = list(prompt)
        if params.drafter.needs_draft_model:
            self.join_draft(wait=True)
        stats = GenerationStats()

        def emit(event: Event) -> Event:
            stats.observe(event)
            return event

        t0 = self.clock()
        before = self.target.evaluated_tokens
        self.target.forward(prompt[:-1], 0)
        prefilled = self.target.changes
        evaluated = self.target.evaluated_tokens - before
        planner = self.planner_for(params)
        planner.controller.new_generation()
        drafters = dict(planner.drafters)
        # Plain decoding (``none``) stays plain under a grammar: the baseline speculation is
        # measured against.
        if (
            grammar is not None
            and params.drafter is not DrafterMode.NONE
            and self.grammar_drafter.name not in params.left_out
        ):
            self.grammar_drafter.bind(grammar)
            drafters[self.grammar_drafter.name] = self.grammar_drafter
        for drafter in drafters.values():
            drafter.begin(prompt, params)  # the draft model may read the prompt: prefill time
        seconds = self.clock() - t0 + (restored.seconds if restored is not None else 0.0)
        yield emit(PrefillDone(len(prompt), evaluated, seconds, restored))
        self.round_ended()
        run = Run(
            prompt, params, np.random.default_rng(params.seed), planner.controller,
            drafters, TextAssembler(params.stop), emit, self.target, self.clock,
            target_changes=prefilled, timed=self._timed(), tree_nodes=tree_shape(self.target)[1],
            grammar=grammar,
        )  # fmt: skip
        reason: FinishReason | None = None
        try:
            while reason is None:
                if cancel is not None and cancel.is_set():
                    reason = FinishReason.CANCELLED
                elif len(run.committed) > self.target.n_ctx:
                    yield emit(EngineWarning(f"the context of {self.target.n_ctx} tokens is full"))
                    reason = FinishReason.LENGTH
                else:
                    reason = yield from self._round(run)
        finally:  # also when the consumer stops reading
            planner.end()
            self.grammar_drafter.bind(None)
        # Held-back text that never became a stop string is still part of the answer.
        tail = run.text.finish()
        if params.trace:
            stats.trace = run.trace
        yield Finished(reason, run.text.text, tuple(run.generated), stats, tail=tail)

    def _timed(self) -> tuple:
        """The models whose evaluations are timed (``compute_seconds``): the target, and the
        draft model when there is one."""
        models = [self.target] if self.draft is None else [self.target, self.draft]
        return tuple(m for m in models if hasattr(m, "compute_seconds"))

    @staticmethod
    def _compute(run: Run) -> float:
        return sum(m.compute_seconds for m in run.timed)

    def _round(self, run: Run) -> Generator[Event, None, FinishReason | None]:
        """One draft-verify round; returns why generation ends, or None to go on."""
        if self.pending_draft is not None:
            yield from self._take_up_draft(run)
        t_round = self.clock()
        compute = self._compute(run)
        room = self.target.n_ctx - len(run.committed)
        remaining = min(run.params.max_tokens - len(run.generated) - 1, room)
        offered = offers(run, remaining)
        if offered:
            # Each branch is an offer's length, at most ``remaining``; every node takes a cell.
            nodes = min(room, run.tree_nodes)
            # Trees are verified unconstrained, reading no rows: under a grammar, or where
            # the target's log-probabilities are asked for, chains only.
            chains_only = (
                not run.params.greedy or run.grammar is not None or run.params.logprobs is not None
            )
            choice = run.controller.choose(list(offered.values()), sampled=chains_only, nodes=nodes)
        else:  # what the controller chooses without offers, spared at every plain step
            choice = PLAIN_STEP
        tried = tree_round(run, choice) if choice.branches > 1 else chain_round(run, choice)
        draft, verdict = tried.draft, tried.verdict

        drafted = len(draft.tokens)  # of the chain the round amounted to
        outcome = yield from emit_tokens(run, verdict, draft)
        # A tree of n nodes is one batch of n + 1 tokens, as a chain of n drafts.
        run.controller.observe_timing(tried.nodes, tried.t_done - tried.t_verify)
        mine = Outcome(True, drafted, verdict.accepted)
        for name, drafter in run.drafters.items():
            drafter.observe(run.committed, mine if name == choice.drafter else NOT_CHOSEN)
        offer = offered.get(choice.drafter) if choice.drafter is not None else None
        run.controller.observe(choice, offer, drafted, verdict.accepted)
        event = RoundCompleted(
            index=run.rounds,
            drafter=draft.source if tried.nodes else None,
            drafted=tried.nodes,
            accepted=verdict.accepted,
            emitted=outcome.emitted,
            seconds=self.clock() - t_round - outcome.paused,
            draft_seconds=tried.t_verify - t_round,
            verify_seconds=tried.t_done - tried.t_verify,
            reason=choice.reason,
            match=choice.match,
            branches=tried.branches,
            compute_seconds=self._compute(run) - compute if run.timed else None,
        )
        if run.params.trace:
            run.trace.append({k: v for k, v in asdict(event).items() if v not in ("", None)})
        run.rounds += 1
        yield run.emit(event)
        self.round_ended()
        yield from self._drafter_warnings(run)
        return outcome.reason

    def _take_up_draft(self, run: Run) -> Iterator[Event]:
        """Between rounds: a draft model whose load has ended drafts from this round on
        (its drafters begin on the text so far); a failed load is said once."""
        pending = self.pending_draft
        assert pending is not None
        if not pending.settled:
            return
        problem = pending.problem
        added = self.join_draft()
        if problem and not added:
            yield run.emit(EngineWarning(f"drafting without the draft model: {problem}"))
        run.timed = self._timed()
        mine = self.planner_for(run.params).drafters  # the run drafts with a copy of them
        for name in added:
            if name in mine:
                run.drafters[name] = mine[name]
                run.drafters[name].begin(run.committed, run.params)

    @staticmethod
    def _drafter_warnings(run: Run) -> Iterator[Event]:
        """What drafters with the ``Warns`` capability (``drafting.base``) had to say."""
        for drafter in run.drafters.values():
            pending = getattr(drafter, "warnings", None)
            while pending:
                yield run.emit(EngineWarning(pending.pop(0)))


def _nothing() -> None:
    pass


def check_learned(
    data: Any, target: TargetModel, draft: CachedModel | None, costs: CostProfile | None
) -> None:
    """Raise ``ValueError``, ``KeyError`` or ``TypeError`` unless ``data`` could be restored
    into the drafters ``auto`` builds from these models (a decoder's ``restored``); changes
    nothing."""
    auto = GenerationParams.model_validate({"drafter": DrafterMode.AUTO})
    resources = Resources(LiveCosts(costs or DEFAULT_COSTS), target, draft)
    restore_drafters(build_drafters(auto, resources), data, RESTORE_KEEP)


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
