"""A hostile minute: does a busy ``localspec serve`` stay up, answer ``/health`` at once,
keep its memory, and give every ordinary request the answer it gives when idle?
(docs/serve.md, Several at once and Limits)

    python experiments/serve_hostile.py --url http://127.0.0.1:8080 --pid PID \\
        [--seconds 60] [--clients 8] [--api-key KEY]

First every ordinary request (greedy chat answers, and fill-in-the-middle completions where
the target has FIM tokens) runs once on the idle server: its answer is the reference. Then,
for ``--seconds``, ``--clients`` clients each alternate an ordinary request with a hostile
one: a request whose client leaves while it waits, a body sent slowly, a body cut off
mid-way, a body that stops arriving (the server's ``--body-timeout`` answers it), a body
past ``--max-body``, a prompt past the context, and bodies that are not JSON, are nested
too deep or are not UTF-8. ``/health`` is polled every 100 ms, and the server's RSS
(``/proc/PID/status``) is read before and after the minute and sampled during it.

It prints one JSON summary: the requests by kind and outcome, the slowest ``/health``
poll, the RSS before, after and at most, and how many ordinary answers were the idle
server's. It passes (exit 0) when no poll waited over 1 s, the RSS grew by less than
300 MB, no hostile request got a 5xx or an answer other than its own (a 4xx naming why, or
an answer for the slow body), and every ordinary answer was the idle one. Greedy answers
are identical under load only with batch-invariant kernels: serve with ``--exact``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import httpx

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
POLL_S, SLOW_POLL_S = 0.1, 1.0
RSS_GROWTH = 300 * 10**6  # bytes the RSS may grow by over the minute
CHATS = [
    "Write a Python function that tells whether a number is prime.",
    "Name three uses of a hash map.",
    "Rename load to read in: def load(path): return open(path).read()",
]
FIMS = [
    ("def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"),
    ("class Point:\n    def __init__(self, x, y):\n        ", "\n\n    def norm(self):\n"),
]
STALL_WAIT_S = 45.0  # longest a stalled body waits for the server's 408


def ordinary_requests() -> list[tuple[str, str, dict]]:
    """``(name, path, body)``: greedy, short, the same every time."""
    chats = [(f"chat {i}", CHAT, {"messages": [{"role": "user", "content": text}],
              "max_tokens": 32, "temperature": 0}) for i, text in enumerate(CHATS)]  # fmt: skip
    fims = [(f"fim {i}", COMPLETIONS, {"prompt": prefix, "suffix": suffix, "max_tokens": 24,
             "temperature": 0}) for i, (prefix, suffix) in enumerate(FIMS)]  # fmt: skip
    return chats + fims


def answer_of(r: httpx.Response) -> object:
    """What an ordinary answer must repeat: its text, finish reason and token count (or its
    status and error code where it was refused)."""
    if r.status_code != 200:
        return [r.status_code, r.json().get("error", {}).get("code")]
    body = r.json()
    choice = body["choices"][0]
    text = choice["message"]["content"] if "message" in choice else choice["text"]
    return [text, choice["finish_reason"], body["usage"]["completion_tokens"]]


@dataclass
class Seen:
    """What the minute saw, filled by its threads."""

    outcomes: Counter = field(default_factory=Counter)  # (kind, outcome) -> requests
    failures: list[str] = field(default_factory=list)
    ordinary: Counter = field(default_factory=Counter)  # identical / differing
    polls: int = 0
    slowest_poll: float = 0.0
    polls_failed: int = 0
    rss_max: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def count(self, kind: str, outcome: str, failure: str = "") -> None:
        with self.lock:
            self.outcomes[(kind, outcome)] += 1
            if failure:
                self.failures.append(f"{kind}: {failure}")


@dataclass
class Server:
    url: str
    headers: dict[str, str]

    @property
    def address(self) -> tuple[str, int]:
        parts = urlsplit(self.url)
        return parts.hostname or "127.0.0.1", parts.port or 80

    def raw(self, body: bytes, *, declared: int | None = None, pieces: int = 1,
            gap_s: float = 0.0, stop_after: int | None = None, close: bool = False,
            wait_s: float = 60.0) -> int | None:  # fmt: skip
        """POST ``body`` to the chat endpoint by hand: declared as ``declared`` bytes, sent
        in ``pieces`` ``gap_s`` apart, only its first ``stop_after`` bytes, the connection
        closed at once with ``close``. The answer's status (None: none came)."""
        host, port = self.address
        sent = body if stop_after is None else body[:stop_after]
        length = len(body) if declared is None else declared
        head = (f"POST {CHAT} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                "Content-Type: application/json\r\nConnection: close\r\n"
                + "".join(f"{k}: {v}\r\n" for k, v in self.headers.items())
                + f"Content-Length: {length}\r\n\r\n")  # fmt: skip
        with socket.create_connection((host, port), timeout=wait_s) as conn:
            conn.sendall(head.encode())
            size = -(-len(sent) // pieces) or 1
            try:
                for i in range(0, len(sent), size):
                    conn.sendall(sent[i : i + size])
                    time.sleep(gap_s)
            except OSError:  # the server answered before the body was all sent
                pass
            if close:
                return None
            return _status(conn)


def _status(conn: socket.socket) -> int | None:
    """The status of the answer the connection gives (read to its end), None without one."""
    data = b""
    try:
        while chunk := conn.recv(65536):
            data += chunk
    except OSError:  # reset, or it timed out: whatever came is what there is
        pass
    line = data.split(b"\r\n", 1)[0].split()
    return int(line[1]) if len(line) > 1 and line[1].isdigit() else None


def small_chat(tokens: int = 8) -> bytes:
    return json.dumps({"messages": [{"role": "user", "content": "Say hi."}],
                       "max_tokens": tokens, "temperature": 0}).encode()  # fmt: skip


def leaves_while_waiting(server: Server) -> tuple[str, str]:
    """A request for many tokens whose client gives up after 0.3 s."""
    body = {"messages": [{"role": "user", "content": CHATS[0]}], "max_tokens": 512}
    try:
        r = httpx.post(server.url + CHAT, json=body, headers=server.headers, timeout=0.3)
    except httpx.TimeoutException:
        return "left", ""
    return str(r.status_code), "" if r.status_code < 500 else r.text[:160]


def cut_off(server: Server) -> tuple[str, str]:
    """A client that hangs up halfway through its body: nothing to answer, the server must
    only stay up (its log: one line)."""
    server.raw(small_chat(), stop_after=20, close=True)
    return "cut", ""


def expecting(*statuses: int) -> Callable[[int | None], tuple[str, str]]:
    def judge(status: int | None) -> tuple[str, str]:
        outcome = "no answer" if status is None else str(status)
        return outcome, "" if status in statuses else f"got {outcome}, not {statuses}"

    return judge


def hostile_requests() -> list[tuple[str, Callable[[Server], tuple[str, str]]]]:
    """``(kind, send)``: each sends one hostile request and says its outcome and, where it
    is not what the server owes it, why."""
    nested = b"[" * 200_000
    return [
        ("leaves while waiting", leaves_while_waiting),
        ("body sent slowly", lambda s: expecting(200)(s.raw(small_chat(), pieces=8, gap_s=0.25))),
        ("body cut off mid-way", cut_off),
        ("body that stops arriving",
         lambda s: expecting(408)(s.raw(small_chat(), stop_after=20, wait_s=STALL_WAIT_S))),
        ("body past --max-body",
         lambda s: expecting(413)(s.raw(small_chat() + b" " * (2 << 20)))),
        ("prompt past the context",
         lambda s: expecting(400)(s.raw(json.dumps({"messages": [{"role": "user",
                   "content": "word " * 150_000}], "max_tokens": 8}).encode()))),  # fmt: skip
        ("not JSON", lambda s: expecting(400)(s.raw(b'{"messages": ['))),
        ("JSON nested too deep", lambda s: expecting(400)(s.raw(nested))),
        ("not UTF-8", lambda s: expecting(400)(s.raw(b'{"messages": "\xff\xfe"}'))),
    ]  # fmt: skip


def client(server: Server, until: float, seen: Seen, start: int, idle: dict) -> None:
    """Alternate an ordinary request (compared with the idle answer) and a hostile one."""
    ordinary = [req for req in ordinary_requests() if req[0] in idle]
    hostile = hostile_requests()
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=600) as http:
        for i in itertools.count(start):
            if time.monotonic() >= until:
                return
            name, path, body = ordinary[i % len(ordinary)]
            same = answer_of(http.post(path, json=body)) == idle[name]
            with seen.lock:
                seen.ordinary["identical" if same else "differing"] += 1
                if not same:
                    seen.failures.append(f"{name}: the answer differs from the idle one")
            kind, send = hostile[i % len(hostile)]
            try:
                outcome, why = send(server)
            except OSError as err:  # refused or reset before any answer
                outcome, why = type(err).__name__, str(err)
            seen.count(kind, outcome, why)


