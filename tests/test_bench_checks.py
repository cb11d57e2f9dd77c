"""The bench's checks beyond its shipped sets: ``auto-without-DRAFTER``, the check sets run
when named, where each drafter pays (break-even), a slower link to the RPC workers
(``--rpc-delay``), a question asked again in fresh processes (``auto-again``) and
``localspec bench replay DIR``."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from localspec.bench import fresh as bench_fresh
from localspec.bench import modes as bench_modes
from localspec.bench import prompts as bench_prompts
from localspec.bench import replay as bench_replay
from localspec.bench import report as bench_report
from localspec.bench import run as bench_run
from localspec.bench import runner as bench_runner
from localspec.bench import summary as bench_summary
from localspec.bench.break_even import ALL, break_even
from localspec.bench.relay import DelayRelay, relayed
from localspec.cli.app import build_app
from localspec.core.costs import CostProfile
from localspec.core.drafting.registry import drafter_names
from localspec.core.params import DrafterMode
from localspec.errors import InputError, UsageError
from localspec.session.pair import ModelOptions
from localspec.storage.library import HISTORY, HISTORY_ENV
from tests.test_bench import FakeBenchSession, fake_prompts, rec
from tests.test_bench_options import args

COSTS = CostProfile(plain_s=1.0, verify_s={1: 1.2, 4: 1.5, 15: 2.5}, draft_step_s=0.1)

# -- auto-without-DRAFTER ------------------------------------------------------------------


def test_auto_without_a_drafter_is_a_mode_for_every_drafter_of_the_registry():
    for name in drafter_names():
        mode = bench_modes.BenchMode(f"auto-without-{name}")
        assert mode.left_out == name and mode.drafter == DrafterMode.AUTO
    assert bench_modes.parse_modes("auto,auto-without-ngram") == (
        "none", "auto", "auto-without-ngram",
    )  # fmt: skip
    # Without the draft model's drafter, the draft model is not loaded for it.
    assert bench_modes.BenchMode("auto").loads_draft_model
    assert not bench_modes.BenchMode("auto-without-model").loads_draft_model
    assert not bench_modes.BenchMode("auto-without-model").needs_draft_model
    with pytest.raises(ValueError, match="no bench mode"):
        bench_modes.BenchMode("auto-without-poetry")
    with pytest.raises(UsageError, match="auto-without-poetry") as err:
        bench_modes.parse_modes("auto,auto-without-poetry")
    assert "auto-without-DRAFTER" in err.value.hint and "lookahead" in err.value.hint
    with pytest.raises(ValidationError):  # a config of the bench checks its modes
        bench_runner.BenchConfig(modes=("none", "auto-without-poetry"))


def test_auto_without_ngram_runs_beside_auto_and_never_drafts_with_it():
    config = bench_runner.BenchConfig(
        modes=("none", "auto", "auto-without-ngram"), max_tokens=60, trace=True
    )
    records = bench_runner.BenchRunner(FakeBenchSession(), config).run(fake_prompts()[:2])
    by_mode: dict[str, list] = {}
    for r in records:
        by_mode.setdefault(r.mode, []).append(r)
    assert any("ngram" in (r.by_drafter or {}) for r in by_mode["auto"])
    for r in by_mode["auto-without-ngram"]:
        assert "ngram" not in (r.by_drafter or {})
        assert all(entry.get("drafter") != "ngram" for entry in r.trace)
    # Greedy: the same answers, whichever drafters drafted them.
    for none, without in zip(by_mode["none"], by_mode["auto-without-ngram"], strict=True):
        assert without.token_ids == none.token_ids
    summary = bench_summary.summarize(records, config.modes, greedy=True)
    assert "auto-without-ngram" in summary["overall"]


def test_fresh_processes_refuse_auto_without_and_auto_again_needs_them():
    with pytest.raises(UsageError, match="auto-without-ngram"):
        bench_fresh.check_modes(("none", bench_modes.BenchMode("auto-without-ngram")), fresh=True)
    with pytest.raises(UsageError, match="auto-again") as err:
        bench_fresh.check_modes(("none", bench_modes.AGAIN_MODE), fresh=False)
    assert "--fresh" in err.value.hint
    bench_fresh.check_modes(("none", bench_modes.AGAIN_MODE), fresh=True)


# -- the check sets ------------------------------------------------------------------------


def test_check_sets_run_only_when_named_and_count_their_limit_per_category():
    default = bench_prompts.load_prompts()
    assert not {p.source for p in default} & {
        p.source for p in bench_prompts.load_prompts(["check4"])
    }
    check4 = bench_prompts.load_prompts(["check4"])
    assert len(check4) == 24
    categories = {p.category for p in check4}
    assert {"code_completion", "code_rewrite"} <= categories
    limited = bench_prompts.load_prompts(["check4"], limit=1)
    assert len(limited) == len(categories)
    assert sorted(p.category for p in limited) == sorted(categories)
    followups = bench_prompts.load_prompts(["history_followup"])
    assert followups and all(p.first and p.first != p.prompt for p in followups)
    unrelated = bench_prompts.load_prompts(["check3_unrelated"])
    assert all(p.prediction for p in unrelated)


def test_two_check_sets_that_hold_the_same_prompt_are_refused_together():
    with pytest.raises(UsageError, match="hold the prompt"):
        bench_prompts.load_prompts(["check3", "check3_unrelated"])


def test_a_prompt_files_first_question_must_be_text(tmp_path):
    path = tmp_path / "mine.jsonl"
    path.write_text(json.dumps({"prompt": "again?", "first": 3}) + "\n")
    with pytest.raises(InputError, match='"first" must be a string'):
        bench_prompts.load_prompt_file(path)


# -- break-even ----------------------------------------------------------------------------


def drafted(record, by_drafter):
    return {**record, "by_drafter": by_drafter}


def test_break_even_prices_each_drafters_rounds_against_plain_steps():
    records = [
        drafted(rec("code", "1", "auto", 10.0, 100), {
            "ngram": {"rounds": 10, "drafted": 40, "accepted": 30},
            "model": {"rounds": 5, "drafted": 20, "accepted": 10},
            "none": {"rounds": 40, "drafted": 0, "accepted": 0},
        }),
        drafted(rec("math", "1", "auto", 10.0, 100), {
            "ngram": {"rounds": 10, "drafted": 40, "accepted": 10},
        }),
    ]  # fmt: skip
    rows = break_even(records, COSTS)
    keyed = {(r["category"], r["drafter"]): r for r in rows}
    assert set(keyed) == {("code", "ngram"), ("math", "ngram"), (ALL, "ngram"), ("code", "model")}
    code = keyed[("code", "ngram")]
    # k = 4 drafts a round, T = 1 + 3 tokens a pass; copies draft for free.
    assert code["mean_draft"] == 4.0 and code["tokens_per_pass"] == 4.0
    assert code["draft_step"] == 0.0 and code["pays_below"] == 4.0
    assert code["verify_here"] == pytest.approx(COSTS.verify(4) / COSTS.plain_s, abs=1e-3)
    pooled = keyed[(ALL, "ngram")]
    assert pooled["rounds"] == 20 and pooled["tokens_per_pass"] == 3.0
    model = keyed[("code", "model")]
    # The draft model pays a step (0.1 of a plain step) per drafted token: 3 - 4 * 0.1.
    assert model["draft_step"] == pytest.approx(0.1) and model["pays_below"] == pytest.approx(2.6)
    # One category: no pooled row repeats it; without costs, no price of this machine.
    assert not any(r["category"] == ALL and r["drafter"] == "model" for r in rows)
    assert all(r["verify_here"] is None for r in break_even(records, None))


def test_the_report_shows_where_each_drafter_pays():
    records = [
        rec("code", "1", "none", 10.0, 100),
        drafted(rec("code", "1", "auto", 12.0, 100), {
            "ngram": {"rounds": 10, "drafted": 40, "accepted": 30},
        }),
    ]  # fmt: skip
    summary = bench_summary.summarize(records, ("none", "auto"), greedy=False)
    assert "pays below" not in bench_report.render_table(summary)
    summary["break_even"] = break_even(records, COSTS)
    table = bench_report.render_table(summary)
    assert "pays below" in table
    assert "| auto | code | ngram | 10 | 4.0 | 4.00 | 0.00 | 4.00 |" in table


# -- a slower link to the RPC workers ------------------------------------------------------


def echo_server() -> tuple[socket.socket, str]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(1 << 16):
                    conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    return server, f"127.0.0.1:{server.getsockname()[1]}"


def round_trip(address: str, payload: bytes) -> tuple[bytes, float]:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as conn:
        t0 = time.perf_counter()
        conn.sendall(payload)
        got = b""
        while len(got) < len(payload):
            got += conn.recv(1 << 16)
        return got, time.perf_counter() - t0


def test_the_relay_adds_its_delay_to_every_round_trip_and_keeps_the_bytes():
    server, address = echo_server()
    relay = DelayRelay(address, 200.0)
    try:
        payload = bytes(range(256)) * 64
        for _ in range(2):
            got, seconds = round_trip(relay.address, payload)
            assert got == payload and seconds >= 0.2
    finally:
        relay.close()
        server.close()
    with pytest.raises(OSError):
        round_trip(relay.address, b"x")


def test_relays_stand_for_each_worker_in_order_and_a_bad_delay_is_refused(tmp_path):
    server, address = echo_server()
    relays = relayed([address, address], 0.0)
    try:
        assert len({r.address for r in relays}) == 2
        assert round_trip(relays[1].address, b"ping")[0] == b"ping"
    finally:
        for r in relays:
            r.close()
        server.close()
    with pytest.raises(UsageError, match="--rpc-delay"):
        bench_run._choose_modes(args(rpc_delay=5.0))  # no --rpc
    with pytest.raises(UsageError, match="--rpc-delay"):
        bench_run._choose_modes(args(rpc_delay=-1.0, rpc=address))


def test_fresh_processes_reach_the_workers_the_bench_reaches(tmp_path):
    pair = ModelOptions(rpc=("127.0.0.1:5000",), rpc_split=(1.0, 2.0))
    flags = bench_fresh.pair_flags(pair, tmp_path / "t.gguf", None)
    assert flags[flags.index("--rpc") + 1] == "127.0.0.1:5000"
    assert "--rpc-timeout" in flags and flags[flags.index("--rpc-split") + 1] == "1.0,2.0"


# -- auto-again: a question asked again in fresh processes ---------------------------------


class FakeComplete:
    """``subprocess.run`` of ``localspec complete``: answers with the history on when asked,
    saving each answer in the private home's history, as the real one does."""

    def __init__(self, home):
        self.history = home / "datastores" / HISTORY
        self.calls: list[dict] = []

    def __call__(self, cmd, *, input, env, **kwargs):
        had = self.history.exists()
        self.calls.append({"cmd": cmd, "prompt": input, "history": env[HISTORY_ENV], "had": had})
        if env[HISTORY_ENV] == "1":
            self.history.mkdir(parents=True, exist_ok=True)
            (self.history / "answers").write_text(input)
        answer = {
            "finish_reason": "length",
            "token_ids": [len(input) % 7, 1, 2],
            "timing": {"load_s": 0.1},
            "stats": {"generated_tokens": 3, "decode_s": 0.3, "overhead_s": 0.06,
                      "drafted": 2, "accepted": 2, "by_drafter": {}},
        }  # fmt: skip
        return subprocess.CompletedProcess(cmd, 0, stdout=json.dumps(answer) + "\n", stderr="")


