"""The device check's model shapes (experiments/device/shapes.py) on tiny GGUF models: a
shape read from a file and rescaled writes a model llama.cpp loads and decodes with."""

from __future__ import annotations

import pytest

from localspec.backend.llama import LlamaModel, LoadOptions
from tests.scripts import EXPERIMENTS, load_script

SHAPES = EXPERIMENTS / "device" / "shapes.py"


@pytest.fixture(scope="module")
def shaping():
    return load_script(SHAPES, "device_shapes")


def test_a_shape_keeps_the_metadata_and_tensor_shapes_and_survives_saving(
    shaping, tiny_pair, tmp_path
):
    target, _, _ = tiny_pair
    shape = shaping.describe(target)
    assert shape["fields"]["general.architecture"][0] == "llama"
    assert len(shape["fields"]["tokenizer.ggml.tokens"][0]) > 10
    names = {name for name, _ in shape["tensors"]}
    assert "token_embd.weight" in names and "blk.1.attn_q.weight" in names
    shaping.save(shape, tmp_path / "s.json.gz")
    assert shaping.load(tmp_path / "s.json.gz") == shape


def test_a_rescaled_shape_has_the_widths_and_depth_asked_for(shaping, tiny_pair):
    target, _, _ = tiny_pair
    shape = shaping.describe(target)
    wide = shaping.scaled(shape, "wide", n_embd=512, n_ff=1024, n_layer=3, n_head=8, n_head_kv=4)
    dims = dict((name, tuple(d)) for name, d in wide["tensors"])
    n_vocab = len(shape["fields"]["tokenizer.ggml.tokens"][0])
    assert dims["token_embd.weight"] == (512, n_vocab)
    assert dims["blk.2.attn_q.weight"] == (512, 512)
    assert dims["blk.2.attn_k.weight"] == (512, 4 * 64)  # kv heads x head dimension
    assert dims["blk.0.ffn_down.weight"] == (1024, 512)
    assert "blk.3.attn_q.weight" not in dims and dims["output.weight"] == (512, n_vocab)
    assert wide["fields"]["llama.block_count"][0] == 3


def test_a_random_model_of_a_shape_loads_and_repeats_its_last_token(shaping, tiny_pair, tmp_path):
    target, _, _ = tiny_pair
    small = shaping.tiny(shaping.describe(target), "tiny", n_layer=2, n_embd=256)
    path = shaping.write_f16(small, tmp_path / "random.gguf")
    model = LlamaModel(path, LoadOptions(n_ctx=64, n_threads=1))
    try:
        # Decisive: it repeats its last token, by a margin no batch shape's rounding moves.
        found = model.greedy([1, 5, 9, 14], 2, confidence=True)
        assert found.ids == [9, 14]
        assert found.top_p is not None and min(found.top_p) > 3 / model.n_vocab
    finally:
        model.close()


def test_the_lanes_step_times_gathered_rounds_and_rounds_in_turn(tiny_pair):
    """The device check's lanes step (experiments/device/check.py) on the tiny target: both
    ways run every lane's rounds, the gathered way in one evaluation per round."""
    check = load_script(SHAPES.parent / "check.py", "device_check", beside=True)
    target, _, _ = tiny_pair
    model = LlamaModel(target, LoadOptions(n_ctx=256, n_threads=1, lanes=3))
    try:
        out = check.lanes_speedup(model, rounds=4, depth=16)
    finally:
        model.close()
    assert out["lanes"] == 3 and out["in_turn_s"] > 0 and out["gathered_s"] > 0
    # Every lane queued before the first round: one evaluation per round of all three.
    assert out["evaluations"] == 4
    assert out["speedup"] == round(out["in_turn_s"] / out["gathered_s"], 3)
