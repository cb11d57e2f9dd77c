"""Replays of recorded answers through the real engine, priced by a machine's costs.

With greedy decoding a draft is accepted as far as it agrees with the answer the target
gave, so a recorded answer is all the target the engine needs to make its choices again:
``OracleTarget`` answers every position of the recorded text with its next token, and
advances a virtual clock by what the evaluation would cost on the machine the costs were
measured on (a plain step, a verify batch of k drafts, a draft tree). ``replay`` runs
``SpecDecoder.generate`` over it, so a replay makes exactly the engine's choices (a change
to the engine or the controller shows in the replay without being copied there), and
returns the rounds and the estimated seconds. Greedy decoding only. A prediction in the
parameters is drafted from as the prediction drafter drafts in ``auto``.

A draft model can take part too (``DraftChoices``: its greedy choice and that choice's
probability after every prefix of the recorded text, from one pass of the real draft model
over it): ``OracleDraft`` answers with them while a draft follows the text and, once a draft
has left it (its tokens are rejected from there on anyway), with a token of its own at the
probability it had where it left, so drafts run on as long as the real one's would until its
confidence cut-off. Its steps advance the clock by the profile's draft step, a catch-up batch
as ``DraftCosts`` prices one; reading the prompt is prefill time, as in the engine.

``replay_ngram_simple`` replays llama.cpp's ``ngram-simple`` speculation over the same answer
at the same costs, for a side-by-side.

Token ids are renumbered into a small vocabulary for the replay (the logits rows then stay
small) and back in what it returns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from localspec.core.cached_model import CachedModel, Greedy, common_prefix_length
from localspec.core.costs import CostProfile
from localspec.core.engine import SpecDecoder, run_to_completion
from localspec.core.events import Event, RoundCompleted
from localspec.core.params import GenerationParams
from localspec.core.tree import DraftTree

CONTEXT_ROOM = 4096  # past the text: drafts are never cut short by the context


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass(frozen=True)
class DraftChoices:
    """A draft model's greedy choice after ``prompt + answer[:i]`` for every i (one more
    than the answer's tokens), and its probability at temperature 1."""

    ids: list[int]
    top_p: list[float]


class OracleTarget(CachedModel):
    """A target whose greedy choice after a prefix of ``text`` is the text's next token
    (``end`` after all of it), given as token ids (``greedy_after``, ``greedy_tree``) or
    one-hot rows; its evaluations advance ``clock`` by ``costs``. ``stops``:
    the text's own end-of-generation tokens (the ends of the template's turns)."""

    def __init__(
        self,
        text: Sequence[int],
        end: int,
        n_vocab: int,
        costs: CostProfile,
        clock: VirtualClock,
        stops: frozenset[int] = frozenset(),
    ) -> None:
        super().__init__()
        self.text, self.end, self.stops = list(text), end, stops
        self.n_vocab, self.n_ctx = n_vocab, len(self.text) + CONTEXT_ROOM
        self.costs, self.clock = costs, clock

    @property
    def supports_trees(self) -> bool:
        return True

    def _choice(self, context: Sequence[int], agreed: int) -> int:
        """The greedy token after ``context`` (of which ``agreed`` tokens follow the text)."""
        n = len(context)
        if agreed < n:
            return self.end  # off the text: never accepted, so any token will do
        return self.text[n] if n < len(self.text) else self.end

    def _rows(self, choices: list[int]) -> np.ndarray:
        rows = np.zeros((len(choices), self.n_vocab), dtype=np.float32)
        rows[np.arange(len(choices)), choices] = 1.0
        return rows

    def _evaluate(self, tokens: list[int], n_logits: int) -> np.ndarray:
        return self._rows(self._evaluate_greedy(tokens, n_logits, False, self.n_vocab).ids)

    def _evaluate_greedy(self, tokens: list[int], n: int, confidence: bool, vocab: int) -> Greedy:
        if n:  # a round's batch of k drafts: priced as verifying them
            self.clock.now += self.costs.verify(n - 1)
        context = [*self.cached, *tokens]
        agreed = common_prefix_length(context, self.text)
        ends = range(len(context) - n + 1, len(context) + 1)
        ids = [self._choice(context[:m], min(agreed, m)) for m in ends]
        return Greedy(ids, [1.0] * n if confidence else None)

    def _remove_from(self, n: int) -> None:
        pass  # the cached list is the whole state

    def _evaluate_tree(self, start: int, last: int, tree: DraftTree) -> np.ndarray:
        return self._rows(self._evaluate_tree_greedy(start, last, tree))

    def _evaluate_tree_greedy(self, start: int, last: int, tree: DraftTree) -> list[int]:
        self.clock.now += self.costs.verify(len(tree))
        context = [*self.cached, last]
        paths = [
            context,
            *([*context, *(tree.tokens[j] for j in tree.path(i))] for i in range(len(tree))),
        ]
        return [self._choice(p, common_prefix_length(p, self.text)) for p in paths]

    def _keep_path(self, start: int, tree: DraftTree, path: list[int]) -> None:
        pass

    def token_bytes(self, token: int) -> bytes:
        return b""

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        return []  # a recorded answer's ids have no text: a replay never runs a grammar

    def is_eog(self, token: int) -> bool:
        return token == self.end or token in self.stops


