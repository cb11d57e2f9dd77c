"""Greedy choices made by llama.cpp's backend sampler (tiny GGUF models): greedy decoding
reads no logits row on the target or the draft model, counted where the backend calls
llama.cpp, and decodes what the host's way decodes; sampling still reads its rows."""

from __future__ import annotations

from collections import Counter

import llama_cpp
import pytest

from localspec.backend.llama import LlamaModel, LoadOptions
from localspec.core.cached_model import DEVICE, HOST
from localspec.core.engine import SpecDecoder, run_to_completion
from localspec.core.params import GenerationParams
from localspec.core.tree import DraftTree, verify_tree_greedy

PROMPT = [1, 5, 9, 14, 20, 7, 3, 4]
OPTIONS = LoadOptions(n_ctx=256, n_threads=1)


def _address(ctx) -> int:
    return ctx if isinstance(ctx, int) else ctx.value


@pytest.fixture
def rows_read(monkeypatch):
    """Calls that read logits rows, per context address (llama_get_logits and
    llama_get_logits_ith, the only ways to a row)."""
    counts: Counter[int] = Counter()
    for name in ("llama_get_logits", "llama_get_logits_ith"):
        real = getattr(llama_cpp, name)

        def counted(ctx, *args, _real=real):
            counts[_address(ctx)] += 1
            return _real(ctx, *args)

        monkeypatch.setattr(llama_cpp, name, counted)
    return counts


@pytest.fixture
def pair(tiny_pair):
    """Load a target and its draft, device or host; all closed at the end."""
    target_path, draft_path, _ = tiny_pair
    loaded: list[LlamaModel] = []

    def load(device: bool) -> tuple[LlamaModel, LlamaModel]:
        target = LlamaModel(target_path, LoadOptions(**{**vars(OPTIONS), "device_greedy": device}))
        draft_options = LoadOptions(
            **{**vars(OPTIONS), "device_greedy": device, "greedy_confidence": True}
        )
        draft = LlamaModel(draft_path, draft_options)
        loaded.extend([target, draft])
        return target, draft

    yield load
    for m in loaded:
        m.close()


def _generate(target, draft, **params) -> tuple[int, ...]:
    decoder = SpecDecoder(target, draft)
    finished = run_to_completion(decoder.generate(PROMPT, GenerationParams(**params)))
    return finished.token_ids


@pytest.mark.parametrize("drafter", ["model", "lookahead", "none"])
def test_greedy_decoding_reads_no_logits_row_and_decodes_what_the_host_decodes(
    pair, rows_read, drafter
):
    host_target, host_draft = pair(device=False)
    expected = _generate(host_target, host_draft, max_tokens=40, drafter=drafter)
    assert rows_read[_address(host_target.shared.ctx)] > 0  # the host's way reads its rows
    target, draft = pair(device=True)
    assert target.greedy_where == draft.greedy_where == DEVICE
    assert host_target.greedy_where == HOST
    rows_read.clear()
    assert _generate(target, draft, max_tokens=40, drafter=drafter) == expected
    assert rows_read[_address(target.shared.ctx)] == 0
    assert rows_read[_address(draft.shared.ctx)] == 0
    assert target.evaluated_tokens > 0 and (drafter != "model" or draft.evaluated_tokens > 0)


def test_llama_cpp_copies_no_row_of_a_greedy_batch(pair):
    target, _ = pair(device=True)
    ids = target.greedy(PROMPT, 3).ids
    for i in range(-3, 0):
        assert llama_cpp.llama_get_sampled_logits_count_ith(target.shared.ctx, i) == 0
        assert llama_cpp.llama_get_sampled_token_ith(target.shared.ctx, i) == ids[3 + i]
    reference = target.forward(PROMPT, 3)  # rows asked for: the samplers are set aside
    assert ids == reference.argmax(axis=-1).tolist()


def test_a_draft_tree_is_verified_from_the_devices_choices(pair, rows_read):
    (host, _), (device, _) = pair(device=False), pair(device=True)
    tree = DraftTree.from_branches([[3, 4, 11], [3, 8], [6, 2, 2, 9]])
    rows_read.clear()
    choices = device.greedy_tree(PROMPT, tree)
    assert rows_read[_address(device.shared.ctx)] == 0
    assert choices == host.greedy_tree(PROMPT, tree)
    device.keep_path(verify_tree_greedy(choices, tree).path)
    host.keep_path(verify_tree_greedy(choices, tree).path)
    assert device.cached == host.cached


def test_sampling_reads_rows_and_greedy_decoding_then_reads_none_again(pair, rows_read):
    target, draft = pair(device=True)
    sampled = _generate(target, draft, max_tokens=12, drafter="model", temperature=0.8)
    assert len(sampled) == 12 and rows_read[_address(target.shared.ctx)] > 0
    assert rows_read[_address(draft.shared.ctx)] > 0  # q: the draft's whole distribution
    rows_read.clear()
    _generate(target, draft, max_tokens=12, drafter="model")
    assert rows_read[_address(target.shared.ctx)] == rows_read[_address(draft.shared.ctx)] == 0
    assert target.greedy_where == DEVICE
