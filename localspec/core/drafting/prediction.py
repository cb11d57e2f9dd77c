"""Predicted outputs: drafts from what the caller says the answer will mostly be.

OpenAI's predicted outputs give, with a request, a text the answer is expected to copy for
the most part (the old version of a file an edit rewrites). ``PredictionSource`` reads it
as prompt lookup reads an earlier occurrence (a ``follow.Follower`` it holds), knowing
where the answer stands in it: its text is the prediction followed by the answer so far,
and its copy starts at the prediction's first token, so it offers a draft from the answer's
first token without waiting for a match; that first draft, made before the answer has
written anything, may fail at once (the answer opens with something else), so it is kept as
long as failing it costs at most ``tunables.BLIND_COST`` plain steps at the machine's costs.
An answer that opens with something else (a code fence, "Here is the updated file:") does
not lose that place: the prediction's start waits
for the answer to come to it, and until the copy from there parts or has run a few tokens,
its drafts are priced as at the start (``Evidence.START``, as a long match). As the answer
goes on it follows the prediction through the edits the answer makes (a replaced or
inserted span resyncs, a rename learned once is applied again) and, past a longer cut,
finds its place again by the longest match of the answer's end in the prediction; where the
answer comes back after an edit in a copy it had followed for a while, the copy is priced
as at the start again.

Its offers are priced as every copy is (``pricing.CopyPricing``), with odds of long copies
of its own that start higher than prompt lookup's (``tunables.PREDICTION_COPY_ODDS``): a
caller who gives a prediction says the answer copies it. How far to trust it is still
learned from its drafts and from the drafts rounds passed over, so a prediction the answer
does not follow costs at most a few failed drafts, and on a machine where a failed draft
costs many plain steps the first ones wait until the answer has followed the prediction for
a few tokens. Without a prediction it offers nothing. Its q is one-hot, so greedy output is
the target's own and sampling stays exact, as with every drafter.

``prediction_counts`` says how much of a prediction an answer used, as OpenAI's usage does,
in time linear in their lengths (a server counts every request's).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace

from localspec.core.costs import StepCosts
from localspec.core.drafting.base import Outcome, Resources
from localspec.core.drafting.copying import CopyDrafter
from localspec.core.drafting.evidence import CopyOffer, Evidence
from localspec.core.drafting.follow import Follower
from localspec.core.drafting.pricing import CopyPricing
from localspec.core.drafting.tunables import BLIND_COST, PREDICTION_COPY_ODDS, RESUME_AFTER
from localspec.core.params import GenerationParams

NAME = "prediction"


class PredictionSource:
    """Copies from ``GenerationParams.prediction`` (a ``copying.CopySource``); see the
    module docstring. ``vocab``: the target's vocabulary size; a prediction is read up to
    its first id outside it (a caller's mistake the target could not evaluate). ``costs``:
    the machine's, which size the draft made before the answer has written anything
    (``blind``); without them it is as long as any."""

    def __init__(
        self,
        ends: Callable[[int], bool] | None = None,
        vocab: int | None = None,
        costs: StepCosts | None = None,
    ) -> None:
        self.follower = Follower(ends=ends, sealed=True)
        self.vocab = vocab
        self.costs = costs
        self.prediction: tuple[int, ...] = ()
        # The answer has not come to the prediction's first token yet (see ``_follow``).
        self._waiting = False
        # The copy under way has followed the prediction from its first token, unedited.
        self._from_head = False
        # The copy parted after following the prediction for ``RESUME_AFTER`` tokens or
        # more: where the answer comes back to it, it is priced as at the start.
        self._resumes = False

    def begin(self, prompt: Sequence[int], params: GenerationParams | None = None) -> None:
        """A new answer after ``prompt``, predicted by ``params.prediction``."""
        prediction = params.prediction if params is not None else ()
        bad = [i for i, t in enumerate(prediction) if t < 0 or (self.vocab and t >= self.vocab)]
        self.prediction = tuple(prediction[: bad[0]] if bad else prediction)
        self.follower.start(self.prediction, len(prompt), params)
        self._waiting, self._from_head, self._resumes = bool(self.prediction), False, False
        if self.prediction:
            self.follower.place.start_at(0)  # the answer starts where the prediction starts

    def end(self) -> None:
        """The answer is over: the prediction and its index go, so that a drafter kept for
        later answers holds no request's text."""
        self.prediction = ()
        self.follower.end()

    def find(self, committed: Sequence[int], limit: int) -> CopyOffer | None:
        copy = self.follower.find(committed, limit) if self.prediction else None
        if copy is not None and self._waiting:  # nothing the answer wrote is of it yet
            return replace(copy, available=max(1, self.blind(copy.available)))
        # The answer came to the prediction's start, or back to a copy it had followed for
        # a while: priced as at the start.
        back = self._from_head or self._resumes
        if (
            copy is not None
            and copy.evidence is Evidence.RESUMED
            and back
            and self.follower.place.run >= 1
        ):
            return replace(copy, evidence=Evidence.START)
        return copy

    def blind(self, k: int) -> int:
        """The longest draft of at most ``k`` tokens to make before the answer has written
        anything: nothing it wrote says whether it opens with the prediction or with
        something else (a code fence, a sentence), so such a draft is one that may fail at
        once. It is kept as long as failing it costs at most ``BLIND_COST`` plain steps (0:
        none where even one draft costs more)."""
        costs = self.costs
        if costs is None:
            return k
        most = BLIND_COST * costs.plain_s
        return max((n for n in range(1, k + 1) if costs.verify(n) <= most), default=0)

    def preview(self, k: int) -> list[int]:
        return self.follower.preview(k)

    def draft(self, committed: Sequence[int], k: int) -> list[int]:
        return self.follower.draft(committed, k)

    def continuation(self, k: int) -> list[int]:
        return self.follower.continuation(k)

    def alternatives(self, k: int, m: int) -> list[list[int]]:
        return self.follower.alternatives(k, m)

    def take(self, i: int) -> None:
        self.follower.take(i)

    def advance(self, committed: Sequence[int], outcome: Outcome) -> None:
        first, end = self.follower.take_in(committed, outcome)
        for i in range(first, len(self.follower.tokens)):
            self._follow(i, end)

    def _follow(self, i: int, end: int) -> None:
        """Before the answer has come to the prediction, a token that is not its first is
        something the answer writes before it (a preamble, a code fence), not an edit:
        the start waits for the answer however long that takes, and learns nothing."""
        place = self.follower.place
        if self._waiting:
            if place.cursor is not None and place.run > 0:  # drafts from the start held
                self._waiting, self._from_head = False, True
            elif self.follower.tokens[i] == self.prediction[0]:  # the answer came to it
                self._waiting, self._from_head = False, True
                place.start_at(1, 1)
                return
            else:
                place.lose()
                return
        run = place.run
        place.follow(i, end)
        if place.cursor is None:
            self._from_head = False
            if place.parted is None:  # its place is lost
                self._resumes = False
            elif run:  # parted here: an edit
                self._resumes = run >= RESUME_AFTER


def prediction_drafter(
    ends: Callable[[int], bool] | None = None,
    vocab: int | None = None,
    *,
    limit: int = 64,
    costs: StepCosts | None = None,
) -> CopyDrafter:
    """The prediction's drafter: its source priced as a copy the caller vouches for."""
    source = PredictionSource(ends, vocab, costs)
    return CopyDrafter(NAME, source, CopyPricing(PREDICTION_COPY_ODDS), limit)


def build(params: GenerationParams, resources: Resources) -> CopyDrafter:
    target = resources.target
    return prediction_drafter(
        target.is_eog, target.n_vocab, limit=params.ngram_draft_max, costs=resources.costs
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
