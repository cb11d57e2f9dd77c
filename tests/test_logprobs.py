"""Log-probabilities from the target's own distribution, read off the rows verification
reads: every emitted token carries its own and the top alternatives, whatever drafted it."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.core.engine import SpecDecoder
from localspec.core.events import TokenEmitted
from localspec.core.params import GenerationParams
from tests.fakes import FakeModel, plain_greedy
from tests.test_engine import CHEAP_VERIFY, PROMPT


@pytest.mark.parametrize("mode", ["none", "model", "ngram"])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_logprobs_are_the_targets_own_at_every_token(mode, temperature):
    """Each emitted token carries its log-probability under the target's row at its
    position (temperature 1) and the top alternatives, whoever drafted it; greedy output
    is unchanged by asking."""
    target = FakeModel(seed=1, window=2)
    draft = FakeModel(seed=1, window=2, noise=0.6)
    decoder = SpecDecoder(target, draft, CHEAP_VERIFY)
    kw = dict(max_tokens=30, drafter=mode, temperature=temperature, seed=3)
    events = list(decoder.generate(PROMPT, GenerationParams(logprobs=3, **kw)))
    emitted = [e for e in events if isinstance(e, TokenEmitted)]
    context = list(PROMPT)
    for e in emitted:
        logits = target.logits_after(context).astype(np.float64)
        logs = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        assert e.logprob is not None and e.logprob.logprob == pytest.approx(logs[e.token_id])
        assert [t for t, _, _ in e.logprob.top] == list(np.argsort(-logs, kind="stable")[:3])
        assert e.logprob.piece == target.token_bytes(e.token_id)
        context.append(e.token_id)
    if temperature == 0.0:
        assert [e.token_id for e in emitted] == plain_greedy(target, PROMPT, 30)
    unasked = list(decoder.generate(PROMPT, GenerationParams(**kw)))
    assert all(e.logprob is None for e in unasked if isinstance(e, TokenEmitted))
