"""Grammars on llama.cpp's grammar sampler: GBNF text and JSON schemas, checked and compiled
for one model's vocabulary.

``LlamaGrammar`` is ``core.grammar.Grammar`` over ``llama_sampler_init_grammar``: ``accept``
is ``llama_sampler_accept``, ``allows`` applies the sampler to a one-token candidate array
(cheap), ``allowed`` to the whole vocabulary (a pass over every token: the engine asks for it
only when it must), and ``clone`` is ``llama_sampler_clone``. llama.cpp aborts the process when
a grammar is advanced by a token it forbids, so ``accept`` checks first and raises
``ValueError`` instead.

``schema_grammar(schema)`` converts a JSON schema (a dict or its text) with llama-cpp-python's
own converter (``llama_cpp.llama_grammar.json_schema_to_gbnf``); ``compile_grammar(vocab,
text)`` parses GBNF for a vocabulary, raising ``GrammarError`` with a sentence when it does not
parse. Both bound their input (``MAX_GRAMMAR_CHARS``, ``MAX_SCHEMA_CHARS``) so that no request
can make them work for long.
"""

from __future__ import annotations

import ctypes
import json
from typing import Any

import llama_cpp
import numpy as np
from llama_cpp import llama_grammar

MAX_GRAMMAR_CHARS = 64_000
MAX_SCHEMA_CHARS = 32_000
ROOT = b"root"
# llama_token_data as numpy lays it out: the candidates a grammar pass reads and marks.
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


class GrammarError(ValueError):
    """A grammar or schema that cannot constrain an answer, said as a sentence."""


def schema_grammar(schema: Any) -> str:
    """GBNF for a JSON schema (a dict, or JSON text of one); ``GrammarError`` when the text
    is not JSON, too large, or the converter cannot take it."""
    text = schema if isinstance(schema, str) else json.dumps(schema)
    if len(text) > MAX_SCHEMA_CHARS:
        raise GrammarError(f"the schema is {len(text)} characters, over {MAX_SCHEMA_CHARS}")
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as e:
        raise GrammarError(f"the schema is not JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise GrammarError("the schema is not a JSON object")
    try:
        return llama_grammar.json_schema_to_gbnf(json.dumps(parsed))
    except RecursionError:
        raise GrammarError("the schema nests too deeply to convert") from None
    except Exception as e:  # the converter raises what it meets: say it
        raise GrammarError(f"the schema cannot be converted to a grammar: {e}") from None


def check_size(text: str) -> None:
    if len(text) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"the grammar is {len(text)} characters, over {MAX_GRAMMAR_CHARS}")


class LlamaGrammar:
    """A grammar sampler at one state (see the module docstring)."""

    def __init__(self, sampler: Any, n_vocab: int) -> None:
        self._sampler = sampler
        self.n_vocab = n_vocab

    def __del__(self) -> None:
        sampler, self._sampler = getattr(self, "_sampler", None), None
        if sampler:
            llama_cpp.llama_sampler_free(sampler)

    def clone(self) -> LlamaGrammar:
        return LlamaGrammar(llama_cpp.llama_sampler_clone(self._sampler), self.n_vocab)

    def allows(self, token: int) -> bool:
        return bool(self.allowed_among(np.array([token], dtype=np.int32))[0])

    def allowed(self, n_vocab: int) -> np.ndarray:
        n = min(n_vocab, self.n_vocab)
        keep = np.zeros(n_vocab, dtype=bool)
        keep[:n] = self.allowed_among(np.arange(n, dtype=np.int32))
        return keep

    def allowed_among(self, ids: np.ndarray) -> np.ndarray:
        data = np.zeros(len(ids), dtype=_TOKEN_DATA)
        data["id"] = ids
        array = llama_cpp.llama_token_data_array(
            data.ctypes.data_as(llama_cpp.llama_token_data_p), len(ids), -1, False
        )
        llama_cpp.llama_sampler_apply(self._sampler, ctypes.byref(array))
        # The grammar sets the logit of each token it forbids to -inf, in place.
        return np.isfinite(data["logit"])

    def accept(self, token: int) -> None:
        if not self.allows(token):
            raise ValueError(f"the grammar does not allow token {token} here")
        llama_cpp.llama_sampler_accept(self._sampler, token)


def check_grammar(text: str) -> None:
    """``GrammarError`` unless ``text`` is GBNF that parses (no model needed: the parse
    alone, so that a front end refuses it before anything loads)."""
    check_size(text)
    if not text.strip():
        raise GrammarError("the grammar is empty")
    sampler = llama_cpp.llama_sampler_init_grammar(None, text.encode("utf-8"), ROOT)
    if not sampler:
        raise GrammarError("the grammar does not parse (GBNF with a rule named root)")
    llama_cpp.llama_sampler_free(sampler)


def model_grammar(model: Any, text: str) -> LlamaGrammar:
    """``compile_grammar`` for a loaded ``LlamaModel`` (its vocabulary)."""
    return compile_grammar(model._vocab, model.n_vocab, text)


def compile_grammar(vocab: Any, n_vocab: int, text: str) -> LlamaGrammar:
    """``text`` (GBNF, its rule ``root`` first to match) for a model's vocabulary handle
    (``LlamaModel._vocab``); ``GrammarError`` when it is too large or does not parse."""
    check_size(text)
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, text.encode("utf-8"), ROOT)
    if not sampler:
        raise GrammarError("the grammar does not parse (GBNF with a rule named root)")
    return LlamaGrammar(sampler, n_vocab)


def compile_lazy(model: Any, text: str, trigger_tokens: list[int]) -> LlamaGrammar:
    """A lazy grammar for a loaded ``LlamaModel``: text is free until one of
    ``trigger_tokens`` comes (a tool-call tag), and from that token on (its own text
    included) must match ``text``."""
    check_size(text)
    tokens = (llama_cpp.llama_token * len(trigger_tokens))(*trigger_tokens)
    sampler = llama_cpp.llama_sampler_init_grammar_lazy_patterns(
        model._vocab, text.encode("utf-8"), ROOT, None, 0, tokens, len(trigger_tokens)
    )
    if not sampler:
        raise GrammarError("the grammar does not parse (GBNF with a rule named root)")
    return LlamaGrammar(sampler, model.n_vocab)
