"""The bench's options that decide what is measured: the user's own prompt file, cold and
warm runs, per-round traces, llama.cpp's plain decoding (native-none) and its overshoot,
short runs left out of the ratios, ratios against the best native mode, and the CLI wiring.
All over fakes and hand-made records; no timing assertions."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from localspec.backend.native import NO_DRAFT_FLAGS, NativeRunner, check_binary
from localspec.bench import modes as bench_modes
from localspec.bench import prompts as bench_prompts
from localspec.bench import report as bench_report
from localspec.bench import run as bench_cli
from localspec.bench import runner as bench_runner
from localspec.bench import summary as bench_summary
from localspec.bench.records import RunRecord
from localspec.cli.bench import bench_command
from localspec.core.engine import SpecDecoder
from localspec.core.params import GenerationParams
from localspec.errors import InputError, UsageError
from localspec.options.bench import BenchChoice
from localspec.options.model import ModelChoice, command_line
from tests.test_bench import (
    NATIVE_SAMPLE,
    SPEC_SIMPLE_HELP,
    SPEC_SIMPLE_MODES,
    FakeBenchSession,
    fake_prompts,
    rec,
)

# -- --prompts FILE ------------------------------------------------------------------------


def write_lines(path: Path, *lines: str) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_prompt_file_fills_in_id_category_and_source(tmp_path):
    path = write_lines(
        tmp_path / "mine.jsonl",
        '{"prompt": "first"}',
        "",
        '{"prompt": "second", "id": "x", "category": "code", "source": "my notes"}',
        '{"prompt": "third", "category": "code", "extra": 1}',
    )
    prompts = bench_prompts.load_prompt_file(path)
    assert prompts == [
        bench_prompts.BenchPrompt("mine", "line-1", "first", str(path)),
        bench_prompts.BenchPrompt("code", "x", "second", "my notes"),
        bench_prompts.BenchPrompt("code", "line-4", "third", str(path)),
    ]
    # --categories filters by the file's own categories, --limit counts per category.
    assert [p.id for p in bench_prompts.load_prompt_file(path, ["code"])] == ["x", "line-4"]
    assert [p.id for p in bench_prompts.load_prompt_file(path, limit=1)] == ["line-1", "x"]
    with pytest.raises(UsageError, match="no prompts in category math") as err:
        bench_prompts.load_prompt_file(path, ["math"])
    assert "mine, code" in err.value.hint
    with pytest.raises(UsageError, match="--limit"):
        bench_prompts.load_prompt_file(path, limit=0)


@pytest.mark.parametrize(
    ("lines", "needle"),
    [
        (['{"prompt": "ok"}', "{not json"], "line 2: not JSON"),
        (['{"id": "a"}'], 'line 1: no non-empty string "prompt"'),
        (['{"prompt": 42}'], 'line 1: no non-empty string "prompt"'),
        (['{"prompt": "   "}'], 'line 1: no non-empty string "prompt"'),
        (['["prompt", "a list"]'], "line 1: not a JSON object"),
        (['{"prompt": "a", "category": 3}'], 'line 1: "category" must be a non-empty string'),
        (['{"prompt": "a", "id": "1"}', '{"prompt": "b", "id": "1"}'], "line 2: id '1' repeats"),
        (["", "   "], "holds no prompts"),
    ],
)
def test_prompt_file_errors_name_the_file_and_line(tmp_path, lines, needle):
    path = write_lines(tmp_path / "bad.jsonl", *lines)
    with pytest.raises(InputError) as err:
        bench_prompts.load_prompt_file(path)
    assert needle in str(err.value) and str(path) in str(err.value)
    assert err.value.hint


def test_a_missing_or_empty_prompt_file_is_an_input_error(tmp_path):
    missing = tmp_path / "nowhere.jsonl"
    with pytest.raises(InputError, match="cannot read the prompt file") as err:
        bench_prompts.load_prompt_file(missing)
    assert str(missing) in str(err.value) and "--prompts" in err.value.hint
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(InputError, match="holds no prompts"):
        bench_prompts.load_prompt_file(empty)


# -- cold and warm -------------------------------------------------------------------------


class StartingStates(FakeBenchSession):
    """Notes what each auto or model run's controller knew when the run began."""

    def __init__(self):
        super().__init__()
        self.started: list[tuple[str, dict]] = []

    def generate(self, tokens, params, cancel=None, *, grammar=None):
        if params.drafter in ("auto", "model"):
            learned = self.decoder.learned(params)
            self.started.append((params.drafter.value, learned))
        return super().generate(tokens, params, cancel, grammar=grammar)


