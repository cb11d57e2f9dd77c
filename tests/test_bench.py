"""The bench's bookkeeping: prompt sets, run order, records, summary arithmetic, report files,
native output parsing, and the two commands over the tiny GGUF pair. No timing assertions."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from localspec.backend.native import NativeRunner, parse_native_output
from localspec.bench import ceiling as bench_ceiling
from localspec.bench import modes as bench_modes
from localspec.bench import prompts as bench_prompts
from localspec.bench import report as bench_report
from localspec.bench import run as bench_run
from localspec.bench import runner as bench_runner
from localspec.bench import summary as bench_summary
from localspec.bench.records import RunRecord
from localspec.cli.bench import bench_command
from localspec.cli.calibrate import calibrate_command, format_costs
from localspec.core.costs import CostProfile
from localspec.core.engine import SpecDecoder, run_to_completion
from localspec.core.params import DrafterMode, GenerationParams
from localspec.core.preflight import PairFacts
from localspec.errors import BackendError, UsageError
from tests.fakes import FakeModel

# -- prompt sets ---------------------------------------------------------------------------


def test_every_shipped_category_has_ten_sourced_prompts():
    prompts = bench_prompts.load_prompts()
    for category in bench_prompts.CATEGORIES:
        mine = [p for p in prompts if p.category == category]
        assert len(mine) >= 10, category
        assert len({p.id for p in mine}) == len(mine), f"duplicate ids in {category}"
        for p in mine:
            assert p.prompt.strip() and p.source.strip(), (category, p.id)


def test_load_prompts_limit_and_errors(tmp_path):
    assert len(bench_prompts.load_prompts(["math", "chat_qa"], limit=2)) == 4
    with pytest.raises(UsageError, match="unknown category: poetry"):
        bench_prompts.load_prompts(["poetry"])
    with pytest.raises(UsageError, match="--limit"):
        bench_prompts.load_prompts(["math"], limit=0)
    (tmp_path / "math.jsonl").write_text('{"id": "a", "prompt": "1+1"}\n')
    with pytest.raises(Exception, match="line 1"):
        bench_prompts.load_prompts(["math"], directory=tmp_path)


def test_parse_modes_always_runs_the_baseline_first():
    assert bench_modes.parse_modes("ngram,auto") == ("none", "ngram", "auto")
    assert bench_modes.parse_modes("auto, none") == ("none", "auto")
    with pytest.raises(UsageError, match="unknown fast"):
        bench_modes.parse_modes("none,fast")


def test_modes_know_what_runs_them_and_what_they_load():
    modes = bench_modes.parse_modes("auto-chains,native-draft,native-ngram,model,lookahead")
    assert all(isinstance(m, bench_modes.BenchMode) for m in modes)
    chains, native_draft, native_ngram, model, lookahead = modes[1:]
    assert chains.drafter == DrafterMode.AUTO and not chains.is_native
    assert native_draft.is_native and native_draft.loads_draft_model
    assert native_ngram.is_native and not native_ngram.loads_draft_model
    assert model.needs_draft_model and model.loads_draft_model
    assert lookahead.drafter == DrafterMode.LOOKAHEAD and not lookahead.loads_draft_model
    assert json.dumps(list(modes)) == json.dumps([str(m) for m in modes])  # plain names


def test_run_records_read_back_as_they_were_written():
    config = bench_runner.BenchConfig(modes=("none", "auto"), max_tokens=16, trace=True)
    records = bench_runner.BenchRunner(FakeBenchSession(), config).run(fake_prompts()[:1])
    for record in records:
        line = json.dumps(record.to_dict())
        assert RunRecord.from_dict(json.loads(line)) == record
        assert list(json.loads(line))[:8] == [
            "category", "prompt_id", "mode", "run", "repeat", "time", "engine", "finish_reason"
        ]  # fmt: skip
    plain = bench_runner.BenchConfig(modes=("none",), max_tokens=4)
    untraced = bench_runner.BenchRunner(FakeBenchSession(), plain).run(fake_prompts()[:1])
    assert "trace" not in untraced[0].to_dict()  # written only when kept
    # Hand-made and older records carry fewer fields: what they lack reads as None.
    short = RunRecord.from_dict(rec("a", "1", "none", 10.0, 100))
    assert short.plain_steps is None and short.key == ("a", "1")


def test_run_order_interleaves_modes_per_prompt_and_rotates_them():
    prompts = [bench_prompts.BenchPrompt("math", str(i), "p", "s") for i in range(4)]
    order = bench_runner.run_order(prompts, ("none", "ngram", "auto"))
    assert order == [
        (0, "none"), (0, "ngram"), (0, "auto"),
        (1, "ngram"), (1, "auto"), (1, "none"),
        (2, "auto"), (2, "none"), (2, "ngram"),
        (3, "none"), (3, "ngram"), (3, "auto"),
    ]  # fmt: skip


# -- runner over fake models ---------------------------------------------------------------


class TimedFake(FakeModel):
    """A fake that times its evaluations, like LlamaModel's ``compute_seconds``."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.compute_seconds = 0.0
        self.resets = 0

    def _logits(self, tokens, n_logits):
        t0 = time.perf_counter()
        rows = super()._logits(tokens, n_logits)
        self.compute_seconds += time.perf_counter() - t0
        return rows

    def reset(self):
        self.resets += 1
        super().reset()


