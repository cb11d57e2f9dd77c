"""The Python API's ``tools=`` and ``tool_choice=`` on a tiny pair whose template takes tools:
a call comes back as the result's ``tool_calls`` in OpenAI's shape with the finish reason
``tool_calls`` (streamed, the pieces hold the call's text back), ``none`` is text, a tool's
result goes back as a ``tool`` message, and each refusal is a ``UsageError`` naming the
keyword before anything runs."""

from __future__ import annotations

import json

import pytest

import localspec
from localspec.api.stream import Stream
from localspec.core.events import Finished, TokenEmitted
from localspec.core.stats import GenerationStats
from localspec.errors import UsageError
from tests.test_tools import NOW, WEATHER, write_tools_pair

ASK = [{"role": "user", "content": "the weather in the city"}]
NAMED = {"type": "function", "function": {"name": "now"}}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target, draft = write_tools_pair(tmp_path_factory.mktemp("api-tools"))
    with localspec.load(target, draft, ctx=512, threads=1, calibrate=False) as speculator:
        yield speculator


def assert_openai_calls(calls, names):
    assert calls
    for call in calls:
        assert set(call) == {"id", "type", "function"} and call["type"] == "function"
        assert isinstance(call["id"], str) and call["id"]
        assert set(call["function"]) == {"name", "arguments"}
        assert call["function"]["name"] in names
        assert isinstance(json.loads(call["function"]["arguments"]), dict)


def test_a_required_call_comes_back_as_tool_calls(pair):
    answer = pair.chat(ASK, tools=[WEATHER, NOW], tool_choice="required", max_tokens=80)
    assert answer.finish_reason == localspec.FinishReason.TOOL_CALLS == "tool_calls"
    assert_openai_calls(answer.tool_calls, {"get_weather", "now"})
    assert answer.text == ""
    assert answer.message == {
        "role": "assistant",
        "content": None,
        "tool_calls": list(answer.tool_calls),
    }


def test_a_named_function_is_the_one_called(pair):
    answer = pair.chat(ASK, tools=[WEATHER, NOW], tool_choice=NAMED, max_tokens=80)
    assert answer.finish_reason == "tool_calls"
    assert_openai_calls(answer.tool_calls, {"now"})


def test_a_streamed_call_holds_its_text_back_and_ends_in_the_same_calls(pair):
    whole = pair.chat(ASK, tools=[WEATHER, NOW], tool_choice="required", max_tokens=80)
    stream = pair.stream_chat(ASK, tools=[WEATHER, NOW], tool_choice="required", max_tokens=80)
    assert not "".join(stream.pieces()).strip()
    assert stream.result.tool_calls == whole.tool_calls and stream.text == ""
    assert stream.result.finish_reason == "tool_calls"
    events = list(pair.stream_chat(ASK, tools=[WEATHER, NOW], tool_choice="required"))
    assert "<tool_call>" in events[-1].text  # the events carry the answer's whole text


def test_tool_choice_none_is_the_plain_chat(pair):
    plain = pair.chat(ASK, max_tokens=12)
    answer = pair.chat(ASK, tools=[WEATHER], tool_choice="none", max_tokens=12)
    assert answer.tool_calls == () and answer.finish_reason != "tool_calls"
    assert answer.token_ids == plain.token_ids and answer.text == plain.text


def test_auto_is_text_or_calls_read_out_of_it(pair):
    answer = pair.chat(ASK, tools=[WEATHER], max_tokens=40)
    events = list(pair.stream_chat(ASK, tools=[WEATHER], max_tokens=40))
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.token_ids == answer.token_ids
    if answer.tool_calls:
        assert answer.finish_reason == "tool_calls"
        assert finished.text.startswith(answer.text) and "<tool_call>" in finished.text
    else:
        assert answer.text == finished.text and answer.finish_reason == finished.reason


def test_tool_results_and_earlier_calls_go_back_to_the_model(pair):
    called = pair.chat(ASK, tools=[WEATHER], tool_choice="required", max_tokens=80)
    result = {"role": "tool", "tool_call_id": called.tool_calls[0]["id"], "content": "sunny"}
    follow_up = [*ASK, called.message, result]
    answer = pair.chat(follow_up, tools=[WEATHER], tool_choice="none", max_tokens=8)
    assert answer.stats.generated_tokens > 0
    # The earlier call is shown to the model: the prompt is longer than without it.
    without = [*ASK, {"role": "assistant", "content": ""}, result]
    shorter = pair.chat(without, tools=[WEATHER], tool_choice="none", max_tokens=1)
    assert answer.stats.prompt_tokens > shorter.stats.prompt_tokens
    odd_id = {**called.message, "tool_calls": [{**called.tool_calls[0], "id": object()}]}
    assert pair.chat([*ASK, odd_id, result], max_tokens=2).stats.generated_tokens == 2
    parts = [{"role": "user", "content": [{"type": "text", "text": "the weather"}]}]
    assert pair.chat(parts, max_tokens=2).stats.generated_tokens == 2


