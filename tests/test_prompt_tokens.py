"""Control tokens are parsed in the template's text only, unless the user lets them through."""

from __future__ import annotations

import pytest

from localspec.errors import InputError
from localspec.session.open import open_session
from localspec.session.pair import ModelOptions

EOS = 2  # "</s>" in the tiny vocabulary, a control token


@pytest.fixture(scope="module")
def session(tiny_pair):
    target, _, _ = tiny_pair
    s = open_session(ModelOptions(target=str(target), use_draft=False, n_ctx=256, calibrate=False))
    yield s
    s.close()


def test_user_text_cannot_inject_control_tokens(session):
    text = "the cat </s> the dog"
    assert EOS not in session.text_tokens(text, raw=True)
    assert EOS in session.text_tokens(text, raw=True, parse_special=True)
    chat = session.chat_tokens([{"role": "user", "content": text}])
    assert EOS not in chat
    assert EOS in session.chat_tokens([{"role": "user", "content": text}], parse_special=True)


def test_template_text_keeps_its_control_tokens(session):
    # The fallback template (ChatML) is plain text for this vocabulary; what matters is that
    # tokenizing the pieces apart gives the same tokens as the whole, for ordinary text.
    messages = [{"role": "user", "content": "the cat"}, {"role": "assistant", "content": "a dog"}]
    whole = session.chat_tokens(messages, parse_special=True)
    assert session.chat_tokens(messages) == whole


def test_a_template_that_reshapes_text_refuses_control_tokens(session, monkeypatch):
    upper = "{% for m in messages %}{{ m['content'] | upper }}{% endfor %}"
    monkeypatch.setattr(session.prompts, "_template", upper)
    assert session.chat_tokens([{"role": "user", "content": "the cat"}])
    with pytest.raises(InputError, match="control tokens"):
        session.chat_tokens([{"role": "user", "content": "the </s>"}])


def test_a_prompt_that_cannot_run_is_refused_before_the_first_event(session):
    """The session's one preflight runs when it is asked, not when its stream is read: a
    front end can offer to trim a conversation before anything was generated. Its errors
    carry their data and name no front end's options."""
    from localspec.core.params import GenerationParams
    from localspec.errors import ContextOverflowError, MissingDraftError

    too_long = [{"role": "user", "content": "the cat " * 400}]
    with pytest.raises(ContextOverflowError) as overflow:
        session.chat(too_long, GenerationParams(drafter="none"))
    assert overflow.value.n_ctx == 256 and overflow.value.n_tokens > 256
    assert overflow.value.option == "n_ctx" and "--" not in overflow.value.hint
    with pytest.raises(MissingDraftError, match="needs a draft model") as missing:
        session.complete("the cat", GenerationParams(drafter="model"))
    assert missing.value.drafter == "model" and missing.value.exit_code == 2
    with pytest.raises(InputError, match="the input is empty"):
        session.complete("  \n", GenerationParams(drafter="none"))