class FakeBenchSession:
    def __init__(self):
        self.target = TimedFake(n_vocab=24, n_ctx=512, seed=3)
        self.draft = TimedFake(n_vocab=24, n_ctx=512, seed=3, noise=0.6)
        costs = CostProfile(plain_s=1.0, verify_s={1: 1.2, 4: 1.5, 15: 2.5}, draft_step_s=0.1)
        self.corpora = []
        self.decoder = SpecDecoder(self.target, self.draft, costs, corpora=lambda: self.corpora)
        self.costs = costs
        self.forgotten = 0  # forget_learning calls
        self.store_corpora = []
        self.grammars = []  # what each generate was constrained by
        self.tools_shown = []  # the tools each chat_tokens showed

    @property
    def has_draft(self):
        return self.draft is not None

    @property
    def facts(self):
        return PairFacts(self.target.n_ctx, self.has_draft, derived=False)

    @property
    def draft_path(self):
        return None

    def use_stores(self, on):
        self.corpora = self.store_corpora if on else []

    def forget_learning(self):
        self.forgotten += 1
        self.decoder.forget_learning()

    def text_tokens(self, text, *, raw):
        return [ord(c) % 24 for c in text]

    def plain_tokens(self, text):
        return [ord(c) % 24 for c in text]

    def generate(self, tokens, params, cancel=None, *, grammar=None):
        self.grammars.append(grammar)
        return self.decoder.generate(tokens, params, cancel)

    def chat_tokens(self, messages, *, tools=None):
        self.tools_shown.append(tools)
        return [ord(c) % 24 for m in messages for c in m["content"]]


def fake_prompts():
    return [
        bench_prompts.BenchPrompt("code_rewrite", "r1", "abcabcabcabd abcabc", "test"),
        bench_prompts.BenchPrompt("code_rewrite", "r2", "hello hello hello", "test"),
        bench_prompts.BenchPrompt("math", "m1", "one plus two is three", "test"),
    ]


def test_runner_records_every_prompt_in_every_mode_from_a_fresh_context():
    session = FakeBenchSession()
    # As many tokens as a ratio needs: shorter runs are left out of the ratios.
    config = bench_runner.BenchConfig(
        modes=bench_modes.ENGINE_MODES, max_tokens=bench_summary.MIN_RATIO_TOKENS
    )
    seen = []
    records = bench_runner.BenchRunner(session, config).run(
        fake_prompts(), lambda r, done, total: seen.append((done, total))
    )
    assert len(records) == 3 * 4 and seen[-1] == (12, 12)
    expected = bench_runner.run_order(fake_prompts(), bench_modes.ENGINE_MODES)
    ids = [p.id for p in fake_prompts()]
    assert [(ids.index(r.prompt_id), r.mode) for r in records] == expected
    # Warm-up (4 runs) plus 12 runs, each resetting both models first.
    assert session.target.resets == session.draft.resets == 16
    assert session.forgotten == 16  # cold by default: every run starts with nothing learned
    for r in (record.to_dict() for record in records):  # as records.jsonl holds them
        assert r["engine"] == "localspec" and "trace" not in r
        assert r["generated_tokens"] == len(r["token_ids"]) == bench_summary.MIN_RATIO_TOKENS
        assert r["drafted"] >= r["accepted"] >= 0
        assert 0.0 <= r["outside_share"] <= 1.0
        assert r["compute_s"] > 0
        json.dumps(r)  # a JSONL line
        # Every round of a plain run is a plain step, timed as the machine's speed then.
        assert r["plain_steps"] <= r["rounds"]
        assert (r["plain_step_s"] > 0) if r["plain_steps"] else r["plain_step_s"] is None
        if r["mode"] == "none":
            assert r["drafted"] == 0 and r["acceptance_rate"] is None
            assert r["plain_steps"] == r["rounds"]
    # Greedy output of the fakes does not depend on batching: every mode agrees with none.
    summary = bench_summary.summarize(records, bench_modes.ENGINE_MODES, greedy=True)
    for mode in bench_modes.ENGINE_MODES:
        assert summary["overall"][mode]["agreement"]["identical"] == 1.0
    assert summary["overall"]["none"]["ratio_to_none"] == pytest.approx(1.0)
    assert summary["overall"]["auto"]["short_runs"] == 0
    assert summary["overall"]["auto"]["mean_tokens"] == bench_summary.MIN_RATIO_TOKENS
    assert "ratio_to_best_native" not in summary["overall"]["auto"]  # no native mode ran


