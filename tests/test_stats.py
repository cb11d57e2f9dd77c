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


def test_prediction_use_counts_the_copied_stretches_and_who_drafted_them():
    from localspec.core.stats import USE_RUN, prediction_use

    prediction = list(range(100, 140))
    # An edit: 12 tokens copied, 3 written anew, 20 copied, then 6 of the answer's own.
    answer = [*prediction[:12], 7, 8, 9, *prediction[15:35], 1, 2, 3, 4, 5, 6]
    origins = (
        ["ngram"] * 8 + [TARGET] * 4 + [TARGET] * 3 + ["prediction"] * 19 + [TARGET] + [TARGET] * 6
    )
    use = prediction_use(prediction, answer, origins)
    assert (use.tokens, use.used, use.drafted, use.by_prediction) == (40, 32, 27, 19)
    assert use.to_dict() == {
        "used_tokens": 32,
        "drafted_tokens": 27,
        "drafted_by_prediction": 19,
    }
    line = use.summary()
    assert "copied 32" in line and "27 drafted (84%)" in line and "5 written by the target" in line
    # A stretch shorter than USE_RUN is not a copy; stats gathered from events agree.
    short = prediction_use(prediction, prediction[: USE_RUN - 1], [TARGET] * (USE_RUN - 1))
    assert short.used == 0
    s = GenerationStats()
    for i, origin in enumerate(origins):
        s.observe(TokenEmitted(answer[i], "x", origin, i))
    assert s.origins == origins
    assert prediction_use(prediction, answer, s.origins) == use
