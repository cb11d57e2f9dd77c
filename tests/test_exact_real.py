"""Exact mode on the real default pair (slow): batch-invariant logits, and greedy output
identical to plain decoding's in every drafter mode, and with a prediction.

The checks are about tokens only, so no bench warms up, measures the target's ceiling or
draws a chart. An answer equal to plain decoding's says something about a drafter mode only
where it drafted, so the checks assert that every mode they check had drafts accepted, and
where answers are cut short (``SHORT_TOKENS``), drafts rejected too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict

import pytest

from tests.test_exact import run_probe

pytestmark = pytest.mark.slow

# Prompts per bench category (6 categories). One each keeps the suite's time reasonable;
# LOCALSPEC_EXACT_PROMPTS=4 runs 24 prompts.
PROMPTS_PER_CATEGORY = int(os.environ.get("LOCALSPEC_EXACT_PROMPTS", "1"))
NEW_TOKENS = 256
# Tokens of each answer in the every-mode bench (the suite's longest run);
# LOCALSPEC_EXACT_TOKENS=256 checks longer answers (and sets SHORT_TOKENS too).
EVERY_MODE_TOKENS = int(os.environ.get("LOCALSPEC_EXACT_TOKENS", "128"))
# Tokens of each answer in the bench of the self-draft and lookahead. In exact mode a verify
# batch costs about a plain step per row, so their rounds are the dearest (lookahead took
# 46% of the every-mode bench at 128 tokens, on 2 cores), and their drafts are rejected in
# most rounds: in the code_completion prompt's 64 tokens, 43 of lookahead's 48 drafts and
# 22 of the self-draft's 44, so half the answer still verifies dozens of rejections.
SHORT_TOKENS = int(os.environ.get("LOCALSPEC_EXACT_TOKENS", "64"))

Runs = dict[str, dict[str, dict]]  # a bench's records by prompt, then by mode


def _localspec(args: list[str], home, timeout: int = 3600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "localspec.cli.app", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "LOCALSPEC_HOME": str(home)},
    )


def _exact_bench(home, out, args: list[str]) -> Runs:
    """Run ``localspec bench --exact`` with ``args``; its records by prompt, then by mode."""
    # The answers are what is checked here: no warm-up, no chart, no ceiling measured.
    argv = ["bench", "--exact", *args, "--threads", "2", "--out", str(out)]
    proc = _localspec([*argv, "--no-warmup", "--no-chart", "--no-ceiling"], home)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs: Runs = defaultdict(dict)
    for line in (out / "records.jsonl").read_text().splitlines():
        record = json.loads(line)
        runs[f"{record['category']}/{record['prompt_id']}"][record["mode"]] = record
    assert json.loads((out / "summary.json").read_text())["meta"]["exact"] is True
    return runs


def _assert_plain(runs: Runs, modes: tuple[str, ...], rejected: bool) -> None:
    """Every prompt's answer in each of ``modes`` is its plain one, token for token; each
    mode had drafts accepted (and with ``rejected``, drafts rejected) over the prompts."""
    assert len(runs) == 6 * PROMPTS_PER_CATEGORY
    for prompt, by_mode in runs.items():
        for mode in modes:
            same = by_mode[mode]["token_ids"] == by_mode["none"]["token_ids"]
            assert same, f"{prompt}: {mode} parted from plain"
    for mode in modes:
        stats = [d for by_mode in runs.values() for d in by_mode[mode]["by_drafter"].values()]
        drafted, accepted = sum(d["drafted"] for d in stats), sum(d["accepted"] for d in stats)
        assert accepted > 0 and (drafted > accepted or not rejected), (mode, drafted, accepted)


@pytest.fixture(scope="module")
def self_draft(real_pair_home, tmp_path_factory) -> tuple[subprocess.CompletedProcess, Runs]:
    """``models derive-draft`` (half the target's layers, the first and last quarter: which
    to keep is measured by the command itself, tested on tiny models), then one exact bench
    with ``--draft self`` of ``SHORT_TOKENS`` an answer: the self-draft drafting alone
    (``self``) and in ``auto``, and lookahead, which drafts from the target's own rows
    whatever the draft (so it shares this bench's plain runs and measured costs)."""
    home, _, _ = real_pair_home
    derived = _localspec(["models", "derive-draft", "--layers", "0-6,21-27", "--quiet"], home)
    assert derived.returncode == 0, derived.stderr[-3000:]
    runs = _exact_bench(
        home,
        tmp_path_factory.mktemp("self-draft") / "bench",
        ["--draft", "self", "--modes", "none,self,lookahead,auto",
         "--max-tokens", str(SHORT_TOKENS), "--limit", str(PROMPTS_PER_CATEGORY)],
    )  # fmt: skip
    return derived, runs


def test_real_target_logits_are_the_same_alone_and_in_any_batch(real_pair_home):
    _, target, _ = real_pair_home
    # Past 512 cached cells, where a lone query row would take another attention kernel.
    result = run_probe(target, exact=True, n_ctx=1024, context=600, sizes=(2, 3, 8, 16, 33, 64))
    assert result["exact"] and result["rows"] == 64
    assert result["equal"] == {k: True for k in ("2", "3", "8", "16", "33", "64")}, result


def test_greedy_output_is_plain_decodings_in_every_drafter_mode(
    real_pair_home, self_draft, tmp_path
):
    """Every drafter mode with the default draft, then lookahead (in the self-draft's bench,
    on shorter answers)."""
    home, _, _ = real_pair_home
    modes = ("ngram", "model", "auto")
    runs = _exact_bench(
        home,
        tmp_path / "bench",
        ["--modes", ",".join(["none", *modes]), "--max-tokens", str(EVERY_MODE_TOKENS),
         "--limit", str(PROMPTS_PER_CATEGORY)],
    )  # fmt: skip
    _assert_plain(runs, modes, rejected=False)
    _assert_plain(self_draft[1], ("lookahead",), rejected=True)


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


def test_a_draft_of_the_targets_own_layers_leaves_greedy_output_plain_decodings(self_draft):
    """``--draft self`` with a derived draft, drafting alone (``self``) and in ``auto``, in
    exact mode on a prompt of every category."""
    derived, runs = self_draft
    assert derived.stdout.strip().endswith(".gguf")
    for prompt, by_mode in runs.items():
        assert by_mode["self"]["by_drafter"]["self"]["drafted"] > 0, prompt  # it drafted
    _assert_plain(runs, ("self",), rejected=True)
    _assert_plain(runs, ("auto",), rejected=False)