def test_auto_again_asks_the_first_question_then_the_prompt_with_the_history_on(
    tmp_path, monkeypatch
):
    runner = bench_fresh.FreshRunner(ModelOptions(), tmp_path / "t.gguf", None)
    fake = FakeComplete(runner.home)
    monkeypatch.setattr(bench_fresh.subprocess, "run", fake)
    try:
        record = runner.run("again?", bench_modes.AGAIN_MODE, 8, 0.0, None, first="before?")
        assert [c["prompt"] for c in fake.calls] == ["before?", "again?"]
        assert [c["had"] for c in fake.calls] == [False, True]  # emptied before the first
        assert all(c["history"] == "1" and "--no-history" not in c["cmd"] for c in fake.calls)
        assert not fake.history.exists()  # and after: no other run drafts from it
        assert "same_as_first" not in record  # another question: no answer to compare with
        assert record["outside_share"] == pytest.approx(0.2)
        same = runner.run("again?", bench_modes.AGAIN_MODE, 8, 0.0, None)
        assert same["same_as_first"] is True
        fake.calls.clear()
        runner.run("plain", bench_modes.BenchMode("auto"), 8, 0.0, None)
        assert fake.calls[0]["history"] == "0" and "--no-history" in fake.calls[0]["cmd"]
    finally:
        runner.close()


