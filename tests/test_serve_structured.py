"""``response_format`` (json_object, json_schema with strict), ``json_schema`` and ``grammar``
on a real server over the tiny pair: answers that parse and match, streamed and not, and a
400 naming the field for each bad one, before anything runs."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.test_serve import ask, client, server  # noqa: F401  (the module's server)

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}, "n": {"type": "integer"}},
    "required": ["city", "n"],
}


def schema_format(schema=SCHEMA, **extra):
    return {"type": "json_schema", "json_schema": {"name": "place", "schema": schema, **extra}}


def test_a_json_schema_answer_parses_and_matches_streamed_and_not(server):  # noqa: F811
    openai_client = client(server)
    answer = openai_client.chat.completions.create(
        model="x", messages=ask("where?"), response_format=schema_format(strict=True),
        max_tokens=60,
    )  # fmt: skip
    text = answer.choices[0].message.content
    parsed = json.loads(text)
    assert set(parsed) == {"city", "n"} and isinstance(parsed["n"], int)
    stream = openai_client.chat.completions.create(
        model="x", messages=ask("where?"), response_format=schema_format(), max_tokens=60,
        stream=True,
    )  # fmt: skip
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == text


def test_json_object_and_a_grammar_on_completions(server):  # noqa: F811
    answer = client(server).chat.completions.create(
        model="x", messages=ask("hi"), response_format={"type": "json_object"}, max_tokens=40
    )
    # A random tiny model writes one long string: cut by max_tokens, it is an object begun.
    text, finish = answer.choices[0].message.content, answer.choices[0].finish_reason
    assert text.startswith("{") and (finish == "length" or isinstance(json.loads(text), dict))
    r = httpx.post(server["url"] + "/v1/completions", json={
        "model": "x", "prompt": "the", "grammar": 'root ::= "yes" | "no"'})  # fmt: skip
    assert r.status_code == 200 and r.json()["choices"][0]["text"] in ("yes", "no")


@pytest.mark.parametrize(
    ("extra", "param", "says"),
    [
        ({"response_format": {"type": "xml"}}, "response_format", "must be"),
        ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "must be"),
        ({"response_format": schema_format(strict="yes")},
         "response_format.json_schema.strict", "true or false"),
        ({"response_format": schema_format({"$ref": "#/nowhere"})},
         "response_format.json_schema.schema", "cannot be converted"),
        ({"response_format": schema_format({"type": "string", "description": "x" * 40_000})},
         "response_format.json_schema.schema", "over"),
        ({"grammar": "root ::= nothing"}, "grammar", "does not parse"),
        ({"json_schema": "{nope"}, "json_schema", "not JSON"),
        ({"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}, "grammar",
         "both given"),
    ],
)  # fmt: skip
def test_a_bad_format_schema_or_grammar_is_a_400_naming_the_field(server, extra, param, says):  # noqa: F811
    body = {"model": "x", "messages": ask("hi"), **extra}
    r = httpx.post(server["url"] + "/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and says in error["message"]
