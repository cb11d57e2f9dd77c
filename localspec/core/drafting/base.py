"""The drafter protocol: what the engine and the controller know of any drafter.

A drafter is built for a mode by the registry (``core.drafting.registry``) and kept across
generations, so what it learns carries from answer to answer, as llama.cpp keeps a
``common_speculative_state``. The engine calls, for every generation and round:

- ``begin(prompt, params)``: a new answer starts (a new text to learn about);
- ``offer(committed, limit)``: what it could draft after ``committed`` (at most ``limit``
  tokens), priced by itself: an ``Offer`` carries the expected accepted tokens for every
  draft length (``expected_accepted``) and the seconds drafting them would take. None:
  nothing to offer;
- ``propose(committed, k, params, rng)``: draft at most ``k`` tokens, when the controller
  picked this drafter;
- ``observe(committed, outcome)``: the round is over, ``committed`` grew; ``outcome`` says
  whether this drafter drafted and how much of it was accepted. Every drafter learns here,
  from its own verdicts;
- ``learned()`` / ``restore(data, keep)``: its evidence as plain data, and back
  (discounted to ``keep``), so that the next process starts warm.

Optional capability: a drafter whose sources may disagree (the copying ones) can draft
the competing continuations as one draft tree; it then exposes itself as ``branching``
(a ``Branching``), and its offers price trees (``Offer.tree``). Drafters without it set
``branching = None`` and are never planned a tree.

Optional capability ``Warns``: a drafter that drafts from something that may fail
outside its control (a datastore on disk) keeps a ``warnings`` list; the engine yields each
line as an ``EngineWarning`` after the round and empties it, so a drafter never has to fail
a generation to say that it had to leave something out.

Optional capability ``Watching``: a drafter that drafts from what the target computed
(lookahead) exposes ``watching`` (None while it has no use for them); the engine shows it
the target's greedy token after every position of every target pass, as a tree of nodes.

Optional capability ``Ends``: a drafter that holds what only the answer under way needs
(an index of a long prediction) frees it in ``end()``, which the engine calls once the
generation is over, finished, cancelled or abandoned; ``begin`` builds it again.

The loop never asks which kind of drafter it holds: names (``Drafter.name``) only label
stats, events and token origins. ``Resources`` is what the registry builds drafters from.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from localspec.core.cached_model import CachedModel, TargetModel
from localspec.core.costs import LiveCosts
from localspec.core.params import GenerationParams, Policy


def no_seconds(k: int) -> float:
    """The drafting time of a draft that costs nothing to make (a copy)."""
    return 0.0


@dataclass(frozen=True)
class Offer:
    """What a drafter could propose this round, priced by the drafter itself.

    ``expected_accepted(k)`` lists the expected accepted tokens of drafts of 1..k tokens (k
    at most ``available``); ``draft_seconds(k)`` is the time drafting k tokens would take
    (free for copies). When its sources disagree, ``tree(m, k)`` lists the same for a draft
    tree of ``m`` branches (2 <= m <= ``branches``) of 1..k tokens each. ``probe``: when
    idle for long, a short draft may be tried so that its estimate can recover (an estimate
    learned only from its own drafts). ``label`` and ``match`` only describe the round."""

    drafter: str
    available: int  # most tokens it can draft now
    expected_accepted: Callable[[int], list[float]]
    draft_seconds: Callable[[int], float] = no_seconds
    tree: Callable[[int, int], list[float]] | None = None
    branches: int = 1  # most branches a tree of its sources may have (1: chains only)
    probe: bool = False
    label: str = ""  # what it is drafted on, for the plan's reason, e.g. " (match 5, streak)"
    match: int = 0  # matched suffix length of a copying offer (0: none)


@dataclass(frozen=True)
class Draft:
    source: str  # the drafter's name ("" for no draft: a plain step)
    tokens: list[int]
    probs: list[np.ndarray] | None = None  # q for each token; None means one-hot


@dataclass(frozen=True)
class Outcome:
    """A drafter's part in a finished round."""

    chosen: bool  # the round drafted from this drafter (its draft may have been empty)
    drafted: int = 0  # tokens of its draft verified (after a tree, the branch taken)
    accepted: int = 0  # of those, accepted by the target


NOT_CHOSEN = Outcome(False)
PLAIN = Draft("", [])


class Branching(Protocol):
    """A drafter that can draft the competing continuations of its sources."""

    def alternatives(self, k: int, m: int) -> list[list[int]]:
        """Up to ``m`` continuations of up to ``k`` tokens with distinct first tokens, the
        one ``propose(k)`` would draft now first."""

    def take(self, i: int) -> None:
        """After ``alternatives``: branch ``i`` is what the target took, so that the next
        ``observe`` follows it."""


class Warns(Protocol):
    warnings: list[str]  # lines for the engine to yield after the round, then emptied


class Watching(Protocol):
    def watch(self, tokens: Sequence[int], parents: Sequence[int], chosen: Sequence[int]) -> None:
        """A target pass: ``chosen[0]`` is the target's greedy token after the last committed
        token, ``chosen[1 + i]`` after node ``i`` (``tokens[i]``, child of node
        ``parents[i]``; ``core.tree.ROOT`` is the last committed token; a chain's node i is
        the child of i - 1)."""


class Ends(Protocol):
    def end(self) -> None:
        """The generation is over: free what only its answer needed."""


class Drafter(Protocol):
    name: str
    limit: int  # the longest draft it may propose in a round

    @property
    def branching(self) -> Branching | None:
        """Itself, where it offers draft trees; an attribute or a property."""

    def begin(self, prompt: Sequence[int], params: GenerationParams) -> None: ...

    def offer(self, committed: Sequence[int], limit: int) -> Offer | None: ...

    def propose(
        self,
        committed: Sequence[int],
        k: int,
        params: GenerationParams,
        rng: np.random.Generator,
    ) -> Draft: ...

    def observe(self, committed: Sequence[int], outcome: Outcome) -> None: ...

    def learned(self) -> dict[str, Any]: ...

    def restore(self, data: Any, keep: float) -> None:
        """Start from ``learned()`` data, discounted to ``keep``; raises ``ValueError``,
        ``KeyError`` or ``TypeError`` on malformed data, changing nothing."""


class Corpus(Protocol):
    """A token corpus to draft from (``storage.datastore.TokenIndex``)."""

    def longest_match(self, context: Sequence[int], n_max: int = 32, n_min: int = 2) -> Any: ...

    def continuations(
        self, match: Any, k: int, limit: int = 64
    ) -> list[tuple[tuple[int, ...], int]]: ...


@dataclass(frozen=True)
class Resources:
    """What drafters are built from: the live costs they price with (shared with the
    controller), the target (its vocabulary and end of generation), the draft model if one
    is loaded (and its drafter's name), the named corpora to draft from as they are when an
    answer begins, the clock a drafter that times its own work reads (the engine's), and
    the mode's ``Policy``, fixed or priced (``build_drafters`` sets it from the mode)."""

    costs: LiveCosts
    target: TargetModel
    draft_model: CachedModel | None = None
    corpora: Callable[[], Sequence[tuple[str, Corpus]]] = lambda: ()
    clock: Callable[[], float] = time.perf_counter
    draft_name: str = "model"  # the draft model's drafter: "self" for a derived draft
    policy: Policy = Policy.PRICED
