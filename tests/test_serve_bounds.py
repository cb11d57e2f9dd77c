"""The work one request to ``localspec serve`` may cause, bounded: its ``max_tokens``, its
prediction (how long, how it is counted, what it leaves in memory), its ``speculative``
settings and the planners they build, and how a stopped server ends a stream. Driven with
the real HTTP client against the real server on loopback, over the tiny pair."""

from __future__ import annotations

import httpx
import pytest

from localspec.session.open import open_session
from tests.serving import serve_options, serving

CHAT = "/v1/chat/completions"
PROMPT = "the cat sat on the mat and the dog sat on the log"


@pytest.fixture(scope="module")
def session(tiny_pair):
    session = open_session(serve_options(tiny_pair))
    yield session
    session.close()


def ask(text: str = PROMPT, **extra) -> dict:
    return {"messages": [{"role": "user", "content": text}], **extra}


def post(url: str, body: dict, **kw) -> httpx.Response:
    return httpx.post(url + CHAT, json=body, timeout=60, **kw)


def refused(r: httpx.Response, param: str) -> str:
    """The message of a 400 in OpenAI's shape that names ``param``."""
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param, error
    return error["message"]


# -- max_tokens ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value", [31.0, 1e3, "200", "1000000000000000000000", True, 0, [5], {"n": 5}]
)
@pytest.mark.parametrize("name", ["max_tokens", "max_completion_tokens"])
def test_a_max_tokens_that_is_not_a_whole_number_is_refused(session, name, value):
    # pydantic would take 31.0, 1e3 and "200" as numbers, past the limit's check.
    with serving(session, max_tokens_limit=30) as served:
        refused(post(served.url, ask(**{name: value})), name)
        assert served.worker.submitted == 0
        answer = post(served.url, ask(**{name: 30}))
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] <= 30
