"""A draft derived from the target drafts as the draft model does, under the name ``self``,
and ``auto`` weighs it by this machine's costs: where its steps and the target's verify
batches are cheap it drafts, where they are not it is left alone."""

from __future__ import annotations

import pytest

from localspec.core.costs import CostProfile
from localspec.core.engine import SpecDecoder, run_to_completion
from localspec.core.params import GenerationParams
from localspec.core.replay import VirtualClock
from tests.fakes import FakeModel, TimedFake, plain_greedy

VOCAB = 200
PROMPT = [3, 1, 4, 1, 5]
# A GPU's shape (a batch costs little more than a step, a draft step a third of one) and a
# small CPU's (a batch of k drafts costs k more steps, a 21-of-28-layer draft 0.8 of one).
CHEAP = CostProfile(
    plain_s=1.0, verify_s={k: 1.0 + 0.05 * k for k in range(1, 65)}, draft_step_s=0.3
)
DEAR = CostProfile(plain_s=1.0, verify_s={k: 1.0 + 1.0 * k for k in range(1, 65)}, draft_step_s=0.8)


class TimedDraft(FakeModel):
    """A draft whose steps advance the virtual clock by its calibrated step cost."""

    def __init__(self, clock, step_s, **kw) -> None:
        super().__init__(**kw)
        self.clock, self.step_s = clock, step_s

    def _logits(self, tokens, n_logits):
        self.clock.now += self.step_s * max(1, len(tokens) // 4 if len(tokens) > 1 else 1)
        return super()._logits(tokens, n_logits)


@pytest.mark.parametrize("costs, pays", [(CHEAP, True), (DEAR, False)])
def test_auto_weighs_a_self_draft_by_this_machines_costs(costs, pays):
    clock = VirtualClock()
    target = TimedFake(clock, costs, seed=5, window=3, n_vocab=VOCAB)
    # The same weights with some noise: a draft that mostly agrees, as a derived one does.
    draft = TimedDraft(clock, costs.draft_step_s, seed=5, window=3, n_vocab=VOCAB, noise=0.3)
    decoder = SpecDecoder(target, draft, costs, clock=clock, draft_name="self")
    fin = run_to_completion(decoder.generate(PROMPT, GenerationParams(max_tokens=150)))
    plain = plain_greedy(FakeModel(seed=5, window=3, n_vocab=VOCAB), PROMPT, 150)
    assert list(fin.token_ids) == plain
    assert "model" not in fin.stats.by_drafter  # its drafts are labelled as the target's own
    drafted = fin.stats.by_origin.get("self", 0)
    assert drafted > 40 if pays else drafted == 0


def test_drafter_self_drafts_with_it_alone():
    clock = VirtualClock()
    target = TimedFake(clock, DEAR, seed=5, window=3, n_vocab=VOCAB)
    draft = TimedDraft(clock, 0.8, seed=5, window=3, n_vocab=VOCAB, noise=0.3)
    decoder = SpecDecoder(target, draft, DEAR, clock=clock, draft_name="self")
    params = GenerationParams(max_tokens=80, drafter="self")
    fin = run_to_completion(decoder.generate(PROMPT, params))
    assert list(fin.token_ids) == plain_greedy(FakeModel(seed=5, window=3, n_vocab=VOCAB),
                                                PROMPT, 80)  # fmt: skip
    assert set(fin.stats.by_drafter) <= {"self", "none"} and fin.stats.by_origin["self"] > 0
