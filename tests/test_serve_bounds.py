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


# -- predictions -----------------------------------------------------------------------------

AUTO = {"speculative": {"drafter": "auto"}}


def predicted(text: str, **extra) -> dict:
    return ask(max_tokens=60, prediction={"type": "content", "content": text}, **extra)


class HealthPoller:
    """Polls ``/health`` every 100 ms on a thread of its own; ``longest`` is the longest any
    poll waited: how long the event loop was held."""

    def __init__(self, url: str) -> None:
        import threading

        self.url, self.longest, self.polls = url, 0.0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import time

        with httpx.Client(timeout=60) as http:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                assert http.get(self.url + "/health").status_code == 200
                self.longest = max(self.longest, time.perf_counter() - t0)
                self.polls += 1
                self._stop.wait(0.1)

    def __enter__(self) -> HealthPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)


def test_a_prediction_longer_than_a_few_contexts_is_refused_without_holding_the_loop(session):
    # One token repeated, which the answer writes several times: counted by an alignment,
    # 400,000 of them held the event loop for seconds.
    with serving(session) as served, HealthPoller(served.url) as health:
        message = refused(post(served.url, predicted("k" * 400_000, **AUTO)), "prediction")
        assert "reads at most 2048 (4 times its context)" in message
    assert health.polls > 0 and health.longest < 1.0
    with serving(session) as served:  # up to four contexts is read
        answer = post(served.url, predicted("k" * 2000, **AUTO))
        assert answer.status_code == 200, answer.text
        details = answer.json()["usage"]["completion_tokens_details"]
        total = details["accepted_prediction_tokens"] + details["rejected_prediction_tokens"]
        assert total == len(session.plain_tokens("k" * 2000))


def test_a_predictions_use_is_counted_in_the_worker(session, monkeypatch):
    import threading

    from localspec.serve import app

    where: list[str] = []
    count = app.prediction_counts

    def counting(prediction, answer):
        where.append(threading.current_thread().name)
        return count(prediction, answer)

    monkeypatch.setattr(app, "prediction_counts", counting)
    with serving(session) as served:
        for stream in (False, True):
            body = predicted("the cat sat on the mat", stream=stream, **AUTO)
            body["stream_options"] = {"include_usage": True} if stream else None
            assert post(served.url, body).status_code == 200
    assert where == ["localspec-lane-0", "localspec-lane-0"]  # a lane's thread


def test_prediction_counts_take_linear_time():
    import time

    from localspec.core.drafting.prediction import prediction_counts

    start = time.process_time()
    counts = prediction_counts([7] * 1_000_000, [7] * 45 + [1] * 1000)
    assert counts == (45, 1_000_000 - 45)
    assert time.process_time() - start < 2  # an alignment in order takes minutes here
    assert prediction_counts([1, 2, 3], [3, 2, 1]) == (3, 0)  # wherever they stand
    assert prediction_counts([1, 1, 2], [1, 5]) == (1, 2)  # each answer token counts once


@pytest.mark.parametrize("drafter", ["model", "ngram", "none", "lookahead"])
def test_a_prediction_with_a_drafter_that_ignores_it_is_a_400(session, drafter):
    # ``complete`` and the Python API refuse the same; counts would describe nothing.
    with serving(session, draft_id="draft") as served:
        body = predicted("the cat", speculative={"drafter": drafter})
        assert "drafter auto" in refused(post(served.url, body), "prediction")
        assert served.worker.submitted == 0


# -- speculative settings and the planners they build ----------------------------------------


def test_requests_naming_limits_of_their_own_build_a_bounded_number_of_planners(session):
    from localspec.core.planner import MAX_PLANNERS

    with serving(session) as served:
        for n_min in (*range(1, 21), 1000):  # 1000: past any draft, capped at n_max
            body = predicted("the cat sat on the mat " * 40, speculative={"n_min": n_min})
            assert post(served.url, body).status_code == 200
        controllers = session.decoder.controllers()
        assert len(controllers) <= MAX_PLANNERS
        assert max(c.draft_min for c in controllers) <= 64
        for bad in (3.0, "3", True, 0):
            refused(post(served.url, ask(speculative={"n_min": bad})), "speculative.n_min")


def test_a_requests_drafts_are_never_longer_than_the_servers_own(session):
    # A pinned draft model drafting as far as n_max with no confidence cut-off multiplied
    # the work per token many times over; the server's --draft-max (16) bounds it.
    with serving(session, draft_id="draft") as served:
        body = ask(max_tokens=48, speculative={"drafter": "model", "n_max": 64, "p_min": 0})
        timings = post(served.url, body).json()["timings"]
        assert timings["draft_n"] > 0 and timings["draft_n"] <= 16 * timings["target_passes"]
        message = refused(post(served.url, ask(speculative={"n_max": 65})), "speculative.n_max")
        assert "at most 64 tokens a round" in message


def test_a_server_may_refuse_every_speculative_setting(session):
    with serving(session, speculative_overrides=False) as served:
        for body in (ask(speculative={"drafter": "none"}), ask(**{"speculative.n_max": 4})):
            name = "speculative." + ("drafter" if "speculative" in body else "n_max")
            assert "no speculative settings" in refused(post(served.url, body), name)
        assert served.worker.submitted == 0
        assert post(served.url, ask(max_tokens=4)).status_code == 200


# -- what /health says -----------------------------------------------------------------------


def test_health_tells_the_queue_length_to_clients_only(session):
    from localspec.serve.access import Access

    with serving(session, access=Access(keys=("k1",))) as served:
        anyone = httpx.get(served.url + "/health")
        assert anyone.status_code == 200 and anyone.json() == {"status": "ok"}
        wrong = httpx.get(served.url + "/health", headers={"Authorization": "Bearer k2"})
        assert wrong.json() == {"status": "ok"}
        client = httpx.get(served.url + "/health", headers={"Authorization": "Bearer k1"})
        idle = {"status": "ok", "waiting": 0, "running": 0, "parallel": 1}
        assert client.json() == idle
    with serving(session) as served:  # without keys every caller is a client
        assert httpx.get(served.url + "/health").json() == idle