def test_runner_refuses_model_mode_without_a_draft_and_native_without_binary():
    session = FakeBenchSession()
    session.draft = None
    with pytest.raises(UsageError, match="draft"):
        bench_runner.BenchRunner(session, bench_runner.BenchConfig(modes=("none", "model")))
    with pytest.raises(UsageError, match="llama.cpp binary"):
        bench_runner.BenchRunner(session, bench_runner.BenchConfig(modes=("none", "native-ngram")))


def test_measure_ceiling_times_every_batch_and_restores_an_empty_cache():
    model = TimedFake(n_vocab=24, n_ctx=512)
    ceiling = bench_ceiling.measure_ceiling(model, list(range(20)))
    assert model.cached == []
    # 16, 32 and 64 tokens with logits for each, after the same 20-token context:
    # one warm-up and three timed batches each.
    batches = [(start, n, k) for start, n, k in model.calls if k > 1]
    for size in bench_ceiling.CEILING_BATCHES:
        assert batches.count((20, size, size)) == 4
    assert [b["batch"] for b in ceiling["by_batch"]] == list(bench_ceiling.CEILING_BATCHES)
    best = max(ceiling["by_batch"], key=lambda b: b["tokens_per_s"])
    assert ceiling["batch"] == best["batch"] and ceiling["tokens_per_s"] == best["tokens_per_s"]
    assert ceiling["ceiling_ratio"] == pytest.approx(
        ceiling["tokens_per_s"] / ceiling["plain_tokens_per_s"], rel=1e-2
    )


def test_measure_ceiling_caps_the_batches_at_the_context_left():
    model = TimedFake(n_vocab=24, n_ctx=60)
    ceiling = bench_ceiling.measure_ceiling(model, list(range(20)))
    assert [b["batch"] for b in ceiling["by_batch"]] == [16, 32, 40]  # 60 - 20 tokens left
    assert max(start + n for start, n, _ in model.calls) == 60
    assert bench_ceiling.ceiling_batches(4096, 256) == [16, 32, 64]


def test_a_ceiling_after_a_depth_reads_the_context_repeated_to_it():
    assert bench_ceiling.ceiling_context([1, 2, 3], 7, 512) == [1, 2, 3, 1, 2, 3, 1]
    assert len(bench_ceiling.ceiling_context([1, 2, 3], 5000, 512)) == 512 - 16  # room left
    assert bench_ceiling.ceiling_context(list(range(300)), None, 512) == list(range(256))
    model = TimedFake(n_vocab=24, n_ctx=512)
    ceiling = bench_ceiling.measure_ceiling(model, [1, 2, 3], depth=100)
    assert ceiling["depth"] == 100
    batches = [(start, n, k) for start, n, k in model.calls if k > 1]
    assert {(start, n) for start, n, _ in batches} == {(100, 16), (100, 32), (100, 64)}


def test_ceilings_are_measured_per_category_where_its_answers_run():
    session = FakeBenchSession()
    runner = bench_runner.BenchRunner(session, bench_runner.BenchConfig(max_tokens=40))
    prompts = fake_prompts()
    ceilings = runner.ceilings(prompts)
    assert list(ceilings) == ["code_rewrite", "math"]
    # The median of each prompt's tokens and half the answer it may write (40 tokens).
    rewrites = sorted(len(p.prompt) + 20 for p in prompts if p.category == "code_rewrite")
    assert ceilings["code_rewrite"]["depth"] == int(sum(rewrites) / 2)
    assert ceilings["math"]["depth"] == len(prompts[2].prompt) + 20
    assert session.target.cached == []


# -- summary arithmetic --------------------------------------------------------------------


def rec(cat, pid, mode, tps, tokens, *, drafted=0, accepted=0, rounds=None, compute=None, ids=()):
    decode_s = tokens / tps
    return {
        "category": cat,
        "prompt_id": pid,
        "mode": mode,
        "generated_tokens": tokens,
        "decode_s": decode_s,
        "decode_tokens_per_s": tps,
        "drafted": drafted,
        "accepted": accepted,
        "rounds": rounds if rounds is not None else tokens,
        "compute_s": compute,
        "token_ids": list(ids),
    }