def test_the_summary_counts_second_answers_that_were_the_first():
    records = [
        rec("q", "1", "none", 10.0, 100),
        {**rec("q", "1", "auto-again", 20.0, 100), "same_as_first": True},
        rec("q", "2", "none", 10.0, 100),
        {**rec("q", "2", "auto-again", 20.0, 100), "same_as_first": False},
    ]
    summary = bench_summary.summarize(records, ("none", "auto-again"), greedy=False)
    assert summary["overall"]["auto-again"]["same_as_first"] == 0.5


# -- bench replay DIR ----------------------------------------------------------------------


def test_a_replay_reads_the_none_answers_and_refuses_what_it_cannot_replay(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps({"meta": {"temperature": 0.0}}))
    lines = [
        {"category": "math", "prompt_id": "1", "mode": "none", "repeat": 0, "token_ids": [1]},
        {"category": "math", "prompt_id": "1", "mode": "none", "repeat": 1, "token_ids": [2]},
        {"category": "math", "prompt_id": "1", "mode": "auto", "token_ids": [1]},
    ]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    run = bench_replay.read_run(tmp_path)
    assert [a["token_ids"] for a in run.answers] == [[1]]
    with pytest.raises(UsageError, match="records no costs"):
        bench_replay.profiles(run, None, None)
    assert bench_replay.profiles(run, None, COSTS) == {"this machine": COSTS}
    costs = tmp_path / "gpu.json"
    costs.write_text(json.dumps(COSTS.to_dict()))
    assert list(bench_replay.profiles(run, costs, None)) == ["gpu"]
    (tmp_path / "summary.json").write_text(json.dumps({"meta": {"temperature": 0.7}}))
    with pytest.raises(UsageError, match="sampled"):
        bench_replay.read_run(tmp_path)
    with pytest.raises(InputError, match="records.jsonl"):
        bench_replay.read_run(tmp_path / "missing")


