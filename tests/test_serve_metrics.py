"""``GET /metrics``: Prometheus' text format, read back with Prometheus' own parser
(``prometheus_client``), behind the API key where one is set, and counting what the answers'
``timings`` say: 100 requests of every kind (chat and completions, streamed or not, several
prompts, drafting with the model, n-grams or none), then every counter against their sum.
The real server over the tiny pair, driven with the real HTTP client."""

from __future__ import annotations

import json
from collections import Counter

import httpx
import pytest

from localspec.core.params import GenerationParams
from localspec.serve.access import Access
from localspec.session.open import open_session
from tests.serving import serve_options, serving

parser = pytest.importorskip("prometheus_client.parser")
PROMPTS = ["the cat sat on the mat", "a b c a b c a b", "the dog and the cat and the dog",
           "one two three", "to the and of the"]  # fmt: skip
DRAFTERS = ["model", "ngram", "none", "auto"]


@pytest.fixture(scope="module")
def session(tiny_pair):
    session = open_session(serve_options(tiny_pair))
    yield session
    session.close()


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """Every sample, by name and labels, as Prometheus' parser reads them."""
    found = {}
    for family in parser.text_string_to_metric_families(text):
        for sample in family.samples:
            found[sample.name, tuple(sorted(sample.labels.items()))] = sample.value
    return found


def request(url: str, i: int) -> dict:
    """Request ``i`` of the run; its ``timings`` (summed over a stream's final chunk)."""
    drafter = DRAFTERS[i % len(DRAFTERS)]
    spec = {"speculative": {"drafter": drafter}, "max_tokens": 6 + i % 7}
    text = PROMPTS[i % len(PROMPTS)]
    if i % 3 == 0:
        path = "/v1/completions"
        prompt = [text, PROMPTS[(i + 1) % len(PROMPTS)]] if i % 2 else text
        body = {"prompt": prompt, **spec}
    else:
        path = "/v1/chat/completions"
        body = {"messages": [{"role": "user", "content": text}], **spec}
    if i % 4 == 1:
        with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=60) as r:
            assert r.status_code == 200
            chunks = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: {")]  # fmt: skip
        return next(c["timings"] for c in reversed(chunks) if "timings" in c)
    r = httpx.post(url + path, json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["timings"]


def test_metrics_parse_and_count_what_the_answers_timings_say(session):
    params = GenerationParams(max_tokens=8, drafter="auto")
    with serving(session, defaults=params) as served:
        runs = [request(served.url, i) for i in range(100)]
        r = httpx.get(served.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    found = samples(r.text)

    def total(name: str, **labels: str) -> float:
        return found[f"localspec_{name}", tuple(sorted(labels.items()))]

    assert total("requests_total", outcome="completed") == 100
    assert total("requests_total", outcome="queue_full") == 0
    assert total("queue_waiting") == 0 and total("lanes_busy") == 0 and total("lanes") == 1
    assert total("prompt_evaluated_tokens_total") == sum(t["prompt_n"] for t in runs)
    assert total("prompt_tokens_total") == sum(t["prompt_n"] + t["cache_n"] for t in runs)
    assert total("generated_tokens_total") == sum(t["predicted_n"] for t in runs)
    assert total("target_passes_total") == sum(t["target_passes"] for t in runs)
    drafted, accepted = Counter(), Counter()
    at_drafted, at_accepted = Counter(), Counter()
    for t in runs:
        for name, by in t["by_drafter"].items():
            drafted[name] += by["drafted"]
            accepted[name] += by["accepted"]
            for k, n in enumerate(by["drafted_at"], 1):
                at_drafted[name, k] += n
            for k, n in enumerate(by["accepted_at"], 1):
                at_accepted[name, k] += n
    assert drafted["model"] > 0 and drafted["ngram"] > 0  # the run drafted both ways
    for name in drafted:
        assert total("draft_tokens_total", drafter=name) == drafted[name]
        assert total("draft_accepted_tokens_total", drafter=name) == accepted[name]
    assert sum(drafted.values()) == sum(t["draft_n"] for t in runs)
    for (name, k), n in at_drafted.items():
        assert total("draft_position_drafted_total", drafter=name, position=str(k)) == n
        assert (
            total("draft_position_accepted_total", drafter=name, position=str(k))
            == (at_accepted[name, k])
        )
    answered = sum(1 for t in runs if t["predicted_n"])
    assert total("time_to_first_token_seconds_count") == answered
    assert total("time_to_first_token_seconds_bucket", le="+Inf") == answered
    gaps = sum(t["predicted_n"] for t in runs) - answered
    assert total("inter_token_latency_seconds_count") == gaps


def test_metrics_need_the_key_where_one_is_set(session):
    with serving(session, access=Access(keys=("key-a",))) as served:
        assert httpx.get(served.url + "/metrics").status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert httpx.get(served.url + "/metrics", headers=wrong).status_code == 401
        right = {"Authorization": "Bearer key-a"}
        r = httpx.get(served.url + "/metrics", headers=right)
        assert r.status_code == 200 and "localspec_requests_total" in r.text


def test_a_full_queue_and_a_request_that_leaves_are_counted(session):
    from localspec.serve.worker import GenerationWorker, Job, QueueFull

    idle = GenerationWorker(session, max_queue=1)  # not started: jobs just wait
    waiting = idle.submit(Job(lambda s, c: iter(()), GenerationParams()))
    with pytest.raises(QueueFull):
        idle.submit(Job(lambda s, c: iter(()), GenerationParams()))
    idle.withdraw(waiting)
    idle.withdraw(waiting)  # counted once
    found = samples(idle.metrics.render(idle.waiting, idle.running, idle.lanes))
    assert found["localspec_requests_total", (("outcome", "queue_full"),)] == 1
    assert found["localspec_requests_total", (("outcome", "cancelled"),)] == 1
    assert found["localspec_queue_waiting", ()] == 0
