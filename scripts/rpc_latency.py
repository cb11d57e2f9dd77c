#!/usr/bin/env python3
"""Plain decoding against `auto` with the target on an RPC worker, at several network
round-trip delays: does speculation pay more as each target step pays more latency?

Starts `localspec worker` on 127.0.0.1, and for each delay a relay on 127.0.0.1 that holds
every chunk of bytes for half the delay in each direction (a round trip then costs the delay
more, as with `tc netem delay` on a link). Then runs one fresh `localspec complete --json`
process per prompt, mode and delay (cold, as a user's), plus the same without --rpc, and
prints decode tokens/s and auto / none per setting. Nothing leaves 127.0.0.1.

    python scripts/rpc_latency.py --delays 0,1,5 --prompts 3 --max-tokens 128

A benchmark, not a test: one run's tok/s moves by 10% with whatever else the machine does.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import deque


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class DelayRelay:
    """Forwards 127.0.0.1:port to a worker, delivering each chunk half the round-trip delay
    after it arrived, in order (delay, not bandwidth: chunks in flight overlap)."""

    def __init__(self, worker_port: int, rtt_ms: float, port: int) -> None:
        self.worker_port = worker_port
        self.half = rtt_ms / 2000.0
        self.listener = socket.create_server(("127.0.0.1", port))
        self.port = port
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            worker = socket.create_connection(("127.0.0.1", self.worker_port))
            for sock in (client, worker):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            pair = (client, worker)
            for src, dst in ((client, worker), (worker, client)):
                queue: deque[tuple[float, bytes]] = deque()
                ready = threading.Condition()
                threading.Thread(target=self._read, args=(src, queue, ready), daemon=True).start()
                threading.Thread(
                    target=self._write, args=(dst, queue, ready, pair), daemon=True
                ).start()

    def _read(self, src: socket.socket, queue: deque, ready: threading.Condition) -> None:
        while True:
            try:
                data = src.recv(1 << 20)
            except OSError:
                data = b""
            with ready:
                queue.append((time.monotonic() + self.half, data))
                ready.notify()
            if not data:
                return

    def _write(
        self, dst: socket.socket, queue: deque, ready: threading.Condition, pair: tuple
    ) -> None:
        while True:
            with ready:
                while not queue:
                    ready.wait()
                due, data = queue.popleft()
            wait = due - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            if not data:  # one side closed: end both (shutdown wakes the blocked reads)
                for sock in pair:
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)
                return
            try:
                dst.sendall(data)
            except OSError:
                return


def code_prompts(n: int) -> list[str]:
    from localspec.bench.prompts import load_prompts

    return [p.prompt for p in load_prompts(["code_completion"], n)]


def run(localspec: list[str], prompt: str, args: list[str], env: dict) -> dict:
    result = subprocess.run(
        [*localspec, "complete", "--json", *args], input=prompt, capture_output=True,
        text=True, env=env, timeout=1800,
    )  # fmt: skip
    if result.returncode != 0:
        raise SystemExit(f"complete failed: {result.stderr.strip()}")
    return json.loads(result.stdout.strip().splitlines()[-1])["stats"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--delays", default="0,1,5", help="round-trip delays in ms")
    parser.add_argument("--prompts", type=int, default=3, help="code completion prompts")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--target", default=None)
    parser.add_argument("--draft", default=None)
    opts = parser.parse_args()
    delays = [float(d) for d in opts.delays.split(",")]
    localspec = [sys.executable, "-m", "localspec"]
    env = dict(os.environ)
    common = ["--max-tokens", str(opts.max_tokens), "--threads", str(opts.threads)]
    common += ["--target", opts.target] if opts.target else []
    common += ["--draft", opts.draft] if opts.draft else []

    worker_port = free_port()
    worker = subprocess.Popen(
        [*localspec, "worker", "--port", str(worker_port), "--threads", str(opts.threads)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    try:
        time.sleep(3)
        relays = {d: DelayRelay(worker_port, d, free_port()) for d in delays}
        settings: list[tuple[str, list[str]]] = [("local", [])]
        settings += [(f"rpc +{d:g} ms", ["--rpc", f"127.0.0.1:{relays[d].port}"]) for d in delays]
        prompts = code_prompts(opts.prompts)
        rows = []
        for name, extra in settings:
            speeds: dict[str, list[float]] = {"none": [], "auto": []}
            for prompt in prompts:
                for mode in ("none", "auto"):
                    stats = run(localspec, prompt, [*common, "--drafter", mode, *extra], env)
                    speeds[mode].append(stats["decode_tokens_per_s"])
                    print(f"{name:>12} {mode:>4}: {stats['decode_tokens_per_s']:.1f} tok/s "
                          f"({stats['generated_tokens']} tokens)", file=sys.stderr)  # fmt: skip
            none = statistics.geometric_mean(speeds["none"])
            auto = statistics.geometric_mean(speeds["auto"])
            rows.append((name, none, auto, auto / none))
        print("| setting | none tok/s | auto tok/s | auto / none |")
        print("| --- | ---: | ---: | ---: |")
        for name, none, auto, ratio in rows:
            print(f"| {name} | {none:.1f} | {auto:.1f} | {ratio:.2f}x |")
    finally:
        worker.kill()
        worker.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
