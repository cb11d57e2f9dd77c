"""The Python API's ``json_schema=`` and ``grammar=`` on the tiny pair: the answer matches,
greedy output is the same whatever the drafter, and a bad schema or grammar is a
``UsageError`` naming the keyword before anything runs."""

from __future__ import annotations

import json

import pytest

import localspec
from localspec.errors import UsageError

SCHEMA = {
    "type": "object",
    "properties": {"word": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}},
    "required": ["word", "n"],
}


@pytest.fixture(scope="module")
def pair(tiny_pair):
    target, draft, _ = tiny_pair
    with localspec.load(target, draft, ctx=512, threads=1, calibrate=False) as speculator:
        yield speculator


def test_a_schema_bound_completion_and_chat_parse(pair):
    answer = json.loads(pair.complete("the cat", json_schema=SCHEMA, max_tokens=60).text)
    assert set(answer) == {"word", "n"}
    chat = pair.chat([{"role": "user", "content": "a"}], json_schema=json.dumps(SCHEMA))
    assert set(json.loads(chat.text)) == {"word", "n"}
    streamed = pair.stream_complete("the", grammar='root ::= "yes" | "no"')
    assert "".join(streamed.pieces()) in ("yes", "no")


def test_greedy_output_under_a_schema_is_the_same_whatever_the_drafter(pair):
    answers = {
        drafter: pair.complete("the dog", json_schema=SCHEMA, drafter=drafter).token_ids
        for drafter in ("none", "ngram", "model", "auto")
    }
    assert len(set(answers.values())) == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"json_schema": {"$ref": "#/nowhere"}}, "json_schema: the schema cannot be converted"),
        ({"json_schema": "{oops"}, "json_schema: the schema is not JSON"),
        ({"grammar": "root ::= nothing"}, "grammar: the grammar does not parse"),
        ({"grammar": 12}, "grammar: must be GBNF text"),
        ({"grammar": 'root ::= "a"', "json_schema": SCHEMA}, "are both given"),
    ],
)
def test_a_bad_schema_or_grammar_is_a_usage_error_naming_it(pair, options, message):
    with pytest.raises(UsageError, match=message):
        pair.complete("the", **options)
