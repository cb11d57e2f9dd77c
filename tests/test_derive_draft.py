"""Self-drafts: a GGUF of some of a target's blocks, the measured choice of which, the cache
and ``localspec models derive-draft``. Tiny models only: every test runs in a second."""

from __future__ import annotations

import json
import os
from pathlib import Path

import gguf
import numpy as np
import pytest
from typer.testing import CliRunner

from localspec.backend.llama import LlamaModel, LoadOptions
from localspec.cli.models import models_app
from localspec.errors import DownloadError, ModelFileError, UsageError
from localspec.models import layerchoice, selfdraft
from localspec.models.derive import compact_layers, derive_gguf, parse_layers
from localspec.models.layerchoice import (
    Candidate,
    candidate_subsets,
    choose_layers,
    expected_speedup,
    pick,
    rate,
)
from localspec.models.selfdraft import cached_derived, derived_dir, derived_draft, load_derived
from tests.tiny_gguf import F16, write_tiny_llama

OPTIONS = LoadOptions(n_ctx=128, n_threads=1, tree_seqs=0)
KS = (1, 2, 4, 8, 16)


@pytest.fixture(scope="module")
def tiny4(tmp_path_factory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("t4") / "tiny4.gguf", n_layer=4, ftype=F16)


def tensors(path: Path) -> dict[str, gguf.ReaderTensor]:
    return {t.name: t for t in gguf.GGUFReader(path).tensors}


def fields(path: Path) -> dict[str, object]:
    reader = gguf.GGUFReader(path)
    return {f.name: f.contents() for f in reader.fields.values() if not f.name.startswith("GGUF.")}


def rewrite_without(src: Path, dest: Path, dropped: str) -> None:
    """``src`` copied with one tensor left out: a file llama.cpp must refuse."""
    reader = gguf.GGUFReader(src)
    writer = gguf.GGUFWriter(dest, "llama")
    for f in reader.fields.values():
        if f.name != "general.architecture" and not f.name.startswith("GGUF."):
            sub = f.types[-1] if f.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(f.name, f.contents(), f.types[0], sub_type=sub)
    kept = [t for t in reader.tensors if t.name != dropped]
    for t in kept:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in kept:
        writer.write_tensor_data(t.data)
    writer.close()


# --- derive_gguf ------------------------------------------------------------------------


def test_derived_file_keeps_the_chosen_blocks_renumbered_with_identical_bytes(tiny4, tmp_path):
    out = derive_gguf(tiny4, [0, 2, 3], tmp_path / "d.gguf")
    src, got = tensors(tiny4), tensors(out)
    blocks = sorted({n.split(".")[1] for n in got if n.startswith("blk.")})
    assert blocks == ["0", "1", "2"]
    for new, old in enumerate([0, 2, 3]):
        for suffix in ("attn_q.weight", "ffn_down.weight", "attn_norm.weight"):
            a, b = src[f"blk.{old}.{suffix}"], got[f"blk.{new}.{suffix}"]
            assert a.tensor_type == b.tensor_type
            assert a.data.tobytes() == b.data.tobytes()
    assert got["blk.0.attn_q.weight"].tensor_type == gguf.GGMLQuantizationType.F16
    for name in ("token_embd.weight", "output_norm.weight", "output.weight"):
        assert got[name].data.tobytes() == src[name].data.tobytes()
    assert fields(out)["llama.block_count"] == 3


def test_quantized_blocks_are_copied_raw(tiny4, tmp_path):
    from localspec.backend.quantize import quantize

    q = quantize(tiny4, tmp_path / "q.gguf", "Q4_0", threads=1)
    out = derive_gguf(q, [1, 3], tmp_path / "dq.gguf")
    src, got = tensors(q), tensors(out)
    assert got["blk.1.ffn_up.weight"].tensor_type == gguf.GGMLQuantizationType.Q4_0
    assert got["blk.1.ffn_up.weight"].data.tobytes() == src["blk.3.ffn_up.weight"].data.tobytes()
    assert got["blk.0.attn_k.weight"].data.tobytes() == src["blk.1.attn_k.weight"].data.tobytes()


