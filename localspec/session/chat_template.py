"""Render a conversation with the chat template stored in the target's GGUF metadata.

The template is Jinja2 (``tokenizer.chat_template``), rendered in a sandbox the way
Hugging Face and llama-cpp-python do: ``messages``, ``add_generation_prompt``,
``bos_token``/``eos_token``, ``raise_exception`` and ``strftime_now``. A model without a
template falls back to ChatML, which is what most small instruct models expect.

Templates come from model files anyone can publish, so they are untrusted: the sandbox
(jinja2 >= 3.1.6, which closes the known escapes) keeps them from reaching Python, the
rendered text is cut off at ``max_chars`` (a template cannot print gigabytes), and any
failure while rendering, whatever its type, is a ``ModelFileError`` naming the model's
template. Only ``raise_exception`` called by the template itself (it refuses the
conversation, e.g. roles that do not alternate) is a ``UsageError``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment

from localspec.errors import LocalspecError, ModelFileError, UsageError

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

ROLES = ("system", "user", "assistant", "tool")
# Room for the template's own text around the messages.
TEMPLATE_ROOM = 1 << 20


def _raise(message: str) -> None:
    raise UsageError(f"the chat template refused the conversation: {message}")


def render_chat(
    template: str | None,
    messages: list[dict[str, str]],
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    max_chars: int | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """The conversation as the template renders it; ``max_chars`` defaults to eight times
    the messages' and tools' length plus a megabyte. ``tools``: the functions offered
    (OpenAI's shape), given to the template as ``tools``; an assistant message may then
    carry ``tool_calls`` and a ``tool`` message a function's result."""
    for m in messages:
        if m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise UsageError(
                f"malformed chat message: {m!r}", "roles are system, user, assistant, tool"
            )
    if max_chars is None:
        size = sum(len(m["content"]) + len(str(m.get("tool_calls", ""))) for m in messages)
        max_chars = 8 * (size + len(str(tools or ""))) + TEMPLATE_ROOM
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    hint = "use --raw to send the text without a template"
    try:
        compiled = env.from_string(template or CHATML)
        pieces: list[str] = []
        size = 0
        for piece in compiled.generate(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            **({"tools": tools} if tools else {}),
        ):
            size += len(piece)
            if size > max_chars:
                raise ModelFileError(
                    f"the model's chat template rendered more than {max_chars} characters",
                    hint,
                )
            pieces.append(piece)
        return "".join(pieces)
    except LocalspecError:
        raise
    except Exception as err:  # untrusted code: any failure (TypeError, RecursionError, ...)
        detail = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        raise ModelFileError(
            f"the model's chat template failed to render ({detail[:300]})", hint
        ) from None
