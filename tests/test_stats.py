"""Stats arithmetic in the field's own words."""

from __future__ import annotations

from localspec.core.events import Origin, PrefillDone, RoundCompleted, TokenEmitted
from localspec.core.params import DrafterKind
from localspec.core.stats import GenerationStats


def test_stats_arithmetic_and_per_position_acceptance():
    s = GenerationStats()
    s.observe(PrefillDone(10, 10, 0.5))
    model, ngram = DrafterKind.MODEL, DrafterKind.NGRAM
    rounds = [(model, 4, 2, 3), (model, 4, 4, 5), (ngram, 2, 0, 1), (None, 0, 0, 1)]
    n = 0
    for i, (drafter, drafted, accepted, emitted) in enumerate(rounds):
        for j in range(emitted):
            origin = Origin.TARGET if j == accepted else Origin(drafter)
            s.observe(TokenEmitted(n, "x", origin, n))
            n += 1
        s.observe(RoundCompleted(i, drafter, drafted, accepted, emitted, 0.25))
    d = s.to_dict()
    assert d["drafted"] == 10 and d["accepted"] == 6 and d["rounds"] == 4
    assert d["acceptance_rate"] == 0.6
    assert d["mean_accepted_length"] == 2.5  # 1 + 6 / 4
    assert d["generated_tokens"] == 10
    assert d["decode_tokens_per_s"] == 10.0
    assert d["tokens_by_origin"] == {"model": 6, "ngram": 0, "store": 0, "target": 4}
    by_model = d["by_drafter"]["model"]
    assert by_model["per_position_acceptance"] == [1.0, 1.0, 0.5, 0.5]
    assert by_model["mean_accepted_length"] == 4.0
    assert d["by_drafter"]["ngram"]["acceptance_rate"] == 0.0
    assert d["by_drafter"]["none"]["rounds"] == 1
