"""Render a conversation with the chat template stored in the target's GGUF metadata.

The template is Jinja2 (``tokenizer.chat_template``), rendered in a sandbox the way
Hugging Face and llama-cpp-python do: ``messages``, ``add_generation_prompt``,
``bos_token``/``eos_token``, ``raise_exception`` and ``strftime_now``. A model without a
template falls back to ChatML, which is what most small instruct models expect.
"""

from __future__ import annotations

from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from localspec.errors import UsageError

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

ROLES = ("system", "user", "assistant")


def _raise(message: str) -> None:
    raise UsageError(f"the chat template refused the conversation: {message}")


def render_chat(
    template: str | None,
    messages: list[dict[str, str]],
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
) -> str:
    for m in messages:
        if m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise UsageError(f"malformed chat message: {m!r}", "roles are system, user, assistant")
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        compiled = env.from_string(template or CHATML)
        return compiled.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
        )
    except jinja2.TemplateError as err:
        raise UsageError(
            f"the model's chat template failed to render: {err}",
            "use --raw to send the text without a template",
        ) from err
