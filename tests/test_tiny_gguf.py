"""The tiny GGUF writer makes models llama.cpp really loads, tokenizes and evaluates."""

from __future__ import annotations

import gguf
import numpy as np
import pytest

from tests.tiny_gguf import F16, tiny_vocab, write_tiny_llama

llama_cpp = pytest.importorskip("llama_cpp")


def _tokens(path):
    field = gguf.GGUFReader(path).fields["tokenizer.ggml.tokens"]
    return [bytes(field.parts[i]).decode() for i in field.data]


def test_loads_with_the_low_level_api(tmp_path):
    path = write_tiny_llama(tmp_path / "m.gguf")
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(
        str(path).encode(), llama_cpp.llama_model_default_params()
    )
    assert model
    llama_cpp.llama_model_free(model)


@pytest.mark.parametrize("ftype", ["f32", F16])
def test_tokenizes_ascii_and_generates(tmp_path, ftype):
    llm = llama_cpp.Llama(
        str(write_tiny_llama(tmp_path / "m.gguf", ftype=ftype)), n_ctx=128, verbose=False
    )
    text = b"def add(a, b): return a + b  # 42!"
    tokens = llm.tokenize(text)
    assert tokens[0] == 1  # BOS
    assert llm.detokenize(tokens[1:]).strip() == text.strip()
    out = llm("the", max_tokens=4, temperature=0)
    assert out["usage"]["completion_tokens"] >= 1


def test_seeds_share_the_vocab_but_not_the_weights(tmp_path):
    a = write_tiny_llama(tmp_path / "a.gguf", seed=0)
    b = write_tiny_llama(tmp_path / "b.gguf", seed=1)
    again = write_tiny_llama(tmp_path / "a2.gguf", seed=0)
    assert _tokens(a) == _tokens(b) == tiny_vocab()
    assert a.read_bytes() == again.read_bytes()
    assert a.read_bytes() != b.read_bytes()
    logits = []
    for path in (a, b):
        llm = llama_cpp.Llama(str(path), n_ctx=64, logits_all=True, verbose=False)
        llm.eval(llm.tokenize(b"hello"))
        logits.append(np.array(llm.scores[llm.n_tokens - 1]))
    assert not np.allclose(logits[0], logits[1])


def test_a_different_vocab_is_possible(tmp_path):
    a = write_tiny_llama(tmp_path / "a.gguf")
    b = write_tiny_llama(tmp_path / "b.gguf", vocab=["▁foo", "bar"], n_vocab=400)
    assert _tokens(a) != _tokens(b)
    assert len(_tokens(b)) == 400 and "▁foo" in _tokens(b)
    with pytest.raises(ValueError):
        write_tiny_llama(tmp_path / "c.gguf", n_vocab=10)