def test_repeats_run_whole_interleaved_passes_and_the_summary_takes_median_runs():
    session = FakeBenchSession()
    config = bench_runner.BenchConfig(modes=("none", "ngram"), max_tokens=8, repeat=3)
    records = bench_runner.BenchRunner(session, config).run(fake_prompts())
    assert len(records) == 3 * 2 * 3
    assert [r.repeat for r in records] == [0] * 6 + [1] * 6 + [2] * 6
    # Each pass rotates the modes once more, so no mode always runs first on a prompt.
    r1 = [r.mode for r in records if r.prompt_id == "r1"]
    assert r1 == ["none", "ngram", "ngram", "none", "none", "ngram"]

    runs = [
        rec("a", "1", "none", 10.0, 100), rec("a", "1", "none", 30.0, 100),
        rec("a", "1", "none", 20.0, 100), rec("a", "1", "ngram", 40.0, 100),
        rec("a", "1", "ngram", 10.0, 100),
    ]  # fmt: skip
    medians = bench_summary.median_runs([RunRecord.from_dict(r) for r in runs])
    assert [(r.mode, r.decode_tokens_per_s) for r in medians] == [
        ("none", 20.0),
        ("ngram", 10.0),  # of an even count, the lower middle run
    ]
    summary = bench_summary.summarize(runs, ("none", "ngram"), greedy=False)
    assert summary["overall"]["ngram"]["ratio_to_none"] == pytest.approx(0.5)
    assert summary["overall"]["none"]["prompts"] == 1


def test_summary_ratios_are_paired_geometric_means_and_agreement_counts_prefixes():
    records = [
        rec("a", "1", "none", 10.0, 100, compute=9.0, ids=[1, 2, 3, 4]),
        rec("a", "1", "ngram", 20.0, 100, drafted=80, accepted=60, rounds=40, compute=4.5,
            ids=[1, 2, 3, 4]),
        rec("a", "2", "none", 20.0, 100, compute=4.0, ids=[5, 6, 7, 8]),
        rec("a", "2", "ngram", 10.0, 100, drafted=20, accepted=0, rounds=100, compute=4.0,
            ids=[5, 6, 9, 9]),
        rec("b", "1", "none", 10.0, 80, ids=[1]),
        rec("b", "1", "ngram", 40.0, 80, drafted=0, ids=[2]),
    ]  # fmt: skip
    s = bench_summary.summarize(records, ("none", "ngram"), greedy=True)
    a = s["categories"]["a"]["ngram"]
    assert a["ratio_to_none"] == pytest.approx(1.0)  # 2x and 0.5x
    assert a["decode_tokens_per_s"] == pytest.approx(
        200 / 15, abs=1e-3
    )  # pooled: 200 tokens, 5 + 10 s
    assert a["acceptance_rate"] == pytest.approx(60 / 100)
    assert a["mean_accepted_length"] == pytest.approx(1 + 60 / 140, abs=1e-4)
    assert a["outside_share"] == pytest.approx(1 - 8.5 / 15, abs=1e-4)
    assert a["agreement"] == {
        "identical": 0.5,
        "mean_common_prefix": 3.0,
        "mean_baseline_length": 4.0,
    }
    # Overall: geometric mean of 2, 0.5 and 4 over all prompts (b's prompt "1" is not a's).
    assert s["overall"]["ngram"]["ratio_to_none"] == pytest.approx(4 ** (1 / 3), rel=1e-3)
    assert s["overall"]["ngram"]["agreement"]["identical"] == pytest.approx(1 / 3, abs=1e-4)
    assert s["categories"]["b"]["ngram"]["acceptance_rate"] is None
    assert s["categories"]["b"]["none"]["outside_share"] is None
    assert (
        bench_summary.summarize(records, ("none", "ngram"), greedy=False)["overall"]["ngram"][
            "agreement"
        ]
        is None
    )
    assert bench_summary.geometric_mean([]) is None
    assert math.isclose(bench_summary.geometric_mean([2.0, 8.0]), 4.0)


def clocked(record, plain_steps, plain_step_s):
    return {**record, "plain_steps": plain_steps, "plain_step_s": plain_step_s}


