"""Exact mode: batch-invariant target kernels, chosen per process before any evaluation.

The switch llama.cpp reads for its tiled matmul is read once per process, so these tests
run the models in fresh interpreters; the guard itself is tested in-process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from localspec.backend import kernels, llama
from localspec.cli.calibrate import format_costs
from localspec.core.costs import CostProfile
from localspec.errors import BackendError
from tests.test_cli import assert_clean_error, localspec, pair_args
from tests.tiny_gguf import write_tiny_llama


@pytest.fixture(scope="module")
def kquant_pair(tmp_path_factory):
    """A tiny target and draft in Q4_K_M, whose matmuls take the same kernels as the
    default pair's (rows of 256, the K-quant block)."""
    from localspec.backend.quantize import quantize

    d = tmp_path_factory.mktemp("kquant")
    pair = []
    for name, seed in (("target", 1), ("draft", 2)):
        f32 = write_tiny_llama(d / f"{name}-f32.gguf", n_embd=256, n_ff=512, seed=seed)
        pair.append(quantize(f32, d / f"{name}.gguf", "Q4_K_M"))
    return pair[0], pair[1], None


def test_exact_kernels_sets_the_switch_before_any_evaluation(monkeypatch):
    monkeypatch.delenv(kernels.TILED_MM_SWITCH, raising=False)
    monkeypatch.setattr(kernels, "_decoded", False)
    monkeypatch.setattr(kernels, "_switched", False)
    kernels.exact_kernels()
    assert os.environ[kernels.TILED_MM_SWITCH] == "0"
    # Child processes (kernels.cpp's own tools in the bench) get their usual kernels back.
    assert kernels.TILED_MM_SWITCH not in kernels.default_kernels_environ()


def test_exact_kernels_refuses_once_the_process_has_evaluated(monkeypatch):
    monkeypatch.delenv(kernels.TILED_MM_SWITCH, raising=False)
    monkeypatch.setattr(kernels, "_decoded", True)
    with pytest.raises(BackendError, match="before this process evaluates"):
        kernels.exact_kernels()
    assert kernels.TILED_MM_SWITCH not in os.environ


def test_a_switch_the_user_set_is_kept_for_children(monkeypatch):
    monkeypatch.setenv(kernels.TILED_MM_SWITCH, "0")
    monkeypatch.setattr(kernels, "_decoded", True)
    monkeypatch.setattr(kernels, "_tiled_off", True)  # it was off at the first evaluation
    monkeypatch.setattr(kernels, "_switched", False)
    kernels.exact_kernels()  # already off: nothing to refuse
    assert kernels.default_kernels_environ()[kernels.TILED_MM_SWITCH] == "0"


def test_a_switch_set_after_the_first_evaluation_does_not_count(monkeypatch):
    """kernels.cpp read the switch at this process's first evaluation; turning it off in the
    environment afterwards changes nothing, so exact mode is still refused."""
    monkeypatch.setenv(kernels.TILED_MM_SWITCH, "0")
    monkeypatch.setattr(kernels, "_decoded", True)
    monkeypatch.setattr(kernels, "_tiled_off", False)
    with pytest.raises(BackendError, match="before this process evaluates"):
        kernels.exact_kernels()


def test_the_first_evaluation_records_the_switch(monkeypatch):
    monkeypatch.setattr(kernels, "_decoded", False)
    monkeypatch.setattr(kernels, "_tiled_off", False)
    monkeypatch.setenv(kernels.TILED_MM_SWITCH, "0")
    kernels.note_decoded()
    monkeypatch.delenv(kernels.TILED_MM_SWITCH)
    kernels.note_decoded()  # later evaluations do not change what kernels.cpp read
    assert kernels._decoded and kernels._tiled_off


