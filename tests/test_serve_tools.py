"""``tools`` on a real server over a tiny pair whose template takes tools: a forced call
comes back as ``message.tool_calls`` and streamed as ``delta.tool_calls`` with
``finish_reason: "tool_calls"``, a tool's result is taken back as a ``tool`` message, and a
tool list not in OpenAI's shape is a 400 naming the field."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from localspec.core.params import GenerationParams
from tests.serving import serving
from tests.test_tools import NOW, WEATHER
from tests.test_tools import session as tools_session  # noqa: F401  (the tools pair)


@pytest.fixture(scope="module")
def served(tools_session):  # noqa: F811
    with serving(tools_session, defaults=GenerationParams(max_tokens=80, drafter="auto")) as s:
        yield s


def client(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served.url + "/v1", api_key="none", max_retries=0, timeout=60)


ASK = [{"role": "user", "content": "the weather in the city"}]


def test_a_required_call_comes_back_as_tool_calls_streamed_and_not(served):
    answer = client(served).chat.completions.create(
        model="x", messages=ASK, tools=[WEATHER, NOW], tool_choice="required"
    )
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.function.name in ("get_weather", "now")
    assert isinstance(json.loads(call.function.arguments), dict)
    stream = client(served).chat.completions.create(
        model="x", messages=ASK, tools=[WEATHER, NOW], tool_choice="required", stream=True
    )
    chunks = [c for c in stream if c.choices]
    streamed = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert [c.choices[0].finish_reason for c in chunks][-1] == "tool_calls"
    assert [(t.function.name, t.function.arguments) for t in streamed] == [
        (t.function.name, t.function.arguments) for t in choice.message.tool_calls
    ]
    assert not "".join(c.choices[0].delta.content or "" for c in chunks).strip()


def test_a_tool_result_is_taken_back(served):
    messages = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_0", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "a"}'}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": "sunny"},
    ]  # fmt: skip
    answer = client(served).chat.completions.create(
        model="x", messages=messages, tools=[WEATHER], tool_choice="none", max_tokens=8
    )
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.choices[0].message.content


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"tools": [{"type": "function"}]}, "tools[0].function"),
        ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
        ({"tools": "get_weather"}, "tools"),
        ({"tools": [WEATHER], "tool_choice": "maybe"}, "tool_choice"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "x"}}},
         "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "$ref": "#/nowhere"}}}]}, "tools"),
    ],
)  # fmt: skip
def test_a_tool_list_not_in_openais_shape_is_a_400_naming_the_field(served, extra, param):
    body = {"model": "x", "messages": ASK, **extra}
    r = httpx.post(served.url + "/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


@pytest.mark.parametrize(
    ("message", "says"),
    [
        ({"role": "assistant", "content": None, "tool_calls": [{"type": "function",
          "function": {"name": "now", "arguments": "{oops"}}]},
         "messages[1].tool_calls: arguments must be JSON text"),
        ({"role": "assistant", "content": None, "tool_calls": "now"},
         "messages[1].tool_calls must be a list"),
        ({"role": "robot", "content": "a"}, "messages[1] needs a role"),
    ],
)  # fmt: skip
def test_a_message_the_template_cannot_read_is_a_400_naming_messages(served, message, says):
    body = {"model": "x", "messages": [*ASK, message], "tools": [WEATHER]}
    r = httpx.post(served.url + "/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "messages" and error["message"].startswith(says)


def test_held_calls_stream_text_until_a_tag_even_split_over_pieces():
    from localspec.session.tools import HeldCalls

    held = HeldCalls(["now"])
    sent = [held.piece(p) for p in ["Let me ", "check <", "tool_", "call>\n", '{"name": "now", ',
                                    '"arguments": {}}\n</tool_call>']]  # fmt: skip
    assert "".join(sent) == "Let me check "
    tail, calls = held.end()
    assert tail == "" and calls[0]["index"] == 0 and calls[0]["function"]["name"] == "now"
    cut = HeldCalls(["now"])
    assert cut.piece("a <") == "a " and cut.piece("b") == "<b"
    assert cut.piece('x <tool_call>\n{"na') == "x " and cut.end() == ('<tool_call>\n{"na', [])


def test_an_answer_that_is_one_bare_call_is_read_as_that_call():
    from localspec.serve.tool_replies import tool_message
    from localspec.session.tools import HeldCalls, split_calls

    fenced = '```json\n{"name": "now", "arguments": {}}\n```'
    message, reason = tool_message(fenced, ["now"])
    assert reason == "tool_calls" and message["tool_calls"][0]["function"]["name"] == "now"
    assert split_calls(fenced, ["other"]) == (fenced, [])  # a function not offered: text
    assert split_calls('{"name": "now", "arguments": {}, "x": 1}', ["now"])[1] == []
    held = HeldCalls(["now"])
    assert [held.piece(p) for p in ["``", "`json\n{", '"name": "now", "arguments": {}}\n```']] == [
        "",
        "",
        "",
    ]
    assert held.end()[1][0]["function"]["name"] == "now"
    prose = HeldCalls(["now"])
    assert prose.piece("`") == "" and prose.piece("x` is a name") == "`x` is a name"
    code = HeldCalls(["now"])
    assert code.piece("```json\n[1") == "" and code.end() == ("```json\n[1", [])