def test_per_prompt_floor_as_measured_and_by_each_runs_own_plain_steps():
    records = [
        # p1: auto drafted nothing, but the machine ran 20% slower during its run.
        clocked(rec("chat", "p1", "none", 30.0, 120), 120, 0.030),
        clocked(rec("chat", "p1", "auto", 25.0, 120), 120, 0.036),
        # p2: same speed of the machine; auto lost 4% to drafts that parted.
        clocked(rec("chat", "p2", "none", 30.0, 120), 120, 0.030),
        clocked(rec("chat", "p2", "auto", 28.8, 120, drafted=30, accepted=2), 100, 0.030),
        # p3: auto drafted nearly every round, so its run has no clock of its own.
        clocked(rec("chat", "p3", "none", 30.0, 120), 120, 0.030),
        clocked(rec("chat", "p3", "auto", 60.0, 120, drafted=110, accepted=100), 5, 0.050),
    ]
    g = bench_summary.summarize(records, ("none", "auto"), greedy=True)["categories"]["chat"]
    auto = g["auto"]
    assert auto["lowest_ratio_to_none"] == {
        "category": "chat", "prompt_id": "p1", "ratio": pytest.approx(25 / 30, abs=1e-4)
    }  # fmt: skip
    assert auto["steady_prompts"] == 2
    assert auto["lowest_steady_ratio_to_none"]["prompt_id"] == "p2"
    assert auto["lowest_steady_ratio_to_none"]["ratio"] == pytest.approx(0.96)
    assert auto["steady_ratio_to_none"] == pytest.approx(math.sqrt(1.0 * 0.96), abs=1e-4)
    assert "lowest_ratio_to_none" not in g["none"]  # the baseline has no floor against itself
    table = bench_report.render_table(
        bench_summary.summarize(records, ("none", "auto"), greedy=True)
    )
    assert "| chat | auto | 0.83x (p1) | 0.98x (2 of 3) | 0.96x (p2) |" in table
    assert "0.83x (chat/p1)" in table  # the overall row names the category too
    # Without plain steps recorded (older records, native runs) there is no steady figure.
    bare = [rec("chat", "p1", "none", 30.0, 120), rec("chat", "p1", "auto", 25.0, 120)]
    auto = bench_summary.summarize(bare, ("none", "auto"), greedy=True)["overall"]["auto"]
    assert auto["steady_prompts"] == 0 and auto["steady_ratio_to_none"] is None


def test_the_share_of_the_ceiling_divides_each_prompts_ratio_by_its_categorys_ceiling():
    records = [
        rec("math", "1", "none", 10.0, 100),
        rec("math", "1", "auto", 15.0, 100),
        rec("code", "2", "none", 10.0, 100),
        rec("code", "2", "auto", 30.0, 100),
        rec("code", "2", "native-ngram", 20.0, 100),
    ]
    ceilings = {"math": {"ceiling_ratio": 3.0}, "code": {"ceiling_ratio": 4.0}}
    summary = bench_summary.summarize(records, ("none", "auto", "native-ngram"), True, ceilings)
    assert summary["categories"]["math"]["auto"]["of_ceiling"] == pytest.approx(0.5)
    assert summary["categories"]["code"]["auto"]["of_ceiling"] == pytest.approx(0.75)
    assert summary["overall"]["auto"]["of_ceiling"] == pytest.approx(
        math.sqrt(0.5 * 0.75), abs=1e-4
    )
    assert "of_ceiling" not in summary["categories"]["code"]["native-ngram"]
    summary["ceilings"] = {
        name: {**c, "depth": 900, "batch": 64, "batch_s": 0.5, "plain_tokens_per_s": 30.0}
        for name, c in ceilings.items()
    }
    table = bench_report.render_table(summary)
    assert "| of ceiling |" in table and "| math | auto | 1 | 100 | 15.0 | 1.50x | 0.50 |" in table
    assert "- code: 4.00x after 900 tokens of context (a batch of 64 in 500 ms" in table
    plain = bench_report.render_table(bench_summary.summarize(records, ("none", "auto"), True))
    assert "of ceiling" not in plain


