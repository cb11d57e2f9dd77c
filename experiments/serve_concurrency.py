"""What an editor's completions and a chat feel on one OpenAI-compatible server at once.

Every request is greedy (temperature 0) and streamed; every streamed chunk is timed.

- ``fim-during-chat``: a fill-in-the-middle (FIM) request on an idle server (``--idle-repeats``
  times, median), then the same FIM request sent once a long chat answer (``--chat-tokens``,
  default 500) has streamed ``--fim-after`` chunks (default 20). For the FIM: time to first
  token and time to its end; for the chat: its time and tokens. The figure is the ratio of
  FIM-during-chat to FIM-idle (the goal: at most 2x).
- ``clients``: the requests of a prompt file (chat and FIM, mixed) sent by one client one after
  another (``serial``, which is also K=1), then by K concurrent clients for each K of
  ``--clients`` (each client sends its contiguous share of the list one after another).
  Per run: completion tokens / wall time, time to first token and latency (p50, p90), and
  starvation: per request the longest gap between two of its chunks, and its share of all the
  chunks the server streamed while it ran (from its sending to its end, so that queueing
  counts; a fair server gives each running client at least 1/(2K); ``starved`` counts the
  requests below) and while it streamed (first to last chunk); ``same text`` counts the
  answers equal to the serial run's.

It starts the server itself (and stops it at the end, on Ctrl-C or on an error), or uses one
already running (``--url``):

- ``--server localspec [--parallel N]``: ``localspec serve --port P [--parallel N]`` with
  ``LOCALSPEC_HISTORY=0`` and its default models; without ``--parallel`` the server's own
  default (``auto``; a build without the flag needs it left out);
- ``--server llama --parallel N --spec ngram-mod|draft|none``: llama.cpp's ``llama-server`` with
  the default target (``-np N -c 4096*N -t 2``, N 1 by default), for ``draft`` the draft model
  (``--spec-type draft-simple``); FIM then goes to its ``/infill``.

llama-server batches a request only with requests of its own task type, so an ``/infill``
waits for a chat that streams (and the reverse): ``--fim-endpoint prompt`` sends FIM as a plain
``/v1/completions`` request with the FIM tokens written out instead (``--fim-template``,
Qwen2.5-Coder's by default), which shares the chat's batches.

``--server-arg`` (repeatable) passes more arguments to the server; its log is written beside
``--out``. Run it with the project's virtual environment (it starts ``python -m localspec``)::

    python experiments/serve_concurrency.py fim-during-chat --server localspec --parallel 2 \\
        --out /work/results/concurrency/ls-np2-fim.json
    python experiments/serve_concurrency.py clients --clients 1,2,4 --server llama \\
        --parallel 4 --spec ngram-mod --out /work/results/concurrency/llama-np4-ngram.json
    python experiments/serve_concurrency.py clients --url http://127.0.0.1:8080 --clients 2

The prompt file (``--prompts``) holds one JSON object a line:
``{"kind": "chat", "messages": [...], "max_tokens": 200}`` or
``{"kind": "fim", "prefix": "...", "suffix": "...", "max_tokens": 48}``. Each distinct prompt
is sent once with ``max_tokens`` 1 before measuring (``--no-warmup`` to skip), so that every
measured run finds the same prompt caches. ``--smoke`` caps answers at 16 tokens (chat) and
8 (FIM), the ``clients`` list at 4 requests and the long chat at 48 tokens, for a quick check.
The output is a JSON of every request (its chunks' times included) and a summary; a markdown
table goes to stdout.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

RESULTS = Path("/work/results/concurrency")
MODELS = Path.home() / ".cache" / "localspec" / "models"
TARGET_MODEL = MODELS / "qwen2.5-coder-1.5b.gguf"
DRAFT_MODEL = MODELS / "qwen2.5-coder-0.5b.gguf"
LLAMA_SERVER = Path("/work/native/build/bin/llama-server")
SMOKE_TOKENS = {"chat": 16, "fim": 8}
SMOKE_REQUESTS = 4
SMOKE_LONG_CHAT = 48
SMOKE_FIM_AFTER = 8
SPEC_ARGS = {"none": [], "ngram-mod": ["--spec-type", "ngram-mod"]}
QWEN_FIM = "<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>"

Window = tuple[float, float]  # seconds from a run's start


# --- prompts -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    id: int  # its place in the prompt file, from 0
    kind: str  # "chat" or "fim"
    max_tokens: int
    messages: tuple[dict[str, str], ...] = ()
    prefix: str = ""
    suffix: str = ""


def load_prompts(path: Path) -> list[Prompt]:
    prompts: list[Prompt] = []
    for number, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        obj = json.loads(line)
        kind = obj["kind"]
        if kind == "chat":
            prompt = Prompt(len(prompts), kind, obj.get("max_tokens", 200), tuple(obj["messages"]))
        elif kind == "fim":
            tokens = obj.get("max_tokens", 48)
            prompt = Prompt(len(prompts), kind, tokens, prefix=obj["prefix"], suffix=obj["suffix"])
        else:
            raise ValueError(f"{path}:{number + 1}: kind must be chat or fim, not {kind!r}")
        prompts.append(prompt)
    return prompts


def capped(prompt: Prompt, caps: dict[str, int] | None) -> Prompt:
    if caps is None:
        return prompt
    return replace(prompt, max_tokens=min(prompt.max_tokens, caps[prompt.kind]))


def pick(prompts: Sequence[Prompt], kind: str, index: int) -> Prompt:
    of_kind = [p for p in prompts if p.kind == kind]
    if not of_kind:
        raise SystemExit(f"the prompt file has no {kind} prompt")
    return of_kind[index % len(of_kind)]


# --- requests ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    # "completions": /v1/completions with a suffix; "infill": llama-server's /infill;
    # "prompt": /v1/completions with the FIM prompt written out (``fim_template``)
    fim_endpoint: str
    timeout: float  # seconds a whole request may take
    fim_template: str = QWEN_FIM


def request_of(prompt: Prompt, target: Target) -> tuple[str, dict[str, Any]]:
    """The path and body of a prompt's streamed, greedy request."""
    usage = {"stream_options": {"include_usage": True}}
    common = {"max_tokens": prompt.max_tokens, "temperature": 0, "stream": True}
    if prompt.kind == "chat":
        return "/v1/chat/completions", {"messages": list(prompt.messages), **common, **usage}
    if target.fim_endpoint == "infill":  # llama-server's own shape (n_predict, no usage)
        body = {"input_prefix": prompt.prefix, "input_suffix": prompt.suffix}
        return "/infill", {**body, "n_predict": prompt.max_tokens, "temperature": 0, "stream": True}
    if target.fim_endpoint == "prompt":  # the server parses the template's FIM tokens
        text = target.fim_template.format(prefix=prompt.prefix, suffix=prompt.suffix)
        return "/v1/completions", {"prompt": text, **common, **usage}
    return "/v1/completions", {"prompt": prompt.prefix, "suffix": prompt.suffix, **common, **usage}


