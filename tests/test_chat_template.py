"""Chat templates are untrusted code from model files: every way a template can fail is a
clear error about the model's template (exit 1), never an internal error (exit 70), and a
template cannot print without bound or reach Python through the sandbox."""

from __future__ import annotations

import pytest

from localspec.errors import ModelFileError, UsageError
from localspec.session.chat_template import render_chat
from tests.test_cli import assert_clean_error, localspec
from tests.tiny_gguf import write_tiny_llama

USER = [{"role": "user", "content": "hi"}]

FAILING = {
    "type error": "{{ messages + 1 }}",
    "recursion": "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "sandbox escape": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "syntax": "{% for m in messages %}",
    "division by zero": "{{ 1 // 0 }}",
}


@pytest.mark.parametrize("name", sorted(FAILING))
def test_every_rendering_failure_is_a_model_file_error(name):
    with pytest.raises(ModelFileError, match="chat template failed to render") as info:
        render_chat(FAILING[name], USER)
    assert "--raw" in info.value.hint


def test_rendered_length_is_bounded():
    endless = (
        "{% for i in range(100000) %}{% for j in range(100000) %}xxxxxxxx{% endfor %}{% endfor %}"
    )
    with pytest.raises(ModelFileError, match="more than 1000 characters"):
        render_chat(endless, USER, max_chars=1000)
    # The default bound scales with the conversation and stops the loop above too.
    with pytest.raises(ModelFileError, match="rendered more than"):
        render_chat(endless, USER)


def test_a_template_refusing_the_conversation_is_the_users_error():
    template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(UsageError, match="roles must alternate"):
        render_chat(template, USER)


def test_a_sound_template_still_renders():
    assert render_chat(None, USER) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_complete_with_a_broken_template_exits_1_with_a_clear_error(tmp_path):
    target = write_tiny_llama(tmp_path / "t.gguf", seed=1, chat_template=FAILING["recursion"])
    draft_copy = write_tiny_llama(tmp_path / "d.gguf", seed=2)
    proc = localspec(
        "complete", "--target", str(target), "--draft", str(draft_copy), "--ctx", "256",
        "--max-tokens", "4",
    )  # fmt: skip
    assert proc.returncode == 1
    assert_clean_error(proc, "chat template failed to render", "RecursionError")