def test_report_files_table_and_chart(tmp_path):
    records = [
        rec("math", "1", "none", 10.0, 100, ids=[1, 2]),
        rec("math", "1", "auto", 15.0, 100, drafted=50, accepted=40, rounds=60, ids=[1, 2]),
    ]
    summary = bench_summary.summarize(records, ("none", "auto"), greedy=True)
    summary["meta"] = {"target": "tiny", "threads": 2}
    summary["ceiling"] = {
        "batch": 16,
        "batch_s": 0.2,
        "tokens_per_s": 80.0,
        "plain_tokens_per_s": 28.0,
        "ceiling_ratio": 2.86,
    }
    table = bench_report.render_table(summary)
    assert "| math | auto | 1 | 100 | 15.0 | 1.50x | 80% |" in table
    assert "vs best native" not in table and "Note:" not in table
    assert bench_report.OVERALL in table and "80.0 tok/s" in table
    md, js = bench_report.write_summary(summary, tmp_path)
    assert "- threads: 2" in md.read_text()
    assert json.loads(js.read_text())["overall"]["auto"]["ratio_to_none"] == 1.5
    png = bench_report.write_chart(summary, tmp_path / "speedup.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# -- native binary -------------------------------------------------------------------------

# Captured from llama-speculative-simple (llama-cpp-python 0.3.36's llama.cpp), draft-simple.
NATIVE_SAMPLE = """\
0.01.632.273 I cmn          init: llama threadpool init, n_threads = 2
0.04.306.383 I common_speculative_init_result: loading draft model '/work/devmodels/draft.gguf'
0.41.918.762 I encoded   27 tokens in    2.575 seconds, speed:   10.486 t/s
0.41.918.763 I decoded   35 tokens in   28.773 seconds, speed:    1.216 t/s
0.41.918.763 I
0.41.918.764 I n_draft   = 3
0.41.918.765 I n_predict = 35
0.41.918.765 I n_drafted = 31
0.41.918.765 I n_accept  = 24
0.41.918.766 I accept    = 77.419%
0.41.918.766 I
0.41.918.766 I draft:
0.41.918.857 I common_perf_print:        load time =    3708.40 ms
"""


def test_parse_native_output():
    r = parse_native_output(NATIVE_SAMPLE, "native-draft")
    assert (r.prompt_tokens, r.generated_tokens, r.drafted, r.accepted) == (27, 35, 31, 24)
    assert r.decode_s == pytest.approx(28.773) and r.decode_tokens_per_s == pytest.approx(1.216)
    assert r.prefill_s == pytest.approx(2.575) and r.draft_max == 3
    record = r.to_record()
    assert record["acceptance_rate"] == pytest.approx(24 / 31, abs=1e-4)
    assert record["token_ids"] is None and record["mode"] == "native-draft"
    with pytest.raises(BackendError, match="timings"):
        parse_native_output("error: failed to load model")


def test_native_command_flags_per_mode(tmp_path):
    runner = NativeRunner(
        tmp_path / "bin", tmp_path / "t.gguf", tmp_path / "d.gguf", str, threads=2, n_ctx=1024
    )
    draft = runner.command("native-draft", "hi", 50, 0.0, None)
    assert draft[draft.index("--spec-type") + 1] == "draft-simple"
    assert draft[draft.index("-md") + 1] == str(tmp_path / "d.gguf")
    assert "--no-escape" in draft and draft[draft.index("--top-k") + 1] == "1"
    ngram = runner.command("native-ngram", "hi", 50, 0.7, 5)
    assert ngram[ngram.index("--spec-type") + 1] == "ngram-simple"
    assert "-md" not in ngram and ngram[ngram.index("--seed") + 1] == "5"
    with pytest.raises(UsageError, match="not found"):
        runner.check(["native-ngram"])


# -- commands over the tiny GGUF pair ------------------------------------------------------


def cli_app():
    app = typer.Typer(add_completion=False)
    app.command("bench")(bench_command)
    app.command("calibrate")(calibrate_command)
    return app


def test_bench_command_on_the_tiny_pair(tiny_pair, tmp_path):
    target, draft, _ = tiny_pair
    out = tmp_path / "results"
    args = ["bench", "--target", str(target), "--draft", str(draft), "--categories",
            "math,translation", "--limit", "1", "--max-tokens", "8", "--out", str(out),
            "--threads", "1", "--ctx", "1024"]  # fmt: skip
    result = CliRunner().invoke(cli_app(), args)
    assert result.exit_code == 0, result.output
    lines = (out / "records.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == 2 * 4
    assert {r["mode"] for r in records} == set(bench_modes.ENGINE_MODES)
    for r in records:
        assert r["generated_tokens"] >= 1 and 0.0 <= r["outside_share"] <= 1.0
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["categories"]) == {"math", "translation"}
    assert summary["ceiling"]["batch"] in bench_ceiling.CEILING_BATCHES
    assert "measuring the target's ceiling" in result.output
    assert summary["meta"]["cold"] is True
    assert (out / "speedup.png").exists() and (out / "summary.md").exists()
    assert bench_report.OVERALL in result.stdout
    # The same folder twice would mix two runs.
    again = CliRunner().invoke(cli_app(), args)
    assert again.exit_code == 2 and "already holds bench results" in again.output


def test_bench_without_the_ceiling_measures_none_and_reports_the_runs(tiny_pair, tmp_path):
    target, draft, _ = tiny_pair
    out = tmp_path / "results"
    args = ["bench", "--target", str(target), "--draft", str(draft), "--categories", "math",
            "--limit", "1", "--max-tokens", "6", "--modes", "none,ngram", "--out", str(out),
            "--threads", "1", "--ctx", "512", "--no-chart", "--no-ceiling"]  # fmt: skip
    result = CliRunner().invoke(cli_app(), args)
    assert result.exit_code == 0, result.output
    assert "measuring the target's ceiling" not in result.output
    summary = json.loads((out / "summary.json").read_text())
    assert not summary["ceiling"] and not summary["ceilings"]
    assert "of_ceiling" not in summary["categories"]["math"]["ngram"]
    assert len((out / "records.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--categories", "poetry"], "unknown category: poetry"),
        (["--modes", "none,native-ngram"], "--native-bin"),
        (["--native-bin", "/nonexistent/llama-speculative-simple"], "binary not found"),
    ],
)
def test_bench_command_errors_are_messages(tiny_pair, tmp_path, extra, needle):
    target, draft, _ = tiny_pair
    args = ["bench", "--target", str(target), "--draft", str(draft), "--out",
            str(tmp_path / "o"), "--limit", "1", *extra]  # fmt: skip
    result = CliRunner().invoke(cli_app(), args)
    assert result.exit_code != 0
    assert "error: " in result.output and needle in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_calibrate_command_prints_costs(tiny_pair):
    target, draft, _ = tiny_pair
    args = ["calibrate", "--target", str(target), "--draft", str(draft), "--ctx", "256",
            "--threads", "1"]  # fmt: skip
    result = CliRunner().invoke(cli_app(), args)
    assert result.exit_code == 0, result.output
    for needle in ("plain target step", "k=15", "k=63", "draft step", "ceiling (best batch"):
        assert needle in result.stdout
    costs = CostProfile(plain_s=0.036, verify_s={1: 0.082, 15: 0.212}, draft_step_s=0.02)
    text = format_costs(costs, Path("/cache/calibration"))
    assert "75.5 tok/s" in text and "/cache/calibration" in text


