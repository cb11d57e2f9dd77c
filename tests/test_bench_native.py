"""The bench beside all of llama.cpp: the ngram-map-k and ngram-mod modes, llama-bench's plain
decoding at the prompt's depth (native-bench: its command, its JSON, the binary found beside
llama-speculative-simple), the best native run taken over every speculative native mode, and
the report's columns. The binaries are faked at the subprocess boundary; no timing asserted."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from localspec.backend.native import (
    NO_DRAFT_FLAGS,
    NativeRunner,
    check_binary,
    llama_bench_path,
    parse_llama_bench_json,
    parse_native_output,
)
from localspec.bench import modes as bench_modes
from localspec.bench import report as bench_report
from localspec.bench import run as bench_run
from localspec.bench import runner as bench_runner
from localspec.bench import summary as bench_summary
from localspec.cli.bench import bench_command
from localspec.errors import BackendError, UsageError
from tests.test_bench import (
    NATIVE_SAMPLE,
    SPEC_SIMPLE_HELP,
    FakeBenchSession,
    fake_prompts,
    rec,
)
from tests.test_bench_options import args

# Captured from llama-bench (built from llama-cpp-python 0.3.36's llama.cpp) run as the
# bench runs it for a code_rewrite prompt of 252 tokens:
# `llama-bench -m qwen2.5-coder-1.5b.gguf -p 0 -n 32 -d 252 -t 2 -r 1 -fa on -o json`.
LLAMA_BENCH_SAMPLE = """\
[
  {
    "build_commit": "0c1e570",
    "build_number": 1,
    "cpu_info": "AMD EPYC",
    "gpu_info": "",
    "backends": "CPU",
    "model_filename": "/tmp/benchhome/models/qwen2.5-coder-1.5b.gguf",
    "model_type": "qwen2 1.5B Q4_K - Medium",
    "model_size": 1111370240,
    "model_n_params": 1777088000,
    "n_batch": 2048,
    "n_ubatch": 512,
    "n_threads": 2,
    "cpu_mask": "0x0",
    "cpu_strict": false,
    "poll": 50,
    "type_k": "f16",
    "type_v": "f16",
    "n_gpu_layers": -1,
    "n_cpu_moe": 0,
    "split_mode": "layer",
    "main_gpu": 0,
    "no_kv_offload": false,
    "flash_attn": 1,
    "devices": "auto",
    "tensor_split": "0.00",
    "tensor_buft_overrides": "none",
    "load_mode": "auto",
    "lazy_mode": "auto",
    "embeddings": false,
    "no_op_offload": 0,
    "no_host": false,
    "repack": true,
    "fit_target": 0,
    "fit_min_ctx": 0,
    "n_prompt": 0,
    "n_gen": 32,
    "n_depth": 252,
    "test_time": "2026-11-26T02:55:39Z",
    "avg_ns": 893970134,
    "stddev_ns": 0,
    "avg_ts": 35.795379,
    "stddev_ts": 0.000000,
    "samples_ns": [ 893970134 ],
    "samples_ts": [ 35.7954 ]
  }
]
"""
SAMPLE_DEPTH, SAMPLE_GEN = 252, 32


# -- llama-bench's JSON --------------------------------------------------------------------


def test_parse_llama_bench_json_reads_its_generation_test():
    test = json.loads(LLAMA_BENCH_SAMPLE)[0]
    r = parse_llama_bench_json(LLAMA_BENCH_SAMPLE)
    assert r.mode == "native-bench"
    assert (r.prompt_tokens, r.generated_tokens) == (SAMPLE_DEPTH, SAMPLE_GEN)
    assert r.decode_tokens_per_s == pytest.approx(test["avg_ts"])
    assert r.decode_s == pytest.approx(test["avg_ns"] / 1e9)
    assert r.samples_tokens_per_s == tuple(test["samples_ts"])
    assert r.prefill_s is None and r.drafted == r.accepted == 0 and r.draft_max is None
    record = r.to_record()
    assert record["acceptance_rate"] is None and record["token_ids"] is None
    assert record["samples_tokens_per_s"] == test["samples_ts"]
    json.dumps(record)  # a JSONL line


def test_parse_llama_bench_json_skips_what_comes_before_and_after_the_array():
    noisy = "warning: something\n" + LLAMA_BENCH_SAMPLE + "\nbye\n"
    assert parse_llama_bench_json(noisy).generated_tokens == SAMPLE_GEN


@pytest.mark.parametrize(
    ("output", "needle"),
    [
        ("error: failed to load model", "did not print the JSON"),
        ('[{"n_gen": 32', "did not print the JSON"),
        ('{"n_gen": 32}', "did not print the JSON"),
        ("[]", "printed 0 generation tests"),
        ('[{"n_prompt": 512, "n_gen": 0, "avg_ts": 9.0, "avg_ns": 1}]', "printed 0 generation"),
        ('[{"n_gen": 8, "avg_ts": 1.0, "avg_ns": 1}, {"n_gen": 8, "avg_ts": 1.0, "avg_ns": 1}]',
         "printed 2 generation tests"),
        ('[{"n_gen": 8, "avg_ns": 1}]', "lacks n_gen, avg_ns or avg_ts"),
    ],
)  # fmt: skip
def test_parse_llama_bench_json_errors(output, needle):
    with pytest.raises(BackendError, match=needle):
        parse_llama_bench_json(output)


def test_n_gram_modes_do_not_report_draft_simples_draft_length():
    assert parse_native_output(NATIVE_SAMPLE, "native-draft").draft_max == 3
    for mode in ("native-ngram", "native-ngram-map-k", "native-ngram-mod", "native-none"):
        assert parse_native_output(NATIVE_SAMPLE, mode).draft_max is None


# -- command lines -------------------------------------------------------------------------


def runner_for(tmp_path: Path, **kw) -> NativeRunner:
    binary = tmp_path / "llama-speculative-simple"
    return NativeRunner(binary, tmp_path / "t.gguf", tmp_path / "d.gguf", str, **kw)


@pytest.mark.parametrize(
    ("mode", "spec_type"),
    [("native-ngram-map-k", "ngram-map-k"), ("native-ngram-mod", "ngram-mod")],
)
def test_ngram_map_k_and_ngram_mod_run_with_llama_cpps_defaults(tmp_path, mode, spec_type):
    runner = runner_for(tmp_path, threads=2, extra_args=["--spec-ngram-mod-n-min", "8"])
    cmd = runner.command(mode, "hi", 50, 0.0, 3)
    assert cmd[0] == str(tmp_path / "llama-speculative-simple")
    assert cmd[cmd.index("--spec-type") + 1] == spec_type
    assert cmd[cmd.index("-n") + 1] == "50" and cmd[cmd.index("--seed") + 1] == "3"
    assert "-md" not in cmd and NO_DRAFT_FLAGS[0] not in cmd
    # No settings of their own: llama.cpp's defaults, unless --native-flags says otherwise.
    spec_flags = [a for a in cmd if a.startswith("--spec-") and a != "--spec-type"]
    assert spec_flags == ["--spec-ngram-mod-n-min"] and cmd[-2:] == ["--spec-ngram-mod-n-min", "8"]


def test_llama_bench_command_is_plain_decoding_at_the_prompts_depth(tmp_path):
    runner = runner_for(tmp_path, threads=2, extra_args=["--spec-draft-n-max", "8"])
    assert runner.bench_binary == tmp_path / "llama-bench"
    # llama-speculative-simple's --native-flags are not llama-bench's: left out.
    assert runner.bench_command(123, 200) == [
        str(tmp_path / "llama-bench"),
        "-m", str(tmp_path / "t.gguf"),
        "-p", "0", "-n", "200", "-d", "123", "-t", "2", "-r", "1", "-fa", "on", "-o", "json",
    ]  # fmt: skip
    assert runner.describe("native-bench", 200, 0.0).endswith("-d DEPTH -t 2 -r 1 -fa on -o json")
    assert runner.describe("native-ngram-mod", 200, 0.0).startswith("-m ")
    assert "-p PROMPT" in runner.describe("native-ngram-mod", 200, 0.0)
    assert llama_bench_path(Path("/x/llama-speculative-simple.exe")) == Path("/x/llama-bench.exe")


# -- finding and checking the binaries -----------------------------------------------------


def fake_binary(path: Path, help_text: str, body: str = "") -> Path:
    help_line = f'if [ "$1" = "--help" ]; then echo "{help_text}"; exit 0; fi'
    path.write_text(f"#!/bin/sh\n{help_line}\n{body}")
    path.chmod(0o755)
    return path


def test_native_bench_needs_the_llama_bench_beside_the_native_bin(tmp_path):
    spec = fake_binary(tmp_path / "llama-speculative-simple", SPEC_SIMPLE_HELP)
    check_binary(
        spec, ("none", *bench_modes.NATIVE_SPEC_MODES, "native-none")
    )  # no llama-bench needed
    with pytest.raises(UsageError, match="llama-bench .beside --native-bin. not found") as err:
        check_binary(spec, ("none", "native-bench"))
    assert str(tmp_path / "llama-bench") in str(err.value)
    assert "build_native.sh" in err.value.hint and "native-bench out of --modes" in err.value.hint
    fake_binary(tmp_path / "llama-bench", "-n, --n-gen <n>")  # a llama-bench without -d
    with pytest.raises(UsageError, match="does not offer --n-depth"):
        check_binary(spec, ("none", "native-bench"))
    fake_binary(tmp_path / "llama-bench", "-d, --n-depth <n>")
    check_binary(spec, ("none", *bench_modes.NATIVE_MODES))
    # native-bench alone runs llama-bench only: llama-speculative-simple need not be there.
    check_binary(tmp_path / "absent" / "llama-speculative-simple", ("none",))
    (tmp_path / "only").mkdir()
    fake_binary(tmp_path / "only" / "llama-bench", "-d, --n-depth <n>")
    check_binary(tmp_path / "only" / "llama-speculative-simple", ("none", "native-bench"))


@pytest.mark.parametrize("mode", ["native-ngram-map-k", "native-ngram-mod"])
def test_an_older_binary_without_the_new_spec_types_is_refused(tmp_path, mode):
    old = fake_binary(tmp_path / "llama-speculative-simple", "--spec-type none,ngram-simple")
    with pytest.raises(UsageError, match=f"does not offer --spec-type .* .needed by {mode}"):
        check_binary(old, ("none", mode))


def cli_app() -> typer.Typer:
    app = typer.Typer(add_completion=False)
    app.command("bench")(bench_command)
    app.command("other")(lambda: None)
    return app


def test_a_missing_llama_bench_is_an_error_with_the_build_hint_not_a_traceback(tmp_path):
    spec = fake_binary(tmp_path / "llama-speculative-simple", SPEC_SIMPLE_HELP)
    argv = ["bench", "--native-bin", str(spec), "--modes", "none,native-bench",
            "--out", str(tmp_path / "o")]  # fmt: skip
    result = CliRunner().invoke(cli_app(), argv)
    assert result.exit_code == 2, result.output
    assert "error: llama-bench (beside --native-bin) not found" in result.output
    assert "build_native.sh" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert not (tmp_path / "o").exists()  # refused before any model was loaded


def test_native_bin_alone_adds_every_native_mode_and_names_them_valid(tmp_path):
    spec = fake_binary(tmp_path / "llama-speculative-simple", SPEC_SIMPLE_HELP)
    fake_binary(tmp_path / "llama-bench", "-d, --n-depth <n>")
    chosen, _ = bench_run._choose_modes(args(native_bin=spec))
    assert chosen == ("none", "auto", *bench_modes.NATIVE_MODES)
    assert set(bench_modes.NATIVE_MODES) == {
        "native-draft", "native-ngram", "native-ngram-map-k", "native-ngram-mod",
        "native-none", "native-bench",
    }  # fmt: skip
    chosen, _ = bench_run._choose_modes(args(native_bin=spec, modes="native-ngram-map-k"))
    assert chosen == ("none", "native-ngram-map-k")
    help_text = CliRunner().invoke(cli_app(), ["bench", "--help"], env={"COLUMNS": "200"}).output
    for mode in ("native-ngram-map-k", "native-ngram-mod", "native-bench"):
        assert mode in help_text


# -- the runner ----------------------------------------------------------------------------


def fake_llama_bench(path: Path, log: Path) -> Path:
    """A llama-bench that logs its arguments and answers with the captured sample, its n_gen
    and n_depth set to the -n and -d it was given (as the real one does)."""
    path.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        "argv = sys.argv[1:]\n"
        "if argv == ['--help']:\n"
        "    sys.exit(print('-d, --n-depth <n>'))\n"
        f"open({str(log)!r}, 'a').write(' '.join(argv) + '\\n')\n"
        f"test = json.loads({LLAMA_BENCH_SAMPLE!r})[0]\n"
        "test['n_gen'] = int(argv[argv.index('-n') + 1])\n"
        "test['n_depth'] = int(argv[argv.index('-d') + 1])\n"
        "print('a log line', file=sys.stderr)\n"
        "print(json.dumps([test], indent=2))\n"
    )
    path.chmod(0o755)
    return path


def test_native_bench_runs_llama_bench_after_as_many_tokens_as_the_prompt(tmp_path):
    log = tmp_path / "args.txt"
    fake_llama_bench(tmp_path / "llama-bench", log)
    runner = runner_for(tmp_path, threads=2)
    runner.check(("none", "native-bench"))
    session = FakeBenchSession()
    config = bench_runner.BenchConfig(modes=("none", "native-bench"), max_tokens=20)
    prompts = fake_prompts()[:2]
    records = bench_runner.BenchRunner(session, config, runner).run(prompts)
    native = [r.to_dict() for r in records if r.mode == "native-bench"]
    depths = [len(session.text_tokens(p.prompt, raw=False)) for p in prompts]
    assert [r["prompt_tokens"] for r in native] == depths
    assert all(r["engine"] == "llama.cpp" and r["same_prompt_tokens"] for r in native)
    assert all(r["generated_tokens"] == 20 and "overshoot" not in r for r in native)
    assert all(r["decode_tokens_per_s"] == pytest.approx(35.795379) for r in native)
    calls = log.read_text().splitlines()
    assert len(calls) == 1 + 2  # the warm-up, then one per prompt
    assert calls[0].split()[-12:-6] == ["-n", "16", "-d", str(depths[0]), "-t", "2"]
    assert [c.split()[c.split().index("-d") + 1] for c in calls[1:]] == list(map(str, depths))
    summary = bench_summary.summarize(records, config.modes, greedy=True)
    assert summary["overall"]["none"]["ratio_to_native_bench"] is None  # 20 tokens: too short
    assert summary["overall"]["native-bench"]["agreement"] is None


def test_a_failing_llama_bench_is_a_backend_error(tmp_path):
    (tmp_path / "llama-bench").write_text("#!/bin/sh\necho 'error: failed to load model' >&2\n"
                                          "exit 1\n")  # fmt: skip
    (tmp_path / "llama-bench").chmod(0o755)
    with pytest.raises(BackendError, match="llama-bench .native-bench. failed with exit code 1"):
        runner_for(tmp_path).run_bench(10, 8)


# -- the summary and the report ------------------------------------------------------------

MODES = ("none", "auto", *bench_modes.NATIVE_MODES)


def all_native_records() -> list[dict]:
    # prompt: none, auto, draft, ngram, ngram-map-k, ngram-mod, native-none, native-bench
    rows = {
        "1": (10.0, 30.0, 10.0, 15.0, 20.0, 12.0, 8.0, 11.0),  # ngram-map-k is the best
        "2": (20.0, 60.0, 40.0, 20.0, 30.0, 50.0, 18.0, 25.0),  # ngram-mod is the best
    }
    return [
        rec("code", pid, mode, tps, 100)
        for pid, speeds in rows.items()
        for mode, tps in zip(MODES, speeds, strict=True)
    ]


def test_best_native_is_the_fastest_of_all_four_speculative_native_modes():
    s = bench_summary.summarize(all_native_records(), MODES, greedy=False)
    overall = s["overall"]
    assert overall["auto"]["ratio_to_best_native"] == pytest.approx(
        (30 / 20 * 60 / 50) ** 0.5, abs=1e-4
    )
    assert overall["none"]["ratio_to_best_native"] == pytest.approx(
        (10 / 20 * 20 / 50) ** 0.5, abs=1e-4
    )
    # llama.cpp's plain decoding, in either binary, is never the "best native".
    none = overall["none"]
    assert none["ratio_to_native_none"] == pytest.approx((10 / 8 * 20 / 18) ** 0.5, abs=1e-4)
    assert none["ratio_to_native_bench"] == pytest.approx((10 / 11 * 20 / 25) ** 0.5, abs=1e-4)
    assert overall["native-none"]["ratio_to_native_bench"] == pytest.approx(
        (8 / 11 * 18 / 25) ** 0.5, abs=1e-4
    )
    # llama.cpp's speculative modes against its own plain decoding.
    assert overall["native-ngram-map-k"]["ratio_to_native_none"] == pytest.approx(
        (20 / 8 * 30 / 18) ** 0.5, abs=1e-4
    )
    assert overall["native-ngram-mod"]["ratio_to_native_none"] == pytest.approx(
        (12 / 8 * 50 / 18) ** 0.5, abs=1e-4
    )
    for mode in bench_modes.NATIVE_MODES:
        assert "ratio_to_best_native" not in overall[mode]
    assert "ratio_to_native_bench" not in overall["auto"]
    assert "ratio_to_native_none" not in overall["auto"]
    assert "ratio_to_native_none" not in overall["native-bench"]


def test_best_native_with_only_the_new_modes():
    keep = ("none", "auto", "native-ngram-map-k", "native-ngram-mod")
    records = [r for r in all_native_records() if r["mode"] in keep]
    auto = bench_summary.summarize(records, keep, greedy=False)["overall"]["auto"]
    assert auto["ratio_to_best_native"] == pytest.approx((30 / 20 * 60 / 50) ** 0.5, abs=1e-4)


def test_the_report_has_a_column_per_native_reference_and_a_row_per_new_mode():
    s = bench_summary.summarize(all_native_records(), MODES, greedy=False)
    table = bench_report.render_table(s)
    header = table.splitlines()[0]
    assert "| vs none | vs best native | vs native-none | vs llama-bench | acceptance |" in header
    rows = {line.split(" | ")[1]: line for line in table.splitlines() if line.startswith("| code")}
    assert set(rows) == set(MODES)
    # none: vs none, vs best native, vs native-none, vs llama-bench.
    assert "| 1.00x | 0.45x | 1.18x | 0.85x |" in rows["none"]
    assert "| 1.73x | - | 2.04x | - |" in rows["native-ngram-map-k"]
    assert "| 0.85x | - | - | 0.72x |" in rows["native-none"]
    assert "| 1.17x | - | - | - |" in rows["native-bench"]
    # Without native-bench, no llama-bench column.
    no_bench = [r for r in all_native_records() if r["mode"] != "native-bench"]
    table = bench_report.render_table(bench_summary.summarize(no_bench, MODES[:-1], greedy=False))
    assert "vs llama-bench" not in table and "vs native-none" in table
    text = bench_report.render_markdown(s)
    assert "native-ngram-map-k, native-ngram-mod" in text and "vs llama-bench:" in text
