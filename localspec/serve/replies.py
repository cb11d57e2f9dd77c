"""A job's events as OpenAI's answers: one JSON object, or server-sent events.

Contract: ``next_event`` waits for a job's next event on the event loop, on an asyncio queue
the worker feeds (None once the job is over or cancelled); ``cancel_on_disconnect``
withdraws the job when its client goes away; ``raise_for`` turns an event that is an error
into the ``ApiError`` to answer with (a typed error: a 400, a request's refusal worded by
``refusal``; anything else: ``internal``, a 500 that names only a logged id).
``whole_answer`` gathers every event into one answer; ``streamed_answer`` sends each as it
comes and cancels the job when the client stops reading. Both give one choice per prompt,
in order, ``usage`` summed over them, and ``timings`` only ``with_timings``. An answer the
server cut short as it stops (``Job.stopped``) ends with ``stopping``'s error: a 503, or
in a stream an error event before ``[DONE]``, so that no client takes it for a whole
answer. ``Asked`` is what the request asked for besides its prompts.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request

from localspec.core.events import Finished, FinishReason, TokenEmitted
from localspec.core.stats import GenerationStats
from localspec.errors import (
    ConflictingOptionsError,
    ContextOverflowError,
    LocalspecError,
    MissingDraftError,
    UnsupportedByModelError,
)
from localspec.serve.errors import ApiError
from localspec.serve.logprob_shapes import chat_logprobs, completion_logprobs
from localspec.serve.openai_shapes import finish_reason, timings, usage
from localspec.serve.tool_replies import TOOL_CALLS, tool_message
from localspec.serve.worker import Job
from localspec.session.tools import HeldCalls

log = logging.getLogger("localspec.serve")


@dataclass
class Asked:
    """What a request asked for besides its prompts. Not frozen: two threads share it. The
    worker appends to ``predicted`` the tokens of the prediction (if one was given) once it
    has read it, and to ``counts`` each answer's ``prediction_counts`` before handing on
    that answer's ``Finished`` (serve/app.py); the reply reads them only after that
    ``Finished`` has come through the job's queue, so it never sees them change."""

    chat: bool
    stream: bool = False
    include_usage: bool = False
    n_prompts: int = 1
    predicted: list[tuple[int, ...]] = field(default_factory=list)
    counts: list[tuple[int, int]] = field(default_factory=list)
    tools: tuple[str, ...] = ()  # the functions offered: calls are read out of the answer


def internal(err: BaseException) -> ApiError:
    """A failure of the server itself: logged here with an id, answered with the id only
    (its text may name files or objects of this machine)."""
    ref = uuid.uuid4().hex[:8]
    log.error("internal error %s: %r", ref, err, exc_info=err)
    return ApiError(500, f"internal error {ref}; the server's log has the details",
                    type="server_error", code="internal_error")  # fmt: skip


def stopping() -> ApiError:
    """The answer of a job the server cancelled as it stops: a 503, or in a stream the
    error event OpenAI sends when a stream fails (its client raises it)."""
    return ApiError(503, "the server is stopping: the answer was cut short", type="server_error",
                    code="server_stopping")  # fmt: skip


async def next_event(job: Job) -> Any:
    """The job's next event, or None once it is over (or cancelled: nobody waits for it).
    Its events must be bound to the running loop (``Events.bind``)."""
    if job.cancel.is_set():
        return None
    return await job.events.next()