def test_metadata_is_the_sources_but_the_block_count_and_name(tiny4, tmp_path):
    out = derive_gguf(tiny4, [0, 1, 3], tmp_path / "d.gguf")
    before, after = fields(tiny4), fields(out)
    assert after.pop("llama.block_count") == 3 and before.pop("llama.block_count") == 4
    assert after.pop("general.name") == "tiny-llama (self-draft, layers 0-1,3)"
    before.pop("general.name")
    assert after == before  # the tokenizer's keys included, token by token


def test_per_layer_arrays_are_cut_to_the_kept_layers(tmp_path):
    w = gguf.GGUFWriter(tmp_path / "arr.gguf", "llama")
    w.add_block_count(4)
    w.add_array("llama.attention.head_count", [4, 5, 6, 7])
    w.add_array("llama.other", [1, 2, 3])  # not one per layer: kept whole
    w.add_array("tokenizer.ggml.scores", [0.5, 1.5, 2.5, 3.5])  # not the model's: kept
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    for i in range(4):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.full(4, i, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out = derive_gguf(tmp_path / "arr.gguf", [1, 3], tmp_path / "d.gguf")
    got = fields(out)
    assert got["llama.attention.head_count"] == [5, 7]
    assert got["llama.other"] == [1, 2, 3]
    assert got["tokenizer.ggml.scores"] == [0.5, 1.5, 2.5, 3.5]
    assert got["general.name"] == "arr (self-draft, layers 1,3)"
    assert tensors(out)["blk.1.attn_norm.weight"].data.tolist() == [3.0] * 4


def test_all_layers_derived_evaluate_as_the_source_and_a_subset_evaluates(tiny4, tmp_path):
    tokens = [1, 300, 301, 302, 303]
    whole = LlamaModel(tiny4, OPTIONS)
    copy = LlamaModel(derive_gguf(tiny4, range(4), tmp_path / "all.gguf"), OPTIONS)
    part = LlamaModel(derive_gguf(tiny4, [0, 3], tmp_path / "part.gguf"), OPTIONS)
    try:
        expected = whole.forward(tokens, len(tokens))
        assert np.array_equal(copy.forward(tokens, len(tokens)), expected)
        rows = part.forward(tokens, len(tokens))
        assert rows.shape == expected.shape and np.isfinite(rows).all()
        assert part.tokenize("def the") == whole.tokenize("def the")
    finally:
        for m in (whole, copy, part):
            m.close()


@pytest.mark.parametrize("layers", [[], [1, 1], [2, 1], [4], [-1, 0], [0, 9]])
def test_bad_layer_lists_are_usage_errors(tiny4, tmp_path, layers):
    with pytest.raises(UsageError) as err:
        derive_gguf(tiny4, layers, tmp_path / "d.gguf")
    assert err.value.hint
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("text", ["", "a", "3-1", "1,,2", "1-", "-2", "1.5"])
def test_bad_layer_texts_are_usage_errors(text):
    with pytest.raises(UsageError, match="invalid layer list"):
        parse_layers(text)


def test_layer_texts_round_trip():
    assert parse_layers("0-3, 7,9-10") == [0, 1, 2, 3, 7, 9, 10]
    assert parse_layers("20-21,0-1,1") == [0, 1, 20, 21]
    assert compact_layers([0, 1, 2, 3, 7, 9, 10]) == "0-3,7,9-10"


def test_a_source_that_is_not_gguf_is_a_model_file_error(tmp_path):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model at all" * 10)
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        derive_gguf(junk, [0], tmp_path / "d.gguf")
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\xff" * 100)
    with pytest.raises(ModelFileError, match="cannot read"):
        derive_gguf(broken, [0], tmp_path / "d.gguf")
    with pytest.raises(ModelFileError, match="model file not found"):
        derive_gguf(tmp_path / "missing.gguf", [0], tmp_path / "d.gguf")


def test_a_gguf_without_blocks_is_a_model_file_error(tmp_path):
    w = gguf.GGUFWriter(tmp_path / "flat.gguf", "llama")
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFileError, match="block_count"):
        derive_gguf(tmp_path / "flat.gguf", [0], tmp_path / "d.gguf")


