"""Measured costs and learned acceptance on disk: validated, best effort, per pair."""

from __future__ import annotations

import json

import pytest

from localspec.core.costs import CostProfile
from localspec.core.drafting.evidence import CopyOffer, Evidence
from localspec.core.drafting.grades import Grade
from localspec.core.drafting.tunables import COPY_ODDS
from localspec.core.engine import run_to_completion
from localspec.core.events import EngineWarning, Event, Finished
from localspec.core.params import GenerationParams
from localspec.machine.calibrate import CostCache, fastest_of
from localspec.progress import Progress, ProgressKind
from localspec.storage.learning import FORMAT, LearningStore

PROFILE = CostProfile(plain_s=0.04, verify_s={1: 0.07, 15: 0.3}, draft_step_s=0.02)


@pytest.mark.parametrize(
    "content",
    [
        '{"plain_s": 0.04, "verify_s": []}',
        '{"plain_s": 0, "verify_s": {"1": 0.07}}',
        '{"plain_s": "fast", "verify_s": {"1": 0.07}}',
        "[1, 2]",
        "not json",
        "",
    ],
)
def test_a_damaged_cost_cache_counts_as_missing(tmp_path, content):
    cache = CostCache(tmp_path)
    cache.path("k").write_text(content)
    assert cache.load("k") is None


def test_cost_cache_round_trip_and_best_effort_save(tmp_path):
    cache = CostCache(tmp_path / "calibration")
    assert cache.save("k", PROFILE) == ""
    assert cache.load("k") == PROFILE
    assert [p.name for p in (tmp_path / "calibration").iterdir()] == ["k.json"]  # no temp left
    blocked = tmp_path / "file"
    blocked.write_text("a file where the directory should be")
    problem = CostCache(blocked / "calibration").save("k", PROFILE)
    assert "could not write" in problem  # reported, not raised
    assert CostCache(tmp_path / "calibration").forget() == 1


def test_two_measurements_keep_the_faster_of_each_cost():
    slow = CostProfile(plain_s=0.08, verify_s={1: 0.05, 15: 0.6}, draft_step_s=0.01)
    best = fastest_of(PROFILE, slow)
    assert best.plain_s == 0.04 and best.verify_s == {1: 0.05, 15: 0.3}
    assert best.draft_step_s == 0.01


def test_learning_store_round_trip_damaged_and_foreign_files(tmp_path):
    store = LearningStore(tmp_path)
    model = {"hits": [1.0], "tries": [2.0]}
    learned = {"drafters": {"ngram": {"copies": [1.0, 2.0], "streaks": {}}, "model": model}}
    assert store.load("pair") == (None, "")  # nothing saved yet: no warning either
    assert store.save("pair", learned) == ""
    assert store.load("pair") == (learned, "")
    store.path("pair").write_text("{broken")
    data, why = store.load("pair")
    assert data is None and "unreadable" in why
    store.path("other").write_text(json.dumps({"format": FORMAT, "pair": "pair", "learned": {}}))
    data, why = store.load("other")
    assert data is None and "another model pair" in why
    older = {"format": 1, "pair": "old", "learned": {}}
    store.path("old").write_text(json.dumps(older))
    data, why = store.load("old")  # an older release's evidence, of another shape
    assert data is None and f"not a format {FORMAT} file" in why
    assert store.forget() == 3


def test_the_previous_formats_file_is_read_into_one_entry_per_drafter(tmp_path):
    store = LearningStore(tmp_path)
    model = {"hits": [1.0], "tries": [2.0]}
    ngram = {"copies": [1.0, 2.0], "streaks": {"16": {"hits": [3.0], "tries": [3.0]}}}
    store_entry = {"copies": [0.5, 1.0], "streaks": {}}
    saved = {**ngram, "model": model, "store": store_entry}
    store.path("pair").write_text(json.dumps({"format": 2, "pair": "pair", "learned": saved}))
    data, why = store.load("pair")
    assert why == ""
    assert data == {"drafters": {"ngram": ngram, "model": model, "store": store_entry}}
    without_store = {k: v for k, v in saved.items() if k != "store"}  # before datastores
    store.path("pair").write_text(
        json.dumps({"format": 2, "pair": "pair", "learned": without_store})
    )
    assert store.load("pair")[0] == {"drafters": {"ngram": ngram, "model": model}}
    store.path("pair").write_text(json.dumps({"format": 2, "pair": "pair", "learned": {}}))
    data, why = store.load("pair")
    assert data is None and "malformed" in why


