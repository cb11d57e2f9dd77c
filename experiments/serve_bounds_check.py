"""Do a running ``localspec serve``'s bounds hold under hostile requests? (docs/serve.md, Limits)

    python experiments/serve_bounds_check.py --url http://127.0.0.1:8080 --pid PID \\
        --weights TARGET.gguf DRAFT.gguf [--seconds 60] [--draft-max 16]

First the ordinary request (a streamed greedy chat answer) runs once on the idle server.
Then, for ``--seconds``, four clients send hostile requests (predictions far over the
bound, long ones within it, pinned drafters with ``p_min: 0`` and the longest drafts,
limits of their own per request, floats and strings for ``max_tokens``), a fifth streams
the ordinary request again and again, and ``/health`` is polled every 100 ms while the
server's RSS is sampled. It passes when no poll waited over a second, the RSS stayed under
the weights plus 1.5 GiB, every hostile request got a 400 naming the field or an answer
within its bounds, and every ordinary answer was token for token the idle one's (each
streamed chunk is one token's text). Greedy answers are identical under load only with
batch-invariant kernels: serve with ``--exact``. Prints what it saw; exits 1 on a failure.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

CHAT = "/v1/chat/completions"
PRIME = "Write a Python function that tells whether a number is prime, with a docstring."
ORDINARY = {
    "messages": [{"role": "user", "content": PRIME}],
    "max_tokens": 96,
    "temperature": 0,
    "stream": True,
    "stream_options": {"include_usage": True},
}
POLL_S, SLOW_POLL_S = 0.1, 1.0
RSS_ALLOWANCE = 3 << 29  # 1.5 GiB over the weights
HOSTILE_TOKENS = 24  # new tokens a hostile request asks for when it may run
LONGEST_COPY = 64  # the server's longest copy: no request drafts more a round


@dataclass
class Seen:
    """What the run saw, filled by its threads."""

    polls: int = 0
    slowest_poll: float = 0.0
    rss_max: int = 0
    outcomes: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    ordinary: list[bool] = field(default_factory=list)  # identical to the idle answer
    lock: threading.Lock = field(default_factory=threading.Lock)

    def fail(self, what: str) -> None:
        with self.lock:
            self.failures.append(what)


def ask(extra: dict, *, tokens: int = HOSTILE_TOKENS) -> dict:
    return {"messages": [{"role": "user", "content": "Rename load to read in this file."}],
            "max_tokens": tokens, **extra}  # fmt: skip


def prediction(text: str, **speculative: object) -> dict:
    extra: dict = {"prediction": {"type": "content", "content": text}}
    if speculative:
        extra["speculative"] = speculative
    return extra


def hostile_requests(draft_max: int) -> list[tuple[str, dict, str | None, int]]:
    """``(name, body, the param a 400 must name or None for an answer, longest draft)``."""
    return [
        ("prediction far over four contexts", ask(prediction("k" * 400_000)), "prediction", 0),
        ("long prediction within the bound", ask(prediction("def load(path): ... " * 600)),
         None, LONGEST_COPY),
        ("pinned draft model, p_min 0, longest drafts",
         ask({"speculative": {"drafter": "model", "n_max": 64, "p_min": 0}}), None, draft_max),
        ("limits of its own per request",
         ask(prediction("load the file " * 50, n_min=1)), None, LONGEST_COPY),
        ("n_max past the server's", ask({"speculative": {"n_max": 1000}}), "speculative.n_max", 0),
        ("max_tokens as a float", {**ask({}), "max_tokens": 31.0}, "max_tokens", 0),
        ("max_tokens as a string", {**ask({}), "max_tokens": "200"}, "max_tokens", 0),
        ("a prediction with a drafter that ignores it",
         ask(prediction("x" * 1000, drafter="ngram")), "prediction", 0),
    ]  # fmt: skip


def judge(body: dict, param: str | None, longest: int, r: httpx.Response) -> str:
    """Why the answer is not what the bounds allow; empty when it is."""
    if param is not None:
        error = r.json().get("error", {}) if r.status_code == 400 else {}
        return "" if error.get("param") == param else f"{r.status_code}, not a 400 naming {param}"
    if r.status_code != 200:
        return f"{r.status_code}: {r.text[:160]}"
    answer = r.json()
    timings = answer.get("timings", {})
    if answer["usage"]["completion_tokens"] > body["max_tokens"]:
        return f"{answer['usage']['completion_tokens']} tokens for max_tokens {body['max_tokens']}"
    if timings and timings["draft_n"] > longest * max(timings["target_passes"], 1):
        return f"{timings['draft_n']} drafted in {timings['target_passes']} passes"
    return ""


def hostile_client(url: str, until: float, seen: Seen, start: int, draft_max: int) -> None:
    kinds = hostile_requests(draft_max)
    with httpx.Client(base_url=url, timeout=600) as http:
        for i in itertools.count(start):
            if time.monotonic() >= until:
                return
            name, body, param, longest = kinds[i % len(kinds)]
            if name == "limits of its own per request":  # a new n_min each time
                body["speculative"] = {"n_min": i % 200 + 1}
            why = judge(body, param, longest, http.post(CHAT, json=body))
            with seen.lock:
                seen.outcomes[(name, "ok" if not why else "FAILED")] += 1
            if why:
                seen.fail(f"{name}: {why}")


def streamed(http: httpx.Client) -> tuple[list[str], int]:
    """The ordinary request's streamed pieces (one per token) and its completion tokens."""
    pieces: list[str] = []
    tokens = -1
    with http.stream("POST", CHAT, json=ORDINARY) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line.removeprefix("data: "))
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            for choice in chunk.get("choices", []):
                if choice["delta"].get("content"):
                    pieces.append(choice["delta"]["content"])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return pieces, tokens


