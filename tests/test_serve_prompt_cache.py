"""``localspec serve``'s prompt cache, per client, on the tiny pair over HTTP: a client's
long prompt comes back from memory after another prompt took the lane (``timings.cache_n``
and ``usage.prompt_tokens_details.cached_tokens`` count it); another API key never restores
it, so its figures say nothing of what others asked."""

from __future__ import annotations

import httpx
import pytest

from localspec.serve.access import Access
from localspec.session.open import open_session
from localspec.storage.prompt_cache import MEMORY
from tests.serving import serve_options, serving

LONG = " ".join(f"the cat number {i} sat on the mat" for i in range(30))
OTHER = " ".join(f"a dog called {i} ran to the log" for i in range(30))


@pytest.fixture(scope="module")
def session(tiny_pair):
    options = serve_options(tiny_pair).model_copy(
        update={"lanes": 1, "n_ctx": 1024, "prompt_cache_tiers": (MEMORY,)}
    )
    session = open_session(options)
    yield session
    session.close()


def ask(url: str, text: str, key: str | None = None) -> dict:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": 8}
    response = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def cached(answer: dict) -> int:
    n = answer["timings"]["cache_n"]
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == n
    return n


def test_a_b_a_on_one_lane_restores_a(session):
    with serving(session) as served:
        first = ask(served.url, LONG)
        assert cached(first) == 0
        assert cached(ask(served.url, OTHER)) < 30  # the chat template's head only
        again = ask(served.url, LONG)
        assert cached(again) >= first["usage"]["prompt_tokens"] - 2
        assert again["choices"][0]["message"] == first["choices"][0]["message"]
        metrics = httpx.get(f"{served.url}/metrics", timeout=10).text.splitlines()
        assert "localspec_prompt_cache_hits_total 1" in metrics


def test_a_prompt_is_restored_for_its_own_key_only(session):
    with serving(session, access=Access(keys=("key-a", "key-b"))) as served:
        first = ask(served.url, LONG, "key-a")
        assert cached(first) == 0
        assert cached(ask(served.url, LONG, "key-b")) == 0  # nothing of key-a's
        again = ask(served.url, LONG, "key-a")
        assert cached(again) >= first["usage"]["prompt_tokens"] - 2
        assert cached(ask(served.url, LONG, "key-b")) >= first["usage"]["prompt_tokens"] - 2
