"""Predicted outputs: drafts from what the caller says the answer will mostly be.

OpenAI's predicted outputs give, with a request, a text the answer is expected to copy for
the most part (the old version of a file an edit rewrites). ``PredictionDrafter`` reads it
as prompt lookup reads an earlier occurrence (``core.drafting.follow``), knowing where the
answer stands in it: its text is the prediction followed by the answer so far, and its
copy starts at the prediction's first token, so it offers a draft from the answer's first
token without waiting for a match. An answer that opens with something else (a code fence,
"Here is the updated file:") does not lose that place: the prediction's start waits for the
answer to come to it, and until the copy from there parts or has run a few tokens, its
drafts are priced as a long match's (``copying.HEAD``). As the answer goes on it follows
the prediction through the edits the answer makes (a replaced or inserted span resyncs, a
rename learned once is applied again) and, past a longer cut, finds its place again by the
longest match of the answer's end in the prediction; where the answer comes back after an
edit in a copy it had followed for a while, the copy is priced as at the start again.

Its offers are priced as every copy is (``copying.CopyPricing``), with odds of long copies
of its own that start higher than prompt lookup's: a caller who gives a prediction says
the answer copies it. How far to trust it is still learned from its drafts and from the
drafts rounds passed over, so a prediction the answer does not follow costs at most a few
failed drafts, and on a machine where a failed draft costs many plain steps the first ones
wait until the answer has followed the prediction for a few tokens. Without a prediction
it offers nothing. Its q is one-hot, so greedy output is the target's own and sampling
stays exact, as with every drafter.

``prediction_counts`` says how much of a prediction an answer used, as OpenAI's usage does,
in time linear in their lengths (a server counts every request's).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace

from localspec.core.drafting.base import Resources
from localspec.core.drafting.copying import CopyOffer, CopyPricing
from localspec.core.drafting.follow import CopyFollower, Cursor
from localspec.core.params import GenerationParams

NAME = "prediction"
# Its text's odds of long copies against the match buckets' chances before any evidence:
# twice prompt lookup's (``copying.COPY_ODDS``), since the caller vouches for it.
PREDICTION_COPY_ODDS = 1.0
# A copy of the prediction that parted after following it this far was the answer copying
# it: an edit interrupts it, and where the answer comes back it goes on copying.
RESUME_AFTER = 16


class PredictionDrafter(CopyFollower):
    """Copies from ``GenerationParams.prediction``; see the module docstring."""

    name = NAME

    def __init__(
        self,
        ends: Callable[[int], bool] | None = None,
        vocab: int | None = None,
        *,
        limit: int = 64,
    ) -> None:
        """``vocab``: the target's vocabulary size; a prediction is read up to its first
        id outside it (a caller's mistake the target could not evaluate)."""
        super().__init__(ends=ends, limit=limit, pricing=CopyPricing(PREDICTION_COPY_ODDS))
        self.vocab = vocab
        self.prediction: tuple[int, ...] = ()
        self._prompt = 0  # committed tokens before the answer
        # The answer has not come to the prediction's first token yet (see ``_follow``).
        self._waiting = False
        # The copy under way has followed the prediction from its first token, unedited.
        self._from_head = False
        # The copy parted after following the prediction for ``RESUME_AFTER`` tokens or
        # more: where the answer comes back to it, it is priced as at the start.
        self._resumes = False

    def begin(self, tokens: Sequence[int], params: GenerationParams | None = None) -> None:
        """A new answer after the prompt ``tokens``, predicted by ``params.prediction``."""
        prediction = params.prediction if params is not None else ()
        bad = [i for i, t in enumerate(prediction) if t < 0 or (self.vocab and t >= self.vocab)]
        self.prediction = tuple(prediction[: bad[0]] if bad else prediction)
        self._prompt = len(tokens)
        super().begin(self.prediction, params)
        self._waiting, self._from_head, self._resumes = bool(self.prediction), False, False
        if self.prediction:
            self._cursor = Cursor(0)  # the answer starts where the prediction starts

    def end(self) -> None:
        """The answer is over: the prediction and its index go (``Ends``), so that a
        planner kept for later answers holds no request's text."""
        self.prediction = ()
        super().end()

    def _follow(self, i: int, end: int) -> None:
        """Before the answer has come to the prediction, a token that is not its first is
        something the answer writes before it (a preamble, a code fence), not an edit:
        the start waits for the answer however long that takes, and learns nothing."""
        if self._waiting:
            if self._cursor is not None and self._run > 0:  # drafts from the start held
                self._waiting, self._from_head = False, True
            elif self._tokens[i] == self.prediction[0]:  # the answer came to the start
                self._waiting, self._from_head = False, True
                self._cursor, self._run, self._parted = Cursor(1), 1, None
                return
            else:
                self._cursor, self._run, self._parted = None, 0, None
                return
        run = self._run
        super()._follow(i, end)
        if self._cursor is None:
            self._from_head = False
            if self._parted is None:  # its place is lost
                self._resumes = False
            elif run:  # parted here: an edit
                self._resumes = run >= RESUME_AFTER

    def _unread(self, committed: Sequence[int]) -> Sequence[int]:
        # The text read is the prediction, then the answer (what follows the prompt).
        answered = len(self._tokens) - len(self.prediction)
        return committed[self._prompt + answered :]

    def _longest(self) -> int:
        # The answer's end is matched in the prediction, never the prediction's own end:
        # the answer follows the prompt, not the prediction.
        return min(self.n_max, len(self._tokens) - len(self.prediction))

    def copy_offer(self, committed: Sequence[int], limit: int) -> CopyOffer | None:
        found = super().copy_offer(committed, limit) if self.prediction else None
        # The answer came to the prediction's start, or back to a copy it had followed for
        # a while: priced as at the start.
        back = self._from_head or self._resumes
        if found is not None and found.resync and self._run >= 1 and back:
            return replace(found, resync=False, head=True)
        return found


def build(params: GenerationParams, resources: Resources) -> PredictionDrafter:
    return PredictionDrafter(
        resources.target.is_eog, resources.target.n_vocab, limit=params.ngram_draft_max
    )


def prediction_counts(prediction: Sequence[int], answer: Sequence[int]) -> tuple[int, int]:
    """``(accepted, rejected)``: the prediction's tokens that appear in the answer, and the
    rest (OpenAI's ``accepted_prediction_tokens`` and ``rejected_prediction_tokens``). Each
    answer token stands for at most one of the prediction's, wherever it is: a count per
    token id, linear in the lengths (an alignment in order is quadratic in the worst case,
    and a request chooses both lists)."""
    have = Counter(answer)
    accepted = sum(min(n, have[token]) for token, n in Counter(prediction).items())
    return accepted, len(prediction) - accepted
