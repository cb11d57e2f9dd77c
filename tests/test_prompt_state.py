"""Prompts computed once (session/prompt_state.py), on the tiny pair: a prompt answered in
one session is restored in the next from disk and only the rest is evaluated; the answer is
the one the cold prompt gave; a server's clients restore only their own prompts from memory;
a pair of other model files or another recipe restores nothing; and a prompt too short to be
worth it is not saved."""

from __future__ import annotations

import pytest

from localspec.core.events import Finished, PrefillDone
from localspec.core.params import DrafterMode, GenerationParams
from localspec.session import prompt_state
from localspec.session.open import open_session
from localspec.session.pair import ModelOptions
from localspec.storage.prompt_cache import DISK, MEMORY

PROMPT = [1, *[(7 * i + 3) % 40 + 2 for i in range(150)]]
OTHER_END = [*PROMPT[:120], *[(5 * i + 1) % 30 + 2 for i in range(40)]]


@pytest.fixture(autouse=True)
def every_prompt_worth_saving(monkeypatch):
    # The tiny models evaluate a token in microseconds: nothing would be worth a write.
    monkeypatch.setattr(prompt_state, "WORTH", 0.0)


def options(path, tiers=(MEMORY, DISK), **extra) -> ModelOptions:
    return ModelOptions(
        target=str(path), use_draft=False, n_ctx=512, calibrate=False,
        prompt_cache_tiers=tiers, **extra,
    )  # fmt: skip


def answer(session, tokens, max_tokens=12):
    params = GenerationParams(max_tokens=max_tokens, drafter=DrafterMode.NGRAM)
    events = list(session.generate(tokens, params))
    prefill = next(e for e in events if isinstance(e, PrefillDone))
    finished = events[-1]
    assert isinstance(finished, Finished)
    return prefill, finished


def test_a_prompt_saved_by_one_session_is_restored_by_the_next(tiny_pair):
    target, _, _ = tiny_pair
    first = open_session(options(target, (DISK,)))
    try:
        cold, cold_answer = answer(first, PROMPT)
    finally:
        first.close()
    assert cold.restored is None and cold.evaluated_tokens == len(PROMPT) - 1
    second = open_session(options(target, (DISK,)))
    try:
        warm, warm_answer = answer(second, PROMPT)
        assert warm.restored is not None and warm.restored.tier == DISK
        assert warm.restored.tokens == len(PROMPT) - 1 and warm.evaluated_tokens == 0
        assert warm_answer.token_ids == cold_answer.token_ids
        assert warm_answer.stats.restored_tokens == len(PROMPT) - 1
        assert warm_answer.stats.to_dict()["prompt_cache"]["from"] == DISK
    finally:
        second.close()
    third = open_session(options(target, (DISK,)))
    try:
        other, _ = answer(third, OTHER_END)  # the same file, another question after it
        assert other.restored is not None and other.restored.tokens == 120
        assert other.evaluated_tokens == len(OTHER_END) - 1 - 120
    finally:
        third.close()


def test_another_model_file_or_recipe_restores_nothing(tiny_pair):
    target, draft, _ = tiny_pair
    first = open_session(options(target, (DISK,)))
    try:
        answer(first, PROMPT)
    finally:
        first.close()
    for other in (options(draft, (DISK,)), options(target, (DISK,), flash_attn=False)):
        session = open_session(other)
        try:
            prefill, _ = answer(session, PROMPT)
            assert prefill.restored is None and prefill.evaluated_tokens == len(PROMPT) - 1
        finally:
            session.close()


def test_no_tier_keeps_nothing(tiny_pair, tmp_path):
    target, _, _ = tiny_pair
    for _ in range(2):
        session = open_session(options(target, ()))
        try:
            prefill, _ = answer(session, PROMPT)
            assert prefill.restored is None
        finally:
            session.close()


def test_a_short_prompt_is_not_saved(tiny_pair):
    target, _, _ = tiny_pair
    session = open_session(options(target, (DISK,)))
    try:
        answer(session, PROMPT[:20], max_tokens=4)
        assert session.prompt_state is not None
        assert session.prompt_state.cache.disk is not None
        assert session.prompt_state.cache.disk.files() == []
    finally:
        session.close()


