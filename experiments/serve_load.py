"""Load a running ``localspec serve``: N concurrent streaming clients, M requests each.

    python experiments/serve_load.py --url http://127.0.0.1:8080 --clients 4 --requests 5

Bounded in count (clients x requests) and in time (--deadline seconds; what is still
running then counts as failed). Prints requests/s, time to first token and end-to-end
latency (p50/p95), generated tokens/s, acceptance (from the final chunk's ``timings``)
and the number of failed requests.
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import httpx

PROMPTS = [
    "Write a Python function that reverses a string.",
    "Explain what a hash table is in two sentences.",
    "List three uses of the sort command.",
    "def fibonacci(n):",
]


def one_request(url: str, key: str | None, prompt: str, max_tokens: int, timeout: float) -> dict:
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    start = time.monotonic()
    first = None
    timings: dict = {}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, headers=headers,
                      timeout=timeout) as r:  # fmt: skip
        if r.status_code != 200:
            r.read()
            raise RuntimeError(f"HTTP {r.status_code}: {r.text[:200]}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            if chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                first = first or time.monotonic()
            timings = chunk.get("timings", timings)
    end = time.monotonic()
    return {"ttft": (first or end) - start, "latency": end - start, "timings": timings}


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--requests", type=int, default=5, help="per client")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--deadline", type=float, default=300.0, help="seconds for the whole run")
    args = ap.parse_args()
    if not (1 <= args.clients <= 64 and 1 <= args.requests <= 1000):
        ap.error("--clients must be 1..64 and --requests 1..1000")

    results: list[dict] = []
    failures: list[str] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + args.deadline

    def client(c: int) -> None:
        for r in range(args.requests):
            left = stop_at - time.monotonic()
            if left <= 0:
                with lock:
                    failures.append("deadline reached")
                continue
            prompt = PROMPTS[(c + r) % len(PROMPTS)]
            try:
                res = one_request(args.url, args.api_key, prompt, args.max_tokens, left)
                with lock:
                    results.append(res)
            except Exception as err:  # counted and reported, the run goes on
                with lock:
                    failures.append(str(err))

    began = time.monotonic()
    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, stop_at - time.monotonic()) + 5)
    wall = time.monotonic() - began

    tokens = sum(r["timings"].get("predicted_n", 0) for r in results)
    drafted = sum(r["timings"].get("draft_n", 0) for r in results)
    accepted = sum(r["timings"].get("draft_n_accepted", 0) for r in results)
    ttft = [r["ttft"] for r in results]
    lat = [r["latency"] for r in results]
    print(f"requests: {len(results)} ok, {len(failures)} failed in {wall:.1f}s "
          f"({len(results) / wall:.2f} req/s)")  # fmt: skip
    print(f"TTFT     p50 {pct(ttft, 0.5) * 1000:.0f} ms  p95 {pct(ttft, 0.95) * 1000:.0f} ms")
    print(f"latency  p50 {pct(lat, 0.5) * 1000:.0f} ms  p95 {pct(lat, 0.95) * 1000:.0f} ms")
    print(f"tokens   {tokens} generated, {tokens / wall:.1f} tok/s overall")
    rate = accepted / drafted if drafted else 0.0
    print(f"drafts   {drafted} drafted, {accepted} accepted (acceptance {rate:.0%})")
    for reason in sorted(set(failures))[:5]:
        print(f"failure: {reason}")


if __name__ == "__main__":
    main()