def poll_health(server: Server, stop: threading.Event, seen: Seen) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as http:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                ok = http.get("/health").status_code == 200
            except httpx.TransportError:
                ok = False
            waited = time.monotonic() - t0
            with seen.lock:
                seen.polls += 1
                seen.slowest_poll = max(seen.slowest_poll, waited)
                seen.polls_failed += not ok
            stop.wait(POLL_S)


def rss(pid: int) -> int:
    """The process's resident memory in bytes (``VmRSS``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def sample_rss(pid: int, stop: threading.Event, seen: Seen) -> None:
    while not stop.is_set():
        seen.rss_max = max(seen.rss_max, rss(pid))
        stop.wait(0.25)


def idle_answers(server: Server) -> tuple[dict, dict]:
    """Each ordinary request's answer on the idle server, and those it refused (a target
    without FIM tokens refuses a suffix): those are left out of the minute."""
    answers, refused = {}, {}
    with httpx.Client(base_url=server.url, headers=server.headers, timeout=600) as http:
        for name, path, body in ordinary_requests():
            r = http.post(path, json=body)
            (answers if r.status_code == 200 else refused)[name] = answer_of(r)
    return answers, refused


def run(args: argparse.Namespace) -> dict:
    server = Server(args.url, {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {})
    idle, refused = idle_answers(server)
    seen = Seen()
    rss_before = rss(args.pid)
    until = time.monotonic() + args.seconds
    stop = threading.Event()
    watchers = [
        threading.Thread(target=poll_health, args=(server, stop, seen), daemon=True),
        threading.Thread(target=sample_rss, args=(args.pid, stop, seen), daemon=True),
    ]
    clients = [threading.Thread(target=client, args=(server, until, seen, c, idle), daemon=True)
               for c in range(args.clients)]  # fmt: skip
    t0 = time.monotonic()
    for thread in watchers + clients:
        thread.start()
    for thread in clients:
        thread.join()
    ran_s = time.monotonic() - t0
    time.sleep(1.0)  # the last requests' memory handed back
    stop.set()
    for thread in watchers:
        thread.join(5)
    return summary(args, seen, idle, refused, rss_before, rss(args.pid), ran_s)


def summary(args: argparse.Namespace, seen: Seen, idle: dict, refused: dict,
            rss_before: int, rss_after: int, ran_s: float) -> dict:  # fmt: skip
    hostile_failed = len(seen.failures) - seen.ordinary["differing"]
    checks = {
        "health_polls_within_1s": seen.slowest_poll <= SLOW_POLL_S and seen.polls_failed == 0,
        "rss_growth_under_300MB": rss_after - rss_before < RSS_GROWTH,
        "ordinary_answers_identical": seen.ordinary["differing"] == 0 and bool(seen.ordinary),
        "hostile_requests_answered_as_owed": hostile_failed == 0,
    }
    requests: dict[str, dict[str, int]] = {}
    for (kind, outcome), n in sorted(seen.outcomes.items()):
        requests.setdefault(kind, {})[outcome] = n
    return {
        "url": args.url,
        "seconds": args.seconds,
        "ran_s": round(ran_s, 1),
        "clients": args.clients,
        "ordinary": {
            "kinds": sorted(idle),
            "refused_when_idle": refused,
            "identical": seen.ordinary["identical"],
            "differing": seen.ordinary["differing"],
        },
        "hostile": requests,
        "health": {
            "polls": seen.polls,
            "failed": seen.polls_failed,
            "slowest_ms": round(seen.slowest_poll * 1000, 1),
        },
        "rss_mb": {
            "before": round(rss_before / 1e6, 1),
            "after": round(rss_after / 1e6, 1),
            "max": round(max(seen.rss_max, rss_after) / 1e6, 1),
            "growth": round((rss_after - rss_before) / 1e6, 1),
        },
        "failures": sorted(set(seen.failures))[:20],
        "checks": checks,
        "passed": all(checks.values()),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--pid", type=int, required=True, help="the server's process id (its RSS)")
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--api-key", help="the key to send, where the server has keys")
    args = ap.parse_args()
    result = run(args)
    print(json.dumps(result, indent=2))
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