@dataclass
class Record:
    """One request: times in seconds from its run's start."""

    phase: str
    client: int
    prompt_id: int
    kind: str
    max_tokens: int
    sent: float
    first: float | None = None  # its first content chunk
    end: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    text: str = ""
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    tokens_predicted: int | None = None  # llama-server's /infill figure
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.end is not None

    @property
    def tokens(self) -> int:
        """Completion tokens: the server's count when it gives one, else the content chunks."""
        if self.usage and isinstance(self.usage.get("completion_tokens"), int):
            return self.usage["completion_tokens"]
        if self.timings and isinstance(self.timings.get("predicted_n"), int):
            return self.timings["predicted_n"]
        if self.tokens_predicted is not None:
            return self.tokens_predicted
        return len(self.chunk_times)

    @property
    def ttft(self) -> float | None:
        return None if self.first is None else self.first - self.sent

    @property
    def latency(self) -> float | None:
        return None if self.end is None else self.end - self.sent

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["chunk_times"] = [round(t, 4) for t in self.chunk_times]
        out.update(tokens=self.tokens, ttft=self.ttft, latency=self.latency)
        return out


class ServerError(Exception):
    """An error event in a stream."""


def sse_data(resp: http.client.HTTPResponse, sock: socket.socket, deadline: float) -> Iterator[str]:
    """The data of each server-sent event (its ``data:`` lines joined), until the stream ends."""
    lines: list[str] = []
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the request's time ran out")
        sock.settimeout(remaining)
        raw = resp.readline()
        if not raw:
            break
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:  # an event ends at a blank line
            if lines:
                yield "\n".join(lines)
            lines = []
        elif line.startswith("data:"):
            lines.append(line[6:] if line.startswith("data: ") else line[5:])
        # comments (":" pings) and other fields (event:, id:, retry:) carry nothing for us
    if lines:
        yield "\n".join(lines)


