"""Exact mode on the real default pair (slow): batch-invariant logits, and greedy output
identical to plain decoding's in every drafter mode, and with a prediction."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict

import pytest

from tests.test_exact import run_probe

pytestmark = pytest.mark.slow

# Prompts per bench category (6 categories). One each keeps the suite's time reasonable
# (about a minute per prompt on 2 cores); LOCALSPEC_EXACT_PROMPTS=4 runs 24 prompts.
PROMPTS_PER_CATEGORY = int(os.environ.get("LOCALSPEC_EXACT_PROMPTS", "1"))
NEW_TOKENS = 256
# Tokens of each answer in the every-mode check (five modes of six prompts in exact mode,
# the suite's longest run); LOCALSPEC_EXACT_TOKENS=256 checks longer answers.
EVERY_MODE_TOKENS = int(os.environ.get("LOCALSPEC_EXACT_TOKENS", "128"))


def _localspec(args: list[str], home, timeout: int = 3600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "localspec.cli.app", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "LOCALSPEC_HOME": str(home)},
    )


def _exact_bench(home, out, args: list[str]) -> dict[str, dict[str, dict]]:
    """Run ``localspec bench --exact`` with ``args``; its records by prompt, then by mode."""
    # The answers are what is checked here: no chart, no ceiling measured.
    argv = ["bench", "--exact", *args, "--threads", "2", "--out", str(out)]
    proc = _localspec([*argv, "--no-chart", "--no-ceiling"], home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs: dict[str, dict[str, dict]] = defaultdict(dict)
    for line in (out / "records.jsonl").read_text().splitlines():
        record = json.loads(line)
        runs[f"{record['category']}/{record['prompt_id']}"][record["mode"]] = record
    return runs


def test_real_target_logits_are_the_same_alone_and_in_any_batch(real_pair_home):
    _, target, _ = real_pair_home
    # Past 512 cached cells, where a lone query row would take another attention kernel.
    result = run_probe(target, exact=True, n_ctx=1024, context=600, sizes=(2, 3, 8, 16, 33, 64))
    assert result["exact"] and result["rows"] == 64
    assert result["equal"] == {k: True for k in ("2", "3", "8", "16", "33", "64")}, result


def test_greedy_output_is_plain_decodings_in_every_drafter_mode(real_pair_home, tmp_path):
    home, _, _ = real_pair_home
    out = tmp_path / "bench"
    runs = _exact_bench(
        home,
        out,
        ["--modes", "none,ngram,model,lookahead,auto", "--max-tokens", str(EVERY_MODE_TOKENS),
         "--limit", str(PROMPTS_PER_CATEGORY)],
    )  # fmt: skip
    assert len(runs) == 6 * PROMPTS_PER_CATEGORY
    for prompt, by_mode in runs.items():
        assert set(by_mode) == {"none", "ngram", "model", "lookahead", "auto"}, prompt
        for mode in ("ngram", "model", "lookahead", "auto"):
            same = by_mode[mode]["token_ids"] == by_mode["none"]["token_ids"]
            assert same, f"{prompt}: {mode} parted from plain"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["meta"]["exact"] is True


def test_greedy_output_with_a_prediction_is_plain_decodings(real_pair_home, tmp_path):
    """A whole-file edit and a rewrite, each drafted from its prediction (the file, the
    function it quotes) in ``auto``: the prediction is drafted from, and the answer is
    plain decoding's, token for token."""
    home, _, _ = real_pair_home
    runs = _exact_bench(
        home,
        tmp_path / "bench",
        ["--categories", "apply,code_rewrite", "--limit", "1", "--modes", "none,auto-prediction",
         "--max-tokens", str(NEW_TOKENS)],
    )  # fmt: skip
    assert len(runs) == 2
    for prompt, by_mode in runs.items():
        plain, predicted = by_mode["none"], by_mode["auto-prediction"]
        assert predicted["token_ids"] == plain["token_ids"], prompt
    apply = next(by_mode for prompt, by_mode in runs.items() if prompt.startswith("apply/"))
    assert apply["auto-prediction"]["by_drafter"]["prediction"]["accepted"] > 0


def test_a_draft_of_the_targets_own_layers_leaves_greedy_output_plain_decodings(
    real_pair_home, tmp_path
):
    """``--draft self`` with a derived draft (half the layers, the first and last quarter:
    which to keep is measured by the command itself, tested on tiny models), drafting alone
    (``self``) and in ``auto``, in exact mode on a prompt of every category."""
    home, _, _ = real_pair_home
    derived = _localspec(["models", "derive-draft", "--layers", "0-6,21-27", "--quiet"], home)
    assert derived.returncode == 0, derived.stderr[-3000:]
    assert derived.stdout.strip().endswith(".gguf")
    out = tmp_path / "bench"
    runs = _exact_bench(
        home,
        out,
        ["--draft", "self", "--modes", "none,self,auto", "--max-tokens", "128", "--limit", "1"],
    )
    assert len(runs) == 6
    for prompt, by_mode in runs.items():
        for mode in ("self", "auto"):
            assert by_mode[mode]["token_ids"] == by_mode["none"]["token_ids"], (prompt, mode)
        assert by_mode["self"]["by_drafter"]["self"]["drafted"] > 0, prompt  # it drafted
