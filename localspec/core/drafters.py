"""Drafters: who proposes the tokens the target verifies, behind one small protocol.

A ``Drafter`` is told the prompt (``begin``), says each round what it could draft
(``offer``: how many tokens, on what evidence, at what set-up cost), drafts when the
controller picks it (``propose``), and learns from the verdict (``observe``). The engine
calls these without knowing which drafter it talks to.

The copying drafters (n-gram, datastore) can also say where their sources disagree
(``Offer.shares``) and draft the competing continuations (``alternatives(k, m)``), for the
engine to verify as one draft tree; ``take(i)`` then tells the drafter which branch the
target took, so that its ``observe`` follows that branch. These two are not part of the
protocol: a drafter without them is simply never asked for a tree.

- ``NgramDrafter`` (prompt lookup, in ``core.ngram``): drafts what followed earlier
  occurrences of the text's suffix, following a copy through the edits it makes. Free to
  run; its q is one-hot, so ``Draft.probs`` is None. ``PassedDraft`` grades, as the answer
  goes on, a draft a round passed over (``NgramDrafter.preview``).
- ``StoreDrafter`` (retrieval, in ``core.retrieval``): drafts what followed the text's
  suffix in the user's corpora.
- ``ModelDrafter``: runs the draft model autoregressively on its own KV cache (only tokens
  it lacks are evaluated, in one catch-up batch timed apart from the one-token steps),
  greedy when decoding is greedy, otherwise sampling from its warped q (returned for exact
  verification). It stops early when its confidence falls below ``p_min`` or after an
  end-of-generation token.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from localspec.core.cached_model import CachedModel, common_prefix_length
from localspec.core.params import DrafterKind, GenerationParams
from localspec.core.sampling import sample, top_probability, warp


@dataclass(frozen=True)
class Offer:
    """What a drafter could propose this round, for the controller to weigh."""

    kind: DrafterKind
    available: int  # most tokens it can draft now
    match: int = 0  # n-gram: how many tokens of the suffix matched (the evidence)
    streak: bool = False  # n-gram: its previous long draft was accepted whole (a copy goes on)
    catch_up: int = 0  # draft model: tokens its first pass evaluates (0: just one)
    resync: bool = False  # n-gram: resumes a copy that parted a few tokens ago (see below)
    support: float = 1.0  # datastore: share of the match's occurrences that go on as drafted
    # Copying drafters: when the occurrences they examined disagree, the share of them that
    # goes on with each distinct next token, the one drafted first (empty: no alternatives).
    shares: tuple[float, ...] = ()


@dataclass(frozen=True)
class Draft:
    source: DrafterKind
    tokens: list[int]
    probs: list[np.ndarray] | None = None  # q for each token; None means one-hot
    steps: int = 0  # draft-model forward passes of one token
    step_seconds: float = 0.0  # time of those passes
    catch_up_tokens: int = 0  # tokens the first pass evaluated, when it caught up (else 0)
    catch_up_seconds: float = 0.0  # time of that first pass (which also drafted one token)


class Drafter(Protocol):
    kind: DrafterKind

    def begin(self, tokens: Sequence[int]) -> None:
        """A new generation starts from ``tokens`` (the prompt)."""

    def offer(self, committed: Sequence[int], limit: int) -> Offer | None:
        """What could be drafted after ``committed`` (at most ``limit`` tokens); None: nothing."""

    def propose(
        self,
        committed: Sequence[int],
        k: int,
        params: GenerationParams,
        rng: np.random.Generator,
        p_min: float,
    ) -> Draft:
        """Draft at most ``k`` tokens after ``committed``."""

    def observe(self, committed: Sequence[int], drafted: int, accepted: int) -> None:
        """The round is over: ``committed`` grew; this drafter's draft (if any) had
        ``drafted`` tokens, of which ``accepted`` survived (both 0 if it did not draft)."""


@runtime_checkable
class Branching(Protocol):
    """A copying drafter that can draft the competing continuations of its sources."""

    def alternatives(self, k: int, m: int) -> list[list[int]]:
        """Up to ``m`` continuations of up to ``k`` tokens with distinct first tokens, the
        one ``propose(k)`` would draft now first (in the order of ``Offer.shares``)."""

    def take(self, i: int) -> None:
        """After ``alternatives``: branch ``i`` is what was drafted, so that the next
        ``observe`` follows it."""


@dataclass
class PassedDraft:
    """A draft a round passed over (``NgramDrafter.preview``, ``StoreDrafter.preview``),
    graded as the answer goes on: ``verdict`` is None until the answer has shown how many
    of its tokens would have been accepted."""

    offer: Offer
    tokens: list[int]
    start: int  # how many tokens were committed when it was passed over

    def verdict(self, committed: Sequence[int]) -> tuple[int, int] | None:
        """``(drafted, accepted)`` once known."""
        seen = committed[self.start : self.start + len(self.tokens)]
        accepted = common_prefix_length(self.tokens, seen)
        if accepted == len(self.tokens) or accepted < len(seen):
            return len(self.tokens), accepted
        return None


class ModelDrafter:
    """Autoregressive drafting with a small model that shares the target's vocabulary."""

    kind = DrafterKind.MODEL

    def __init__(
        self, model: CachedModel, is_eog: Callable[[int], bool], vocab: int | None = None
    ) -> None:
        """``vocab``: the target's vocabulary size; ids at or past it are never drafted
        (vocabularies may differ in size by up to 128 tokens)."""
        self.model = model
        self.is_eog = is_eog
        self.vocab = vocab

    def begin(self, tokens: Sequence[int]) -> None:
        pass  # the model's cache keeps whatever prefix the new prompt shares

    def lag(self, committed: Sequence[int]) -> int:
        """Tokens the draft model would have to evaluate before drafting."""
        return len(committed) - common_prefix_length(self.model.cached, committed)

    def offer(self, committed: Sequence[int], limit: int) -> Offer | None:
        if limit <= 0:
            return None
        lag = self.lag(committed)
        return Offer(self.kind, limit, catch_up=lag if lag > 1 else 0)

    def propose(
        self,
        committed: Sequence[int],
        k: int,
        params: GenerationParams,
        rng: np.random.Generator,
        p_min: float,
    ) -> Draft:
        context = list(committed)
        # With a lag, the first pass evaluates everything the model lacks in one batch and
        # yields the first draft token: timed as catch-up, apart from the one-token steps.
        catch_up = self.lag(context) if self.lag(context) > 1 else 0
        t_catch = 0.0
        drafted: list[int] = []
        probs: list[np.ndarray] = []
        steps, t_steps = 0, 0.0
        for i in range(k):
            t0 = time.perf_counter()
            logits = self.model.forward(context, 1)[0][: self.vocab]
            if i == 0 and catch_up:
                t_catch = time.perf_counter() - t0
            else:
                t_steps += time.perf_counter() - t0
                steps += 1
            if params.greedy:
                if i > 0 and p_min > 0.0 and top_probability(logits) < p_min:
                    break
                tok = int(np.argmax(logits))
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
        return Draft(
            self.kind,
            drafted,
            None if params.greedy else probs,
            steps=steps,
            step_seconds=t_steps,
            catch_up_tokens=catch_up,
            catch_up_seconds=t_catch,
        )

    def observe(self, committed: Sequence[int], drafted: int, accepted: int) -> None:
        pass  # its cache is rolled forward or back by the next ``forward``