# The modes llama-speculative-simple runs (native-bench runs llama-bench).
SPEC_SIMPLE_MODES = tuple(m for m in bench_modes.NATIVE_MODES if m != bench_modes.NATIVE_BENCH)
SPEC_SIMPLE_HELP = (
    "--spec-type none,draft-simple,ngram-simple,ngram-map-k,ngram-map-k4v,ngram-mod "
    "--spec-ngram-simple-size-n N"
)


def test_native_modes_run_a_binary_and_are_summarised_beside_the_engine(tmp_path):
    binary = tmp_path / "llama-speculative-simple"
    sample = tmp_path / "sample.txt"
    sample.write_text(NATIVE_SAMPLE)
    args_log = tmp_path / "args.txt"
    binary.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = "--help" ]; then\n'
        f'  echo "{SPEC_SIMPLE_HELP}"\n'
        "  exit 0\n"
        "fi\n"
        f'echo "$@" >> {args_log}\n'
        f"cat {sample} >&2\n"
    )
    binary.chmod(0o755)
    session = FakeBenchSession()
    runner = NativeRunner(binary, tmp_path / "t.gguf", tmp_path / "d.gguf", lambda t: "abc")
    runner.check(SPEC_SIMPLE_MODES)
    config = bench_runner.BenchConfig(modes=("none", *SPEC_SIMPLE_MODES), max_tokens=20)
    records = bench_runner.BenchRunner(session, config, runner).run(fake_prompts()[:2])
    native = [r.to_dict() for r in records if r.engine == "llama.cpp"]
    assert len(native) == 2 * 5 and {r["mode"] for r in native} == set(SPEC_SIMPLE_MODES)
    assert all(r["decode_tokens_per_s"] == pytest.approx(1.216) for r in native)
    # The sample decoded 35 tokens where 20 were asked.
    assert all(r["overshoot"] == 15 for r in native)
    assert len(args_log.read_text().splitlines()) == 5 + 10  # warm-up, then one per run
    summary = bench_summary.summarize(records, config.modes, greedy=True)
    assert summary["overall"]["native-ngram"]["agreement"] is None
    assert summary["overall"]["native-draft"]["acceptance_rate"] == pytest.approx(24 / 31, abs=1e-4)
    broken = tmp_path / "broken"
    broken.write_text("#!/bin/sh\necho 'error: failed to load model' >&2\nexit 1\n")
    broken.chmod(0o755)
    failing = NativeRunner(broken, tmp_path / "t.gguf", None, str)
    with pytest.raises(BackendError, match="exit code 1: error: failed to load model"):
        failing.run("native-ngram", "abc", 8, 0.0, None)
    with pytest.raises(UsageError, match="does not offer --spec-type ngram-simple"):
        failing.check(["native-ngram"])


def test_chart_without_matplotlib_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(UsageError, match="needs matplotlib"):
        bench_report.require_matplotlib()


def test_ctrl_c_keeps_the_runs_already_recorded(tmp_path):
    class Interrupted:
        def run(self, prompts, on_record):
            on_record(RunRecord.from_dict(rec("math", "1", "none", 10.0, 5, ids=[1])), 1, 4)
            raise KeyboardInterrupt

    records, code = bench_run._run(Interrupted(), [], tmp_path, 4, 1)
    assert code == 130 and len(records) == 1
    assert len((tmp_path / "records.jsonl").read_text().splitlines()) == 1


