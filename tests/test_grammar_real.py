"""Slow: structured output on the real default pair (Qwen2.5-Coder 1.5B target, 0.5B draft),
with batch-invariant kernels (``exact``), so greedy output under a JSON schema must be plain
decoding's under it token for token in every drafter mode, and every answer parses and
matches its schema; the schema's keys are what the grammar drafts by itself."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

EXTRACTION = (
    "Extract the person from this text as JSON.\n\nText: Maria Lopez, 34, works as a "
    "nurse in Valencia and speaks Spanish and English."
)
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "city": {"type": "string"},
        "languages": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "age", "city", "languages"],
}


# Exact mode's kernels are chosen once per process, before its first evaluation, and the
# suite's other tests evaluate first: the answers are made in a process of their own.
ANSWERS = """
import json, sys
from localspec.core.engine import run_to_completion
from localspec.core.params import GenerationParams
from localspec.session.constraints import constraint
from localspec.session.open import open_session
from localspec.session.pair import ModelOptions

target, draft, schema, question = sys.argv[1:]
session = open_session(ModelOptions(target=target, draft=draft, n_ctx=1024, calibrate=False,
                                    exact=True))
grammar = constraint(json_schema=json.loads(schema))
tokens = session.chat_tokens([{"role": "user", "content": question}])
answers = {}
for mode in ("none", "ngram", "model", "lookahead", "auto"):
    params = GenerationParams(max_tokens=80, drafter=mode)
    done = run_to_completion(session.generate(tokens, params, grammar=grammar))
    answers[mode] = {"ids": list(done.token_ids), "text": done.text}
session.close()
print(json.dumps(answers))
"""


def test_greedy_under_a_schema_is_plain_decoding_under_it_in_every_mode(real_pair_home):
    _, target, draft = real_pair_home
    proc = subprocess.run(
        [sys.executable, "-c", ANSWERS, str(target), str(draft), json.dumps(SCHEMA), EXTRACTION],
        capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    answers = json.loads(proc.stdout.strip().splitlines()[-1])
    for found in answers.values():
        answer = json.loads(found["text"])
        assert set(answer) == set(SCHEMA["properties"]) and isinstance(answer["age"], int)
    assert all(a["ids"] == answers["none"]["ids"] for a in answers.values()), answers


def test_the_schemas_keys_are_forced_on_the_real_vocabulary(real_pair_home):
    from localspec.backend.grammar import model_grammar
    from localspec.backend.llama import LlamaModel
    from localspec.core.grammar import forced, token_index
    from localspec.session.constraints import constraint

    _, target, _ = real_pair_home
    model = LlamaModel(target, vocab_only=True)
    grammar = model_grammar(model, constraint(json_schema=SCHEMA))
    for token in model.tokenize('{"name": "Maria", ', add_special=False):
        grammar.accept(token)
    index = token_index(model.n_vocab, model.token_bytes, model.is_eog)
    drafted = b"".join(model.token_bytes(t) for t in forced(grammar, 8, index))
    assert drafted.startswith(b'"age')


def test_a_key_is_drafted_as_the_tokenizer_spells_it_with_the_answers_closing_habit(
    real_pair_home,
):
    from localspec.backend.grammar import model_grammar
    from localspec.backend.llama import LlamaModel
    from localspec.core.drafting.grammar import GrammarDrafter
    from localspec.core.params import GenerationParams
    from localspec.session.constraints import constraint

    _, target, _ = real_pair_home
    model = LlamaModel(target, vocab_only=True)
    grammar = model_grammar(model, constraint(json_schema=SCHEMA))
    answer = model.tokenize('{"name": "Maria", "', add_special=False)
    for token in answer:
        grammar.accept(token)
    drafter = GrammarDrafter(
        model.n_vocab,
        model.token_bytes,
        model.is_eog,
        lambda text: model.tokenize(text, add_special=False, parse_special=False),
    )
    drafter.bind(grammar)
    drafter.begin([], GenerationParams())
    assert drafter.offer(answer, 8) is not None
    drafted = drafter.propose(answer, 8, GenerationParams(), None).tokens
    # "age" then the '":' the answer closed "name" with, as the tokenizer writes them.
    whole = model.tokenize('{"name": "Maria", "age": 34', add_special=False)
    assert drafted == whole[len(answer) : len(answer) + len(drafted)]
    assert b"".join(model.token_bytes(t) for t in drafted) == b'age":'