def test_replayed_answers_give_auto_beside_ngram_simple_per_category():
    text = [5, 6, 7, 8, 9, 10, 11, 12] * 6
    answers = [
        bench_replay.Answer("code", "1", [1, 2, 3, *text], text[:40]),
        bench_replay.Answer("math", "1", [1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11]),
    ]
    result = bench_replay.replay_run(answers, {"here": COSTS}, 64, lambda t: False)
    code = result["here"]["categories"]["code"]
    assert code["answers"] == 1 and code["auto"] > 1.0 and "ngram" in code["auto_drafted"]
    assert "model" not in code  # no draft model's choices: no model column
    assert result["here"]["overall"]["answers"] == 2
    table = bench_replay.render(result)
    assert "| here | code | 1 |" in table and "all (geo-mean)" in table


def test_bench_replay_replays_a_bench_run_of_the_tiny_pair(tiny_pair, tmp_path):
    target, draft, _ = tiny_pair
    out = tmp_path / "results"
    pair = ["--target", str(target), "--draft", str(draft), "--threads", "1", "--ctx", "512"]
    bench = ["bench", *pair, "--categories", "math", "--limit", "1", "--max-tokens", "12",
             "--modes", "none", "--out", str(out), "--no-chart", "--no-warmup"]  # fmt: skip
    result = CliRunner().invoke(build_app("bench"), bench)
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    assert "break_even" in summary
    replayed = CliRunner().invoke(build_app("bench"), ["bench", "replay", str(out), *pair])
    assert replayed.exit_code == 0, replayed.output
    assert "| this run | math | 1 |" in replayed.stdout
    as_json = CliRunner().invoke(build_app("bench"), ["bench", "replay", str(out), *pair, "--json"])
    rows = json.loads(as_json.stdout)["this run"]["answers"]
    assert rows[0]["category"] == "math" and rows[0]["tokens"] >= 1 and "model" in rows[0]


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def _line(**changes) -> dict:
    return {"category": "math", "prompt_id": "apples", "mode": "none", "repeat": 0,
            "token_ids": [1, 2, 3], **changes}  # fmt: skip