def test_auto_store_drafts_from_the_sessions_stores_and_auto_beside_it_does_not():
    from localspec.core.engine import run_to_completion
    from localspec.storage.datastore import TokenIndex

    session = FakeBenchSession()
    prompt = fake_prompts()[2]
    tokens = session.text_tokens(prompt.prompt, raw=False)
    # The store holds the target's own answer to this prompt, as a history store would.
    answer = run_to_completion(
        session.generate(tokens, GenerationParams(max_tokens=80, drafter="none"))
    )
    session.store_corpora = [("history", TokenIndex.build([tokens + list(answer.token_ids)]))]
    config = bench_runner.BenchConfig(modes=("none", "auto", bench_modes.STORE_MODE), max_tokens=80)
    records = bench_runner.BenchRunner(session, config).run([prompt])
    by_mode = {r.mode: r.to_dict() for r in records}
    assert by_mode[bench_modes.STORE_MODE]["tokens_by_origin"]["store"] > 40
    assert "store" not in by_mode["auto"]["tokens_by_origin"]  # lists only the origins seen
    assert by_mode[bench_modes.STORE_MODE]["token_ids"] == by_mode["none"]["token_ids"]
    summary = bench_summary.summarize(records, config.modes, greedy=True)
    assert bench_modes.STORE_MODE in summary["overall"]


def test_auto_store_without_a_store_is_refused():
    with pytest.raises(UsageError, match="datastore"):
        bench_runner.BenchRunner(
            FakeBenchSession(), bench_runner.BenchConfig(modes=("none", bench_modes.STORE_MODE))
        )


def test_auto_chains_is_auto_without_draft_trees_beside_it():
    assert bench_modes.parse_modes("auto,auto-chains") == ("none", "auto", bench_modes.CHAINS_MODE)
    runner = bench_runner.BenchRunner(FakeBenchSession(), bench_runner.BenchConfig())
    chains, auto = runner._params(bench_modes.CHAINS_MODE, 10, 0), runner._params("auto", 10, 0)
    assert chains.drafter == auto.drafter == DrafterMode.AUTO
    assert auto.trees and not chains.trees
    config = bench_runner.BenchConfig(
        modes=("none", "auto", bench_modes.CHAINS_MODE), max_tokens=80, trace=True
    )
    records = bench_runner.BenchRunner(FakeBenchSession(), config).run(fake_prompts()[:1])
    by_mode = {r.mode: r.to_dict() for r in records}
    assert all(entry["branches"] == 1 for entry in by_mode[bench_modes.CHAINS_MODE]["trace"])
    assert by_mode[bench_modes.CHAINS_MODE]["token_ids"] == by_mode["none"]["token_ids"]
    assert (
        bench_modes.CHAINS_MODE
        in bench_summary.summarize(records, config.modes, greedy=True)["overall"]
    )


def test_the_apply_set_is_whole_files_of_this_pythons_standard_library():
    prompts = bench_prompts.load_prompts(["apply"])
    assert len(prompts) >= 4
    for prompt in prompts:
        assert prompt.answer_like_prediction and prompt.prediction
        assert 80 <= prompt.prediction.count("\n") <= 300
        assert prompt.prediction.rstrip() in prompt.prompt  # the file, whole, in the prompt
    assert "apply" not in [p.category for p in bench_prompts.load_prompts()]  # asked for by name


def test_auto_prediction_drafts_from_each_prompts_prediction_or_first_code_block():
    session = FakeBenchSession()
    prompt = session.text_tokens("xyz", raw=False)  # the answer to it is the prediction
    answer = run_to_completion(
        session.decoder.generate(prompt, GenerationParams(max_tokens=40, drafter="none"))
    ).token_ids
    text = "".join(chr(24 * 5 + t) for t in answer)  # plain_tokens maps it back to answer
    quoting = f"rewrite this:\n```\n{text}\n```\n"
    prompts = [
        bench_prompts.BenchPrompt("apply", "given", "xyz", "test", prediction=text,
                          answer_like_prediction=True),
        bench_prompts.BenchPrompt("code_rewrite", "quoted", quoting, "test"),
    ]  # fmt: skip
    assert prompts[1].predicted() == text + "\n"
    config = bench_runner.BenchConfig(modes=("none", "auto-prediction"), max_tokens=8, warmup=False)
    records = bench_runner.BenchRunner(session, config).run(prompts)
    by = {(r.prompt_id, r.mode): r.to_dict() for r in records}
    # An answer like its prediction may run as long as the prediction, whatever max_tokens.
    assert by[("given", "none")]["generated_tokens"] > 8
    assert by[("quoted", "none")]["generated_tokens"] == 8
    assert "prediction" not in by[("given", "none")]["by_drafter"]
    assert by[("given", "auto-prediction")]["tokens_by_origin"]["prediction"] > 0