@pytest.fixture
def tiny_options(tiny_pair):
    from localspec.session.pair import ModelOptions

    target, draft, _ = tiny_pair
    return ModelOptions(target=str(target), draft=str(draft), n_ctx=256, threads=1)


def test_a_second_session_starts_from_what_the_first_learned(tiny_options, isolated_home):
    from localspec.session.open import open_session

    params = GenerationParams(max_tokens=24, drafter="auto")
    first = open_session(tiny_options)
    assert first.decoder.restored is None
    run_to_completion(first.complete("the cat the cat the cat", params, raw=True))
    first.close()
    files = list((isolated_home / "learning").glob("*.json"))
    assert len(files) == 1
    saved = json.loads(files[0].read_text())["learned"]
    second = open_session(tiny_options)
    try:
        assert second.decoder.restored == saved
        assert set(saved["drafters"]) == {"ngram", "prediction", "store", "model", "lookahead"}
        learned = second.decoder.learned(params)["drafters"]
        assert learned["ngram"]["streaks"].keys() == saved["drafters"]["ngram"]["streaks"].keys()
        assert second.learning is not None
        store, key = second.learning
        # What a long copying answer teaches: copies under way hold, and this text copies.
        taught = second.decoder.planner_for(params)
        ngram = taught.drafters["ngram"].pricing
        streak = CopyOffer(32, match=16, evidence=Evidence.UNDER_WAY)
        for _ in range(12):
            ngram.grade(Grade.DRAFTED, streak, 16, 16)
        for _ in range(6):
            ngram.grade(Grade.PASSED, CopyOffer(32, match=16), 12, 12)
        assert ngram.copies.odds > COPY_ODDS
        store.save(key, taught.learned())
    finally:
        second.close()
    third = open_session(tiny_options)
    try:
        warm = third.decoder.planner_for(params).drafters["ngram"].pricing
        # The pair's acceptance along copies comes back at half weight, warm from the start.
        assert warm.estimate(streak).tries[0] == pytest.approx(
            ngram.estimate(streak).tries[0] / 2, rel=1e-3
        )
        assert warm.estimate(streak).alphas(16) == pytest.approx(
            ngram.estimate(streak).alphas(16), abs=0.02
        )
        # Whether a text copies belongs to that text: the next prompt's odds start afresh.
        assert warm.copies.odds == COPY_ODDS
        third.forget_learning()
        assert third.decoder.restored is None
    finally:
        third.close()


def test_a_damaged_learning_file_is_ignored_with_a_warning(tiny_options, isolated_home):
    from localspec.session.open import open_session

    first = open_session(tiny_options)
    run_to_completion(first.complete("the cat", GenerationParams(max_tokens=4), raw=True))
    first.close()
    (path,) = (isolated_home / "learning").glob("*.json")
    for damage in ("{not json", json.dumps({"format": 1, "pair": path.stem, "learned": {"x": 1}})):
        path.write_text(damage)
        lines: list[Progress] = []
        session = open_session(tiny_options, on_progress=lines.append)
        try:
            assert session.decoder.restored is None
            assert any(report.kind is ProgressKind.WARNING for report in lines), lines
            fin = run_to_completion(session.complete("the cat", GenerationParams(max_tokens=4)))
            assert fin.stats.generated_tokens > 0
        finally:
            session.close()


