"""The prompt cache on the real default pair (slow), in fresh ``localspec complete``
processes: with ``--exact`` an answer after a restored prompt is token for token the cold
one's, the prompt restored whole or a file's prefix before another question; the folder
stays within ```LOCALSPEC_PROMPT_CACHE_SIZE``."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

SOURCE = inspect.getsource(textwrap)  # a module of the standard library
FILE = SOURCE[:3000]  # about 700 tokens
FIRST = FILE + "\n\nWhat does dedent do? Answer in one sentence."
SECOND = FILE + "\n\nWhich functions wrap text? Name them."


def _home(tmp_path, real_pair_home):
    """A home of its own (an empty prompt cache) whose models are the test cache's."""
    home = tmp_path / "home"
    home.mkdir()
    (home / "models").symlink_to(real_pair_home[0] / "models")
    return home


def _complete(home, prompt: str, *args: str, size: str = "") -> dict:
    env = {**os.environ, "LOCALSPEC_HOME": str(home), "LOCALSPEC_HISTORY": "0"}
    if size:
        env["LOCALSPEC_PROMPT_CACHE_SIZE"] = size
    proc = subprocess.run(
        [sys.executable, "-m", "localspec.cli.app", "complete", "--json", "--max-tokens", "24",
         "--drafter", "ngram", "--threads", "2", *args],
        input=prompt, capture_output=True, text=True, timeout=1800, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def test_exact_answers_after_a_restored_prompt_are_the_cold_ones(tmp_path, real_pair_home):
    home = _home(tmp_path, real_pair_home)
    cold = _complete(home, FIRST, "--exact")
    assert cold["stats"]["prompt_cache"]["restored_tokens"] == 0
    warm = _complete(home, FIRST, "--exact")
    cache = warm["stats"]["prompt_cache"]
    assert (
        cache["from"] == "disk" and cache["restored_tokens"] == cold["stats"]["prompt_tokens"] - 1
    )
    assert warm["stats"]["prefill_evaluated_tokens"] == 0
    assert warm["token_ids"] == cold["token_ids"]
    # The same file with another question: its prefix restored, the rest evaluated by exact
    # mode's kernels, and the answer that of the same prompt evaluated cold.
    other_cold = _complete(home, SECOND, "--exact", "--no-prompt-cache")
    assert other_cold["stats"]["prompt_cache"]["restored_tokens"] == 0
    other_warm = _complete(home, SECOND, "--exact")
    restored = other_warm["stats"]["prompt_cache"]["restored_tokens"]
    assert restored > 500 and other_warm["stats"]["prefill_evaluated_tokens"] > 0
    assert other_warm["token_ids"] == other_cold["token_ids"]
    # A state made without --exact is not restored in exact mode, nor the other way.
    plain = _complete(home, FIRST)
    assert plain["stats"]["prompt_cache"]["restored_tokens"] == 0


def test_the_folder_stays_within_its_bound(tmp_path, real_pair_home):
    home = _home(tmp_path, real_pair_home)
    bound = 40 << 20  # one or two of these prompts' states (28 KB a token)
    for i, question in enumerate(("What does dedent do?", "What does fill do?", "Why?")):
        _complete(home, SOURCE[: 3000 + 1000 * i] + question, size="40MiB")
        files = list((home / "prompt-cache").rglob("*.state"))
        assert sum(p.stat().st_size for p in files) <= bound
        assert files  # the latest at least is kept
