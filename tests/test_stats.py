"""Stats arithmetic in the field's own words."""

from __future__ import annotations

from localspec.core.events import TARGET, PrefillDone, RoundCompleted, TokenEmitted
from localspec.core.stats import GenerationStats


def test_stats_arithmetic_and_per_position_acceptance():
    s = GenerationStats()
    s.observe(PrefillDone(10, 10, 0.5))
    rounds = [("model", 4, 2, 3), ("model", 4, 4, 5), ("ngram", 2, 0, 1), (None, 0, 0, 1)]
    n = 0
    for i, (drafter, drafted, accepted, emitted) in enumerate(rounds):
        for j in range(emitted):
            origin = TARGET if j == accepted else drafter
            s.observe(TokenEmitted(n, "x", origin, n))
            n += 1
        s.observe(RoundCompleted(i, drafter, drafted, accepted, emitted, 0.25))
    d = s.to_dict()
    assert d["drafted"] == 10 and d["accepted"] == 6 and d["rounds"] == 4
    assert d["acceptance_rate"] == 0.6
    assert d["mean_accepted_length"] == 2.5  # 1 + 6 / 4
    assert d["generated_tokens"] == 10
    assert d["decode_tokens_per_s"] == 10.0
    # Only the origins of emitted tokens, and the target's: ngram's one draft was rejected.
    assert d["tokens_by_origin"] == {"model": 6, "target": 4}
    by_model = d["by_drafter"]["model"]
    assert by_model["per_position_acceptance"] == [1.0, 1.0, 0.5, 0.5]
    assert by_model["mean_accepted_length"] == 4.0
    assert d["by_drafter"]["ngram"]["acceptance_rate"] == 0.0
    assert d["by_drafter"]["none"]["rounds"] == 1


def _generation(rounds: list[tuple[str | None, int, int, int]], seconds: float) -> list:
    """The events of one generation: (drafter, drafted, accepted, emitted) per round."""
    events: list = [PrefillDone(8, 6, 0.5)]
    n = 0
    for i, (drafter, drafted, accepted, emitted) in enumerate(rounds):
        for j in range(emitted):
            events.append(TokenEmitted(n, "x", TARGET if j >= accepted else drafter, n))
            n += 1
        events.append(RoundCompleted(i, drafter, drafted, accepted, emitted, seconds))
    return events


def test_merged_stats_are_the_stats_of_all_the_events():
    first = _generation([("model", 4, 3, 4), (None, 0, 0, 1)], 0.25)
    second = _generation([("ngram", 6, 6, 7), ("model", 2, 0, 1)], 0.5)
    parts = []
    for events in (first, second):
        part = GenerationStats()
        for event in events:
            part.observe(event)
        parts.append(part)
    whole = GenerationStats()
    for event in first + second:
        whole.observe(event)
    merged = GenerationStats.merged(parts)
    assert merged.to_dict() == whole.to_dict()
    assert (merged.drafted, merged.accepted, merged.rounds) == (12, 9, 4)
    assert merged.acceptance_rate == 0.75 and merged.mean_accepted_length == 1 + 9 / 4
    assert merged.by_origin == {"target": 4, "model": 3, "ngram": 6}
    assert parts[0].drafted == 4  # the parts are left as they were


def test_the_trace_is_in_the_json_only_when_kept():
    stats = GenerationStats()
    assert "trace" not in stats.to_dict()
    stats.trace = [{"round": 0}]
    assert stats.to_dict()["trace"] == [{"round": 0}]
