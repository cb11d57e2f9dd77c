"""Drafters: who proposes the tokens the target verifies, behind one small protocol.

A ``Drafter`` is told the prompt (``begin``), says each round what it could draft
(``offer``: how many tokens, on what evidence, at what set-up cost), drafts when the
controller picks it (``propose``), and learns from the verdict (``observe``). The engine
calls these without knowing which drafter it talks to.

- ``NgramDrafter`` (prompt lookup): finds earlier occurrences of the longest suffix of
  prompt + answer (measured up to ``n_max`` tokens back) and drafts what followed them. When
  several occurrences match equally far back, it follows the one the copy under way came
  from, else the continuation most of them share, so one odd recent copy does not outvote
  the rest. When a copy parts (a renamed variable in a rewrite), it keeps its place in the
  source and offers to resume right after the replaced token (``Offer.resync``) before the
  suffix matches again. A continuation ends after an end-of-generation token (given as
  ``ends``): past the end of a turn the source goes on with the chat template, which an
  answer never copies. Free to run; its q is one-hot, so ``Draft.probs`` is None.
  ``preview`` shows what it would draft without drafting, so that a ``PassedDraft`` can
  grade, as the answer goes on, the drafts plain steps passed over.
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
from typing import Protocol

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


# Occurrences of the suffix are found through an index of short keys, then measured back.
LONG_KEY = 4
MAX_CANDIDATES = 256  # most recent occurrences looked at per round
STREAK_MIN = 8  # drafted tokens a whole acceptance needs to count as a copy under way
RESYNC_BELOW = 6  # a suffix match shorter than this defers to resuming a parted copy
RESYNC_MISSES = 8  # answer tokens a parted copy may wait for before its place is lost


@dataclass(frozen=True)
class NgramMatch:
    n: int  # matched suffix length (capped at ``n_max``)
    starts: tuple[int, ...]  # continuation starts of the occurrences matching that far
    available: int  # continuation tokens available from the best of them


class NgramDrafter:
    """Prompt lookup over a growing token list, longest suffix match first."""

    kind = DrafterKind.NGRAM

    def __init__(
        self, n_min: int = 2, n_max: int = 32, ends: Callable[[int], bool] | None = None
    ) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError("need 1 <= n_min <= n_max")
        self.n_min, self.n_max = n_min, n_max
        self.ends = ends
        self._keys = sorted({k for k in (LONG_KEY, n_min) if n_min <= k <= n_max}, reverse=True)
        self._tokens: list[int] = []
        # key length -> key -> continuation starts (index after the key), oldest first
        self._index: dict[int, dict[tuple[int, ...], list[int]]] = {}
        self._streak = False
        self._match: NgramMatch | None = None
        self._match_at = -1  # len(tokens) when ``_match`` was computed
        self._pointer: int | None = None  # where in the text the copy under way reads next
        self._parted: tuple[int, ...] = ()  # where it may resume after parting (see _follow)
        self._misses = 0  # answer tokens since the copy parted
        self._draft_start = 0  # where the last draft was read from

    def begin(self, tokens: Sequence[int]) -> None:
        self._tokens = []
        self._index = {k: {} for k in self._keys}
        self._streak = False
        self._match_at = -1
        self._pointer, self._parted, self._misses = None, (), 0
        self._extend(tokens)

    def _extend(self, tokens: Sequence[int]) -> None:
        """Index newly committed tokens; ``tokens`` is the whole list, an extension."""
        old = len(self._tokens)
        self._tokens.extend(tokens[old:])
        toks = self._tokens
        # A key ending at e (exclusive) is indexed once toks[e] exists: it has a continuation.
        for e in range(max(old, 1), len(toks)):
            for k, table in self._index.items():
                if e >= k:
                    table.setdefault(tuple(toks[e - k : e]), []).append(e)

    def match(self) -> NgramMatch | None:
        """The longest suffix match (computed once per committed length)."""
        if self._match_at != len(self._tokens):
            self._match = self._find()
            self._match_at = len(self._tokens)
        return self._match

    def _find(self) -> NgramMatch | None:
        toks = self._tokens
        n = len(toks)
        for k in self._keys:
            if n <= k:
                continue
            starts = self._index[k].get(tuple(toks[n - k :]))
            if not starts:
                continue
            best, chosen = 0, []
            for p in starts[-MAX_CANDIDATES:]:
                length = k
                while (
                    length < self.n_max
                    and length < p
                    and toks[p - 1 - length] == toks[n - 1 - length]
                ):
                    length += 1
                if length > best:
                    best, chosen = length, [p]
                elif length == best:
                    chosen.append(p)
            if best >= self.n_min:
                if self._pointer in chosen:  # the copy under way goes on: keep to its source
                    chosen = [self._pointer]
                return NgramMatch(best, tuple(chosen), n - max(chosen))
        return None

    def offer(self, committed: Sequence[int], limit: int) -> Offer | None:
        if limit <= 0:
            return None
        found = self.match()
        if self._resyncing(found):
            assert self._pointer is not None
            return Offer(self.kind, self._span(self._pointer, limit), resync=True)
        if found is None:
            return None
        available = self._span(max(found.starts), min(limit, found.available))
        return Offer(self.kind, available, found.n, self._streak)

    def _span(self, start: int, limit: int) -> int:
        """How many of the ``limit`` tokens from ``start`` a draft may take: up to the
        first end-of-generation token, itself included."""
        toks = self._tokens[start : start + limit]
        if self.ends is not None:
            for i, token in enumerate(toks):
                if self.ends(token):
                    return i + 1
        return len(toks)

    def _resyncing(self, found: NgramMatch | None) -> bool:
        """Resume a parted copy when the suffix itself offers nothing better."""
        return (
            self._pointer is not None
            and self._pointer < len(self._tokens)
            and (found is None or found.n < RESYNC_BELOW)
        )

    def continuation(self, found: NgramMatch, k: int) -> tuple[list[int], int]:
        """Up to ``k`` tokens following the matched occurrences: at each step the token
        most of the still-agreeing occurrences continue with (ties: the most recent); and
        where in the text the draft reads from."""
        toks, n = self._tokens, len(self._tokens)
        alive = sorted(found.starts, reverse=True)  # most recent first
        out: list[int] = []
        while len(out) < k:
            i = len(out)
            votes: dict[int, int] = {}
            for p in alive:
                if p + i < n:
                    votes[toks[p + i]] = votes.get(toks[p + i], 0) + 1
            if not votes:
                break
            token = max(votes, key=votes.__getitem__)  # first maximum = most recent occurrence
            out.append(token)
            alive = [p for p in alive if p + i < n and toks[p + i] == token]
            if self.ends is not None and self.ends(token):
                break
        return out, alive[0] if alive else max(found.starts)

    def preview(self, k: int) -> list[int]:
        """Up to ``k`` tokens ``propose`` would draft now, without drafting them."""
        found = self.match()
        if self._resyncing(found):
            assert self._pointer is not None
            return self._tokens[self._pointer : self._pointer + self._span(self._pointer, k)]
        return self.continuation(found, k)[0] if found is not None else []

    def propose(
        self,
        committed: Sequence[int],
        k: int,
        params: GenerationParams,
        rng: np.random.Generator,
        p_min: float,
    ) -> Draft:
        found = self.match()
        if k <= 0 or (found is None and not self._resyncing(found)):
            return Draft(self.kind, [])
        if self._resyncing(found):
            assert self._pointer is not None
            self._draft_start = self._pointer
            return Draft(self.kind, self.preview(k))
        assert found is not None
        tokens, self._draft_start = self.continuation(found, k)
        return Draft(self.kind, tokens)

    def observe(self, committed: Sequence[int], drafted: int, accepted: int) -> None:
        # A long draft accepted whole means a copy is under way; a short one proves little.
        self._streak = drafted >= STREAK_MIN and accepted == drafted
        old = len(self._tokens)
        self._extend(committed)
        new = self._tokens[old:]
        if drafted > 0:  # the copy read from ``_draft_start``, and ``accepted`` tokens held
            self._pointer, self._parted = self._draft_start + accepted, ()
            new = new[accepted:]
        for token in new:
            self._follow(token, old)

    def _follow(self, token: int, end: int) -> None:
        """Keep the copy's place in the source (``end``: where the source ends) as the
        answer goes on. Where they part, the answer either replaced the source token or
        inserted text before it: both places are kept until a token agrees with one."""
        toks = self._tokens
        if self._pointer is not None:
            if self._pointer < end and toks[self._pointer] == token:
                self._pointer += 1
                return
            self._parted, self._pointer, self._misses = (self._pointer, self._pointer + 1), None, 0
            return
        for place in self._parted:
            if place < end and toks[place] == token:
                self._pointer, self._parted = place + 1, ()
                return
        self._misses += 1
        if self._misses > RESYNC_MISSES:
            self._parted = ()


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
