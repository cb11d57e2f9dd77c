"""Tool calls through the chat template, on a tiny pair whose template takes tools: OpenAI's
``tools`` and ``tool_choice`` checked with errors naming the field, a call forced by
``required`` or a named function parses into OpenAI's shape, ``auto`` leaves text free until
the model opens a call, and a template without tools says so."""

from __future__ import annotations

import json

import pytest

from localspec.core.engine import run_to_completion
from localspec.core.params import GenerationParams
from localspec.errors import UsageError
from localspec.session.tools import read_tools, split_calls

TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:{% for t in tools %}\n{{ t | tojson }}{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] }}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}\n<tool_call>\n{{ c.function | tojson }}"
    "\n</tool_call>{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
        },
    },
}
NOW = {
    "type": "function",
    "function": {
        "name": "now",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    },
}


def write_tools_pair(d):
    """A tiny target and draft whose chat template takes tools (``TEMPLATE``), under ``d``."""
    from tests.tiny_gguf import DEFAULT_PIECES, write_tiny_llama

    pieces = [*DEFAULT_PIECES, "<tool_call>", "</tool_call>", "<|im_start|>", "<|im_end|>"]
    target = write_tiny_llama(d / "t.gguf", seed=1, vocab=pieces, chat_template=TEMPLATE)
    draft = write_tiny_llama(d / "d.gguf", seed=2, vocab=pieces, chat_template=TEMPLATE)
    return target, draft


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    from localspec.session.open import open_session
    from localspec.session.pair import ModelOptions

    target, draft = write_tools_pair(tmp_path_factory.mktemp("tools"))
    s = open_session(ModelOptions(target=str(target), draft=str(draft), n_ctx=512, threads=1,
                                  calibrate=False, stores=(), history=False))  # fmt: skip
    yield s
    s.close()


def answer(session, tools, drafter="auto", messages=None):
    messages = messages or [{"role": "user", "content": "the weather in the city"}]
    params = GenerationParams(max_tokens=80, drafter=drafter)
    return run_to_completion(session.chat(messages, params, tools=tools))


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "now"}}])
def test_a_forced_call_parses_into_openais_shape_whatever_the_drafter(session, choice):
    tools = read_tools([WEATHER, NOW], choice)
    outputs = {d: answer(session, tools, d) for d in ("none", "ngram", "model", "auto")}
    assert len({tuple(f.token_ids) for f in outputs.values()}) == 1
    content, calls = split_calls(outputs["none"].text)
    assert content == "" and calls, outputs["none"].text
    for call in calls:
        assert call["type"] == "function" and isinstance(
            json.loads(call["function"]["arguments"]), dict
        )
        if isinstance(choice, dict):
            assert call["function"]["name"] == "now"


def test_auto_leaves_text_free_until_a_call_opens(session):
    """Under ``auto`` the answer is the model's own up to its tool-call tag (the grammar
    waits for it), so it matches the unconstrained answer to the same prompt that far."""
    tools = read_tools([WEATHER], "auto")
    lazy = answer(session, tools)
    question = [{"role": "user", "content": "the weather in the city"}]
    tokens = session.prompts.chat_tokens(question, tools=[WEATHER])
    plain = run_to_completion(session.generate(tokens, GenerationParams(max_tokens=80)))
    opened = plain.text.find("<tool_call>")
    upto = len(plain.text) if opened < 0 else opened + len("<tool_call>")
    assert lazy.text[:upto] == plain.text[:upto] and len(lazy.text) >= upto


def test_a_tool_result_goes_back_to_the_model(session):
    messages = [
        {"role": "user", "content": "the weather"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_0", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "a"}'}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "call_0"},
    ]  # fmt: skip
    fin = answer(session, read_tools([WEATHER], "none"), messages=messages)
    assert fin.stats.generated_tokens > 0


@pytest.mark.parametrize(
    ("tools", "choice", "says"),
    [
        ([{"type": "function"}], None, "tools[0].function must be"),
        ([{"function": {"name": "f"}}], None, 'tools[0] must be {"type": "function"'),
        ([{"type": "function", "function": {"name": "no spaces"}}], None, "tools[0].function.name"),
        ([WEATHER, WEATHER], None, "same name"),
        ([WEATHER], "sometimes", "tool_choice must be auto"),
        ([WEATHER], {"type": "function", "function": {"name": "other"}}, "must name one"),
        (None, "required", "tool_choice needs tools"),
        ("f", None, "tools must be a list"),
    ],
)
def test_tools_not_in_openais_shape_are_refused_naming_the_field(tools, choice, says):
    with pytest.raises(UsageError, match=says.replace("[", r"\[").replace("{", r"\{")):
        read_tools(tools, choice)


def test_a_template_without_tools_says_so(tiny_pair):
    from localspec.session.open import open_session
    from localspec.session.pair import ModelOptions

    target, draft, _ = tiny_pair
    s = open_session(ModelOptions(target=str(target), draft=str(draft), n_ctx=256, threads=1,
                                  calibrate=False, stores=(), history=False))  # fmt: skip
    try:
        with pytest.raises(UsageError, match="has no tool calls"):
            answer(s, read_tools([WEATHER], "auto"))
    finally:
        s.close()