def event_text(event: dict[str, Any]) -> str:
    """The generated text of a chunk: chat's delta, a completion's text or /infill's content."""
    choices = event.get("choices")
    if choices:
        choice = choices[0]
        delta = choice.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        return text if isinstance(text, str) else ""
    content = event.get("content")
    return content if isinstance(content, str) else ""


def absorb(record: Record, pieces: list[str], event: dict[str, Any], at: float) -> None:
    if "error" in event:
        error = event["error"]
        raise ServerError(error.get("message", error) if isinstance(error, dict) else error)
    text = event_text(event)
    if text:
        if record.first is None:
            record.first = at
        record.chunk_times.append(at)
        pieces.append(text)
    if isinstance(event.get("usage"), dict):
        record.usage = event["usage"]
    if isinstance(event.get("timings"), dict):
        record.timings = event["timings"]
    if isinstance(event.get("tokens_predicted"), int):
        record.tokens_predicted = event["tokens_predicted"]


def read_stream(
    record: Record,
    pieces: list[str],
    events: Iterator[str],
    t0: float,
    on_chunk: Callable[[Record], None] | None,
) -> bool:
    """Absorb the events into the record; whether the stream came to its proper end."""
    for data in events:
        if data.strip() == "[DONE]":
            return True
        event = json.loads(data)
        absorb(record, pieces, event, time.monotonic() - t0)
        if on_chunk is not None:
            on_chunk(record)
        if event.get("stop") is True:  # /infill's last chunk (it sends no [DONE])
            return True
    return False


def stream(
    target: Target,
    prompt: Prompt,
    t0: float,
    phase: str,
    client: int,
    on_chunk: Callable[[Record], None] | None = None,
) -> Record:
    """Send one request and read its stream; failures end up in ``Record.error``."""
    path, body = request_of(prompt, target)
    record = Record(phase, client, prompt.id, prompt.kind, prompt.max_tokens, time.monotonic() - t0)
    deadline = time.monotonic() + target.timeout
    conn = http.client.HTTPConnection(target.host, target.port, timeout=target.timeout)
    pieces: list[str] = []
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    try:
        conn.request("POST", path, body=json.dumps(body), headers=headers)
        sock = conn.sock  # kept: the connection lets go of it once the answer closes it
        resp = conn.getresponse()
        if resp.status != 200:
            raise ServerError(f"HTTP {resp.status}: {resp.read(500).decode('utf-8', 'replace')}")
        if not read_stream(record, pieces, sse_data(resp, sock, deadline), t0, on_chunk):
            raise ServerError("the stream ended before its end ([DONE], or /infill's stop)")
    except (OSError, http.client.HTTPException, ValueError, ServerError) as err:
        record.error = f"{type(err).__name__}: {err}"
    finally:
        record.end = time.monotonic() - t0
        record.text = "".join(pieces)
        conn.close()
    return record


def warm_up(target: Target, prompts: Sequence[Prompt]) -> None:
    """Each distinct prompt once, one token long, so that every measured run finds it cached."""
    seen: set[int] = set()
    t0 = time.monotonic()
    for prompt in prompts:
        if prompt.id in seen:
            continue
        seen.add(prompt.id)
        record = stream(target, replace(prompt, max_tokens=1), t0, "warmup", 0)
        if record.error:
            raise SystemExit(f"warm-up request {prompt.id} failed: {record.error}")
    print(f"warm-up: {len(seen)} prompts in {time.monotonic() - t0:.1f} s", file=sys.stderr)


def join(threads: Sequence[threading.Thread]) -> None:
    for thread in threads:
        while thread.is_alive():  # a timed join leaves Ctrl-C to the main thread
            thread.join(0.5)


