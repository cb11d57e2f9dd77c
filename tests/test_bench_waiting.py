"""What a user waits for, in the bench: wall time and time to first token of every run, the
engine's modes as fresh ``localspec complete`` processes (``--fresh``), llama.cpp's as the
processes they are, and the ratios of wall times in the summary and the table."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from localspec.backend.native import NativeResult
from localspec.bench import report as bench_report
from localspec.bench import summary as bench_summary
from localspec.bench.fresh import check_modes, pair_flags
from localspec.bench.modes import BenchMode
from localspec.errors import UsageError
from localspec.session.pair import ModelOptions
from tests.test_bench import FakeBenchSession, cli_app, fake_prompts, rec


def timed(record, wall, first, *, fresh=None):
    return {**record, "wall_s": wall, "first_token_s": first, "fresh": fresh}


def test_wall_ratios_pair_each_prompt_with_none_and_the_first_native_process():
    records = [
        timed(rec("a", "1", "none", 10.0, 100), 12.0, 2.0, fresh=True),
        timed(rec("a", "1", "auto", 20.0, 100), 6.0, 1.0, fresh=True),
        timed(rec("a", "1", "native-ngram", 25.0, 100), 5.0, 1.0),
        timed(rec("a", "1", "native-ngram-mod", 30.0, 100), 4.0, 0.5),
        timed(rec("a", "2", "none", 10.0, 100), 10.0, 2.0, fresh=True),
        timed(rec("a", "2", "auto", 10.0, 100), 10.0, 2.0, fresh=True),
        timed(rec("a", "2", "native-ngram", 8.0, 100), 12.0, 1.5),
        timed(rec("a", "2", "native-ngram-mod", 9.0, 100), 20.0, 1.5),
    ]
    modes = ("none", "auto", "native-ngram", "native-ngram-mod")
    auto = bench_summary.summarize(records, modes, greedy=False)["overall"]["auto"]
    assert auto["wall_s"] == pytest.approx(8.0) and auto["first_token_s"] == pytest.approx(1.5)
    assert auto["wall_to_none"] == pytest.approx(math.sqrt(0.5 * 1.0), rel=1e-3)
    # Against the native process that ended first on each prompt: 6/4 and 10/12.
    assert auto["wall_to_first_native"] == pytest.approx(math.sqrt(1.5 * 10 / 12), rel=1e-3)
    table = bench_report.render_table(bench_summary.summarize(records, modes, greedy=False))
    assert "wall / first native" in table and "first token s" in table


def test_in_process_runs_are_not_compared_with_native_processes():
    records = [
        timed(rec("a", "1", "none", 10.0, 100), 10.0, 0.2, fresh=False),
        timed(rec("a", "1", "native-ngram", 25.0, 100), 5.0, 1.0),
    ]
    none = bench_summary.summarize(records, ("none", "native-ngram"), greedy=False)
    assert "wall_to_first_native" not in none["overall"]["none"]


def test_records_without_timings_leave_the_wait_columns_out():
    records = [rec("a", "1", "none", 10.0, 100), rec("a", "1", "auto", 20.0, 100)]
    summary = bench_summary.summarize(records, ("none", "auto"), greedy=False)
    assert "wall_s" not in summary["overall"]["auto"]
    assert "wall s" not in bench_report.render_table(summary)


def test_a_native_process_first_token_is_its_wall_less_its_decode_time():
    result = NativeResult("native-ngram", 30, 0.2, 64, 1.5, 42.7, 10, 8, None, wall_s=2.25)
    record = result.to_record()
    assert record["wall_s"] == 2.25 and record["first_token_s"] == pytest.approx(0.75)
    assert "wall_s" not in NativeResult("n", 1, 0.1, 2, 0.1, 20.0, 0, 0, None).to_record()


def test_in_process_runs_time_their_answer_from_the_prompt():
    from localspec.bench import runner as bench_runner

    config = bench_runner.BenchConfig(modes=("none", "ngram"), max_tokens=8)
    records = bench_runner.BenchRunner(FakeBenchSession(), config, load_s=1.25).run(
        fake_prompts()[:1]
    )
    for r in records:
        assert 0 < r.first_token_s <= r.wall_s and r.load_s == 1.25 and r.fresh is False


def test_fresh_processes_get_the_pairs_options_and_refuse_what_they_cannot_run(tmp_path):
    pair = ModelOptions(threads=2, n_ctx=1024, n_gpu_layers=-1, draft_gpu_layers=0, exact=True)
    flags = pair_flags(pair, tmp_path / "t.gguf", tmp_path / "d.gguf")
    assert flags == [
        "--target", str(tmp_path / "t.gguf"), "--ctx", "1024", "--draft",
        str(tmp_path / "d.gguf"), "--threads", "2", "--gpu-layers", "all",
        "--draft-gpu-layers", "0", "--exact",
    ]  # fmt: skip
    with pytest.raises(UsageError, match="auto-store"):
        check_modes((BenchMode("none"), BenchMode("auto-store")), fresh=True)


def test_bench_fresh_runs_complete_processes_on_the_tiny_pair(tiny_pair, tmp_path):
    target, draft, _ = tiny_pair
    out = tmp_path / "results"
    args = ["bench", "--target", str(target), "--draft", str(draft), "--categories", "math",
            "--limit", "1", "--max-tokens", "8", "--modes", "none,auto", "--fresh",
            "--out", str(out), "--threads", "1", "--ctx", "512", "--no-chart"]  # fmt: skip
    result = CliRunner().invoke(cli_app(), args)
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert [r["mode"] for r in records] == ["none", "auto"]
    for r in records:
        assert r["fresh"] is True and r["generated_tokens"] >= 1
        assert 0 < r["first_token_s"] <= r["wall_s"] and 0 < r["load_s"] < r["wall_s"]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["meta"]["fresh"] is True
    assert summary["overall"]["auto"]["wall_to_none"] > 0


def test_auto_warm_runs_each_prompt_twice_and_records_the_second(tiny_pair, tmp_path):
    target, draft, _ = tiny_pair
    out = tmp_path / "results"
    args = ["bench", "--target", str(target), "--draft", str(draft), "--categories", "math",
            "--limit", "1", "--max-tokens", "8", "--modes", "none,auto-warm", "--fresh",
            "--out", str(out), "--threads", "1", "--ctx", "512", "--no-chart"]  # fmt: skip
    result = CliRunner().invoke(cli_app(), args)
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    none, warm = records
    assert none["restored_tokens"] == 0 and "cold_first_token_s" not in none
    assert warm["mode"] == "auto-warm" and warm["cold_first_token_s"] > 0
    assert warm["same_as_cold"] is True
    # The tiny pair's state is a few bytes a token: worth saving, and restored whole (but
    # for the last token, which the first round evaluates).
    assert warm["restored_tokens"] == warm["prompt_tokens"] - 1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["overall"]["auto-warm"]["warm_to_cold_first_token"] > 0


def test_auto_warm_needs_fresh_processes():
    with pytest.raises(UsageError, match="auto-warm"):
        check_modes((BenchMode("none"), BenchMode("auto-warm")), fresh=False)
