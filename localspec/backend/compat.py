"""Can this draft's tokens be verified by this target? llama.cpp's rules, with reasons.

From llama.cpp's ``common_speculative_are_compatible``: the same vocabulary type; the same
add-BOS/add-EOS flags, and the same BOS (EOS) id only where the vocabularies add it (an
instruct target and its base draft often end turns with different tokens, which the
target's own verification makes harmless); vocabulary sizes at most 128 apart; and equal
token texts for every id from 5 up to the smaller vocabulary's size. The report names the first
differing token id and both texts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from localspec.backend.llama import LlamaModel
from localspec.backend.vocab import VocabInfo

MAX_VOCAB_SIZE_DIFFERENCE = 128
FIRST_CHECKED_TOKEN = 5


class VocabSource(Protocol):
    def vocab_info(self) -> VocabInfo: ...
    def token_text(self, token: int) -> str: ...


@dataclass
class CompatReport:
    compatible: bool
    reasons: list[str] = field(default_factory=list)
    first_mismatch: tuple[int, str, str] | None = None  # (token id, target text, draft text)

    def summary(self) -> str:
        return "compatible" if self.compatible else "; ".join(self.reasons)


def check_vocabularies(target: VocabSource, draft: VocabSource) -> CompatReport:
    t, d = target.vocab_info(), draft.vocab_info()
    reasons: list[str] = []
    if t.vocab_type != d.vocab_type:
        reasons.append(f"vocabulary types differ (target {t.vocab_type}, draft {d.vocab_type})")
    for label, a, b, compared in (
        ("add-BOS flag", t.add_bos, d.add_bos, True),
        ("add-EOS flag", t.add_eos, d.add_eos, True),
        ("BOS id", t.bos, d.bos, t.add_bos),
        ("EOS id", t.eos, d.eos, t.add_eos),
    ):
        if compared and a != b:
            reasons.append(f"{label} differs (target {a}, draft {b})")
    if abs(t.n_tokens - d.n_tokens) > MAX_VOCAB_SIZE_DIFFERENCE:
        reasons.append(
            f"vocabulary sizes differ by more than {MAX_VOCAB_SIZE_DIFFERENCE} "
            f"(target {t.n_tokens}, draft {d.n_tokens})"
        )
    mismatch = None
    if not reasons:
        for i in range(FIRST_CHECKED_TOKEN, min(t.n_tokens, d.n_tokens)):
            ours, theirs = target.token_text(i), draft.token_text(i)
            if ours != theirs:
                mismatch = (i, ours, theirs)
                reasons.append(f"token {i} differs: target {ours!r}, draft {theirs!r}")
                break
    if reasons:
        return CompatReport(False, reasons, mismatch)
    n = min(t.n_tokens, d.n_tokens)
    return CompatReport(True, [f"same vocabulary type, special-token rules and {n} token texts"])


def check_pair(target_path: Path, draft_path: Path) -> CompatReport:
    """Load only the two vocabularies (fast) and compare them."""
    target = LlamaModel(Path(target_path), vocab_only=True)
    draft = LlamaModel(Path(draft_path), vocab_only=True)
    try:
        return check_vocabularies(target, draft)
    finally:
        target.close()
        draft.close()