def ordinary_client(url: str, until: float, seen: Seen, idle: tuple[list[str], int]) -> None:
    with httpx.Client(base_url=url, timeout=600) as http:
        while time.monotonic() < until:
            same = streamed(http) == idle
            with seen.lock:
                seen.ordinary.append(same)
            if not same:
                seen.fail("an ordinary answer under load differs from the idle server's")


def poll_health(url: str, stop: threading.Event, seen: Seen) -> None:
    with httpx.Client(base_url=url, timeout=30) as http:
        while not stop.is_set():
            t0 = time.monotonic()
            ok = http.get("/health").status_code == 200
            waited = time.monotonic() - t0
            with seen.lock:
                seen.polls += 1
                seen.slowest_poll = max(seen.slowest_poll, waited)
            if not ok:
                seen.fail("/health did not answer ok")
            stop.wait(POLL_S)


def sample_rss(pid: int, stop: threading.Event, seen: Seen) -> None:
    while not stop.is_set():
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                seen.rss_max = max(seen.rss_max, int(line.split()[1]) * 1024)
        stop.wait(0.25)


def run(args: argparse.Namespace) -> Seen:
    seen = Seen()
    t0 = time.monotonic()
    with httpx.Client(base_url=args.url, timeout=600) as http:
        idle = streamed(http)  # the idle server's answer, the reference
    print(f"the idle server answered the ordinary request in {time.monotonic() - t0:.0f} s "
          f"({idle[1]} tokens)")  # fmt: skip
    until = time.monotonic() + args.seconds
    stop = threading.Event()
    watchers = [
        threading.Thread(target=poll_health, args=(args.url, stop, seen), daemon=True),
        threading.Thread(target=sample_rss, args=(args.pid, stop, seen), daemon=True),
    ]
    clients: list[tuple[Callable[..., None], tuple]] = [
        *((hostile_client, (args.url, until, seen, 2 * c, args.draft_max)) for c in range(4)),
        (ordinary_client, (args.url, until, seen, idle)),
    ]  # fmt: skip
    workers = [threading.Thread(target=f, args=a, daemon=True) for f, a in clients]
    for thread in watchers + workers:
        thread.start()
    for thread in workers:
        thread.join()
    print(f"requests were sent for {args.seconds:.0f} s; the last one sent ended "
          f"{time.monotonic() - until:.0f} s later")  # fmt: skip
    stop.set()
    for thread in watchers:
        thread.join(5)
    return seen


def report(seen: Seen, weights: int) -> bool:
    limit = weights + RSS_ALLOWANCE
    checks = [
        (seen.slowest_poll <= SLOW_POLL_S,
         f"/health: {seen.polls} polls, the slowest waited {seen.slowest_poll * 1000:.0f} ms "
         f"(bound {SLOW_POLL_S * 1000:.0f} ms)"),
        (0 < seen.rss_max <= limit,
         f"RSS: at most {seen.rss_max / 2**30:.2f} GiB (bound {limit / 2**30:.2f} GiB: "
         f"{weights / 2**30:.2f} GiB of weights + 1.5 GiB)"),
        (sum(n for (_, verdict), n in seen.outcomes.items() if verdict == "FAILED") == 0,
         f"hostile requests: {sum(seen.outcomes.values())}, each a 400 naming its field or a "
         "bounded answer"),
        (bool(seen.ordinary) and all(seen.ordinary),
         f"ordinary answers under load: {len(seen.ordinary)}, "
         f"{sum(seen.ordinary)} token for token the idle server's"),
    ]  # fmt: skip
    for (name, verdict), n in sorted(seen.outcomes.items()):
        print(f"  {n:4d} x {name}: {verdict}")
    for ok, line in checks:
        print(f"{'ok  ' if ok else 'FAIL'} {line}")
    for failure in sorted(set(seen.failures))[:10]:
        print(f"failure: {failure}")
    return all(ok for ok, _ in checks)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--pid", type=int, required=True, help="the server's process id (its RSS)")
    ap.add_argument("--weights", nargs="+", required=True, help="the pair's GGUF files")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--draft-max", type=int, default=16, help="the server's --draft-max")
    args = ap.parse_args()
    weights = sum(os.path.getsize(path) for path in args.weights)
    seen = run(args)
    return 0 if report(seen, weights) else 1


if __name__ == "__main__":
    raise SystemExit(main())
