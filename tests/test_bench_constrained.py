"""The bench under a grammar: prompts with a JSON schema or tools, the grammar reaching every
runner (the engine, a fresh process, llama.cpp's binary), whether answers are valid, and the
summary's share of valid answers. No model is loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localspec.backend.native import NativeRunner
from localspec.bench import fresh as bench_fresh
from localspec.bench import modes as bench_modes
from localspec.bench import prompts as bench_prompts
from localspec.bench import report as bench_report
from localspec.bench import runner as bench_runner
from localspec.bench import summary as bench_summary
from localspec.bench.constrained import (
    CONSTRAINED_CATEGORIES,
    Constraint,
    answer_valid,
    read_constraint,
)
from localspec.errors import InputError, UsageError
from localspec.session.constraints import constraint
from localspec.session.pair import ModelOptions
from localspec.session.tools import call_grammar, read_tools
from tests.test_bench import FakeBenchSession, rec

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "get_time"}},
]


def _file(tmp_path, rows):
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# -- prompts --------------------------------------------------------------------------------


def test_the_shipped_constrained_sets_are_run_when_named_and_each_prompt_has_its_grammar():
    assert not set(CONSTRAINED_CATEGORIES) & {p.category for p in bench_prompts.load_prompts()}
    prompts = bench_prompts.load_prompts(list(CONSTRAINED_CATEGORIES))
    assert {p.category for p in prompts} == set(CONSTRAINED_CATEGORIES)
    for p in prompts:
        assert p.constraint is not None and "root ::=" in p.constraint.grammar
        assert bool(p.constraint.tools) == (p.category == "tool_calls")


def test_a_prompt_file_line_may_carry_a_schema_or_tools(tmp_path):
    path = _file(
        tmp_path,
        [
            {"prompt": "Alice is 34.", "json_schema": SCHEMA},
            {"prompt": "Weather in Oslo?", "tools": TOOLS},
            {"prompt": "free"},
        ],
    )
    schema, tools, free = bench_prompts.load_prompt_file(path)
    assert schema.constraint == Constraint(constraint(json_schema=SCHEMA) or "")
    offered = read_tools(TOOLS, "required")
    assert offered is not None
    assert tools.constraint == Constraint(call_grammar(offered), tuple(TOOLS))
    assert tools.constraint.tool_names == ["get_weather", "get_time"]
    assert free.constraint is None


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"json_schema": {"type": "nope"}}, r"line 1: json_schema: the schema cannot be converted"),
        ({"json_schema": "text"}, r"line 1: json_schema: must be a JSON schema object"),
        ({"json_schema": SCHEMA, "tools": TOOLS}, r'line 1: give "json_schema" or "tools"'),
        ({"tools": []}, r"line 1: tools: must be a list of at least one function"),
        ({"tools": [{"type": "function"}]}, r"line 1: tools"),
    ],
)
def test_a_schema_or_tool_list_the_converter_cannot_take_names_its_line_and_field(
    tmp_path, row, message
):
    path = _file(tmp_path, [{"prompt": "p", **row}])
    with pytest.raises(InputError, match=message):
        bench_prompts.load_prompt_file(path)


def test_a_shipped_constrained_line_without_its_grammar_is_refused(tmp_path):
    (tmp_path / "extraction.jsonl").write_text(
        json.dumps({"id": "a", "prompt": "p", "source": "s"}) + "\n"
    )
    with pytest.raises(InputError, match="no json_schema or tools"):
        bench_prompts.load_prompts(["extraction"], directory=tmp_path)


def test_an_answer_is_valid_when_it_is_what_its_constraint_asks_for():
    schema = read_constraint({"json_schema": SCHEMA}, "here")
    tools = read_constraint({"tools": TOOLS}, "here")
    assert schema is not None and tools is not None
    assert answer_valid(schema, '{"name": "Alice", "age": 34}')
    assert not answer_valid(schema, '{"name": "Ali')  # cut short by the token limit
    call = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    assert answer_valid(tools, call)
    assert not answer_valid(tools, call.replace("get_weather", "get_mail"))
    assert not answer_valid(tools, "It is sunny.")


# -- runners --------------------------------------------------------------------------------


def _constrained_prompts():
    schema = read_constraint({"json_schema": SCHEMA}, "here")
    tools = read_constraint({"tools": TOOLS}, "here")
    return [
        bench_prompts.BenchPrompt("extraction", "e1", "Alice is 34.", "t", constraint=schema),
        bench_prompts.BenchPrompt("tool_calls", "t1", "Oslo weather?", "t", constraint=tools),
    ]


def test_the_engine_answers_under_each_prompts_grammar_with_its_tools_shown():
    session = FakeBenchSession()
    config = bench_runner.BenchConfig(modes=("none", "auto"), max_tokens=8, warmup=False)
    prompts = _constrained_prompts()
    records = bench_runner.BenchRunner(session, config).run(prompts)
    by_prompt = {p.id: p.constraint.grammar for p in prompts if p.constraint is not None}
    expected = [by_prompt[r.prompt_id] for r in records]
    assert session.grammars == expected  # every mode of each prompt, under its own grammar
    assert session.tools_shown == [TOOLS]  # only the tool prompt goes through chat_tokens
    for r in records:
        assert r.to_dict()["answer_valid"] is False  # the fake writes no JSON


def test_tools_are_refused_with_raw_prompts():
    config = bench_runner.BenchConfig(modes=("none",), max_tokens=8, raw=True, warmup=False)
    with pytest.raises(UsageError, match="--raw"):
        bench_runner.BenchRunner(FakeBenchSession(), config).run(_constrained_prompts())


def test_llama_cpp_runs_under_the_same_grammar_from_a_file(tmp_path, monkeypatch):
    runner = NativeRunner(tmp_path / "bin", tmp_path / "t.gguf", None, str, threads=2)
    seen = {}

    def fake_run(cmd, name, mode, timeout_s, env):
        path = cmd[cmd.index("--grammar-file") + 1]
        seen["grammar"] = Path(path).read_text(encoding="utf-8")  # there while the binary runs
        seen["order"] = cmd.index("--grammar-file") < cmd.index("--spec-type")
        return "", "decoded 5 tokens in 1.0 seconds, speed: 5.0 t/s"

    monkeypatch.setattr("localspec.backend.native._run", fake_run)
    result = runner.run("native-ngram", "prompt", 8, 0.0, None, grammar="root ::= [a-z]+")
    assert seen == {"grammar": "root ::= [a-z]+", "order": True}
    assert result.generated_tokens == 5
    assert "--grammar-file" not in runner.command("native-ngram", "prompt", 8, 0.0, None)


def test_a_fresh_process_reads_the_grammar_and_a_tool_prompt_raw(tmp_path, monkeypatch):
    runner = bench_fresh.FreshRunner(ModelOptions(), tmp_path / "t.gguf", None)
    calls = []

    def fake_complete(cmd, *, input, env, **kwargs):
        grammar = cmd[cmd.index("--grammar") + 1]
        calls.append((cmd, input, Path(grammar).read_text(encoding="utf-8")))
        answer = {
            "finish_reason": "stop",
            "text": '{"name": "Alice", "age": 34}',
            "token_ids": [1, 2],
            "stats": {"generated_tokens": 2, "decode_s": 0.2},
        }
        return bench_fresh.subprocess.CompletedProcess(cmd, 0, json.dumps(answer) + "\n", "")

    monkeypatch.setattr(bench_fresh.subprocess, "run", fake_complete)
    schema, tools = (p.constraint for p in _constrained_prompts())
    auto = bench_modes.BenchMode("auto")
    try:
        record = runner.run(bench_fresh.FreshPrompt("Alice is 34.", schema), auto, 8, 0.0, None)
        assert record["answer_valid"] is True
        cmd, text, grammar = calls[-1]
        assert text == "Alice is 34." and schema is not None and grammar == schema.grammar
        assert "--raw" not in cmd and "--parse-special" not in cmd
        spelled = "<|im_start|>user\nOslo weather?<|im_end|>"
        record = runner.run(bench_fresh.FreshPrompt(spelled, tools, raw=True), auto, 8, 0.0, None)
        assert record["answer_valid"] is False  # JSON, but no call of an offered tool
        cmd, text, grammar = calls[-1]
        assert text == spelled and "--raw" in cmd and "--parse-special" in cmd
    finally:
        runner.close()


# -- summary --------------------------------------------------------------------------------


def test_the_summary_and_report_give_the_share_of_valid_answers():
    records = [
        {**rec("extraction", "1", "none", 10.0, 100), "answer_valid": True},
        {**rec("extraction", "1", "auto", 20.0, 100), "answer_valid": True},
        {**rec("extraction", "2", "none", 10.0, 100), "answer_valid": True},
        {**rec("extraction", "2", "auto", 20.0, 100), "answer_valid": False},
    ]
    summary = bench_summary.summarize(records, ("none", "auto"), greedy=False)
    assert summary["overall"]["auto"]["answers_valid"] == 0.5
    assert summary["overall"]["none"]["answers_valid"] == 1.0
    assert "valid answers" in bench_report.render_table(summary)
    free = bench_summary.summarize([rec("math", "1", "none", 10.0, 100)], ("none",), greedy=False)
    assert "answers_valid" not in free["overall"]["none"]
