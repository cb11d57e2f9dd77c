"""``logprobs`` and ``top_logprobs`` on a real server over the tiny pair: the target's own
log-probabilities in OpenAI's shapes, chat and completions, streamed and not, the answer
unchanged by asking; bad values are a 400 naming the field."""

from __future__ import annotations

import math

import httpx
import pytest

from tests.test_serve import ask, client, server  # noqa: F401  (the module's server)


def test_chat_logprobs_cover_every_token_and_leave_the_answer_as_it_was(server):  # noqa: F811
    openai_client = client(server)
    plain = openai_client.chat.completions.create(model="x", messages=ask("the cat"))
    answer = openai_client.chat.completions.create(
        model="x", messages=ask("the cat"), logprobs=True, top_logprobs=2
    )
    assert answer.choices[0].message.content == plain.choices[0].message.content
    content = answer.choices[0].logprobs.content
    assert len(content) == answer.usage.completion_tokens
    assert "".join(e.token for e in content) == answer.choices[0].message.content
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 2
        assert entry.top_logprobs[0].logprob >= entry.logprob - 1e-9
        assert math.isclose(
            entry.top_logprobs[0].logprob, max(t.logprob for t in entry.top_logprobs)
        )
    stream = openai_client.chat.completions.create(
        model="x", messages=ask("the cat"), logprobs=True, stream=True
    )
    streamed = [e for c in stream if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]  # fmt: skip
    assert [e.token for e in streamed] == [e.token for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content])


def test_completion_logprobs_in_the_legacy_shape(server):  # noqa: F811
    r = httpx.post(server["url"] + "/v1/completions",
                   json={"prompt": "the cat", "max_tokens": 6, "logprobs": 2})  # fmt: skip
    choice = r.json()["choices"][0]
    shown = choice["logprobs"]
    assert "".join(shown["tokens"]) == choice["text"] and len(shown["token_logprobs"]) == 6
    assert all(len(top) <= 2 for top in shown["top_logprobs"])
    assert shown["text_offset"][0] == 0


@pytest.mark.parametrize(
    ("path", "extra", "param"),
    [
        ("chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ("chat/completions", {"top_logprobs": 2}, "top_logprobs"),
        ("chat/completions", {"logprobs": 3}, "logprobs"),
        ("completions", {"logprobs": 6}, "logprobs"),
    ],
)
def test_bad_logprobs_are_a_400_naming_the_field(server, path, extra, param):  # noqa: F811
    body = {"model": "x", **extra}
    body.update({"messages": ask("hi")} if path.startswith("chat") else {"prompt": "hi"})
    r = httpx.post(f"{server['url']}/v1/{path}", json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