PROBE = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    from localspec.backend.llama import LlamaModel, LoadOptions, TILED_MM_SWITCH
    path, exact = sys.argv[1], sys.argv[2] == "1"
    n_ctx, context, sizes = map(json.loads, sys.argv[3:])
    m = LlamaModel(path, LoadOptions(n_ctx=n_ctx, n_threads=2, exact=exact))
    ctx = m.tokenize("the cat and the dog, " * 400)[:context]
    m.forward(ctx, 0)
    ext = m.tokenize("and the cat sat on the mat by the door " * 8, add_special=False)[: max(sizes)]
    single = np.array([m.forward(ctx + ext[: i + 1], 1)[0] for i in range(len(ext))])
    equal = {}
    for k in sizes:
        m.truncate(len(ctx))
        equal[k] = bool(np.array_equal(single[:k], m.forward(ctx + ext[:k], k)))
    print(json.dumps({
        "switch": os.environ.get(TILED_MM_SWITCH),
        "exact": m.exact,
        "rows": len(ext),
        "equal": equal,
    }))
    """
)


def run_probe(path: Path, exact: bool, n_ctx=256, context=40, sizes=(2, 9, 24)) -> dict:
    """Logits of tokens evaluated one by one against the same tokens in batches of
    ``sizes``, after ``context`` tokens, in a fresh interpreter."""
    env = {k: v for k, v in os.environ.items() if k != llama.TILED_MM_SWITCH}
    cmd = [sys.executable, "-c", PROBE, str(path), "1" if exact else "0"]
    proc = subprocess.run(
        [*cmd, json.dumps(n_ctx), json.dumps(context), json.dumps(list(sizes))],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_an_exact_model_gives_the_same_logits_alone_and_in_a_batch(kquant_pair):
    target, _, _ = kquant_pair
    exact = run_probe(target, exact=True)
    assert exact["switch"] == "0" and exact["exact"] and exact["rows"] == 24
    assert all(exact["equal"].values()), exact  # 9 and 24 rows take the batched kernels
    default = run_probe(target, exact=False)
    assert default["switch"] is None and not all(default["equal"].values())  # what it fixes


def test_a_target_whose_kernels_depend_on_the_batch_is_refused(tiny_pair):
    proc = localspec("complete", "--exact", "--drafter", "none", *pair_args(tiny_pair))
    assert_clean_error(proc, "exact mode is not available", "K-quant")


def test_complete_exact_reports_it_and_keeps_greedy_tokens(kquant_pair, tiny_pair):
    runs = {}
    for drafter in ("none", "ngram"):
        proc = localspec(
            "complete", "--raw", "--json", "--exact", "--max-tokens", "16",
            "--drafter", drafter, *pair_args(kquant_pair), stdin=b"the cat and the dog and the cat",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr.decode()
        runs[drafter] = json.loads(proc.stdout)
    assert runs["none"]["exact"] is True and runs["ngram"]["exact"] is True
    assert runs["ngram"]["token_ids"] == runs["none"]["token_ids"]
    plain = localspec("complete", "--raw", "--json", "--max-tokens", "4", *pair_args(tiny_pair))
    assert json.loads(plain.stdout)["exact"] is False


def test_calibrate_shows_the_other_kernels_beside_when_measured():
    mine = CostProfile(plain_s=0.050, verify_s={1: 0.100, 15: 0.400}, draft_step_s=0.02)
    other = CostProfile(plain_s=0.040, verify_s={1: 0.080, 15: 0.200}, draft_step_s=0.02)
    text = format_costs(mine, Path("/cache"), exact=True, other=other)
    assert "kernels: exact (beside: default" in text
    assert "default:    40.0 ms (1.25x)" in text  # the plain step
    assert "default:   200.0 ms (2.00x)" in text  # k=15
    alone = format_costs(mine, Path("/cache"), exact=False)
    assert "localspec calibrate --exact" in alone and "beside" not in alone


def test_the_first_exact_run_with_a_self_draft_derives_it_and_answers(kquant_pair, tmp_path):
    """A fresh home: the self-draft is derived (the target evaluated) in the same process
    that then runs with exact kernels; they are chosen before the derivation."""
    target, _, _ = kquant_pair
    args = ("complete", "--raw", "--json", "--exact", "--max-tokens", "8", "--drafter", "self",
            "--target", str(target), "--ctx", "256", "--threads", "1")  # fmt: skip
    proc = localspec(*args, stdin=b"the cat and the dog", env_home=tmp_path / "home")
    assert proc.returncode == 0, proc.stderr.decode()
    assert "as self-drafts" in proc.stderr.decode()  # this run measured and derived it
    answer = json.loads(proc.stdout)
    assert answer["exact"] is True and answer["token_ids"]


LANES_PROBE = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from localspec.backend.lanes import Slice
    from localspec.backend.llama import LlamaModel, LoadOptions
    m = LlamaModel(sys.argv[1], LoadOptions(n_ctx=256, n_threads=2, exact=True, lanes=2))
    mine = m.tokenize("the cat and the dog, " * 40)[:60]
    other = m.tokenize("and the cat sat on the mat by the door " * 8)[:50]
    lane, neighbour = m.lane(1), m.lane(0)
    alone = lane.forward(mine, 5).copy()
    lane.reset()
    neighbour.forward(other, 0)  # another lane's tokens in the cache, then in the batch
    lane.forward(mine[:-5], 0)
    n = len(mine) - 5
    rows, _ = m.shared.evaluate_slices([
        Slice([1, 2, 3], [50, 51, 52], [(0,)] * 3, [True] * 3),
        Slice(mine[-5:], list(range(n, n + 5)), [(m.shared.first_seq(1),)] * 5, [True] * 5),
    ])
    print(json.dumps({"equal": bool(np.array_equal(alone, rows[1]))}))
    """
)


def test_exact_logits_of_a_lane_do_not_depend_on_the_other_lanes(kquant_pair):
    """``serve --parallel --exact``: a lane's logits are bitwise the same alone and
    evaluated in one batch with another lane's tokens, that lane's cells in the cache."""
    target, _, _ = kquant_pair
    env = {k: v for k, v in os.environ.items() if k != llama.TILED_MM_SWITCH}
    proc = subprocess.run([sys.executable, "-c", LANES_PROBE, str(target)],
                          capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"equal": True}
