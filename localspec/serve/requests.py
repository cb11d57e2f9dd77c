"""A request's body read once, before any job is queued, into the typed request its
endpoint runs.

``chat_request(body, state)`` reads ``/v1/chat/completions``' body into a ``ChatRequest``,
``completion_request(body, state)`` reads ``/v1/completions``' into a
``CompletionRequest``; both read what every request carries alike (``ApiRequest``: its
``GenerationParams`` over the server's defaults and within its limits, its prediction's
text, whether to stream and to add the usage) in the same steps and order. Every refusal
is an ``ApiError`` (a 400 that names the field, in OpenAI's shape, serve/openai_shapes.py);
nothing here touches the session: what a completion's prompts are checked against (the
vocabulary, whether the model has FIM tokens) is the ``ServerState``'s copy of it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from localspec.core.params import GenerationParams
from localspec.core.preflight import check_options
from localspec.errors import ConflictingOptionsError, UsageError
from localspec.serve.errors import ApiError
from localspec.serve.openai_shapes import (
    chat_messages,
    completion_prompts,
    generation_params,
    prediction_text,
    stream_flags,
)
from localspec.serve.replies import Asked, refusal
from localspec.serve.state import ServerState
from localspec.serve.structured import response_grammar
from localspec.session.tools import NONE, Tools, call_grammar, read_tools


@dataclass(frozen=True)
class ApiRequest:
    """What every request asks of its generation."""

    params: GenerationParams
    prediction: str | None  # the answer's predicted text (read with the tokenizer in the worker)
    stream: bool
    include_usage: bool
    grammar: str | None  # GBNF the answer must match (serve/structured.py)


@dataclass(frozen=True)
class ChatRequest(ApiRequest):
    messages: list[dict[str, Any]]
    tools: Tools | None = None  # the functions offered (serve/tool_replies.py)

    def asked(self) -> Asked:
        """What its answer is shaped by (serve/replies.py)."""
        offered = tuple(self.tools.names) if self.tools and self.tools.choice != NONE else ()
        return Asked(True, self.stream, self.include_usage, tools=offered)


@dataclass(frozen=True)
class CompletionRequest(ApiRequest):
    prompts: list[str | list[int]]  # text, or token ids within the vocabulary
    suffix: str | None  # fill-in-the-middle: the text after the cursor
    parse_special: bool  # control-token text in a prompt acts as control tokens

    def asked(self) -> Asked:
        """What its answer is shaped by (serve/replies.py): one choice per prompt."""
        return Asked(False, self.stream, self.include_usage, n_prompts=len(self.prompts))


def chat_request(body: dict[str, Any], state: ServerState) -> ChatRequest:
    messages = chat_messages(body)
    params, prediction, stream, include_usage = _generation(body, state, chat=True)
    grammar = response_grammar(body)
    tools = _tools(body, state)
    if tools is not None and grammar is not None and tools.choice != NONE:
        raise ApiError(400, "tools and response_format are both given: give one",
                       param="response_format")  # fmt: skip
    return ChatRequest(params, prediction, stream, include_usage, grammar, messages, tools)


def _tools(body: dict[str, Any], state: ServerState) -> Tools | None:
    """The request's ``tools`` and ``tool_choice`` in OpenAI's shape, each refusal a 400
    naming the field; the call grammar is built here too, so a function's parameters that
    the converter cannot take are refused before anything runs."""
    try:
        tools = read_tools(body.get("tools"), body.get("tool_choice"))
        if tools is not None and tools.choice != NONE:
            call_grammar(tools)
    except UsageError as error:
        field = error.message.split(" ", 1)[0].rstrip(":")
        raise ApiError(400, error.message, param=field) from None
    if tools is not None and tools.choice != NONE and not state.tools:
        raise ApiError(400, f"tools: the chat template of {state.model_id} has no tool calls: "
                       "use a model whose template takes tools, such as Qwen2.5's",
                       param="tools", code="unsupported_parameter")  # fmt: skip
    return tools


def completion_request(body: dict[str, Any], state: ServerState) -> CompletionRequest:
    suffix = _suffix(body, state)
    prompts = completion_prompts(body, state.n_vocab, infill=bool(suffix))
    params, prediction, stream, include_usage = _generation(body, state, chat=False)
    grammar = response_grammar(body)
    return CompletionRequest(
        params, prediction, stream, include_usage, grammar, prompts, suffix, state.parse_special
    )


def _generation(
    body: dict[str, Any], state: ServerState, *, chat: bool
) -> tuple[GenerationParams, str | None, bool, bool]:
    """What every request carries: its params, its prediction's text and its stream flags."""
    params = generation_params(
        body, state.defaults, state.max_tokens_limit, state.speculative_overrides, chat
    )
    prediction = prediction_text(body)
    _check_options(params, prediction)
    stream, include_usage = stream_flags(body)
    return params, prediction, stream, include_usage


def _check_options(params: GenerationParams, predicted: str | None) -> None:
    """Options that cannot go together (``core.preflight``), refused before a job is
    queued: a prediction is drafted from by ``auto`` only (with another drafter it would be
    ignored, and its counts would say nothing of the answer)."""
    try:
        check_options(params, prediction=predicted is not None)
    except ConflictingOptionsError as error:
        raise refusal(error, chat=False) or error from None


def _suffix(body: dict[str, Any], state: ServerState) -> str | None:
    """The request's ``suffix``, checked: text, and only for a model with FIM tokens."""
    suffix = body.get("suffix")
    if suffix is not None and not isinstance(suffix, str):
        raise ApiError(400, "suffix must be text", param="suffix")
    if suffix and not state.infill:
        raise ApiError(
            400,
            f"suffix (fill-in-the-middle) needs a model with FIM tokens, and "
            f"{state.model_id} has none: use a code model trained for infill, such as "
            "Qwen2.5-Coder",
            param="suffix",
            code="unsupported_parameter",
        )
    return suffix