def starting_states(cold: bool) -> tuple[StartingStates, list[RunRecord]]:
    session = StartingStates()
    config = bench_runner.BenchConfig(modes=("none", "model", "auto"), max_tokens=24, cold=cold)
    records = bench_runner.BenchRunner(session, config).run(fake_prompts())
    return session, records


def fresh_state(session: StartingStates, mode: str) -> dict:
    """What the drafters of ``mode`` know in a decoder that has run nothing."""
    decoder = SpecDecoder(session.decoder.target, session.decoder.draft, session.costs)
    return decoder.learned(GenerationParams(drafter=mode))


def test_cold_runs_forget_before_every_run_and_start_from_nothing():
    session, records = starting_states(cold=True)
    assert session.forgotten == 3 + len(records)  # the warm-up runs too
    assert len(session.started) == 2 * (1 + 3)
    assert all(state == fresh_state(session, mode) for mode, state in session.started)


def test_warm_runs_carry_what_was_learned_to_the_next_prompt():
    session, _ = starting_states(cold=False)
    assert session.forgotten == 0
    for mode in ("model", "auto"):
        fresh = fresh_state(session, mode)
        states = [state for m, state in session.started if m == mode]
        assert states[0] == fresh  # the warm-up began with nothing
        assert all(state != fresh for state in states[1:])


def test_trace_keeps_every_round_in_the_records_only():
    session = FakeBenchSession()
    config = bench_runner.BenchConfig(modes=("none", "auto"), max_tokens=24, trace=True)
    records = bench_runner.BenchRunner(session, config).run(fake_prompts()[:1])
    for r in (record.to_dict() for record in records):
        assert len(r["trace"]) == r["rounds"] > 0
        assert sum(step["emitted"] for step in r["trace"]) == r["generated_tokens"]
        assert {"drafted", "accepted", "seconds", "verify_seconds"} <= set(r["trace"][0])
        json.dumps(r)  # still a JSONL line
    summary = bench_summary.summarize(records, config.modes, greedy=True)
    assert "trace" not in json.dumps(summary)


# -- native-none and overshoot -------------------------------------------------------------


def test_native_none_is_plain_decoding_in_the_same_binary_with_the_same_n(tmp_path):
    runner = NativeRunner(
        tmp_path / "bin", tmp_path / "t.gguf", tmp_path / "d.gguf", str,
        extra_args=["--spec-ngram-simple-size-n", "3"],
    )  # fmt: skip
    commands = {m: runner.command(m, "hi", 77, 0.0, None) for m in SPEC_SIMPLE_MODES}
    for cmd in commands.values():
        assert cmd[0] == str(tmp_path / "bin") and cmd[cmd.index("-n") + 1] == "77"
    plain = commands["native-none"]
    assert "-md" not in plain
    # `--spec-type none` makes the example exit ("failed to initialize speculative
    # decoding"), so ngram-simple is pinned to a lookup that cannot match: its flags come
    # after the user's extra flags, so those cannot turn drafting back on.
    assert plain[plain.index("--spec-type") + 1] == "ngram-simple"
    assert plain[-len(NO_DRAFT_FLAGS) :] == list(NO_DRAFT_FLAGS)
    assert commands["native-ngram"][-2:] == ["--spec-ngram-simple-size-n", "3"]
    assert "1024" not in commands["native-ngram"]