def test_a_failed_write_leaves_nothing_behind(tiny4, tmp_path, monkeypatch):
    from localspec.models import derive

    def broken(src, kept, out):
        out.write_bytes(b"GGUF half")
        raise OSError("disk full")

    monkeypatch.setattr(derive, "_write", broken)
    with pytest.raises(OSError):
        derive_gguf(tiny4, [0, 1], tmp_path / "d.gguf")
    assert list(tmp_path.iterdir()) == []


def test_a_refused_derived_file_is_a_model_file_error_with_a_hint(tiny4, tmp_path):
    good = derive_gguf(tiny4, [0, 2], tmp_path / "good.gguf")
    bad = tmp_path / "bad.gguf"
    rewrite_without(good, bad, "blk.1.ffn_down.weight")
    with pytest.raises(ModelFileError) as err:
        load_derived(bad, OPTIONS, "qwen2.5-coder-1.5b")
    assert str(bad) in err.value.message
    assert err.value.hint == (
        "derive it again: localspec models derive-draft qwen2.5-coder-1.5b --refresh"
    )


# --- the choice -------------------------------------------------------------------------


def test_drafting_does_not_pay_when_verifying_costs_grow_fast():
    verify = {k: 1 + 0.6 * k for k in KS}
    assert expected_speedup(0.5, 0.5, verify) < 1


def test_drafting_pays_when_verifying_is_nearly_free():
    verify = {k: 1 + 0.02 * k for k in KS}
    assert expected_speedup(0.7, 0.4, verify) > 1
    # A perfect free draft yields k + 1 tokens per verify: the longest k wins.
    assert layerchoice.best_draft_length(1.0, 0.0, {k: 1.0 for k in KS}) == (16, 17.0)


def test_the_pick_goes_by_expected_speedup_not_agreement():
    verify = {k: 1 + 0.05 * k for k in KS}
    accurate_but_slow = rate((0, 1, 2), "first 2 + last 1", 0.9, 0.9, verify)
    cheap = rate((0, 1), "first half", 0.7, 0.3, verify)
    assert accurate_but_slow.agreement > cheap.agreement
    assert cheap.expected_speedup > accurate_but_slow.expected_speedup
    assert pick([accurate_but_slow, cheap]) is cheap
    tie = Candidate((0,), "first 1", 0.7, 0.3, cheap.expected_speedup, 2)
    assert pick([cheap, tie]) is tie  # on a tie, fewer layers


def test_candidates_of_a_28_layer_target():
    found = dict((layers, label) for label, layers in candidate_subsets(28))
    labels = list(found.values())
    assert len(found) <= 10
    assert found[tuple(range(14))] == "first half"
    assert found[(*range(0, 28, 2), 27)] == "every other"
    assert "first 10 + last 4" in labels
    assert all(0 < len(layers) < 28 for layers in found)
    assert candidate_subsets(1) == []


def test_choose_layers_measures_every_candidate(tiny4, tmp_path):
    said = []
    choice = choose_layers(
        tiny4, threads=1, on_progress=said.append, calibration_tokens=12, workdir=tmp_path
    )
    assert {c.label for c in choice.candidates} >= {"first half", "every other"}
    assert choice.chosen == pick(choice.candidates)
    for c in choice.candidates:
        assert 0 <= c.agreement <= 1 and c.step_ratio > 0 and c.expected_speedup > 0
    assert set(choice.verify_ratio) == set(KS)
    assert 0 < choice.calibration_tokens <= 24
    assert list(tmp_path.iterdir()) == []  # every candidate's file is gone
    assert any("candidate 1/" in p.text for p in said)


def test_a_candidate_that_matches_the_target_agrees_everywhere(tiny4):
    choice = choose_layers(
        tiny4, threads=1, subsets=[("all", range(4))], calibration_tokens=12, prompts=["def"]
    )
    assert choice.chosen.agreement == 1.0