async def cancel_on_disconnect(request: Request, job: Job, withdraw: Callable[[Job], None]
                               ) -> None:  # fmt: skip
    """Withdraw the job (``GenerationWorker.withdraw``) when the client goes away. Its body
    is read by then, so the next message the server sends is the disconnect (or the end of
    the response)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            withdraw(job)
            return


def refusal(error: LocalspecError, chat: bool) -> ApiError | None:
    """A request's refusal (``core.preflight``) in the server's words, naming the JSON
    field it concerns (``param``); None for any other error."""
    if isinstance(error, ContextOverflowError):
        field = "messages" if chat else "prompt"
        hint = "drop the oldest messages" if chat else "shorten the prompt"
        return ApiError(400, f"{error} ({hint})", code="context_length_exceeded", param=field)
    if isinstance(error, MissingDraftError):
        if error.derived:
            message = (
                f"speculative.drafter is {error.drafter}, but this server's draft was not "
                "derived from the target (serve --draft self): use auto or model"
            )
        else:
            message = (
                f"speculative.drafter is {error.drafter}, but this server has no draft "
                "model: use auto, ngram or lookahead"
            )
        return ApiError(400, message, param="speculative.drafter")
    if isinstance(error, ConflictingOptionsError) and error.option == "prediction":
        return ApiError(400, f"a prediction is drafted from by speculative.drafter auto, not "
                        f"{error.value}: drop one or the other", param="prediction")  # fmt: skip
    return None


def raise_for(item: Any, chat: bool) -> None:
    if isinstance(item, ApiError):  # a refusal the worker found (a prediction too long)
        raise item
    refused = refusal(item, chat) if isinstance(item, LocalspecError) else None
    if refused is not None:
        raise refused
    if isinstance(item, UnsupportedByModelError):
        raise ApiError(400, f"{item} ({item.hint})", code="unsupported_parameter",
                       param="suffix")  # fmt: skip
    if isinstance(item, LocalspecError):
        raise ApiError(400, f"{item} ({item.hint})")
    if isinstance(item, BaseException):
        raise internal(item)


async def whole_answer(
    job: Job, first: Any, head: dict[str, Any], asked: Asked, with_timings: bool
) -> dict[str, Any]:
    """A non-streamed answer: every event gathered, then one JSON object."""
    finished: list[Finished] = []
    emitted: list[list[TokenEmitted]] = [[]]  # each answer's tokens, for their logprobs
    item = first
    while item is not None:
        raise_for(item, asked.chat)
        if isinstance(item, TokenEmitted) and item.logprob is not None:
            emitted[-1].append(item)
        if isinstance(item, Finished):
            if _cut_short(item, job):
                raise stopping()
            finished.append(item)
            emitted.append([])
        item = await next_event(job)
    if len(finished) < asked.n_prompts:
        raise stopping() if job.stopped else ApiError(499, "cancelled", code="cancelled")
    choices: list[dict[str, Any]] = []
    for index, done in enumerate(finished):
        reason = finish_reason(done.reason.value)
        if asked.chat:
            message, called = tool_message(done.text, asked.tools) if asked.tools else (None, None)
            choices.append({
                "index": index,
                "message": message or {"role": "assistant", "content": done.text},
                "finish_reason": called or reason,
                "logprobs": chat_logprobs(emitted[index]) if emitted[index] else None,
            })  # fmt: skip
        else:
            shown = completion_logprobs(emitted[index]) if emitted[index] else None
            choices.append(
                {"index": index, "text": done.text, "finish_reason": reason, "logprobs": shown}
            )
    stats = GenerationStats.merged([done.stats for done in finished])
    answer = {
        **head,
        "object": "chat.completion" if asked.chat else "text_completion",
        "choices": choices,
        "usage": usage(stats, _predicted(asked), len(finished)),
    }
    if with_timings:
        answer["timings"] = timings(stats, len(finished))
    return answer


def _cut_short(done: Finished, job: Job) -> bool:
    """Whether ``done`` ends an answer the server cut short as it stops (the engine ends a
    cancelled generation with a ``Finished`` of its own, which may come before the job's
    end)."""
    return job.stopped and done.reason is FinishReason.CANCELLED


def _predicted(asked: Asked) -> tuple[int, int] | None:
    """The prediction's accepted and rejected tokens over every answer, if it had one."""
    if not asked.predicted:
        return None
    return sum(a for a, _ in asked.counts), sum(r for _, r in asked.counts)


def _with_logprob(data: dict[str, Any], item: TokenEmitted, chat: bool) -> dict[str, Any]:
    """A streamed chunk with its token's log-probability, where the request asked."""
    if item.logprob is not None:
        shown = chat_logprobs([item]) if chat else completion_logprobs([item])
        data["choices"][0]["logprobs"] = shown
    return data


def _sse(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()


async def streamed_answer(
    job: Job, first: Any, head: dict[str, Any], asked: Asked, with_timings: bool
) -> AsyncIterator[bytes]:
    """Server-sent events; each chunk names its prompt's choice index. The last prompt's
    final chunk (or the usage chunk) carries ``timings`` for the whole request."""
    kind = "chat.completion.chunk" if asked.chat else "text_completion"

    def chunk(index: int, text: str | None, reason: str | None, role: bool = False
              ) -> dict[str, Any]:  # fmt: skip
        if asked.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": reason}
        else:
            choice = {"index": index, "text": text or "", "finish_reason": reason}
        return {**head, "object": kind, "choices": [choice]}

    finished: list[Finished] = []
    held = (
        HeldCalls(asked.tools) if asked.tools else None
    )  # text after a tool-call tag waits for its end
    try:
        if asked.chat:
            yield _sse(chunk(0, "", None, role=True))
        item = first
        while item is not None:
            index = len(finished)  # the prompt whose events these are
            if isinstance(item, BaseException):
                yield _sse(internal(item).body)
            elif isinstance(item, TokenEmitted) and item.text:
                text = held.piece(item.text) if held else item.text
                if text:
                    yield _sse(_with_logprob(chunk(index, text, None), item, asked.chat))
            elif isinstance(item, Finished):
                if _cut_short(item, job):
                    break  # its end is the error below, never a whole answer's last chunk
                finished.append(item)
                tail, calls = held.end() if held else ("", [])
                if tail + item.tail:
                    yield _sse(chunk(index, tail + item.tail, None))
                last = chunk(index, None, TOOL_CALLS if calls else finish_reason(item.reason.value))
                if calls:
                    yield _sse(
                        chunk(index, None, None)
                        | {
                            "choices": [
                                {
                                    "index": index,
                                    "delta": {"tool_calls": calls},
                                    "finish_reason": None,
                                }
                            ]
                        }
                    )
                if len(finished) == asked.n_prompts:
                    stats = GenerationStats.merged([done.stats for done in finished])
                    if asked.include_usage:
                        last["usage"] = None
                        yield _sse(last)
                        shown = usage(stats, _predicted(asked), len(finished))
                        last = {**head, "object": kind, "choices": [], "usage": shown}
                    if with_timings:
                        last["timings"] = timings(stats, len(finished))
                yield _sse(last)
            item = await next_event(job)
        if len(finished) < asked.n_prompts and job.stopped:  # never a whole answer's end
            yield _sse(stopping().body)
        yield b"data: [DONE]\n\n"
    finally:  # the client went away (or we are done): let the worker move on
        job.cancel.set()