def test_check_binary_wants_the_lookup_flag_only_for_native_none(tmp_path):
    binary = tmp_path / "llama-speculative-simple"
    binary.write_text('#!/bin/sh\necho "--spec-type none,draft-simple,ngram-simple"\n')
    binary.chmod(0o755)
    check_binary(binary, ("none", "native-draft", "native-ngram"))
    with pytest.raises(UsageError, match="--spec-ngram-simple-size-n .needed by native-none"):
        check_binary(binary, ("none", "native-none"))


def native_binary(tmp_path: Path, decoded: int) -> Path:
    """A stand-in for llama-speculative-simple that reports ``decoded`` tokens."""
    sample = tmp_path / f"sample{decoded}.txt"
    sample.write_text(NATIVE_SAMPLE.replace("decoded   35 tokens", f"decoded   {decoded} tokens"))
    binary = tmp_path / f"native{decoded}"
    binary.write_text(f"#!/bin/sh\ncat {sample} >&2\n")
    binary.chmod(0o755)
    return binary


def test_a_native_run_past_max_tokens_is_kept_and_marked(tmp_path):
    session = FakeBenchSession()
    config = bench_runner.BenchConfig(modes=("none", "native-none"), max_tokens=35, warmup=False)
    exact = NativeRunner(native_binary(tmp_path, 35), tmp_path / "t.gguf", None, str)
    over = NativeRunner(native_binary(tmp_path, 36), tmp_path / "t.gguf", None, str)
    tokens = [1, 2, 3]
    assert "overshoot" not in bench_runner.BenchRunner(session, config, exact).run_native(
        tokens, "native-none", 35, 0
    )
    record = bench_runner.BenchRunner(session, config, over).run_native(
        tokens, "native-none", 35, 0
    )
    assert record["generated_tokens"] == 36 and record["overshoot"] == 1


def test_the_overshoot_note_says_which_runs_wrote_too_much():
    records = [
        rec("a", str(i), mode, 10.0, 100 + extra)
        for i in range(8)
        for mode, extra in (("none", 0), ("native-none", 1), ("native-draft", 3 if i < 7 else 0))
    ]
    for r in records:
        if r["mode"] != "none" and r["generated_tokens"] > 100:
            r["overshoot"] = r["generated_tokens"] - 100
    summary = bench_summary.summarize(
        records, ("none", "native-draft", "native-none"), greedy=False
    )
    assert len(summary["overshoot"]) == 15
    assert summary["overshoot"][0] == {
        "mode": "native-none", "category": "a", "prompt_id": "0",
        "generated_tokens": 101, "overshoot": 1,
    }  # fmt: skip
    table = bench_report.render_table(summary)
    note = next(line for line in table.splitlines() if line.startswith("Note:"))
    assert "more tokens than the 100 asked" in note
    assert "native-none: all 8 runs (+1)" in note
    assert "native-draft: 7 of 8 runs (+3): a/0, a/1, a/2, a/3, a/4, a/5 and 1 more" in note
    clean = bench_summary.summarize([r for r in records if r["mode"] == "none"], ("none",), False)
    assert clean["overshoot"] == [] and "Note:" not in bench_report.render_table(clean)


# -- short runs and native ratios ----------------------------------------------------------