# --- the cache ----------------------------------------------------------------------------


def test_given_layers_are_cached_and_the_second_call_does_no_work(tiny4, monkeypatch):
    assert cached_derived(tiny4) is None
    first = derived_draft(tiny4, threads=1, layers=[0, 1])
    assert first.layers == (0, 1) and first.n_layers == 4 and first.agreement is None
    assert first.path.name == "layers-0-1.gguf" and first.path.is_file()
    assert first.path.parent == derived_dir(tiny4)
    assert os.stat(first.path).st_mode & 0o777 == 0o600
    assert os.stat(first.path.parent).st_mode & 0o777 == 0o700

    def no_work(*args, **kwargs):
        raise AssertionError("worked again")

    monkeypatch.setattr(selfdraft, "write_derived", no_work)
    monkeypatch.setattr(selfdraft, "open_source", no_work)
    monkeypatch.setattr(selfdraft, "choose_layers", no_work)
    assert derived_draft(tiny4, threads=1, layers=[0, 1]) == first
    assert derived_draft(tiny4, threads=1) == first  # the recorded choice
    assert cached_derived(tiny4) == first


def test_measured_choice_is_cached_with_every_candidate(tiny4, monkeypatch):
    found = derived_draft(tiny4, threads=1)
    assert found.measured and found.layers in [c.layers for c in found.candidates]
    record = json.loads((found.path.parent / "choice.json").read_text())
    assert record["layers"] == list(found.layers)
    assert len(record["candidates"]) == len(found.candidates)
    assert set(record["measurement"]["verify_ratio"]) == {str(k) for k in KS}
    assert [p.name for p in found.path.parent.glob("*.gguf")] == [found.path.name]
    monkeypatch.setattr(selfdraft, "choose_layers", lambda *a, **k: pytest.fail("measured"))
    assert cached_derived(tiny4) == found
    # Layers given by hand replace the choice, with earlier numbers when it was measured.
    other = next(c for c in found.candidates if c.layers != found.layers)
    given = derived_draft(tiny4, threads=1, layers=other.layers)
    assert given.agreement == other.agreement and given.candidates == found.candidates
    assert [p.name for p in given.path.parent.glob("*.gguf")] == [given.path.name]


def test_an_unreadable_choice_is_ignored_and_measured_again(tiny4):
    first = derived_draft(tiny4, threads=1, layers=[1, 2])
    (first.path.parent / "choice.json").write_text("{not json")
    assert cached_derived(tiny4) is None
    assert derived_draft(tiny4, threads=1).measured


def test_a_missing_file_is_derived_again_without_measuring(tiny4, monkeypatch):
    first = derived_draft(tiny4, threads=1, layers=[0, 3])
    first.path.unlink()
    assert cached_derived(tiny4) is None
    monkeypatch.setattr(selfdraft, "choose_layers", lambda *a, **k: pytest.fail("measured"))
    assert derived_draft(tiny4, threads=1) == first and first.path.is_file()


def test_a_changed_target_gets_a_folder_of_its_own(tmp_path):
    target = write_tiny_llama(tmp_path / "t.gguf", n_layer=4)
    before = derived_dir(target)
    derived_draft(target, threads=1, layers=[0, 1])
    write_tiny_llama(target, n_layer=4, seed=5)
    os.utime(target, ns=(1, 1))
    assert derived_dir(target) != before and cached_derived(target) is None


def test_a_derived_file_llama_cpp_refuses_is_not_cached(tiny4, monkeypatch):
    real = selfdraft.write_derived

    def dropping(source, layers, dest):
        real(source, layers, dest)
        rewrite_without(dest, dest.with_suffix(".tmp"), "blk.0.attn_q.weight")
        os.replace(dest.with_suffix(".tmp"), dest)
        return dest

    monkeypatch.setattr(selfdraft, "write_derived", dropping)
    with pytest.raises(ModelFileError) as err:
        derived_draft(tiny4, threads=1, layers=[0, 2])
    assert "derived draft" in err.value.message and "--refresh" in err.value.hint
    assert list(derived_dir(tiny4).glob("*.gguf")) == []
    assert cached_derived(tiny4) is None