# --- statistics --------------------------------------------------------------------------


def quantile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between the closest ranks."""
    if not values:
        return None
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def max_gap(record: Record) -> float | None:
    times = record.chunk_times
    return max((b - a for a, b in zip(times, times[1:], strict=False)), default=None)


def windows(record: Record) -> tuple[Window | None, Window | None]:
    """From its sending to its end, as its client waits (queueing and prompt included), and
    from its first chunk to its last."""
    times = record.chunk_times
    request = None if record.end is None else (record.sent, record.end)
    return request, (times[0], times[-1]) if len(times) >= 2 else None


def share(record: Record, all_times: Sequence[float], window: Window) -> float:
    """Its chunks in the window / all the chunks the server streamed in it."""
    start, stop = window
    total = bisect.bisect_right(all_times, stop) - bisect.bisect_left(all_times, start)
    own = sum(start <= t <= stop for t in record.chunk_times)
    return own / total if total else 0.0


def running_mean(records: Sequence[Record], window: Window) -> float | None:
    """How many requests were in flight, on average, in the window."""
    start, stop = window
    if stop <= start:
        return None
    overlap = sum(
        max(0.0, min(stop, r.end) - max(start, r.sent)) for r in records if r.end is not None
    )
    return overlap / (stop - start)


def rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


# --- scenario: fim-during-chat -----------------------------------------------------------


def fim_beside_chat(
    target: Target, chat: Prompt, fim: Prompt, t0: float, after: int
) -> tuple[Record, Record]:
    """The chat streams; once it has ``after`` chunks (or has ended) the FIM goes out."""
    ready = threading.Event()
    done: list[Record] = []

    def on_chunk(record: Record) -> None:
        if len(record.chunk_times) >= after:
            ready.set()

    def run_chat() -> None:
        done.append(stream(target, chat, t0, "chat", 0, on_chunk))
        ready.set()

    thread = threading.Thread(target=run_chat, daemon=True)
    thread.start()
    while not ready.wait(0.5):
        pass
    fim_record = stream(target, fim, t0, "fim-during-chat", 1)
    join([thread])
    return done[0], fim_record


def run_fim_during_chat(
    target: Target, prompts: Sequence[Prompt], args: argparse.Namespace
) -> list[Record]:
    chat = replace(pick(prompts, "chat", args.chat_index), max_tokens=args.chat_tokens)
    fim = replace(pick(prompts, "fim", args.fim_index), max_tokens=args.fim_tokens)
    if args.warmup:
        warm_up(target, [chat, fim])
    t0 = time.monotonic()
    records = [stream(target, fim, t0, "fim-idle", 0) for _ in range(args.idle_repeats)]
    for _ in range(args.rounds):
        records.extend(fim_beside_chat(target, chat, fim, t0, args.fim_after))
    return records


def figures(records: Sequence[Record]) -> dict[str, Any]:
    """Medians of a set of requests: count, time to first token, latency, tokens."""
    return {
        "n": len(records),
        "ttft": median([r.ttft for r in records]),
        "end": median([r.latency for r in records]),
        "tokens": median([r.tokens for r in records]),
    }


def summarize_fim(records: Sequence[Record]) -> dict[str, Any]:
    def of(phase: str) -> list[Record]:
        return [r for r in records if r.phase == phase and r.ok]

    idle, during, chats = figures(of("fim-idle")), figures(of("fim-during-chat")), of("chat")
    pairs = list(zip(chats, of("fim-during-chat"), strict=False))
    return {
        "fim_idle": idle,
        "fim_during_chat": during,
        "chat": figures(chats),
        "ratio_ttft": ratio(during["ttft"], idle["ttft"]),
        "ratio_end": ratio(during["end"], idle["end"]),
        # each FIM went out, and ended, while its chat still streamed
        "overlapped": bool(pairs)
        and all(c.end is not None and f.end is not None and f.end <= c.end for c, f in pairs),
        "errors": [r.error for r in records if r.error],
    }


def table_fim(summary: dict[str, Any]) -> str:
    def cell(value: float | None, unit: str = "") -> str:
        return "-" if value is None else f"{value:.2f}{unit}"

    idle, during, chat = summary["fim_idle"], summary["fim_during_chat"], summary["chat"]
    rows = [
        "| FIM | n | TTFT s | end s | tokens |",
        "|---|---|---|---|---|",
        f"| idle (median) | {idle['n']} | {cell(idle['ttft'])} | {cell(idle['end'])} "
        f"| {cell(idle['tokens'])} |",
        f"| during chat | {during['n']} | {cell(during['ttft'])} | {cell(during['end'])} "
        f"| {cell(during['tokens'])} |",
        f"| ratio (goal <= 2x) | | {cell(summary['ratio_ttft'], 'x')} "
        f"| {cell(summary['ratio_end'], 'x')} | |",
        "",
        f"chat: {cell(chat['tokens'])} tokens in {cell(chat['end'])} s; "
        f"FIM inside the chat's stream: {summary['overlapped']}; "
        f"errors: {len(summary['errors'])}",
    ]
    return "\n".join(rows)


# --- scenario: clients -------------------------------------------------------------------


def request_list(prompts: Sequence[Prompt], count: int | None) -> list[Prompt]:
    if not count:
        return list(prompts)
    return [prompts[i % len(prompts)] for i in range(count)]


def shares_of(requests: Sequence[Prompt], clients: int) -> list[list[Prompt]]:
    """Contiguous shares, so that each client gets chat and FIM alike."""
    n = len(requests)
    return [list(requests[c * n // clients : (c + 1) * n // clients]) for c in range(clients)]


def run_phase(target: Target, requests: Sequence[Prompt], clients: int, name: str) -> list[Record]:
    t0 = time.monotonic()
    results: list[list[Record]] = [[] for _ in range(clients)]

    def client(c: int, share: list[Prompt]) -> None:
        for prompt in share:
            results[c].append(stream(target, prompt, t0, name, c))

    threads = [
        threading.Thread(target=client, args=(c, share), daemon=True)
        for c, share in enumerate(shares_of(requests, clients))
    ]
    for thread in threads:
        thread.start()
    join(threads)
    return [record for per_client in results for record in per_client]


def phases_of(clients: Sequence[int]) -> list[tuple[str, int]]:
    """``serial`` (K=1) first, then every K > 1 asked for."""
    return [("serial", 1)] + [(f"clients-{k}", k) for k in dict.fromkeys(clients) if k > 1]


def run_clients(
    target: Target, requests: Sequence[Prompt], args: argparse.Namespace
) -> list[Record]:
    if args.warmup:
        warm_up(target, requests)
    records: list[Record] = []
    for name, k in phases_of(args.clients):
        print(f"{name}: {len(requests)} requests from {k} client(s)", file=sys.stderr)
        records.extend(run_phase(target, requests, k, name))
    return records


def run_fresh(
    args: argparse.Namespace, requests: Sequence[Prompt], out: Path
) -> tuple[list[Record], dict[str, Any]]:
    """``run_clients`` with each phase on a server started for it: nothing a server keeps
    across requests (its caches, what its drafters learned from earlier answers) carries
    from one phase to the next, which send the same requests."""
    records: list[Record] = []
    facts: dict[str, Any] = {}
    for name, k in phases_of(args.clients):
        log = out.with_suffix(f".{name}.server.log")
        with served(args, log) as (host, port, phase_facts):
            target = Target(host, port, args.fim_endpoint, args.timeout, args.fim_template)
            facts = {**phase_facts, **server_facts(host, port)}
            if args.warmup:
                warm_up(target, requests)
            print(f"{name}: {len(requests)} requests from {k} client(s)", file=sys.stderr)
            records.extend(run_phase(target, requests, k, name))
    return records, facts


def starvation(records: Sequence[Record]) -> list[dict[str, Any]]:
    """Per request: its longest gap between two chunks, its share of the server's chunks
    while it ran (``share``: while its client waited; ``stream_share``: while it streamed)
    and how many requests ran meanwhile on average."""
    all_times = sorted(t for r in records for t in r.chunk_times)
    rows = []
    for r in records:
        request, streamed = windows(r)
        rows.append(
            {
                "client": r.client,
                "prompt_id": r.prompt_id,
                "kind": r.kind,
                "max_gap": rounded(max_gap(r)),
                "share": rounded(share(r, all_times, request)) if request else None,
                "stream_share": rounded(share(r, all_times, streamed)) if streamed else None,
                "running": rounded(running_mean(records, request), 2) if request else None,
            }
        )
    return rows


def summarize_phase(records: Sequence[Record], clients: int, serial: Sequence[Record]) -> dict:
    ok = [r for r in records if r.ok]
    wall = max((r.end or 0.0) for r in records) - min(r.sent for r in records)
    tokens = sum(r.tokens for r in ok)
    per_request = starvation(records)
    gaps = [p["max_gap"] for p in per_request if p["max_gap"] is not None]
    shares = [p["share"] for p in per_request if p["share"] is not None]
    stream_shares = [p["stream_share"] for p in per_request if p["stream_share"] is not None]
    floor = 1 / (2 * clients)
    ttfts = [r.ttft for r in ok if r.ttft is not None]
    latencies = [r.latency for r in ok if r.latency is not None]
    serial_text = {r.prompt_id: r.text for r in serial if r.ok}
    return {
        "clients": clients,
        "requests": len(records),
        "errors": len(records) - len(ok),
        "tokens": tokens,
        "wall": rounded(wall),
        "throughput": rounded(tokens / wall if wall else None),
        "ttft_p50": rounded(quantile(ttfts, 0.5)),
        "ttft_p90": rounded(quantile(ttfts, 0.9)),
        "latency_p50": rounded(quantile(latencies, 0.5)),
        "latency_p90": rounded(quantile(latencies, 0.9)),
        "max_gap": max(gaps, default=None),
        "min_share": min(shares, default=None),
        "min_stream_share": min(stream_shares, default=None),
        "share_floor": rounded(floor),
        "starved": sum(s < floor for s in shares),
        "same_text_as_serial": sum(serial_text.get(r.prompt_id) == r.text for r in ok),
        "per_request": per_request,
        "error_messages": [r.error for r in records if r.error],
    }


def summarize_clients(records: Sequence[Record], args: argparse.Namespace) -> dict[str, Any]:
    serial = [r for r in records if r.phase == "serial"]
    return {
        name: summarize_phase([r for r in records if r.phase == name], k, serial)
        for name, k in phases_of(args.clients)
        if any(r.phase == name for r in records)
    }


def table_clients(summary: dict[str, Any]) -> str:
    def cell(value: float | None, digits: int = 2) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    rows = [
        "| run | K | req | err | tokens | wall s | tok/s | TTFT p50/p90 s | latency p50/p90 s "
        "| max gap s | min share (floor) | min stream share | starved | same text |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, s in summary.items():
        rows.append(
            f"| {name} | {s['clients']} | {s['requests']} | {s['errors']} | {s['tokens']} "
            f"| {cell(s['wall'])} | {cell(s['throughput'])} "
            f"| {cell(s['ttft_p50'])} / {cell(s['ttft_p90'])} "
            f"| {cell(s['latency_p50'])} / {cell(s['latency_p90'])} | {cell(s['max_gap'])} "
            f"| {cell(s['min_share'])} ({cell(s['share_floor'])}) "
            f"| {cell(s['min_stream_share'])} | {s['starved']} "
            f"| {s['same_text_as_serial']}/{s['requests'] - s['errors']} |"
        )
    return "\n".join(rows)


# --- servers -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def localspec_command(args: argparse.Namespace, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "localspec", "serve", "--port", str(port)]
    if args.parallel is not None:  # else the server's own default (auto)
        cmd += ["--parallel", str(args.parallel)]
    return cmd + args.server_arg


def llama_command(args: argparse.Namespace, port: int) -> list[str]:
    cmd = [str(args.llama_server), "-m", str(args.model), "--host", "127.0.0.1"]
    slots = args.parallel or 1
    cmd += ["--port", str(port), "-np", str(slots), "-c", str(4096 * slots)]
    cmd += ["-t", str(args.threads)]
    if args.spec == "draft":  # -md alone leaves the type to the draft's metadata: name it
        cmd += ["-md", str(args.draft_model), "--spec-type", "draft-simple"]
    else:
        cmd += SPEC_ARGS[args.spec]
    return cmd + args.server_arg


def healthy(host: str, port: int) -> bool:
    conn = http.client.HTTPConnection(host, port, timeout=5)
    try:
        conn.request("GET", "/health")
        resp = conn.getresponse()
        body = resp.read()
        return resp.status == 200 and json.loads(body or b"{}").get("status") == "ok"
    except (OSError, http.client.HTTPException, ValueError):
        return False
    finally:
        conn.close()


def wait_healthy(host: str, port: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not healthy(host, port):
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server was not healthy after {timeout:.0f} s")
        time.sleep(0.5)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group (its own session), SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait)
            return


@contextlib.contextmanager
def served(args: argparse.Namespace, log_path: Path) -> Iterator[tuple[str, int, dict]]:
    """``(host, port, facts)`` of the server to measure, started here unless ``--url``."""
    if args.url:
        url = urllib.parse.urlsplit(args.url)
        host, port = url.hostname or "127.0.0.1", url.port or 80
        if not healthy(host, port):
            raise SystemExit(f"{args.url}/health does not answer 200 {{'status': 'ok'}}")
        yield host, port, {"url": args.url}
        return
    port = free_port()
    cmd = localspec_command(args, port) if args.server == "localspec" else llama_command(args, port)
    env = {**os.environ, "LOCALSPEC_HISTORY": "0"} if args.server == "localspec" else None
    print("starting: " + " ".join(cmd), file=sys.stderr)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            started = time.monotonic()
            try:
                wait_healthy("127.0.0.1", port, proc, args.start_timeout)
            except RuntimeError as err:
                tail = log_path.read_text(errors="replace").splitlines()[-15:]
                raise SystemExit("\n".join([f"{err}; the end of {log_path}:", *tail])) from None
            load = round(time.monotonic() - started, 1)
            print(f"healthy after {load} s (log: {log_path})", file=sys.stderr)
            yield "127.0.0.1", port, {"cmd": cmd, "log": str(log_path), "load_s": load}
        finally:
            stop(proc)


def get_json(host: str, port: int, path: str) -> Any:
    """A GET's JSON answer, or None."""
    conn = http.client.HTTPConnection(host, port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return json.loads(resp.read()) if resp.status == 200 else None
    except (OSError, http.client.HTTPException, ValueError):
        return None
    finally:
        conn.close()


def server_facts(host: str, port: int) -> dict[str, Any]:
    """Its models, and for llama-server whether each slot speculates (``/slots``)."""
    slots = get_json(host, port, "/slots")
    facts: dict[str, Any] = {"models": get_json(host, port, "/v1/models")}
    if isinstance(slots, list):
        facts["slots_speculative"] = [s.get("speculative") for s in slots if isinstance(s, dict)]
    return facts


# --- command line ------------------------------------------------------------------------


def client_counts(text: str) -> list[int]:
    counts = [int(part) for part in text.split(",") if part.strip()]
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError("a comma-separated list of client counts >= 1")
    return counts


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    common = argparse.ArgumentParser(add_help=False)
    server = common.add_argument_group("server")
    server.add_argument("--url", help="measure this running server instead of starting one")
    server.add_argument("--server", choices=("localspec", "llama"), default="localspec")
    server.add_argument(
        "--parallel",
        type=int,
        help="generations at once (default: localspec's own default, 1 for llama-server)",
    )
    server.add_argument(
        "--spec",
        choices=("ngram-mod", "draft", "none"),
        default="none",
        help="llama-server's speculation",
    )
    server.add_argument(
        "--server-arg",
        action="append",
        default=[],
        help="one more argument for the server (repeatable)",
    )
    server.add_argument("--threads", type=int, default=2, help="llama-server's -t")
    server.add_argument("--llama-server", type=Path, default=LLAMA_SERVER)
    server.add_argument("--model", type=Path, default=TARGET_MODEL, help="llama-server's -m")
    server.add_argument("--draft-model", type=Path, default=DRAFT_MODEL, help="and its -md")
    server.add_argument(
        "--fim-endpoint",
        choices=("completions", "infill", "prompt"),
        help="FIM as /v1/completions with a suffix (localspec's default), llama-server's "
        "/infill (llama's default), or /v1/completions with --fim-template's prompt",
    )
    server.add_argument(
        "--fim-template", default=QWEN_FIM, help="the FIM prompt of --fim-endpoint prompt"
    )
    server.add_argument("--start-timeout", type=float, default=600.0)
    run = common.add_argument_group("run")
    run.add_argument("--prompts", type=Path, default=RESULTS / "prompts.jsonl")
    run.add_argument("--out", type=Path, help=f"the JSON (default: a name in {RESULTS})")
    run.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    run.add_argument("--no-warmup", dest="warmup", action="store_false")
    run.add_argument(
        "--fresh",
        action="store_true",
        help="clients: each phase on a server started for it (nothing learned carries over)",
    )
    run.add_argument("--smoke", action="store_true", help="short answers, for a quick check")

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="scenario", required=True)
    fim = sub.add_parser("fim-during-chat", parents=[common], help="FIM idle vs. beside a chat")
    fim.add_argument("--idle-repeats", type=int, default=3)
    fim.add_argument("--rounds", type=int, default=1, help="FIM-beside-chat measurements")
    fim.add_argument("--chat-tokens", type=int, default=500)
    fim.add_argument("--fim-tokens", type=int, default=48)
    fim.add_argument("--fim-after", type=int, default=20, help="chat chunks before the FIM")
    fim.add_argument("--chat-index", type=int, default=0, help="which chat prompt of the file")
    fim.add_argument("--fim-index", type=int, default=0, help="which FIM prompt of the file")
    clients = sub.add_parser("clients", parents=[common], help="K concurrent clients")
    clients.add_argument("--clients", type=client_counts, default=[1, 2, 4], help="e.g. 1,2,4")
    clients.add_argument("--requests", type=int, help="how many (default: the whole file)")
    args = ap.parse_args(argv)
    if args.fim_endpoint is None:
        args.fim_endpoint = "infill" if args.server == "llama" else "completions"
    if args.smoke:
        smoke(args)
    return args


