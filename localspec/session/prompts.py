"""A prompt for the loaded target: text or messages into the target's tokens.

``Prompts(target)`` reads the target's chat template, BOS rule and fill-in-the-middle
tokens once. ``chat_tokens`` renders messages through the chat template (control tokens
parsed only in the template's own text unless ``parse_special``); ``text_tokens`` takes one
user message (after an optional system prompt) through the template, or the text as is with
``raw``; ``plain_tokens`` is text as the target reads it inside an answer; ``infill_tokens``
lays out a fill-in-the-middle prompt as llama.cpp's server does. Blank text is an
``InputError``, a message that spells the
model's control tokens (unless ``parse_special``) an ``InputError``, and an infill for a
target without FIM tokens an ``UnsupportedByModelError``.
"""

from __future__ import annotations

from typing import Any

from localspec.backend.llama import LlamaLane
from localspec.errors import InputError, UnsupportedByModelError, empty_input
from localspec.session.chat_template import render_chat


class Prompts:
    def __init__(self, target: LlamaLane) -> None:
        self.target = target
        self.label = target.description()
        self._template = target.chat_template()
        self._bos = (
            target.token_text(target.vocab_info().bos) if target.vocab_info().add_bos else ""
        )
        self.fim = target.fim_tokens()

    def chat_tokens(
        self,
        messages: list[dict[str, Any]],
        *,
        parse_special: bool = False,
        tools: list[dict[str, Any]] | None = None,
    ) -> list[int]:
        """The conversation through the chat template (with the functions ``tools`` offers).
        Control tokens are parsed only in the template's own text: a message that spells
        ``<|im_start|>`` stays plain text unless ``parse_special`` lets it through."""
        real = self._render(messages, tools)
        if parse_special or not any(self._has_control_text(m["content"]) for m in messages):
            return self._bos_for(real) + self._template_tokens(real)
        marks = [f"\ue000{i}\ue001" for i in range(len(messages))]
        masked = [{**m, "content": mark} for m, mark in zip(messages, marks, strict=True)]
        text = self._render(masked, tools)
        rebuilt = text
        for mark, message in zip(marks, messages, strict=True):
            rebuilt = rebuilt.replace(mark, message["content"])
        if rebuilt != real or any(text.count(mark) != 1 for mark in marks):
            # The template reshapes message text, so it cannot be kept apart from it.
            raise InputError(
                "the text contains control tokens of the model (such as <|im_start|>)",
                "remove them, or pass --parse-special to let them act as control tokens",
            )
        tokens = self._bos_for(text)
        rest = text
        for mark, message in zip(marks, messages, strict=True):
            head, rest = rest.split(mark)
            tokens += self._template_tokens(head)
            tokens += self.plain_tokens(message["content"])
        return tokens + self._template_tokens(rest)

    def _has_control_text(self, text: str) -> bool:
        plain = self.plain_tokens(text)
        return plain != self.target.tokenize(text, add_special=False, parse_special=True)

    def _render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None
    ) -> str:
        return render_chat(self._template, messages, bos_token=self._bos, tools=tools)

    def has_tools(self) -> bool:
        """Whether the chat template shows the model tools (it reads ``tools``)."""
        return bool(self._template) and "tools" in (self._template or "")

    def _bos_for(self, text: str) -> list[int]:
        """BOS when the vocabulary adds one and the template did not write it itself."""
        if not self._bos or text.startswith(self._bos):
            return []
        return [self.target.vocab_info().bos]

    def _template_tokens(self, text: str) -> list[int]:
        if not text:
            return []
        return self.target.tokenize(text, add_special=False, parse_special=True)

    def plain_tokens(self, text: str) -> list[int]:
        """``text`` as the target reads it inside an answer: no BOS, control tokens' text
        kept as plain text (a prediction, say)."""
        return self.target.tokenize(text, add_special=False, parse_special=False)

    def text_tokens(
        self, text: str, *, raw: bool, parse_special: bool = False, system: str | None = None
    ) -> list[int]:
        """The prompt's tokens: ``text`` as one user message (after ``system``, if any)
        through the chat template, or as is with ``raw`` (which takes no ``system``: the
        front ends refuse the two together, ``preflight.check_options``)."""
        if not text.strip():
            raise empty_input()
        if raw:
            return self.target.tokenize(text, add_special=True, parse_special=parse_special)
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": text})
        return self.chat_tokens(messages, parse_special=parse_special)

    def infill_tokens(self, prefix: str, suffix: str) -> list[int]:
        """A fill-in-the-middle prompt, laid out as llama.cpp's server lays out an infill:
        ``[BOS] FIM_PRE prefix FIM_SUF suffix FIM_MID`` (BOS only if the vocabulary adds
        one); the model then writes the middle. Both texts stay plain text: a control
        token's text in them is not parsed. ``UnsupportedByModelError`` when the target's
        vocabulary has no FIM tokens."""
        ids = self.fim.infill_ids
        if ids is None:
            raise UnsupportedByModelError(
                f"{self.label} has no fill-in-the-middle tokens",
                "use a code model trained for infill (such as Qwen2.5-Coder), or drop the suffix",
            )
        vocab = self.target.vocab_info()
        tokens = [vocab.bos] if vocab.add_bos and vocab.bos >= 0 else []
        pre, suf, mid = ids
        tokens.append(pre)
        tokens += self.plain_tokens(prefix)
        tokens.append(suf)
        tokens += self.plain_tokens(suffix)
        tokens.append(mid)
        return tokens
