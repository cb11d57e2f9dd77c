"""Fill-in-the-middle prompts: the FIM tokens llama.cpp finds in a vocabulary (by their
known texts, or by GGUF keys), and ``Session.infill_tokens``' layout, id by id."""

from __future__ import annotations

import pytest

from localspec.backend.llama import LlamaModel, LoadOptions
from localspec.backend.vocab import FimTokens
from localspec.errors import UnsupportedByModelError
from localspec.session.open import open_session
from localspec.session.pair import ModelOptions
from tests.tiny_gguf import QWEN_FIM, tiny_vocab, write_tiny_llama

BOS = 1
# Texts llama.cpp does not know, so only the GGUF keys can name them.
OTHER_FIM = ("<|a_pre|>", "<|a_suf|>", "<|a_mid|>", "<|a_pad|>", "<|a_rep|>", "<|a_sep|>")


def _ids(fim):
    vocab = tiny_vocab(fim=fim)
    return FimTokens(*(vocab.index(text) for text in fim))


def _vocab_only(path):
    return LlamaModel(path, LoadOptions(), vocab_only=True)


@pytest.fixture(scope="module")
def session(fim_pair):
    target, _ = fim_pair
    s = open_session(ModelOptions(target=str(target), use_draft=False, n_ctx=256, calibrate=False))
    yield s
    s.close()


def test_qwen_fim_tokens_are_found_by_their_text(fim_pair):
    model = _vocab_only(fim_pair[0])
    try:
        fim = model.fim_tokens()
        assert fim == _ids(QWEN_FIM) and fim.infill
        assert fim.pre == len(tiny_vocab())  # right after the plain vocabulary
    finally:
        model.close()


def test_other_fim_tokens_are_found_by_gguf_keys_only(tmp_path):
    keyed = _vocab_only(write_tiny_llama(tmp_path / "k.gguf", fim=OTHER_FIM, fim_keys=True))
    unkeyed = _vocab_only(write_tiny_llama(tmp_path / "u.gguf", fim=OTHER_FIM))
    try:
        assert keyed.fim_tokens() == _ids(OTHER_FIM)
        assert unkeyed.fim_tokens() == FimTokens(None, None, None, None, None, None)
    finally:
        keyed.close()
        unkeyed.close()


def test_plain_tiny_models_keep_their_vocabulary_and_have_no_fim(tiny_pair):
    assert tiny_vocab(fim=()) == tiny_vocab()
    model = _vocab_only(tiny_pair[0])
    try:
        fim = model.fim_tokens()
        assert not fim.infill and fim == FimTokens(None, None, None, None, None, None)
    finally:
        model.close()


def test_fim_pad_repo_and_file_separator_end_generation(fim_pair):
    # As llama.cpp treats them: a model that writes one of these has finished the middle.
    model = _vocab_only(fim_pair[0])
    try:
        fim = model.fim_tokens()
        assert all(model.is_eog(t) for t in (fim.pad, fim.rep, fim.sep, 2))
        assert not any(model.is_eog(t) for t in (fim.pre, fim.suf, fim.mid))
    finally:
        model.close()


def test_infill_layout_is_prefix_suffix_middle(session):
    fim = _ids(QWEN_FIM)
    prefix, suffix = "def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n"
    tokens = session.infill_tokens(prefix, suffix)
    plain = session.target.tokenize
    pre = plain(prefix, add_special=False, parse_special=False)
    suf = plain(suffix, add_special=False, parse_special=False)
    assert tokens == [BOS, fim.pre, *pre, fim.suf, *suf, fim.mid]
    assert pre and suf and not {fim.pre, fim.suf, fim.mid, BOS} & set(pre + suf)
    decoded = b"".join(session.target.token_bytes(t) for t in pre + suf).decode()
    assert decoded.replace(" ", "") == (prefix + suffix).replace(" ", "")
    # The cursor at the start or end of the file: an empty side is just its FIM token.
    x = plain("x", add_special=False, parse_special=False)
    assert session.infill_tokens("", "x") == [BOS, fim.pre, fim.suf, *x, fim.mid]


def test_control_token_text_in_the_code_stays_text(session):
    fim = _ids(QWEN_FIM)
    tokens = session.infill_tokens("a <|fim_middle|> b", "c <|fim_prefix|>")
    assert tokens.count(fim.mid) == 1 and tokens.count(fim.pre) == 1
    assert tokens[1] == fim.pre and tokens[-1] == fim.mid


def test_no_bos_when_the_vocabulary_adds_none(tmp_path):
    path = write_tiny_llama(tmp_path / "nobos.gguf", fim=QWEN_FIM, add_bos=False)
    s = open_session(ModelOptions(target=str(path), use_draft=False, n_ctx=128, calibrate=False))
    try:
        tokens = s.infill_tokens("a", "b")
        assert tokens[0] == _ids(QWEN_FIM).pre and BOS not in tokens
    finally:
        s.close()


def test_a_model_without_fim_tokens_refuses_clearly(tiny_pair):
    target, _, _ = tiny_pair
    s = open_session(ModelOptions(target=str(target), use_draft=False, n_ctx=128, calibrate=False))
    try:
        with pytest.raises(UnsupportedByModelError, match="no fill-in-the-middle tokens"):
            s.infill_tokens("def f(", "):")
    finally:
        s.close()
