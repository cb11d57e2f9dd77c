"""``localspec complete --json-schema FILE`` and ``--grammar FILE`` over a tiny pair: the
answer matches, greedy output is the same with every drafter, and a bad file is an error
naming the option before anything loads."""

from __future__ import annotations

import json

import pytest

from tests.test_cli import assert_clean_error, localspec, pair_args

SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 10}, "n": {"type": "integer"}},
    "required": ["name", "n"],
}


def test_a_schema_bound_answer_parses_and_is_the_same_with_every_drafter(tiny_pair, tmp_path):
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps(SCHEMA))
    answers = []
    for drafter in ("none", "ngram", "model", "auto"):
        proc = localspec(
            "complete", *pair_args(tiny_pair), "--raw", "--json", "--max-tokens", "60",
            "--json-schema", str(schema), "--drafter", drafter,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr.decode()
        record = json.loads(proc.stdout)
        answer = json.loads(record["text"])
        assert set(answer) == {"name", "n"} and isinstance(answer["n"], int)
        answers.append(record["token_ids"])
    assert all(a == answers[0] for a in answers)


def test_a_grammar_file_constrains_the_answer(tiny_pair, tmp_path):
    grammar = tmp_path / "yes.gbnf"
    grammar.write_text('root ::= ("yes" | "no") "."\n')
    proc = localspec("complete", *pair_args(tiny_pair), "--raw", "--grammar", str(grammar))
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stdout.decode() in ("yes.", "no.")


@pytest.mark.parametrize(
    ("option", "content", "needle"),
    [
        ("--grammar", "root ::= nowhere", "--grammar: the grammar does not parse"),
        ("--grammar", "   ", "--grammar: the grammar is empty"),
        ("--json-schema", "{not json", "--json-schema: the schema is not JSON"),
        ("--json-schema", '{"$ref": "#/missing"}', "--json-schema: the schema cannot be"),
        pytest.param("--json-schema", "x" * 200_000, "--json-schema:", id="oversized"),
    ],
)
def test_a_bad_grammar_or_schema_is_an_error_naming_the_option(tmp_path, option, content, needle):
    path = tmp_path / "bad"
    path.write_text(content)
    # No model is given that exists: the option is refused before any would load.
    proc = localspec("complete", "--target", str(tmp_path / "none.gguf"), option, str(path))
    assert proc.returncode == 2
    assert_clean_error(proc, needle)


def test_both_options_at_once_are_refused(tmp_path):
    path = tmp_path / "g"
    path.write_text('root ::= "a"')
    proc = localspec("complete", "--grammar", str(path), "--json-schema", str(path))
    assert_clean_error(proc, "--grammar and --json-schema are both given")
