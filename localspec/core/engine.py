"""The speculative decoding loop: ``SpecDecoder.generate(prompt, params) -> Iterator[Event]``.

Invariant at the start of every round: the target's cache holds ``committed[:-1]`` and the
last committed token is still to be evaluated. A round (``_round``) then

1. asks every drafter what it could draft and the controller which offer to take and how
   far (k = 0 is a plain step);
2. drafts ``d1..dk`` with the chosen drafter;
3. evaluates ``[last, d1..dk]`` on the target in one batch, logits for those k+1 positions;
4. verifies (greedy, or exact speculative sampling), rolls the target's cache back to the
   accepted length, and emits the accepted drafts plus the target's own token.

A tree round (greedy decoding only, when the controller plans one) drafts the competing
continuations of a copying drafter's sources (``alternatives``), verifies them in one target
pass (``core.tree_round``), and from there on is the chain round of the branch the target
took (``take``): the same tokens emitted, the same bookkeeping. Its stats count every node
of the tree as drafted.

The engine prints nothing and imports no UI: front ends render the events it yields.
Cancellation is cooperative (a ``threading.Event`` checked between rounds).

Short steps. On a GPU a target step takes a few milliseconds, so a round's own work must
not grow with the context: the target is given only the round's new tokens while its cache
is as the last round left it (``CachedModel.changes``), its logits rows are borrowed, not
copied (consumed before the next evaluation), and each round reports the time it spent
outside the models' evaluations (``RoundCompleted.compute_seconds``, the stats' overhead).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol

import numpy as np

from localspec.core.cached_model import CachedModel
from localspec.core.controller import COPY_DEPTH, COPYING, Controller, Plan
from localspec.core.costs import CostProfile
from localspec.core.drafters import Branching, Draft, Drafter, ModelDrafter, Offer, PassedDraft
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
from localspec.core.ngram import NgramDrafter
from localspec.core.params import DrafterKind, DrafterMode, GenerationParams
from localspec.core.retrieval import Corpus, StoreDrafter
from localspec.core.sampling import warp
from localspec.core.stats import GenerationStats
from localspec.core.text import TextAssembler
from localspec.core.tree import DraftTree
from localspec.core.tree_round import tree_shape, verify_branches
from localspec.core.verify import Verdict, verify_greedy, verify_sampled
from localspec.errors import ContextOverflowError


class TargetModel(Protocol):
    """What the engine needs of the target (``CachedModel`` plus its vocabulary)."""

    n_ctx: int
    n_vocab: int
    evaluated_tokens: int
    changes: int

    def forward(
        self, tokens: Sequence[int], n_logits: int, *, borrow: bool = False
    ) -> np.ndarray: ...
    def forward_after(
        self, start: int, tail: Sequence[int], n_logits: int, *, borrow: bool = False
    ) -> np.ndarray: ...
    def truncate(self, n: int) -> None: ...
    @property
    def supports_trees(self) -> bool: ...
    def forward_tree(self, committed: Sequence[int], tree: DraftTree) -> np.ndarray: ...
    def keep_path(self, path: Sequence[int]) -> None: ...
    def token_bytes(self, token: int) -> bytes: ...
    def is_eog(self, token: int) -> bool: ...


# The controller's plan when no drafter offers anything (nothing to weigh, nothing to probe).
PLAIN_STEP = Plan(None, 0, 0.0, "plain step")

# Used when no calibration is given: batch costs typical of a small CPU (see the design note).
DEFAULT_COSTS = CostProfile(
    plain_s=1.0,
    verify_s={1: 2.3, 3: 2.9, 4: 3.2, 15: 5.8, 31: 11.0, 47: 14.0, 63: 17.0},
    draft_step_s=0.5,
)


@dataclass
class _Run:
    """The state of one generation that rounds extend."""

    committed: list[int]  # prompt + generated
    params: GenerationParams
    rng: np.random.Generator
    controller: Controller
    drafters: dict[DrafterKind, Drafter]
    text: TextAssembler
    emit: Callable[[Event], Event]
    generated: list[int] = field(default_factory=list)
    rounds: int = 0
    # The target's ``changes`` after this run's last call on it: while they are unchanged,
    # its cache holds ``committed[:-1]`` as that call left it.
    target_changes: int | None = None
    # Models that count the seconds of their evaluations (``compute_seconds``).
    timed: tuple = ()
    tree_nodes: int = 0  # the most nodes a draft tree may have on the target
    trace: list[dict] = field(default_factory=list)
    # per copying drafter, a draft a round passed over and the answer has not yet graded
    passed: dict[DrafterKind, PassedDraft] = field(default_factory=dict)


@dataclass(frozen=True)
class _Verified:
    """A round's draft and verdict as the chain it amounted to (after a tree, the branch
    the target took), and what the target verified."""

    draft: Draft
    verdict: Verdict
    nodes: int  # draft tokens in the target's batch (every node of a tree)
    branches: int
    t_verify: float  # when the target's pass began
    t_done: float


@dataclass(frozen=True)
class _Outcome:
    emitted: int
    paused: float  # seconds the consumer held the generator while tokens were yielded
    reason: FinishReason | None


class SpecDecoder:
    def __init__(
        self,
        target: TargetModel,
        draft: CachedModel | None = None,
        costs: CostProfile | None = None,
    ) -> None:
        self.target = target
        self.model_drafter = (
            ModelDrafter(draft, target.is_eog, target.n_vocab) if draft is not None else None
        )
        self.costs = costs or DEFAULT_COSTS
        self._controllers: dict[tuple, Controller] = {}
        self.restored: dict | None = None  # learned state to start every new controller from
        self.corpora: list[tuple[str, Corpus]] = []  # what the datastore drafter looks up

    def controllers(self) -> list[Controller]:
        return list(self._controllers.values())

    def forget_learning(self) -> None:
        """Start the next generation as a fresh process would with no saved state: new
        controllers, nothing restored (the machine's measured costs are kept)."""
        self._controllers.clear()
        self.restored = None

    def controller_for(self, params: GenerationParams) -> Controller:
        """One controller per mode, kept across calls so acceptance estimates carry over.
        Its draft trees are on when asked for and the target can verify them; it plans them
        for greedy rounds only."""
        key = (
            params.drafter, params.draft_max, params.ngram_draft_max, params.draft_min,
            params.trees,
        )  # fmt: skip
        if key not in self._controllers:
            allow = tuple(
                k for k in params.drafter.kinds() if k != DrafterKind.MODEL or self.model_drafter
            )
            controller = Controller(
                self.costs,
                allow=allow,
                draft_max=params.draft_max,
                ngram_draft_max=params.ngram_draft_max,
                draft_min=params.draft_min,
                fixed=params.drafter in (DrafterMode.NGRAM, DrafterMode.MODEL),
                trees=params.trees and self.target.supports_trees,
                max_branches=tree_shape(self.target)[0],
            )
            if self.restored is not None and params.drafter == DrafterMode.AUTO:
                controller.restore(self.restored)
            self._controllers[key] = controller
        return self._controllers[key]

    def check(self, prompt: list[int], params: GenerationParams) -> None:
        """Raise what ``generate`` would raise for this prompt before its first event
        (``ContextOverflowError`` for a prompt the context cannot hold), without running it."""
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
        if params.drafter == DrafterMode.MODEL and self.model_drafter is None:
            raise ValueError("the model drafter needs a draft model")

    def generate(
        self,
        prompt: Sequence[int],
        params: GenerationParams,
        cancel: threading.Event | None = None,
    ) -> Iterator[Event]:
        prompt = list(prompt)
        self.check(prompt, params)
        stats = GenerationStats()

        def emit(event: Event) -> Event:
            stats.observe(event)
            return event

        t0 = time.perf_counter()
        before = self.target.evaluated_tokens
        self.target.forward(prompt[:-1], 0)
        prefilled = self.target.changes
        evaluated = self.target.evaluated_tokens - before
        yield emit(PrefillDone(len(prompt), evaluated, time.perf_counter() - t0))

        controller = self.controller_for(params)
        controller.new_generation()
        drafters: dict[DrafterKind, Drafter] = {
            DrafterKind.NGRAM: NgramDrafter(params.ngram_min, params.ngram_max, self.target.is_eog)
        }
        if self.corpora and DrafterKind.STORE in controller.allow:
            drafters[DrafterKind.STORE] = StoreDrafter(
                self.corpora, n_max=params.ngram_max, ends=self.target.is_eog
            )
        if self.model_drafter is not None:
            drafters[DrafterKind.MODEL] = self.model_drafter
        # Only those the controller may choose: the others would do work every round
        # (the n-gram index follows the text) for nothing.
        drafters = {k: d for k, d in drafters.items() if k in controller.allow}
        for drafter in drafters.values():
            drafter.begin(prompt)
        run = _Run(
            prompt, params, np.random.default_rng(params.seed), controller, drafters,
            TextAssembler(params.stop), emit, target_changes=prefilled, timed=self._timed(),
            tree_nodes=tree_shape(self.target)[1],
        )  # fmt: skip
        reason: FinishReason | None = None
        while reason is None:
            if cancel is not None and cancel.is_set():
                reason = FinishReason.CANCELLED
            elif len(run.committed) > self.target.n_ctx:
                yield emit(EngineWarning(f"the context of {self.target.n_ctx} tokens is full"))
                reason = FinishReason.LENGTH
            else:
                reason = yield from self._round(run)
        # Held-back text that never became a stop string is still part of the answer.
        tail = run.text.finish()
        if params.trace:
            stats.trace = run.trace
        yield Finished(reason, run.text.text, tuple(run.generated), stats, tail=tail)

    def _timed(self) -> tuple:
        """The models whose evaluations are timed (``compute_seconds``): the target, and the
        draft model when there is one."""
        models = [self.target]
        if self.model_drafter is not None:
            models.append(self.model_drafter.model)
        return tuple(m for m in models if hasattr(m, "compute_seconds"))

    @staticmethod
    def _compute(run: _Run) -> float:
        return sum(m.compute_seconds for m in run.timed)

    def _round(self, run: _Run) -> Generator[Event, None, FinishReason | None]:
        """One draft-verify round; returns why generation ends, or None to go on."""
        t_round = time.perf_counter()
        compute = self._compute(run)
        room = self.target.n_ctx - len(run.committed)
        remaining = min(run.params.max_tokens - len(run.generated) - 1, room)
        offers = self._offers(run, remaining)
        if offers:
            # Each branch is an offer's length, at most ``remaining``; every node takes a cell.
            nodes = min(room, run.tree_nodes)
            plan = run.controller.plan(
                list(offers.values()), sampled=not run.params.greedy, nodes=nodes
            )
            self._pass_over(run, plan, offers)
        else:  # what the controller plans without offers, spared at every plain step
            plan = PLAIN_STEP
        tried = self._tree_round(run, plan) if plan.branches > 1 else self._chain_round(run, plan)
        draft, verdict = tried.draft, tried.verdict

        drafted = len(draft.tokens)  # of the chain the round amounted to
        outcome = yield from self._emit(run, verdict, draft)
        for kind, drafter in run.drafters.items():
            mine = kind == draft.source and drafted > 0
            drafter.observe(run.committed, drafted if mine else 0, verdict.accepted if mine else 0)
        # A tree of n nodes is one batch of n + 1 tokens, as a chain of n drafts.
        run.controller.observe_timing(tried.nodes, tried.t_done - tried.t_verify, draft)
        offer = offers.get(plan.drafter) if plan.drafter is not None else None
        run.controller.observe(plan, offer, drafted, verdict.accepted)
        for kind, passed in list(run.passed.items()):
            if graded := passed.verdict(run.committed):
                run.controller.observe_passed(passed.offer, *graded)
                del run.passed[kind]
        event = RoundCompleted(
            index=run.rounds,
            drafter=draft.source if tried.nodes else None,
            drafted=tried.nodes,
            accepted=verdict.accepted,
            emitted=outcome.emitted,
            seconds=time.perf_counter() - t_round - outcome.paused,
            draft_seconds=tried.t_verify - t_round,
            verify_seconds=tried.t_done - tried.t_verify,
            reason=plan.reason,
            match=plan.match,
            branches=tried.branches,
            compute_seconds=self._compute(run) - compute if run.timed else None,
        )
        if run.params.trace:
            run.trace.append({k: v for k, v in asdict(event).items() if v not in ("", None)})
        run.rounds += 1
        yield run.emit(event)
        return outcome.reason

    @staticmethod
    def _offers(run: _Run, remaining: int) -> dict[DrafterKind, Offer]:
        """What every allowed drafter could draft this round, up to its limit."""
        offers: dict[DrafterKind, Offer] = {}
        for kind, drafter in run.drafters.items():
            if kind in run.controller.allow:
                offer = drafter.offer(run.committed, run.controller.limit(kind, remaining))
                if offer is not None:
                    offers[kind] = offer
        return offers

    @staticmethod
    def _pass_over(run: _Run, plan: Plan, offers: dict[DrafterKind, Offer]) -> None:
        """Keep what a copying drafter would have drafted when the round drafts from another
        (or not at all), for the answer to grade: whether this text copies from there."""
        for kind in COPYING:
            offer = offers.get(kind)
            if offer is None or kind == plan.drafter or kind in run.passed:
                continue
            drafter = run.drafters[kind]
            assert isinstance(drafter, NgramDrafter | StoreDrafter)
            run.passed[kind] = PassedDraft(offer, drafter.preview(COPY_DEPTH), len(run.committed))

    def _chain_round(self, run: _Run, plan: Plan) -> _Verified:
        """Draft a chain (none for a plain step) and verify it in one target batch."""
        draft = Draft(DrafterKind.NGRAM, [])
        if plan.drafter is not None and plan.k > 0:
            drafter = run.drafters[plan.drafter]
            draft = drafter.propose(run.committed, plan.k, run.params, run.rng, plan.p_min)
        t_verify = time.perf_counter()
        verdict = self._verify_round(run, draft)
        return _Verified(draft, verdict, len(draft.tokens), 1, t_verify, time.perf_counter())

    def _tree_round(self, run: _Run, plan: Plan) -> _Verified:
        """Draft the plan's competing branches and verify them as one draft tree (greedy);
        the drafter is told which branch the target took, and the round amounts to that
        branch's chain round."""
        assert plan.drafter is not None and run.params.greedy
        drafter = run.drafters[plan.drafter]
        assert isinstance(drafter, Branching)
        branches = drafter.alternatives(plan.k, plan.branches)
        if not branches:  # nothing to draft after all: a plain step
            return self._chain_round(run, Plan(None, 0, 0.0, plan.reason))
        t_verify = time.perf_counter()
        tried = verify_branches(self.target, run.committed, branches)
        t_done = time.perf_counter()
        run.target_changes = self.target.changes
        drafter.take(tried.taken)
        draft = Draft(plan.drafter, branches[tried.taken])
        return _Verified(draft, tried.verdict, tried.nodes, len(branches), t_verify, t_done)

    def _emit(self, run: _Run, verdict: Verdict, draft: Draft) -> Generator[Event, None, _Outcome]:
        """Emit the round's tokens, stopping at an end of generation."""
        emitted, paused = 0, 0.0
        drafted = draft.source.value if verdict.accepted else TARGET
        for i, tok in enumerate(verdict.tokens(draft.tokens)):
            if self.target.is_eog(tok):
                return _Outcome(emitted, paused, FinishReason.EOS)
            origin = drafted if i < verdict.accepted else TARGET
            piece = run.text.push(self.target.token_bytes(tok))
            run.committed.append(tok)
            run.generated.append(tok)
            emitted += 1
            t_yield = time.perf_counter()
            yield run.emit(TokenEmitted(tok, piece, origin, len(run.generated) - 1))
            paused += time.perf_counter() - t_yield  # the consumer's time is not ours
            if run.text.stopped:
                return _Outcome(emitted, paused, FinishReason.STOP)
            if len(run.generated) >= run.params.max_tokens:
                return _Outcome(emitted, paused, FinishReason.LENGTH)
        return _Outcome(emitted, paused, None)

    def _verify_round(self, run: _Run, draft: Draft) -> Verdict:
        """Evaluate ``[last, drafts]`` in one target batch, verify, and roll the target's
        cache back so that it holds ``committed[:-1]`` of the next round."""
        committed = run.committed
        batch = [committed[-1], *draft.tokens]
        if run.target_changes == self.target.changes:  # as the last round left it
            rows = self.target.forward_after(len(committed) - 1, batch, len(batch), borrow=True)
        else:  # someone else used the target meanwhile: compare the whole context
            rows = self.target.forward([*committed[:-1], *batch], len(batch), borrow=True)
        # The rows are borrowed: consumed here, before the target evaluates anything else.
        verdict = self._verify(rows, draft, run.params, run.rng)
        self.target.truncate(len(committed) + verdict.accepted)
        run.target_changes = self.target.changes
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
