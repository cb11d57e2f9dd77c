"""A loaded llama.cpp model's vocabulary and metadata: tokenizing, token bytes and texts,
end-of-generation tokens, the vocabulary's description for the compatibility check, its
fill-in-the-middle tokens and GGUF metadata (chat template, name).

Contract: ``LlamaVocabulary`` is a mixin of ``LlamaModel`` (backend/llama.py); it reads the
handles the model sets, ``_model`` and ``_vocab``, and ``n_vocab`` and ``path``, and keeps
per-token answers in the dicts the model creates on load (``_pieces``, ``_eog``): a
vocabulary never changes.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp


@dataclass(frozen=True)
class VocabInfo:
    vocab_type: int
    n_tokens: int
    bos: int
    eos: int
    add_bos: bool
    add_eos: bool


@dataclass(frozen=True)
class FimTokens:
    """The vocabulary's fill-in-the-middle tokens, as llama.cpp found them (GGUF keys, or
    known texts such as Qwen's ``<|fim_prefix|>``); ``None`` where there is none."""

    pre: int | None
    suf: int | None
    mid: int | None
    pad: int | None
    rep: int | None
    sep: int | None

    @property
    def infill(self) -> bool:
        """Whether a prefix-suffix-middle prompt can be built: all three are needed."""
        return None not in (self.pre, self.suf, self.mid)

    @property
    def infill_ids(self) -> tuple[int, int, int] | None:
        """The prefix, suffix and middle tokens; None unless all three exist."""
        if self.pre is None or self.suf is None or self.mid is None:
            return None
        return self.pre, self.suf, self.mid


class LlamaVocabulary:
    _model: Any
    _vocab: Any
    _pieces: dict[tuple[int, bool], bytes]
    _eog: dict[int, bool]
    n_vocab: int
    path: Path

    def tokenize(
        self, text: str, *, add_special: bool = True, parse_special: bool = True
    ) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(
            self._vocab, data, len(data), buf, cap, add_special, parse_special
        )
        if n < 0:
            cap = -n
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(
                self._vocab, data, len(data), buf, cap, add_special, parse_special
            )
        return list(buf[:n])

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        # Every emitted token asks: kept per token, the vocabulary never changes.
        key = (token, special)
        piece = self._pieces.get(key)
        if piece is None:
            piece = self._pieces[key] = self._token_bytes(token, special)
        return piece

    def _token_bytes(self, token: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, 64, 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self._vocab, token, buf, -n, 0, special)
        return buf.raw[:n]

    def token_text(self, token: int) -> str:
        raw = llama_cpp.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    def is_eog(self, token: int) -> bool:
        # Asked for every emitted token and by the n-gram drafter for every token it reads.
        eog = self._eog.get(token)
        if eog is None:
            eog = self._eog[token] = bool(llama_cpp.llama_vocab_is_eog(self._vocab, token))
        return eog

    def vocab_info(self) -> VocabInfo:
        v = self._vocab
        return VocabInfo(
            vocab_type=llama_cpp.llama_vocab_type(v),
            n_tokens=self.n_vocab,
            bos=llama_cpp.llama_vocab_bos(v),
            eos=llama_cpp.llama_vocab_eos(v),
            add_bos=bool(llama_cpp.llama_vocab_get_add_bos(v)),
            add_eos=bool(llama_cpp.llama_vocab_get_add_eos(v)),
        )

    def fim_tokens(self) -> FimTokens:
        def known(token: int) -> int | None:
            return token if 0 <= token < self.n_vocab else None  # LLAMA_TOKEN_NULL is -1

        v = self._vocab
        return FimTokens(
            pre=known(llama_cpp.llama_vocab_fim_pre(v)),
            suf=known(llama_cpp.llama_vocab_fim_suf(v)),
            mid=known(llama_cpp.llama_vocab_fim_mid(v)),
            pad=known(llama_cpp.llama_vocab_fim_pad(v)),
            rep=known(llama_cpp.llama_vocab_fim_rep(v)),
            sep=known(llama_cpp.llama_vocab_fim_sep(v)),
        )

    def metadata(self, key: str) -> str | None:
        buf = ctypes.create_string_buffer(256)
        n = llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, 256)
        if n < 0:
            return None
        if n >= 256:
            buf = ctypes.create_string_buffer(n + 1)
            llama_cpp.llama_model_meta_val_str(self._model, key.encode(), buf, n + 1)
        return buf.value.decode("utf-8", errors="replace")

    def chat_template(self) -> str | None:
        return self.metadata("tokenizer.chat_template")

    def description(self) -> str:
        buf = ctypes.create_string_buffer(128)
        llama_cpp.llama_model_desc(self._model, buf, 128)
        name = self.metadata("general.name") or self.path.stem
        return f"{name} ({buf.value.decode(errors='replace')})"
