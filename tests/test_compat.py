"""The vocabulary compatibility rules, as llama.cpp applies them today: BOS/EOS ids are
compared only where the vocabulary adds them; the add flags, the type, the size (within
128) and the token texts always."""

from __future__ import annotations

from dataclasses import replace

import pytest

from localspec.backend.compat import check_vocabularies
from localspec.backend.vocab import VocabInfo

QWEN = VocabInfo(
    vocab_type=2, n_tokens=151936, bos=151643, eos=151645, add_bos=False, add_eos=False
)


class Vocab:
    def __init__(self, info: VocabInfo, texts: dict[int, str] | None = None) -> None:
        self.info, self.texts = info, texts or {}

    def vocab_info(self) -> VocabInfo:
        return self.info

    def token_text(self, token: int) -> str:
        return self.texts.get(token, f"t{token}")


def check(target: VocabInfo, draft: VocabInfo, texts: dict[int, str] | None = None):
    return check_vocabularies(Vocab(target), Vocab(draft, texts))


def test_an_instruct_target_with_a_base_draft_is_compatible():
    # Base models end with <|endoftext|> (151643), instruct ones with <|im_end|> (151645);
    # neither adds BOS or EOS, so llama.cpp does not compare those ids.
    report = check(QWEN, replace(QWEN, eos=151643))
    assert report.compatible, report.reasons


@pytest.mark.parametrize(
    ("draft", "reason"),
    [
        (replace(QWEN, add_bos=True), "add-BOS flag differs"),
        (replace(QWEN, add_eos=True), "add-EOS flag differs"),
        (replace(QWEN, vocab_type=1), "vocabulary types differ"),
        (replace(QWEN, n_tokens=151936 - 129), "more than 128"),
    ],
)
def test_what_always_counts(draft, reason):
    report = check(QWEN, draft)
    assert not report.compatible and reason in report.summary()


def test_ids_count_where_the_vocabulary_adds_them():
    llama = replace(QWEN, add_bos=True, add_eos=True)
    assert "BOS id differs" in check(llama, replace(llama, bos=1)).summary()
    assert "EOS id differs" in check(llama, replace(llama, eos=2)).summary()


def test_the_first_differing_token_is_named():
    report = check(QWEN, replace(QWEN, n_tokens=151936 - 100), texts={77: "other"})
    assert not report.compatible and report.first_mismatch == (77, "t77", "other")
