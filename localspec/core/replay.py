"""Replays of recorded answers through the real engine, priced by a machine's costs.

With greedy decoding a draft is accepted as far as it agrees with the answer the target
gave, so a recorded answer is all the target the engine needs to make its choices again:
``OracleTarget`` answers every position of the recorded text with its next token, and
advances a virtual clock by what the evaluation would cost on the machine the costs were
measured on (a plain step, a verify batch of k drafts, a draft tree). ``replay`` runs
``SpecDecoder.generate`` over it, so a replay makes exactly the engine's choices (a change
to the engine or the controller shows in the replay without being copied there), and
returns the rounds and the estimated seconds. Greedy decoding only; no draft model. A
prediction in the parameters is drafted from as the prediction drafter drafts in ``auto``.

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

    def is_eog(self, token: int) -> bool:
        return token == self.end or token in self.stops


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
) -> Replayed:
    """Replay ``answer`` to ``prompt`` with a cold engine (as a fresh process starts) at
    ``costs``: the answer ends where it ended, at an end of generation or at
    ``params.max_tokens``. ``ends`` tells end-of-generation tokens, as the drafters are told
    by the real target. ``margin`` replaces the controller's own (a tuning experiment)."""
    if not params.greedy:
        raise ValueError("a replay follows a recorded answer: greedy decoding only")
    ids = sorted({*prompt, *answer, *params.prediction})
    index = {t: i for i, t in enumerate(ids)}
    if params.prediction:
        params = params.model_copy(
            update={"prediction": tuple(index[t] for t in params.prediction)}
        )
    end = len(ids)  # a token of its own after the answer
    stops = frozenset(index[t] for t in ids if ends is not None and ends(t))
    clock = VirtualClock()
    text = [index[t] for t in (*prompt, *answer)]
    target = OracleTarget(text, end, end + 1, costs, clock, stops)
    decoder = SpecDecoder(target, None, costs, clock=clock)
    if margin is not None:
        decoder.planner_for(params).controller.margin = margin
    rounds: list[RoundCompleted] = []

    def keep(event: Event) -> None:
        if isinstance(event, RoundCompleted):
            rounds.append(event)

    finished = run_to_completion(decoder.generate(text[: len(prompt)], params), keep)
    return Replayed(finished.stats.decode_s, rounds, [ids[t] for t in finished.token_ids])
