"""Slow: the real default pair through ``localspec serve`` answers with the same greedy
tokens as ``localspec complete --json``, and its ``timings`` agree with that run's stats;
a fill-in-the-middle request on the same server writes a missing function body."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import openai
import pytest

from tests.test_serve import _free_port

PROMPT = "Write a Python function that checks whether a number is prime."
MAX = 48
FIM_PREFIX = 'def is_prime(n: int) -> bool:\n    """Whether n is a prime number."""\n'
FIM_SUFFIX = "\n\nprint([k for k in range(30) if is_prime(k)])\n"


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
    except httpx.TransportError:
        return False


@pytest.mark.slow
def test_real_pair_through_the_server_matches_complete(real_pair_home):
    home, target, draft = real_pair_home
    env = {**os.environ, "LOCALSPEC_HOME": str(home)}
    proc = subprocess.run(
        [sys.executable, "-m", "localspec.cli.app", "complete", "--json", "--exact",
         "--drafter", "model", "--max-tokens", str(MAX), "--ctx", "2048",
         "--target", str(target), "--draft", str(draft)],
        input=PROMPT.encode(), capture_output=True, timeout=600, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    reference = json.loads(proc.stdout)

    # The server runs in its own process: exact mode's kernels are chosen per process,
    # before anything is evaluated, which this test process has long done.
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "localspec.cli.app", "serve", "--port", str(port), "--exact",
         "--drafter", "model", "--max-tokens", str(MAX), "--ctx", "2048",
         "--target", str(target), "--draft", str(draft)],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 600
        while not _healthy(port):
            assert server.poll() is None, server.communicate()[1]
            assert time.monotonic() < deadline, "the server did not get ready"
            time.sleep(0.5)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", timeout=600)
        answer = client.chat.completions.create(
            model="target", messages=[{"role": "user", "content": PROMPT}]
        )
        fim = client.completions.create(model="target", prompt=FIM_PREFIX, suffix=FIM_SUFFIX)
    finally:
        server.terminate()
        server.wait(30)
    assert answer.choices[0].message.content == reference["text"]
    stats, timings = reference["stats"], answer.model_extra["timings"]
    assert answer.usage.prompt_tokens == stats["prompt_tokens"]
    assert timings["predicted_n"] == stats["generated_tokens"] == len(reference["token_ids"])
    assert timings["draft_n"] == stats["drafted"]
    assert timings["draft_n_accepted"] == stats["accepted"]
    assert timings["target_passes"] == stats["rounds"]

    middle = fim.choices[0].text
    assert middle.strip() and fim.choices[0].finish_reason in ("stop", "length")
    assert "print(" not in middle and FIM_SUFFIX.strip() not in middle, middle
    assert fim.usage.completion_tokens > 0