BAD_CALL = {"type": "function", "function": {"name": "now", "arguments": "{oops"}}


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"tools": [{"type": "function"}]}, "tools[0].function must be"),
        ({"tools": [{"function": {"name": "f"}}]}, 'tools[0] must be {"type": "function"'),
        ({"tools": "get_weather"}, "tools must be a list"),
        ({"tools": [WEATHER, WEATHER]}, "tools: two functions have the same name"),
        ({"tools": [WEATHER], "tool_choice": "maybe"}, "tool_choice must be auto, none"),
        ({"tools": [WEATHER], "tool_choice": NAMED}, "tool_choice must name one of the tools"),
        ({"tool_choice": "required"}, "tool_choice needs tools"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "$ref": "#/nowhere"}}}]}, "tools: a function's parameters"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "enum": [{1, 2}]}}}]}, "tools: must be JSON data"),
        ({"tools": [WEATHER], "json_schema": {"type": "object"}},
         "tools and json_schema are both given"),
        ({"tools": [WEATHER], "tool_choice": "required", "grammar": 'root ::= "a"'},
         "tools and grammar are both given"),
    ],
)  # fmt: skip
def test_a_bad_tool_option_is_a_usage_error_naming_it(pair, options, says):
    with pytest.raises(UsageError) as caught:
        pair.chat(ASK, **options)
    assert caught.value.message.startswith(says), caught.value.message
    assert caught.value.hint


@pytest.mark.parametrize(
    ("messages", "says"),
    [
        ([{"role": "robot", "content": "a"}], "messages[0] needs a role of system, user"),
        ([*ASK, {"role": "assistant", "content": None, "tool_calls": [BAD_CALL]}],
         "messages[1].tool_calls: arguments must be JSON text"),
        ([*ASK, {"role": "assistant", "content": None, "tool_calls": "now"}],
         "messages[1].tool_calls must be a list"),
        ([{"role": "tool", "content": 3}], "messages[0].content must be text"),
    ],
)  # fmt: skip
def test_a_message_the_template_cannot_read_is_a_usage_error_naming_it(pair, messages, says):
    with pytest.raises(UsageError) as caught:
        pair.chat(messages, tools=[WEATHER])
    assert caught.value.message.startswith(says), caught.value.message


def test_complete_takes_no_tools_and_says_so(pair):
    for name, value in (("tools", [WEATHER]), ("tool_choice", "auto")):
        with pytest.raises(UsageError) as caught:
            pair.complete("the weather", **{name: value})
        assert caught.value.message == f"{name} is a chat's option: complete() takes no tools"
        assert "pair.chat(" in caught.value.hint


def test_a_template_without_tools_says_so(tiny_pair):
    target, draft, _ = tiny_pair
    with localspec.load(target, draft, ctx=512, threads=1, calibrate=False) as plain:
        with pytest.raises(UsageError) as caught:
            plain.chat(ASK, tools=[WEATHER])
        assert caught.value.message.startswith("tools: the chat template of")
        assert "has no tool calls" in caught.value.message and caught.value.hint
        answer = plain.chat(ASK, tools=[WEATHER], tool_choice="none", max_tokens=4)
        assert answer.tool_calls == () and answer.stats.generated_tokens == 4


def emitted(texts, reason=localspec.FinishReason.EOS):
    """The events of an answer made of ``texts``, one token each."""
    events = [TokenEmitted(i, t, "target", i) for i, t in enumerate(texts)]
    ids = tuple(range(len(texts)))
    done = Finished(localspec.FinishReason(reason), "".join(texts), ids, GenerationStats())
    return [*events, done]


CALL_PIECES = ["Let me ", "check <", "tool_", 'call>\n{"name": "now", "arguments": {}}\n',
               "</tool_call>"]  # fmt: skip


def test_a_stream_of_pieces_holds_a_call_back_even_split_over_tokens():
    import threading

    stream = Stream(iter(emitted(CALL_PIECES)), threading.Event(), tools=["now"])
    assert list(stream.pieces()) == ["Let me ", "check "]
    result = stream.result
    assert result.text == "Let me check" and result.finish_reason == "tool_calls"
    assert result.tool_calls == (
        {"id": "call_0", "type": "function", "function": {"name": "now", "arguments": "{}"}},
    )
    cut = Stream(iter(emitted(CALL_PIECES[:3], "length")), threading.Event(), tools=["now"])
    assert "".join(cut.pieces()) == "Let me check <tool_"  # no call after all: all of it
    assert cut.result.tool_calls == () and cut.result.finish_reason == "length"
    cancelled = Stream(iter(emitted(CALL_PIECES, "cancelled")), threading.Event(), tools=["now"])
    assert cancelled.finish().finish_reason == "cancelled" and cancelled.result.tool_calls
    plain = Stream(iter(emitted(CALL_PIECES)), threading.Event())
    assert "".join(plain.pieces()) == "".join(CALL_PIECES) == plain.result.text
    assert plain.result.tool_calls == () and plain.result.finish_reason == "eos"
