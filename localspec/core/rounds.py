"""One round's mechanics: its offers, its draft (a chain or a tree), its verification on the
target, and the tokens it emits, over a generation's state (``Run``).

``SpecDecoder._round`` (``core.engine``) strings them together and does the bookkeeping:
``offers`` asks every drafter what it could draft; the controller chooses; ``chain_round``
or ``tree_round`` drafts and verifies; ``emit_tokens`` yields the accepted drafts and the
target's own token, stopping at an end of generation, a stop string or the token limit.

Verification keeps the engine's invariant: after a round the target's cache holds
``committed[:-1]`` of the next one (``verify_round`` rolls it back to the accepted length).
While the target's ``changes`` are those the run's last call left (``Run.target_changes``),
it is given the round's new tokens only; otherwise the whole context is compared. Greedy
decoding asks the target for its greedy choices only, never for a row; sampled rows are
borrowed, consumed before the target evaluates anything else. Drafters that draft from the
target's own choices (``Watching``) are shown them after every position, chain or tree.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field

import numpy as np

from localspec.core.cached_model import TargetModel, greedy_ids
from localspec.core.controller import Choice, Controller
from localspec.core.drafting.base import PLAIN, Draft, Drafter, Offer, Watching
from localspec.core.drafting.copying import one_copy
from localspec.core.events import TARGET, Event, FinishReason, Logprob, TokenEmitted
from localspec.core.grammar import Grammar, best_allowed, cut, masked_for_top
from localspec.core.params import GenerationParams
from localspec.core.sampling import log_softmax, warp
from localspec.core.text import TextAssembler
from localspec.core.tree import ROOT, DraftTree
from localspec.core.tree_round import verify_branches
from localspec.core.verify import Verdict, verify_greedy, verify_rows, verify_sampled


@dataclass
class Run:
    """The state of one generation that rounds extend."""

    committed: list[int]  # prompt + generated
    params: GenerationParams
    rng: np.random.Generator
    controller: Controller
    drafters: dict[str, Drafter]
    text: TextAssembler
    emit: Callable[[Event], Event]
    target: TargetModel
    clock: Callable[[], float]
    generated: list[int] = field(default_factory=list)
    rounds: int = 0
    # The target's ``changes`` after this run's last call on it: while they are unchanged,
    # its cache holds ``committed[:-1]`` as that call left it.
    target_changes: int | None = None
    # Models that count the seconds of their evaluations (``compute_seconds``).
    timed: tuple = ()
    tree_nodes: int = 0  # the most nodes a draft tree may have on the target
    trace: list[dict] = field(default_factory=list)
    # The answer's grammar at the state of ``generated`` (None: unconstrained).
    grammar: Grammar | None = None
    # The log-probabilities of the round's tokens, in order, when ``params.logprobs`` asks.
    logprobs: list[Logprob] = field(default_factory=list)


@dataclass(frozen=True)
class Verified:
    """A round's draft and verdict as the chain it amounted to (after a tree, the branch
    the target took), and what the target verified."""

    draft: Draft
    verdict: Verdict
    nodes: int  # draft tokens in the target's batch (every node of a tree)
    branches: int
    t_verify: float  # when the target's pass began
    t_done: float


@dataclass(frozen=True)
class Emitted:
    emitted: int
    paused: float  # seconds the consumer held the generator while tokens were yielded
    reason: FinishReason | None


def watchers(run: Run) -> list[Watching]:
    """The drafters shown the target's choices this round (``Watching``)."""
    found = (getattr(d, "watching", None) for d in run.drafters.values())
    return [w for w in found if w is not None]


def offers(run: Run, remaining: int) -> dict[str, Offer]:
    """What every drafter could draft this round, up to its limit: one offer per copy
    (``copying.one_copy``)."""
    made: dict[str, Offer] = {}
    for name, drafter in run.drafters.items():
        offer = drafter.offer(run.committed, min(drafter.limit, remaining))
        if offer is not None:
            made[name] = offer
    return one_copy(made, run.drafters, lambda some: run.controller.choose(some).drafter)