class OracleDraft(CachedModel):
    """A draft model that chooses as ``choices`` say after each prefix of ``text`` from its
    ``start``-th token on; off the text, ``filler`` at the probability it had there."""

    def __init__(
        self, text: list[int], start: int, choices: DraftChoices, filler: int, n_vocab: int,
        costs: CostProfile, clock: VirtualClock,
    ) -> None:  # fmt: skip
        super().__init__()
        self.text, self.start, self.choices, self.filler = text, start, choices, filler
        self.n_vocab, self.n_ctx = n_vocab, len(text) + CONTEXT_ROOM
        self.costs, self.clock = costs, clock

    def _evaluate(self, tokens: list[int], n_logits: int) -> np.ndarray:
        found = self._evaluate_greedy(tokens, n_logits, False, self.n_vocab)
        rows = np.zeros((n_logits, self.n_vocab), dtype=np.float32)
        rows[np.arange(n_logits), found.ids] = 1.0
        return rows

    def _evaluate_greedy(self, tokens: list[int], n: int, confidence: bool, vocab: int) -> Greedy:
        step = self.costs.draft_step_s or 0.0
        if n and len(tokens) == 1:
            self.clock.now += step
        elif n:  # a catch-up batch, as DraftCosts prices one before it has timed any
            per_token = self.costs.draft_prefill_s or step / 4
            self.clock.now += max(len(tokens) * per_token, step)
        context = [*self.cached, *tokens]
        agreed = common_prefix_length(context, self.text)
        ids, probs = [], []
        for m in range(len(context) - n + 1, len(context) + 1):
            on = min(agreed, m) - self.start  # the last choice made on the text
            on = max(0, min(on, len(self.choices.ids) - 1))
            ids.append(self.choices.ids[on] if agreed >= m >= self.start else self.filler)
            probs.append(self.choices.top_p[on])
        return Greedy(ids, probs if confidence else None)

    def _remove_from(self, n: int) -> None:
        pass


@dataclass(frozen=True)
class Replayed:
    seconds: float  # the decode's estimated time at the given costs
    rounds: list[RoundCompleted]
    token_ids: list[int]  # the answer as the replay emitted it (the recorded one)


def replay(
    prompt: Sequence[int],
    answer: Sequence[int],
    costs: CostProfile,
    params: GenerationParams,
    ends: Callable[[int], bool] | None = None,
    *,
    margin: float | None = None,
    draft: DraftChoices | None = None,
) -> Replayed:
    """Replay ``answer`` to ``prompt`` with a cold engine (as a fresh process starts) at
    ``costs``: the answer ends where it ended, at an end of generation or at
    ``params.max_tokens``. ``ends`` tells end-of-generation tokens, as the drafters are told
    by the real target. ``margin`` replaces the controller's own (a tuning experiment).
    ``draft``: a draft model's choices along the text (see the module docstring)."""
    if not params.greedy:
        raise ValueError("a replay follows a recorded answer: greedy decoding only")
    ids = sorted({*prompt, *answer, *params.prediction, *(draft.ids if draft else ())})
    index = {t: i for i, t in enumerate(ids)}
    if params.prediction:
        params = params.model_copy(
            update={"prediction": tuple(index[t] for t in params.prediction)}
        )
    end = len(ids)  # a token of its own after the answer; end + 1: a draft's off the text
    stops = frozenset(index[t] for t in ids if ends is not None and ends(t))
    clock = VirtualClock()
    text = [index[t] for t in (*prompt, *answer)]
    target = OracleTarget(text, end, end + 2, costs, clock, stops)
    oracle = None
    if draft is not None:
        renumbered = DraftChoices([index[t] for t in draft.ids], list(draft.top_p))
        oracle = OracleDraft(text, len(prompt), renumbered, end + 1, end + 2, costs, clock)
    decoder = SpecDecoder(target, oracle, costs, clock=clock)
    if margin is not None:
        decoder.planner_for(params).controller.margin = margin
    rounds: list[RoundCompleted] = []

    def keep(event: Event) -> None:
        if isinstance(event, RoundCompleted):
            rounds.append(event)

    finished = run_to_completion(decoder.generate(text[: len(prompt)], params), keep)
    return Replayed(finished.stats.decode_s, rounds, [ids[t] for t in finished.token_ids])


def replay_ngram_simple(
    prompt: list[int], answer: list[int], costs: CostProfile, n: int = 12, m: int = 48
) -> tuple[float, int, list[tuple[int, int, int]]]:
    """Estimated seconds of llama.cpp's ``ngram-simple`` (defaults: a 12-token match, drafts
    of up to 48 tokens) over the same answer, the tokens it covers (it may run past the
    answer's end, as the binary runs past ``-n``; those are not counted), and its drafts.
    Follows ``common_ngram_simple_draft``: the last ``n`` tokens are looked for in the text
    before them, most recent first, and the up to ``m`` tokens after the match are drafted
    when at least ``n`` are available."""
    committed, done, seconds, drafts = list(prompt), 0, 0.0, []
    while done < len(answer):
        tokens: list[int] = []
        cur = len(committed)
        if cur > n + m + 1:
            pattern = committed[cur - n :]
            for j in range(cur - n - 1, 0, -1):
                if committed[j : j + n] == pattern:
                    copy = min(m, cur - (j + n))
                    if copy >= n:
                        tokens = committed[j + n : j + n + copy]
                    break
        accepted = common_prefix_length(tokens, answer[done : done + len(tokens)])
        seconds += costs.verify(len(tokens))
        emitted = min(accepted + 1, len(answer) - done)
        committed.extend(answer[done : done + emitted])
        done += emitted
        if tokens:
            drafts.append((len(tokens), accepted, n))
    return seconds, done, drafts