def test_a_clients_prompt_comes_back_from_memory_for_that_client_only(tiny_pair):
    target, _, _ = tiny_pair
    session = open_session(options(target, (MEMORY,)))
    try:
        session.forget_context("alice")
        _, alone = answer(session, PROMPT)
        session.forget_context("bob")
        prefill, _ = answer(session, PROMPT)  # bob's first: nothing of alice's
        assert prefill.restored is None and prefill.evaluated_tokens == len(PROMPT) - 1
        answer(session, OTHER_END)  # bob's next prompt takes the lane
        session.forget_context("alice")
        prefill, again = answer(session, PROMPT)
        assert prefill.restored is not None and prefill.restored.tier == MEMORY
        assert prefill.restored.tokens == len(PROMPT) - 1
        assert again.token_ids == alone.token_ids
    finally:
        session.close()


def test_one_lane_serving_a_b_a_restores_a(tiny_pair):
    target, _, _ = tiny_pair
    session = open_session(options(target, (MEMORY,)))
    try:
        answer(session, PROMPT)
        answer(session, [1, *range(2, 80)])  # B shares one token with A
        prefill, _ = answer(session, PROMPT)
        assert prefill.restored is not None and prefill.restored.tokens == len(PROMPT) - 1
    finally:
        session.close()


def test_a_resumed_conversation_restores_its_earlier_turns(tiny_pair):
    target, _, _ = tiny_pair
    question = " ".join(f"the cat number {i} sat on the mat" for i in range(8))
    params = GenerationParams(max_tokens=8, drafter=DrafterMode.NGRAM)
    first = open_session(options(target))
    try:
        messages = [{"role": "user", "content": question}]
        done = list(first.chat(messages, params))[-1]
        assert isinstance(done, Finished)
    finally:
        first.close()
    resumed = open_session(options(target))  # as `localspec chat --resume` opens it
    try:
        messages += [{"role": "assistant", "content": done.text},
                     {"role": "user", "content": "and the dog?"}]  # fmt: skip
        events = list(resumed.chat(messages, params))
        prefill = next(e for e in events if isinstance(e, PrefillDone))
        assert prefill.restored is not None and prefill.restored.tier == DISK
        asked = len(resumed.chat_tokens(messages[:1]))
        assert prefill.restored.tokens >= asked  # the first question at least
    finally:
        resumed.close()


def test_the_api_takes_the_prompt_cache_options(tiny_pair):
    import localspec

    target, _, _ = tiny_pair
    with localspec.load(target, drafter="none", ctx=512, prompt_cache_size="64MB") as pair:
        state = pair._session.prompt_state
        assert state is not None and state.cache.disk is not None
        assert state.cache.disk.limit == 64_000_000 and state.cache.memory is not None
    with localspec.load(target, drafter="none", ctx=512, prompt_cache=False) as pair:
        assert pair._session.prompt_state is None
    with pytest.raises(localspec.UsageError, match="prompt_cache_size"):
        localspec.load(target, drafter="none", ctx=512, prompt_cache_size="lots")


def test_the_draft_models_state_comes_back_with_the_targets(tiny_pair):
    target, draft, _ = tiny_pair
    params = GenerationParams(max_tokens=8, drafter=DrafterMode.MODEL)
    with_draft = options(target, (DISK,)).model_copy(update={"draft": str(draft),
                                                             "use_draft": True})  # fmt: skip
    first = open_session(with_draft)
    try:
        cold = list(first.generate(PROMPT, params))[-1]
    finally:
        first.close()
    second = open_session(with_draft)
    try:
        model = second.draft
        assert model is not None
        before = model.evaluated_tokens
        events = list(second.generate(PROMPT, params))
        prefill = next(e for e in events if isinstance(e, PrefillDone))
        assert prefill.restored is not None and prefill.evaluated_tokens == 0
        # The draft model caught up from its restored state: far fewer than the prompt.
        assert model.evaluated_tokens - before < len(PROMPT) // 2
        assert events[-1].token_ids == cold.token_ids
    finally:
        second.close()