def chain_round(run: Run, choice: Choice) -> Verified:
    """Draft a chain (none for a plain step) and verify it in one target batch."""
    draft = PLAIN
    if choice.drafter is not None and choice.k > 0:
        drafter = run.drafters[choice.drafter]
        draft = drafter.propose(run.committed, choice.k, run.params, run.rng)
    beyond = None
    if run.grammar is not None and draft.tokens:
        draft, beyond = grammar_cut(run.grammar, draft)
    t_verify = run.clock()
    verdict = verify_round(run, draft, beyond)
    return Verified(draft, verdict, len(draft.tokens), 1, t_verify, run.clock())


def tree_round(run: Run, choice: Choice) -> Verified:
    """Draft the choice's competing branches and verify them as one draft tree (greedy);
    the drafter is told which branch the target took, and the round amounts to that
    branch's chain round."""
    assert choice.drafter is not None and run.params.greedy
    # Only an offer that prices trees is chosen as one: its drafter branches.
    drafter = run.drafters[choice.drafter].branching
    assert drafter is not None
    branches = drafter.alternatives(choice.k, choice.branches)
    if not branches:  # nothing to draft after all: a plain step
        return chain_round(run, Choice(None, 0, 0.0, choice.reason))
    t_verify = run.clock()
    shown = watchers(run)

    def watch(tree: DraftTree, choices: list[int]) -> None:
        for watcher in shown:
            watcher.watch(tree.tokens, tree.parents, choices)

    tried = verify_branches(run.target, run.committed, branches, watch if shown else None)
    t_done = run.clock()
    run.target_changes = run.target.changes
    drafter.take(tried.taken)
    draft = Draft(choice.drafter, branches[tried.taken])
    return Verified(draft, tried.verdict, tried.nodes, len(branches), t_verify, t_done)


def emit_tokens(run: Run, verdict: Verdict, draft: Draft) -> Generator[Event, None, Emitted]:
    """Emit the round's tokens, stopping at an end of generation."""
    emitted, paused = 0, 0.0
    drafted = draft.source if verdict.accepted else TARGET
    for i, tok in enumerate(verdict.tokens(draft.tokens)):
        if run.target.is_eog(tok):
            return Emitted(emitted, paused, FinishReason.EOS)
        origin = drafted if i < verdict.accepted else TARGET
        logprob = run.logprobs[i] if i < len(run.logprobs) else None
        if run.grammar is not None:
            run.grammar.accept(tok)
        piece = run.text.push(run.target.token_bytes(tok))
        run.committed.append(tok)
        run.generated.append(tok)
        emitted += 1
        t_yield = run.clock()
        yield run.emit(TokenEmitted(tok, piece, origin, len(run.generated) - 1, logprob))
        paused += run.clock() - t_yield  # the consumer's time is not ours
        if run.text.stopped:
            return Emitted(emitted, paused, FinishReason.STOP)
        if len(run.generated) >= run.params.max_tokens:
            return Emitted(emitted, paused, FinishReason.LENGTH)
    return Emitted(emitted, paused, None)


def grammar_cut(grammar: Grammar, draft: Draft) -> tuple[Draft, np.ndarray | None]:
    """The draft up to the first token the grammar forbids, before the target sees it; and
    that token's q (a drafter's own distribution), for the verification to draw the token
    after the kept draft as a rejection of it would."""
    kept, bad = cut(grammar, draft.tokens)
    if bad is None:
        return draft, None
    n = len(kept)
    probs = draft.probs
    beyond = probs[n] if probs is not None else None
    return Draft(draft.source, kept, probs[:n] if probs is not None else None), beyond


def grammar_states(grammar: Grammar, draft: list[int]) -> Callable[[int], Grammar]:
    """The grammar after ``draft[:i]``, for i = 0..len(draft), each made once when asked
    for (in order); the committed state itself is never advanced."""
    states = [grammar]

    def state(i: int) -> Grammar:
        while len(states) <= i:
            nxt = states[-1].clone()
            nxt.accept(draft[len(states) - 1])
            states.append(nxt)
        return states[i]

    return state