def test_calibrate_reset_forgets_measurements_and_learning(tiny_pair, isolated_home):
    from typer.testing import CliRunner

    from localspec.cli.app import app

    target, draft, _ = tiny_pair
    (isolated_home / "learning").mkdir(parents=True)
    (isolated_home / "learning" / "old.json").write_text("{}")
    (isolated_home / "calibration").mkdir(parents=True)
    (isolated_home / "calibration" / "old.json").write_text("{}")
    args = ["calibrate", "--reset", "--target", str(target), "--draft", str(draft),
            "--ctx", "256", "--threads", "1"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "forgot 1 measurement(s) and 1 learned state(s)" in result.output
    assert not (isolated_home / "learning" / "old.json").exists()
    remeasured = list((isolated_home / "calibration").glob("*.json"))
    assert [p.name for p in remeasured] != ["old.json"] and len(remeasured) == 1


def test_concurrent_saves_never_mix_or_leave_temporary_files(tmp_path):
    """Two first runs measuring the same pair save at once: each write goes through its own
    temporary file, so the result is one whole file and nothing else."""
    import json
    import threading

    from localspec.statefiles import write_json

    path = tmp_path / "costs" / "pair.json"
    errors: list[str] = []

    def save(n: int) -> None:
        for i in range(50):
            problem = write_json(path, {"writer": n, "i": i, "pad": "x" * 5000})
            if problem:
                errors.append(problem)

    threads = [threading.Thread(target=save, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert json.loads(path.read_text())["i"] == 49
    assert [p.name for p in path.parent.iterdir()] == ["pair.json"]


def test_learned_state_that_cannot_be_saved_is_warned_of_once(tiny_options, tmp_path):
    from localspec.session.open import open_session

    blocked = tmp_path / "file"
    blocked.write_text("a file where the learning folder should be")
    session = open_session(tiny_options)
    try:
        assert session.learning is not None
        session.learning = (LearningStore(blocked / "learning"), session.learning[1])
        said: list[Event] = []
        for _ in range(3):  # a server answers one request after another
            events = session.complete("the cat", GenerationParams(max_tokens=4))
            run_to_completion(events, said.append)
        warnings = [e.message for e in said if isinstance(e, EngineWarning)]
        assert len(warnings) == 1 and "could not write" in warnings[0]
        first = next(i for i, e in enumerate(said) if isinstance(e, EngineWarning))
        assert isinstance(said[first + 1], Finished)  # in that answer, before its end
    finally:
        session.close()


def test_only_the_pairs_own_limits_save_what_auto_learned(tiny_options, isolated_home):
    from localspec.session.open import open_session

    session = open_session(tiny_options)
    try:
        home = GenerationParams(max_tokens=24, drafter="auto")
        run_to_completion(session.complete("the cat the cat the cat", home, raw=True))
        (path,) = (isolated_home / "learning").glob("*.json")
        saved = path.read_text()
        # A server's request naming limits of its own learns apart, and saves nothing.
        own = home.model_copy(update={"draft_min": 5, "ngram_draft_max": 20})
        run_to_completion(session.complete("the dog the dog the dog", own, raw=True))
        assert path.read_text() == saved
        session.learn_with(own)  # the limits a front end names as the pair's
        run_to_completion(session.complete("the dog the dog the dog", own, raw=True))
        assert path.read_text() != saved
    finally:
        session.close()


def test_one_process_measures_a_pairs_costs_while_the_others_wait(tiny_pair, monkeypatch):
    """Several first runs at once: the others wait for the first's measurement and read it,
    instead of measuring together on a machine they all keep busy."""
    import threading
    import time

    from localspec.machine import costcache
    from localspec.machine.placement import place
    from localspec.models.resources import footprint
    from localspec.session.pair import ModelOptions

    target, draft, _ = tiny_pair
    options = ModelOptions(target=str(target), draft=str(draft))
    placement = place(0, 0, footprint(target, 256), footprint(draft, 256), [])
    release, measured = threading.Event(), []

    def measure(target_model, draft_model, on_progress):
        measured.append(threading.current_thread().name)
        release.wait(10)
        return PROFILE

    monkeypatch.setattr(costcache, "_measure", measure)
    waits: list[Progress] = []
    results: list[CostProfile | None] = []

    def first_run() -> None:
        costs, _ = costcache.step_costs(options, placement, None, None, target, draft,
                                        waits.append)  # fmt: skip
        results.append(costs)

    runs = [threading.Thread(target=first_run, daemon=True) for _ in range(3)]
    for run in runs:
        run.start()
    deadline = time.monotonic() + 10
    while len([w for w in waits if "waiting for another" in w.text]) < 2:
        assert time.monotonic() < deadline and len(measured) < 2, (waits, measured)
        time.sleep(0.01)
    release.set()
    for run in runs:
        run.join(10)
    assert len(measured) == 1 and results == [PROFILE] * 3