def test_short_runs_are_left_out_of_the_ratios_and_counted():
    n = bench_summary.MIN_RATIO_TOKENS
    records = [
        rec("a", "1", "none", 10.0, 100),
        rec("a", "1", "auto", 20.0, 100),
        rec("a", "2", "none", 10.0, n - 1),  # short baseline: no steady rate to compare with
        rec("a", "2", "auto", 90.0, 100),
        rec("a", "3", "none", 10.0, 100),
        rec("a", "3", "auto", 50.0, 20),  # short run itself
        rec("a", "4", "none", 10.0, n),
        rec("a", "4", "auto", 40.0, n),  # exactly the minimum counts
    ]
    s = bench_summary.summarize(records, ("none", "auto"), greedy=False)
    auto = s["overall"]["auto"]
    assert auto["ratio_to_none"] == pytest.approx((2.0 * 4.0) ** 0.5, rel=1e-4)
    assert auto["short_runs"] == 2
    assert auto["mean_tokens"] == pytest.approx((100 + 100 + 20 + n) / 4)
    assert s["overall"]["none"]["short_runs"] == 1 and s["overall"]["none"]["ratio_to_none"] == 1
    table = bench_report.render_table(s)
    assert "| a | auto | 4 | 71 | " in table and "2.83x (2 short left out)" in table
    only_short = bench_summary.summarize(records[2:4], ("none", "auto"), greedy=False)
    assert only_short["overall"]["auto"]["ratio_to_none"] is None
    assert "| - (1 short left out) |" in bench_report.render_table(only_short)


def native_records() -> list[dict]:
    rows = {  # prompt: none, auto, native-draft, native-ngram, native-none (tok/s)
        "1": (10.0, 30.0, 10.0, 15.0, 8.0),
        "2": (20.0, 60.0, 40.0, 20.0, 50.0),  # native-none is fastest: not a "best native"
    }
    modes = ("none", "auto", "native-draft", "native-ngram", "native-none")
    records = [
        rec("a", pid, mode, tps, 100) for pid, speeds in rows.items()
        for mode, tps in zip(modes, speeds, strict=True)
    ]  # fmt: skip
    # Prompt 3: the faster native run is short, so the prompt leaves the native ratio.
    records += [
        rec("a", "3", "none", 10.0, 100),
        rec("a", "3", "auto", 10.0, 100),
        rec("a", "3", "native-draft", 1.0, 100),
        rec("a", "3", "native-ngram", 99.0, 5),
        rec("a", "3", "native-none", 10.0, 100),
    ]
    return records


def test_ratio_to_best_native_pairs_each_prompt_with_its_fastest_speculative_native_run():
    modes = ("none", "auto", "native-draft", "native-ngram", "native-none")
    s = bench_summary.summarize(native_records(), modes, greedy=False)
    auto, none = s["overall"]["auto"], s["overall"]["none"]
    assert auto["ratio_to_best_native"] == pytest.approx((30 / 15 * 60 / 40) ** 0.5, abs=1e-4)
    assert none["ratio_to_best_native"] == pytest.approx((10 / 15 * 20 / 40) ** 0.5, abs=1e-4)
    assert none["ratio_to_native_none"] == pytest.approx(
        (10 / 8 * 20 / 50 * 10 / 10) ** (1 / 3), abs=1e-4
    )
    assert "ratio_to_native_none" not in auto
    for native in ("native-draft", "native-ngram", "native-none"):
        assert "ratio_to_best_native" not in s["overall"][native]
    assert s["categories"]["a"]["auto"]["ratio_to_best_native"] == auto["ratio_to_best_native"]
    table = bench_report.render_table(s)
    header = table.splitlines()[0]
    assert "| vs none | vs best native | vs native-none | acceptance |" in header
    assert f"| {bench_report.OVERALL} | auto | 3 | 100 | " in table
    assert "1.73x | - |" in table  # auto vs best native, and no native-none ratio for it


def test_only_native_none_gives_no_best_native_ratio():
    records = [r for r in native_records() if r["mode"] in ("none", "auto", "native-none")]
    s = bench_summary.summarize(records, ("none", "auto", "native-none"), greedy=False)
    assert "ratio_to_best_native" not in s["overall"]["auto"]
    assert s["overall"]["none"]["ratio_to_native_none"] is not None
    assert "vs best native" not in bench_report.render_table(s)