def smoke(args: argparse.Namespace) -> None:
    if args.scenario == "fim-during-chat":
        args.chat_tokens = min(args.chat_tokens, SMOKE_LONG_CHAT)
        args.fim_tokens = min(args.fim_tokens, SMOKE_TOKENS["fim"])
        args.fim_after = min(args.fim_after, SMOKE_FIM_AFTER)
    else:
        args.requests = min(args.requests or SMOKE_REQUESTS, SMOKE_REQUESTS)


def default_out(args: argparse.Namespace) -> Path:
    kind = "url" if args.url else args.server
    spec = f"-{args.spec}" if kind == "llama" else ""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    slots = args.parallel or ("auto" if kind == "localspec" else 1)
    return RESULTS / f"{args.scenario}-{kind}-np{slots}{spec}-{stamp}.json"


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    # Ctrl-C and SIGTERM unwind through ``served``, which stops the server (SIGINT too when
    # the shell that started us ignores it, as it does for background jobs)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    prompts = [capped(p, SMOKE_TOKENS if args.smoke else None) for p in load_prompts(args.prompts)]
    out = args.out or default_out(args)
    out.parent.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    if args.scenario == "clients" and args.fresh:
        records, facts = run_fresh(args, request_list(prompts, args.requests), out)
        summary, table = summarize_clients(records, args), table_clients
    else:
        with served(args, out.with_suffix(".server.log")) as (host, port, facts):
            target = Target(host, port, args.fim_endpoint, args.timeout, args.fim_template)
            facts.update(server_facts(host, port))
            if args.scenario == "fim-during-chat":
                records = run_fim_during_chat(target, prompts, args)
                summary, table = summarize_fim(records), table_fim
            else:
                records = run_clients(target, request_list(prompts, args.requests), args)
                summary, table = summarize_clients(records, args), table_clients
    meta = {
        key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()
    }
    result = {
        "scenario": args.scenario,
        "started": started,
        "args": meta,
        "server": facts,
        "summary": summary,
        "records": [r.to_json() for r in records],
    }
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(table(summary))
    print(f"\n{out}")


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        sys.exit("interrupted; the server was stopped")
