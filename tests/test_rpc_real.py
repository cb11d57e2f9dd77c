"""Slow: the real default pair with the target on a ``localspec worker`` on 127.0.0.1 and
the draft local gives local plain decoding's greedy tokens.

The worker's CPU backend holds the weights in plain buffers, while a local load repacks
them for other kernels, so logits differ in their last bits; where the runs part, the test
shows it happened at a near-tie of the local run (as tests/test_real_pair.py does for batch
sizes) rather than skipping the comparison.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.test_real_pair import first_divergence, near_leaders
from tests.test_rpc import Worker, env_for, offloaded_to

pytestmark = pytest.mark.slow

PROMPTS = [
    "Write a Python function that checks whether a number is prime.",
    "Rewrite this loop as a list comprehension:\nresult = []\nfor x in range(20):\n"
    "    if x % 3 == 0:\n        result.append(x * x)\n",
]
MAX = 64


def complete(home, target, draft, prompt: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "localspec", "complete", "--json", "--max-tokens", str(MAX),
         "--ctx", "2048", "--target", str(target), "--draft", str(draft), *extra],
        input=prompt, capture_output=True, text=True, env=env_for(home), timeout=1200,
    )  # fmt: skip


def test_real_pair_with_the_target_on_a_worker_matches_local(real_pair_home, tmp_path):
    home, target, draft = real_pair_home
    worker = Worker(tmp_path / "worker-home", threads=2)
    local_session = None
    try:
        for prompt in PROMPTS:
            local = complete(home, target, draft, prompt, "--drafter", "none")
            assert local.returncode == 0, local.stderr
            remote = complete(home, target, draft, prompt, "--drafter", "auto",
                              "--rpc", worker.endpoint)  # fmt: skip
            assert remote.returncode == 0, remote.stderr
            assert len(offloaded_to(remote.stderr)) == 1  # the target's weights went there
            plain = json.loads(local.stdout.splitlines()[-1])["token_ids"]
            spec = json.loads(remote.stdout.splitlines()[-1])["token_ids"]
            i = first_divergence(plain, spec)
            if i is None:
                continue
            if local_session is None:
                from localspec.session.open import open_session
                from localspec.session.pair import ModelOptions

                local_session = open_session(
                    ModelOptions(target=str(target), use_draft=False, calibrate=False, n_ctx=2048)
                )
            tokens = local_session.text_tokens(prompt, raw=False)
            row = local_session.target.forward(tokens + plain[:i], 1)[0].astype(np.float64)
            leaders = near_leaders(row)  # within NEAR_TIE of the local leader
            print(f"diverged at token {i} of {len(plain)}, near-tied leaders {leaders}")
            assert plain[i] in leaders and (i >= len(spec) or spec[i] in leaders), (i, leaders)
    finally:
        worker.stop()
        if local_session is not None:
            local_session.close()
