"""Grammars on llama.cpp's grammar sampler over a tiny real model: GBNF and JSON schemas
compile or fail with a sentence, and the engine's greedy output under a grammar is plain
decoding under it, token for token, with every drafter."""

from __future__ import annotations

import json

import numpy as np
import pytest

from localspec.backend.grammar import (
    MAX_GRAMMAR_CHARS,
    MAX_SCHEMA_CHARS,
    GrammarError,
    compile_grammar,
    schema_grammar,
)
from localspec.backend.llama import LlamaModel, LoadOptions
from localspec.core.engine import SpecDecoder, run_to_completion
from localspec.core.params import GenerationParams
from tests.test_engine import CHEAP_VERIFY

pytest.importorskip("llama_cpp")

GBNF = r'''root ::= "{\"a\": \"" [a-z ]{1,12} "\", \"b\": " [0-9]{1,3} "}"'''
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 12}, "n": {"type": "integer"}},
    "required": ["name", "n"],
}


@pytest.fixture
def pair(tiny_pair):
    target, draft, _ = tiny_pair
    t = LlamaModel(target, LoadOptions(n_ctx=256, n_threads=1))
    d = LlamaModel(draft, LoadOptions(n_ctx=256, n_threads=1))
    yield t, d
    t.close()
    d.close()


def grammar_for(model: LlamaModel, text: str):
    return compile_grammar(model._vocab, model.n_vocab, text)


def plain_under(model: LlamaModel, prompt: list[int], text: str, n: int) -> list[int]:
    """Reference: one token at a time, each the best of the whole masked row."""
    grammar, out = grammar_for(model, text), []
    for _ in range(n):
        row = model.forward([*prompt, *out], 1)[0]
        keep = grammar.allowed(model.n_vocab)
        tok = int(np.argmax(np.where(keep, row, -np.inf)))
        if model.is_eog(tok):
            break
        grammar.accept(tok)
        out.append(tok)
    return out


@pytest.mark.parametrize("mode", ["none", "ngram", "model", "auto"])
@pytest.mark.parametrize("kind", ["gbnf", "schema"])
def test_greedy_under_a_grammar_is_plain_decoding_under_it(pair, mode, kind):
    target, draft = pair
    text = GBNF if kind == "gbnf" else schema_grammar(SCHEMA)
    prompt = target.tokenize("Answer in JSON: the name is the a and")
    expected = plain_under(target, prompt, text, 60)
    decoder = SpecDecoder(target, draft)
    fin = run_to_completion(
        decoder.generate(
            prompt, GenerationParams(max_tokens=60, drafter=mode), grammar=grammar_for(target, text)
        )
    )
    assert list(fin.token_ids) == expected
    answer = json.loads(fin.text)
    if kind == "schema":
        assert set(answer) == {"name", "n"} and isinstance(answer["n"], int)
    else:
        assert set(answer) == {"a", "b"}


def test_forced_keys_are_drafted_by_the_grammar(pair):
    target, _ = pair
    decoder = SpecDecoder(target, costs=CHEAP_VERIFY)
    events = list(
        decoder.generate(
            target.tokenize("JSON:"),
            GenerationParams(max_tokens=60, drafter="auto", left_out=("ngram", "lookahead")),
            grammar=grammar_for(target, schema_grammar(SCHEMA)),
        )
    )
    drafted = [e for e in events if getattr(e, "drafter", None) == "grammar"]
    assert drafted and sum(e.accepted for e in drafted) >= 2


def test_a_grammar_forbids_and_allows_as_llama_cpp_says(pair):
    target, _ = pair
    grammar = grammar_for(target, GBNF)
    brace = target.tokenize("{", add_special=False)[-1]
    letter = target.tokenize("x", add_special=False)[-1]
    assert grammar.allows(brace) and not grammar.allows(letter)
    with pytest.raises(ValueError, match="does not allow"):
        grammar.accept(letter)
    clone = grammar.clone()
    clone.accept(brace)
    assert grammar.allows(brace) and not clone.allows(brace)
    mask = grammar.allowed(target.n_vocab)
    assert mask[brace] and not mask[letter] and mask.sum() < target.n_vocab


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("root ::= undefined-rule", "does not parse"),
        ('root ::= "unterminated', "does not parse"),
        ("x" * (MAX_GRAMMAR_CHARS + 1), "over"),
    ],
)
def test_a_grammar_that_cannot_be_used_is_a_sentence(pair, text, said):
    with pytest.raises(GrammarError, match=said):
        grammar_for(pair[0], text)


@pytest.mark.parametrize(
    ("schema", "said"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "not a JSON object"),
        ({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}, "cannot be converted"),
        ({"type": "string", "description": "x" * MAX_SCHEMA_CHARS}, "over"),
    ],
)
def test_a_schema_that_cannot_be_converted_is_a_sentence(schema, said):
    with pytest.raises(GrammarError, match=said):
        schema_grammar(schema)
