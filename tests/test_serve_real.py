"""Slow: the real default pair through ``localspec serve`` answers with the same greedy
tokens as ``localspec complete --json``, and its ``timings`` agree with that run's stats."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import openai
import pytest
import uvicorn

from localspec.core.params import GenerationParams
from localspec.serve.app import ServerState, create_app
from localspec.serve.worker import GenerationWorker
from localspec.session.session import ModelOptions, open_session
from tests.test_serve import _free_port

PROMPT = "Write a Python function that checks whether a number is prime."
MAX = 48


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

    options = ModelOptions(target=str(target), draft=str(draft), n_ctx=2048, exact=True,
                           calibrate=False)  # fmt: skip
    session = open_session(options)
    worker = GenerationWorker(session)
    worker.start()
    params = GenerationParams(max_tokens=MAX, drafter="model")
    state = ServerState(defaults=params, worker=worker, model_id="target")
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(state), host="127.0.0.1", port=port,
                                           log_level="warning"))  # fmt: skip
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", timeout=600)
        answer = client.chat.completions.create(
            model="target", messages=[{"role": "user", "content": PROMPT}]
        )
    finally:
        server.should_exit = True
        thread.join(10)
        worker.stop()
        session.close()
    assert answer.choices[0].message.content == reference["text"]
    stats, timings = reference["stats"], answer.model_extra["timings"]
    assert answer.usage.prompt_tokens == stats["prompt_tokens"]
    assert timings["predicted_n"] == stats["generated_tokens"] == len(reference["token_ids"])
    assert timings["draft_n"] == stats["drafted"]
    assert timings["draft_n_accepted"] == stats["accepted"]
    assert timings["target_passes"] == stats["rounds"]