def test_the_ceiling_line_names_the_best_batch_and_the_calibrated_one():
    summary = bench_summary.summarize([rec("a", "1", "none", 10.0, 100)], ("none",), greedy=True)
    summary["ceiling"] = {
        "batch": 32, "batch_s": 0.4, "tokens_per_s": 80.0, "plain_tokens_per_s": 20.0,
        "ceiling_ratio": 4.0, "calibrated_tokens_per_s": 70.0, "calibrated_batch": 64,
        "by_batch": [
            {"batch": 16, "batch_s": 0.25, "tokens_per_s": 64.0},
            {"batch": 32, "batch_s": 0.4, "tokens_per_s": 80.0},
            {"batch": 64, "batch_s": 1.0, "tokens_per_s": 64.0},
        ],
    }  # fmt: skip
    table = bench_report.render_table(summary)
    assert "80.0 tok/s at a batch of 32" in table and "64.0 at 16, 64.0 at 64" in table
    assert "4.00x is the most" in table and "70.0 tok/s at a batch of 64" in table


# -- the command ---------------------------------------------------------------------------


def cli_app() -> typer.Typer:
    app = typer.Typer(add_completion=False)
    app.command("bench")(bench_command)
    app.command("other")(lambda: None)  # two commands, so "bench" is a subcommand
    return app


