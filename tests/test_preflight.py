"""A request's one preflight (core/preflight.py): typed errors that carry their data and
name no front end's option, each front end wording them in its own dialect."""

from __future__ import annotations

import pytest

from localspec.api.speculator import _worded as api_worded
from localspec.bench.modes import BenchMode
from localspec.bench.runner import _check_mode
from localspec.cli.common import worded as cli_worded
from localspec.core.params import GenerationParams
from localspec.core.preflight import PairFacts, check_drafter, check_options, check_request
from localspec.errors import (
    EXIT_USAGE,
    ConflictingOptionsError,
    ContextOverflowError,
    InputError,
    MissingDraftError,
    UsageError,
)

PAIR = PairFacts(n_ctx=16, has_draft=True, derived=False)
NO_DRAFT = PairFacts(n_ctx=16, has_draft=False, derived=False)
DERIVED = PairFacts(n_ctx=16, has_draft=True, derived=True)


def test_a_prompt_the_context_cannot_hold_carries_its_figures():
    check_request(PAIR, list(range(15)), GenerationParams())  # room for one new token
    with pytest.raises(ContextOverflowError) as caught:
        check_request(PAIR, list(range(16)), GenerationParams())
    error = caught.value
    assert (error.n_tokens, error.n_ctx, error.option) == (16, 16, "n_ctx")
    assert "16 tokens" in error.message and "--" not in error.message + error.hint
    with pytest.raises(InputError, match="the input is empty"):
        check_request(PAIR, [], GenerationParams())


def test_a_drafter_without_its_draft_model_is_refused_with_which():
    for drafter in ("auto", "ngram", "lookahead", "none", "model"):
        check_drafter(PAIR, GenerationParams(drafter=drafter).drafter)
    for drafter in ("auto", "ngram", "lookahead", "none"):
        check_drafter(NO_DRAFT, GenerationParams(drafter=drafter).drafter)
    with pytest.raises(MissingDraftError) as caught:
        check_request(NO_DRAFT, [1, 2], GenerationParams(drafter="model"))
    assert caught.value.drafter == "model" and not caught.value.derived
    assert caught.value.exit_code == EXIT_USAGE and "--" not in caught.value.message
    with pytest.raises(MissingDraftError) as caught:
        check_drafter(PAIR, GenerationParams(drafter="self").drafter)
    assert caught.value.derived
    check_drafter(DERIVED, GenerationParams(drafter="self").drafter)


def test_options_that_cannot_go_together_name_both():
    check_options(GenerationParams(), raw=True, system="  ")  # a blank system prompt is none
    check_options(GenerationParams(drafter="auto"), prediction=True)
    with pytest.raises(ConflictingOptionsError) as caught:
        check_options(GenerationParams(), raw=True, system="Be brief.")
    assert (caught.value.option, caught.value.other) == ("system", "raw")
    with pytest.raises(ConflictingOptionsError) as caught:
        check_options(GenerationParams(drafter="ngram"), prediction=True)
    error = caught.value
    assert (error.option, error.other, error.value) == ("prediction", "drafter", "ngram")
    assert isinstance(error, UsageError)


def test_the_command_line_words_them_with_its_flags():
    overflow = cli_worded(ContextOverflowError(n_tokens=20, n_ctx=16))
    assert isinstance(overflow, ContextOverflowError) and overflow.n_tokens == 20
    assert overflow.hint == "shorten the input or raise --ctx"
    missing = cli_worded(MissingDraftError("model"))
    assert missing.message == "--drafter model needs a draft model, and none is loaded"
    assert missing.hint == "pass --draft REF, or use --drafter ngram"
    system = cli_worded(ConflictingOptionsError("system", "raw", True, "x"))
    assert system.hint == "drop --raw or --system"
    predicted = cli_worded(ConflictingOptionsError("prediction", "drafter", "model", "x"))
    assert predicted.message == "--prediction is drafted from by --drafter auto, not model"
    assert predicted.hint == "drop --drafter, or --prediction"
    # An error a front end already worded (the bench's) keeps its words.
    assert cli_worded(missing.reworded("mine", "hint")).message == "mine"


def test_the_api_words_them_with_its_keywords():
    overflow = api_worded(ContextOverflowError(n_tokens=20, n_ctx=16))
    assert "larger ctx" in overflow.hint and "--" not in overflow.hint
    missing = api_worded(MissingDraftError("model"))
    assert missing.message == "drafter='model' needs a draft model, and this pair has none"
    assert "drafter='auto'" in missing.hint
    derived = api_worded(MissingDraftError("self", derived=True))
    assert derived.message.startswith("drafter='self' drafts with a draft derived")
    predicted = api_worded(ConflictingOptionsError("prediction", "drafter", "ngram", "x"))
    assert predicted.message == "prediction is drafted from by drafter='auto', not 'ngram'"


def test_the_bench_words_them_as_modes():
    _check_mode(NO_DRAFT, BenchMode("ngram"))
    with pytest.raises(MissingDraftError, match="mode model needs a draft model") as caught:
        _check_mode(NO_DRAFT, BenchMode("model"))
    assert caught.value.hint == "drop it from --modes"
    with pytest.raises(UsageError, match="mode self drafts with a draft derived") as caught:
        _check_mode(PAIR, BenchMode("self"))
    assert "--draft self" in caught.value.hint
    _check_mode(DERIVED, BenchMode("self"))