def test_given_layers_out_of_range_fail_before_any_work(tiny4):
    with pytest.raises(UsageError, match="outside 0-3"):
        derived_draft(tiny4, threads=1, layers=[2, 7])


# --- the command ----------------------------------------------------------------------------

runner = CliRunner()


def test_derive_draft_command_measures_prints_the_table_and_the_path_last(tiny4):
    result = runner.invoke(
        models_app, ["derive-draft", str(tiny4), "--threads", "1"], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    path = Path(lines[-1])
    assert path.is_file() and path == cached_derived(tiny4).path
    assert "first half" in result.stdout and "every other" in result.stdout
    chosen = [line for line in lines if line.startswith("│ * │")]
    assert len(chosen) == 1 and compact_layers(cached_derived(tiny4).layers) in chosen[0]
    assert "self-draft" in lines[-2] and "pay on this machine" in lines[-2]
    assert "candidate 1/" in result.stderr
    again = runner.invoke(models_app, ["derive-draft", str(tiny4), "--quiet"])
    assert again.exit_code == 0 and again.stdout == f"{path}\n" and again.stderr == ""


def test_derive_draft_command_with_layers(tiny4):
    result = runner.invoke(models_app, ["derive-draft", str(tiny4), "--layers", "0,2-3"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().splitlines()[-1].endswith("layers-0_2-3.gguf")
    assert "not measured" in result.stdout


@pytest.mark.parametrize("layers", ["0-x", "0-9", "3-1"])
def test_derive_draft_command_rejects_bad_layers(tiny4, layers):
    result = runner.invoke(models_app, ["derive-draft", str(tiny4), "--layers", layers])
    assert result.exit_code == 2
    assert "\nerror: " in "\n" + result.stderr and "\nhint: " in result.stderr
    assert "Traceback" not in result.output and result.stdout == ""


@pytest.mark.parametrize(
    "damage",
    [
        lambda r: {**r, "draft_length": float("inf")},
        lambda r: {**r, "agreement": 10**400},  # too large for a float
        lambda r: {**r, "n_layers": float("nan")},
        lambda r: {**r, "candidates": [{**r["candidates"][0], "step_ratio": float("inf")}]},
        lambda r: {**r, "candidates": [{**r["candidates"][0], "draft_length": 10**400}]},
        lambda r: {**r, "layers": {"not": "a list"}},
        lambda r: [[[[r]]]],
    ],
)  # fmt: skip
def test_a_crafted_choice_is_measured_again_not_an_internal_error(tiny4, damage):
    found = derived_draft(tiny4, threads=1, layers=[0, 1])
    record = json.loads((found.path.parent / "choice.json").read_text())
    record["candidates"] = [
        {"layers": [0, 1], "label": "first half", "agreement": 0.5, "step_ratio": 0.5,
         "expected_speedup": 1.2, "draft_length": 2}
    ]  # fmt: skip
    (found.path.parent / "choice.json").write_text(json.dumps(damage(record)))
    assert cached_derived(tiny4) is None
    result = runner.invoke(models_app, ["derive-draft", str(tiny4), "--layers", "0-1"])
    assert result.exit_code == 0, result.output
    assert "internal error" not in result.output and result.stdout.strip().endswith(".gguf")


def test_a_choice_nested_too_deep_is_measured_again(tiny4):
    found = derived_draft(tiny4, threads=1, layers=[0, 1])
    (found.path.parent / "choice.json").write_text("[" * 100_000 + "]" * 100_000)
    assert cached_derived(tiny4) is None


def test_a_layer_past_llama_cpps_limit_is_refused_before_any_list_is_built():
    with pytest.raises(UsageError, match="past llama.cpp's limit of 512"):
        parse_layers("0-99999999999")  # a range of 10^11 layers would not fit in memory
    with pytest.raises(UsageError, match="layer 512"):
        parse_layers("511-512")
    assert parse_layers("510-511") == [510, 511]
    result = runner.invoke(models_app, ["derive-draft", "x.gguf", "--layers", "0-99999999999"])
    assert result.exit_code == 2 and "past llama.cpp's limit" in result.stderr


@pytest.mark.parametrize("count", [2**32 - 1, 1_000_000, 513, 0])
def test_an_absurd_block_count_in_a_header_is_a_model_file_error(tmp_path, count):
    from tests.test_gguf_header import with_block_count

    path = with_block_count(tmp_path / "crafted.gguf", count)
    with pytest.raises(ModelFileError, match="block count"):
        derived_draft(path, threads=1)
    with pytest.raises(ModelFileError, match="block count"):
        derive_gguf(path, [0], tmp_path / "d.gguf")
    result = runner.invoke(models_app, ["derive-draft", str(path)])
    assert result.exit_code == 1 and "error: " in result.stderr, result.output
    assert "internal error" not in result.output


# --- interrupted derivations ---------------------------------------------------------------

# ``localspec`` with every candidate's measurement half a second longer, so that a signal
# reliably arrives while candidates are measured (a real process, real signals).
# Ctrl-C as in a terminal: a runner started in the background may pass SIGINT on ignored.
SLOW_LOCALSPEC = """
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from localspec.models import layerchoice
measure = layerchoice._measure_draft
def slow(*args, **kwargs):
    time.sleep(0.5)
    return measure(*args, **kwargs)
layerchoice._measure_draft = slow
from localspec.cli.app import main
sys.argv = ["localspec", *sys.argv[1:]]
main()
"""


def leftovers(home: Path) -> list[str]:
    """What derivations left under ``home``'s derived drafts besides their lock."""
    root = home / "derived"
    found = [p for p in root.rglob("*") if p.is_file()] if root.is_dir() else []
    return sorted(p.name for p in found if p.name != ".lock")


def started_measuring(proc) -> str:
    """stderr up to the first candidate's line."""
    seen = ""
    while "candidate 1/" not in seen:
        line = proc.stderr.readline()
        assert line, seen
        seen += line
    return seen


def test_leftovers_of_an_interrupted_derivation_are_removed_by_the_next(tiny4):
    directory = derived_dir(tiny4)
    directory.mkdir(parents=True)
    (directory / ".layers-0-1.x1y2.tmp").write_bytes(b"GGUF half a target")
    (directory / ".choice.a1b2.tmp").write_text("{")
    (directory / "selfdraft-q9w8").mkdir()
    (directory / "selfdraft-q9w8" / "layers-1.gguf").write_bytes(b"GGUF a candidate")
    found = derived_draft(tiny4, threads=1, layers=[0, 1])
    assert sorted(p.name for p in directory.iterdir()) == [".lock", "choice.json", found.path.name]


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGHUP", "SIGINT"])
def test_a_stopped_derive_draft_leaves_nothing_behind(tmp_path, stop):
    import signal
    import subprocess
    import sys

    target = write_tiny_llama(tmp_path / "t8.gguf", n_layer=8, seed=3)
    home = tmp_path / "home"
    proc = subprocess.Popen(
        [sys.executable, "-c", SLOW_LOCALSPEC, "models", "derive-draft", str(target),
         "--threads", "1"],
        env={**os.environ, "LOCALSPEC_HOME": str(home)}, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        started_measuring(proc)
        proc.send_signal(getattr(signal, stop))
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
    assert leftovers(home) == []


def test_a_server_stopped_while_it_derives_its_draft_exits_cleanly(tmp_path):
    import signal

    from tests.serving import serve_process

    target = write_tiny_llama(tmp_path / "t8.gguf", n_layer=8, seed=3)
    home = tmp_path / "home"
    args = ["--target", str(target), "--draft", "self", "--threads", "1"]
    with serve_process(args, home, ready=False, python=SLOW_LOCALSPEC) as (proc, _):
        started_measuring(proc)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    assert "did not stop" not in stderr and "in time" not in stderr, stderr
    assert leftovers(home) == []


def test_models_list_and_rm_show_and_remove_derived_drafts(tmp_path):
    target = write_tiny_llama(tmp_path / "t.gguf", n_layer=4)
    current = derived_draft(target, threads=1, layers=[0, 1])
    write_tiny_llama(target, n_layer=4, seed=5)  # changed: its old draft serves nothing
    os.utime(target, ns=(1, 1))
    derived_draft(target, threads=1, layers=[0, 2])
    gone = write_tiny_llama(tmp_path / "gone.gguf", n_layer=4)
    derived_draft(gone, threads=1, layers=[1, 2])
    gone.unlink()
    listed = runner.invoke(models_app, ["list"], env={"COLUMNS": "300"})
    assert listed.exit_code == 0, listed.output
    rows = {
        line.split("│")[1].strip(): line for line in listed.stdout.splitlines()
        if line.count("│") > 4 and ("t-" in line or "gone-" in line)
    }  # fmt: skip
    states = {name: next(s for s in ("current", "target changed", "target gone") if s in row)
              for name, row in rows.items()}  # fmt: skip
    assert sorted(states.values()) == ["current", "target changed", "target gone"]
    stale = current.path.parent.name
    assert states[stale] == "target changed"
    removed = runner.invoke(models_app, ["rm", stale, "--yes"])
    assert removed.exit_code == 0, removed.output
    assert not current.path.parent.exists()
    missing = runner.invoke(models_app, ["rm", "t-000000000000", "--yes"])
    assert missing.exit_code == 1 and "error:" in missing.stderr


# --- a full disk ----------------------------------------------------------------------------


def test_a_disk_without_room_for_the_draft_is_said_before_anything_is_written(
    tiny4, tmp_path, monkeypatch
):
    import shutil

    usage = shutil.disk_usage

    def nearly_full(path):
        return usage(path)._replace(free=1 << 20)

    monkeypatch.setattr(shutil, "disk_usage", nearly_full)
    with pytest.raises(DownloadError, match="not enough disk space"):
        derive_gguf(tiny4, [0, 1], tmp_path / "d.gguf")
    assert list(tmp_path.iterdir()) == []
    result = runner.invoke(models_app, ["derive-draft", str(tiny4), "--layers", "0-1"])
    assert result.exit_code == 1 and "not enough disk space" in result.stderr, result.output
    assert "internal error" not in result.output


def test_a_disk_that_fills_up_while_the_draft_is_written_is_a_disk_full_error(
    tiny4, tmp_path, monkeypatch
):
    import errno

    from localspec.models import derive

    def short_write(src, kept, out):
        out.write_bytes(b"GGUF half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(derive, "_write", short_write)
    result = runner.invoke(models_app, ["derive-draft", str(tiny4), "--layers", "0-1"])
    assert result.exit_code == 1 and "the disk is full" in result.stderr, result.output
    assert "internal error" not in result.output
    assert leftovers(derived_dir(tiny4).parent.parent) == []


def test_a_target_swapped_in_place_with_its_mtime_put_back_gets_a_folder_of_its_own(tmp_path):
    """Same size, same mtime (restored), another file: its inode and change time differ,
    as the GGUF header cache's stamp sees them."""
    target = write_tiny_llama(tmp_path / "t.gguf", n_layer=4)
    derived_draft(target, threads=1, layers=[0, 1])
    assert cached_derived(target) is not None
    before, st = derived_dir(target), target.stat()
    swapped = write_tiny_llama(tmp_path / "other.gguf", n_layer=4, seed=5)
    assert swapped.stat().st_size == st.st_size
    os.replace(swapped, target)
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert derived_dir(target) != before and cached_derived(target) is None


def test_cost_profiles_of_a_model_swapped_in_place_are_its_own(tmp_path):
    from localspec.machine.calibrate import file_identity

    model = tmp_path / "m.gguf"
    model.write_bytes(b"a" * 64)
    before, st = file_identity(model), model.stat()
    (tmp_path / "new.gguf").write_bytes(b"b" * 64)
    os.replace(tmp_path / "new.gguf", model)
    os.utime(model, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert model.stat().st_size == st.st_size and model.stat().st_mtime_ns == st.st_mtime_ns
    assert file_identity(model) != before