def test_bench_help_lists_the_new_options():
    result = CliRunner().invoke(cli_app(), ["bench", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    for needle in ("--cold", "--warm", "--prompts", "--trace", "native-none", "auto-chains"):
        assert needle in result.output


def args(**changes) -> bench_cli.BenchArgs:
    """The bench's arguments as the command builds them: the model options, checked as the
    bench's, and the bench's own (two modes and no chart unless ``changes`` say)."""
    model_names = {field.name for field in dataclasses.fields(ModelChoice)}
    model = ModelChoice(**{k: v for k, v in changes.items() if k in model_names})
    own = {k: v for k, v in changes.items() if k not in model_names}
    bench = BenchChoice(**{"modes": "none,auto", "chart": False, **own})
    return bench_cli.BenchArgs(bench, model.options(spelling=command_line("bench")))


def test_native_bin_alone_adds_all_native_modes(tmp_path):
    binary = tmp_path / "llama-speculative-simple"
    binary.write_text(f'#!/bin/sh\necho "{SPEC_SIMPLE_HELP}"\n')
    binary.chmod(0o755)
    llama_bench = tmp_path / "llama-bench"  # native-bench runs the one beside it
    llama_bench.write_text('#!/bin/sh\necho "-d, --n-depth <n>"\n')
    llama_bench.chmod(0o755)
    chosen, _ = bench_cli._choose_modes(args(native_bin=binary))
    assert chosen == ("none", "auto", *bench_modes.NATIVE_MODES)
    chosen, _ = bench_cli._choose_modes(args(native_bin=binary, modes="native-none"))
    assert chosen == ("none", "native-none")


def test_the_runner_reads_its_settings_from_the_bench_options_by_name():
    """Every setting of the runner is an option of the bench's, with the same default, and
    takes the value given on the command line."""
    modes = ("none", "auto")
    assert bench_runner.BenchConfig.of(BenchChoice(), modes) == bench_runner.BenchConfig(
        modes=modes
    )
    given = BenchChoice(max_tokens=7, temperature=0.5, seed=3, raw=True, warmup=False,
                        cold=False, fresh=True, trace=True, repeat=4)  # fmt: skip
    config = bench_runner.BenchConfig.of(given, modes)
    assert config.model_dump() == {
        "modes": modes, "max_tokens": 7, "temperature": 0.5, "seed": 3, "raw": True,
        "warmup": False, "cold": False, "fresh": True, "trace": True, "repeat": 4,
    }  # fmt: skip


def test_cold_keeps_the_saved_learning_out_and_untouched_warm_uses_it():
    config, options = bench_cli._settings(args(), ("none", "auto"))
    assert config.cold and not options.learn
    config, options = bench_cli._settings(args(cold=False, trace=True), ("none", "auto"))
    assert not config.cold and config.trace and options.learn


def test_auto_chains_loads_the_draft_model_as_auto_does():
    chosen, _ = bench_cli._choose_modes(args(modes="auto-chains"))
    assert chosen == ("none", bench_modes.CHAINS_MODE)
    _, options = bench_cli._settings(args(modes="auto-chains"), chosen)
    assert options.use_draft
    _, options = bench_cli._settings(args(modes="ngram"), ("none", "ngram"))
    assert not options.use_draft


def test_exact_reaches_the_model_options():
    _, options = bench_cli._settings(args(exact=True), ("none", "auto"))
    assert options.exact
    _, options = bench_cli._settings(args(), ("none", "auto"))
    assert not options.exact


def test_bench_command_reads_a_prompt_file_before_loading_models(tmp_path):
    bad = write_lines(tmp_path / "mine.jsonl", '{"prompt": "fine"}', '{"id": "no prompt"}')
    for path, needle in ((bad, "line 2"), (tmp_path / "gone.jsonl", "cannot read")):
        result = CliRunner().invoke(
            cli_app(), ["bench", "--prompts", str(path), "--out", str(tmp_path / "o")]
        )
        assert result.exit_code == 2, result.output
        assert needle in result.output and str(path) in result.output
    assert not (tmp_path / "o").exists()


def test_bench_command_warm_with_a_prompt_file_and_traces(tiny_pair, tmp_path):
    target, draft, _ = tiny_pair
    prompts = write_lines(
        tmp_path / "mine.jsonl",
        '{"prompt": "Say hello."}',
        '{"prompt": "Count to five.", "category": "count", "id": "five"}',
    )
    out = tmp_path / "results"
    argv = ["bench", "--target", str(target), "--draft", str(draft), "--prompts", str(prompts),
            "--modes", "none,ngram", "--max-tokens", "6", "--out", str(out), "--threads", "1",
            "--ctx", "512", "--warm", "--trace", "--no-chart"]  # fmt: skip
    result = CliRunner().invoke(cli_app(), argv)
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (out / "records.jsonl").read_text().splitlines()]
    assert {(r["category"], r["prompt_id"]) for r in records} == {
        ("mine", "line-1"),
        ("count", "five"),
    }
    assert all(len(r["trace"]) == r["rounds"] for r in records)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["meta"]["cold"] is False and summary["meta"]["prompt_file"] == str(prompts)
    assert set(summary["categories"]) == {"mine", "count"}
    assert "(2 short left out)" in result.stdout  # 6 tokens a run: no ratio is steady


def test_a_prompt_file_may_give_each_prompt_a_prediction(tmp_path):
    path = tmp_path / "edits.jsonl"
    path.write_text(
        '{"prompt": "fix it", "prediction": "def f():\\n    pass\\n"}\n{"prompt": "plain"}\n'
    )
    given, plain = bench_prompts.load_prompt_file(path)
    assert given.predicted() == "def f():\n    pass\n" and plain.predicted() is None
    path.write_text('{"prompt": "fix it", "prediction": 3}\n')
    with pytest.raises(InputError, match='"prediction" must be a string'):
        bench_prompts.load_prompt_file(path)


def test_bench_model_options_reach_the_model_options_and_are_checked_as_bench_s(tmp_path):
    prompts = write_lines(tmp_path / "mine.jsonl", '{"prompt": "fine"}')
    result = CliRunner().invoke(
        cli_app(), ["bench", "--prompts", str(prompts), "--modes", "none", "--threads", "0"]
    )
    assert result.exit_code == 2, result.output
    assert "invalid --threads" in result.output and "see localspec bench --help" in result.output
    _, options = bench_cli._settings(
        args(threads=3, ctx=1024, gpu_layers="all", rpc="h:1", rpc_split="3,1"), ("none",)
    )
    assert (options.threads, options.n_ctx, options.n_gpu_layers) == (3, 1024, -1)
    assert (options.rpc, options.rpc_split) == (("h:1",), (3.0, 1.0))