# What a damaged or crafted run folder holds: (summary.json's text, records.jsonl's lines,
# --costs file's text or None, what the message says).
DAMAGED = {
    "a record that is a number": ('{"meta": {}}', ["5"], None, "line 1: not a JSON object"),
    "a record that is a list": ('{"meta": {}}', ["[1]"], None, "line 1: not a JSON object"),
    "a missing category": (
        '{"meta": {}}',
        [json.dumps({k: v for k, v in _line().items() if k != "category"})],
        None,
        "its category is missing",
    ),  # fmt: skip
    "a prompt id that is a number": (
        '{"meta": {}}',
        [json.dumps(_line(prompt_id=3))],
        None,
        "its prompt_id",
    ),  # fmt: skip
    "token ids that are text": (
        '{"meta": {}}',
        [json.dumps(_line(token_ids=["a"]))],
        None,
        "not a list of token ids",
    ),  # fmt: skip
    "token ids that are negative": (
        '{"meta": {}}',
        [json.dumps(_line(token_ids=[-1]))],
        None,
        "not a list of token ids",
    ),  # fmt: skip
    "token ids past the vocabulary": (
        '{"meta": {}}',
        [json.dumps(_line(token_ids=[10**9]))],
        None,
        "past",
    ),  # fmt: skip
    "a record nested 100k deep": ('{"meta": {}}', [_deep(100_000)], None, "nested too deep"),
    "meta a list": ('{"meta": []}', [json.dumps(_line())], None, "meta is not a JSON object"),
    "a summary that is a list": ("[1]", [json.dumps(_line())], None, "meta is not a JSON"),
    "costs nested 100k deep": (
        '{"meta": {"costs": ' + _deep(100_000) + "}}",
        [json.dumps(_line())],
        None,
        "nested too deep",
    ),  # fmt: skip
    "costs that are no profile": (
        '{"meta": {"costs": {"plain_s": -1}}}',
        [json.dumps(_line())],
        None,
        "not a cost profile",
    ),  # fmt: skip
    "max_tokens that is text": (
        '{"meta": {"max_tokens": "many"}}',
        [json.dumps(_line())],
        None,
        "max_tokens",
    ),  # fmt: skip
    "a prompt file that is a number": (
        '{"meta": {"prompt_file": 5}}',
        [json.dumps(_line())],
        None,
        "prompt_file",
    ),  # fmt: skip
    "a temperature that is text": (
        '{"meta": {"temperature": "hot"}}',
        [json.dumps(_line())],
        None,
        "temperature",
    ),  # fmt: skip
    "a --costs file that is a list": (
        '{"meta": {}}',
        [json.dumps(_line())],
        "[1, 2]",
        "holds no cost profile",
    ),  # fmt: skip
    "a --costs file nested deep": (
        '{"meta": {}}',
        [json.dumps(_line())],
        _deep(100_000),
        "nested too deep",
    ),  # fmt: skip
    "a --costs file of pairs that are text": (
        '{"meta": {}}',
        [json.dumps(_line())],
        '{"pairs": "x"}',
        "holds no cost profile",
    ),
}


@pytest.mark.parametrize("case", list(DAMAGED))
def test_bench_replay_of_a_damaged_run_says_what_is_wrong(tiny_pair, tmp_path, case):
    """A sentence naming the file and a usage or input exit code, never an internal error."""
    summary, lines, costs, said = DAMAGED[case]
    target, draft, _ = tiny_pair
    (tmp_path / "summary.json").write_text(summary)
    (tmp_path / "records.jsonl").write_text("".join(line + "\n" for line in lines))
    extra = []
    if costs is not None:
        (tmp_path / "costs.json").write_text(costs)
        extra = ["--costs", str(tmp_path / "costs.json")]
    pair = ["--target", str(target), "--draft", str(draft), "--threads", "1", "--ctx", "512"]
    result = CliRunner().invoke(build_app("bench"), ["bench", "replay", str(tmp_path), *pair,
                                                     *extra])  # fmt: skip
    assert result.exit_code in (1, 2), (result.exit_code, result.output, result.exception)
    assert said in result.output and "internal error" not in result.output, result.output