def verify_constrained(
    run: Run, rows: np.ndarray, draft: Draft, beyond: np.ndarray | None
) -> Verdict:
    """Verification against the target restricted by the grammar: at each drafted position
    the grammar's state after the drafts before it masks the row (greedy: the best allowed
    token, a mask only when the row's argmax is forbidden; sampled: exact speculative
    sampling against the masked, renormalized distribution)."""
    assert run.grammar is not None
    state = grammar_states(run.grammar, draft.tokens)
    if run.params.greedy:
        for i, d in enumerate(draft.tokens):
            best = best_allowed(rows[i], state(i))
            if best != d:
                return Verdict(i, best)
        return Verdict(
            len(draft.tokens), best_allowed(rows[len(draft.tokens)], state(len(draft.tokens)))
        )
    warped: dict[int, np.ndarray] = {}

    def target_probs(i: int) -> np.ndarray:
        if i not in warped:
            warped[i] = warp(masked_for_top(rows[i], state(i), run.params.top_k), run.params)
        return warped[i]

    return verify_sampled(target_probs, draft.tokens, draft.probs, run.rng, beyond=beyond)


def row_logprobs(
    rows: np.ndarray, tokens: list[int], top: int | None, pieces: Callable[[int], bytes]
) -> list[Logprob]:
    """Each emitted token's log-probability under the row it was verified on (row i gives
    the token after position i), with ``top`` alternatives; none unless ``top`` is set."""
    if top is None:
        return []
    out = []
    for row, token in zip(rows, tokens, strict=False):
        logs = log_softmax(row)
        best = np.argsort(-logs, kind="stable")[:top]
        alternatives = tuple((int(t), pieces(int(t)), float(logs[t])) for t in best)
        out.append(Logprob(float(logs[token]), pieces(token), alternatives))
    return out


def verify_round(run: Run, draft: Draft, beyond: np.ndarray | None = None) -> Verdict:
    """Evaluate ``[last, drafts]`` in one target batch, verify, and roll the target's
    cache back so that it holds ``committed[:-1]`` of the next round. Greedy decoding
    asks the target for its greedy choices only, never for a row, but under a grammar,
    whose mask needs the row where the argmax is forbidden. ``beyond``: the q of a drafted
    token the grammar cut after the draft (``grammar_cut``)."""
    committed, target = run.committed, run.target
    batch = [committed[-1], *draft.tokens]
    # As the last round left it, the target is given the new tokens only; if someone
    # else used it meanwhile, the whole context is compared.
    start = len(committed) - 1 if run.target_changes == target.changes else 0
    tail = batch if start else [*committed[:-1], *batch]
    if run.grammar is not None or run.params.logprobs is not None:
        rows = target.forward_after(start, tail, len(batch), borrow=True)
        # The rows are borrowed: consumed here, before the target evaluates anything else.
        if run.grammar is not None:
            verdict = verify_constrained(run, rows, draft, beyond)
        elif run.params.greedy:
            verdict = verify_greedy(greedy_ids(rows), draft.tokens)
        else:
            verdict = verify_rows(rows, draft.tokens, draft.probs, run.params, run.rng)
        run.logprobs = row_logprobs(
            rows, verdict.tokens(draft.tokens), run.params.logprobs, target.token_bytes
        )
        choices = greedy_ids(rows) if watchers(run) else []
    elif run.params.greedy:
        choices = target.greedy_after(start, tail, len(batch)).ids
        verdict = verify_greedy(choices, draft.tokens)
    else:
        rows = target.forward_after(start, tail, len(batch), borrow=True)
        # The rows are borrowed: consumed here, before the target evaluates anything else.
        verdict = verify_rows(rows, draft.tokens, draft.probs, run.params, run.rng)
        choices = greedy_ids(rows) if watchers(run) else []
    chain = list(range(ROOT, len(draft.tokens) - 1))  # node i's parent is i - 1
    for watcher in watchers(run) if choices else ():
        watcher.watch(draft.tokens, chain, choices)
    target.truncate(len(committed) + verdict.accepted)
    run.target_changes = target.changes
    return verdict
