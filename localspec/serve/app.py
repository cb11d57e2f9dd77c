"""The HTTP front end: OpenAI's chat and completion endpoints over a ``GenerationWorker``.

``create_app(state)`` builds a FastAPI app. ``ServerState`` holds the worker once the pair is
loaded (``/health`` answers ``loading`` until then, and every other endpoint a 503). Every
endpoint but ``/health`` requires ``Authorization: Bearer KEY`` when a key is set (compared
in constant time). Bodies over ``max_body`` bytes are refused; errors always have OpenAI's
shape. A streamed answer is sent as server-sent events; the first event (or error) is
awaited before the response starts, so a request that cannot run gets a proper status.
A client that disconnects cancels its job; the engine stops after its current round.

``/v1/completions`` takes several prompts (text or token ids; one choice each, generated one
after another, ``usage`` and ``timings`` summed) and a ``suffix``: fill-in-the-middle through
the target's FIM tokens (``Session.infill_tokens``), a 400 naming ``suffix`` for a model
without them.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import queue
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from localspec.core.events import Event, Finished, TokenEmitted
from localspec.core.params import GenerationParams
from localspec.core.stats import GenerationStats
from localspec.errors import ContextOverflowError, LocalspecError, UnsupportedByModelError
from localspec.serve.openai_shapes import (
    ApiError,
    chat_messages,
    completion_prompts,
    finish_reason,
    generation_params,
    timings,
    usage,
)
from localspec.serve.worker import GenerationWorker, Job, QueueFull

POLL_S = 0.1  # how often a waiting request checks that its client is still there


@dataclass
class ServerState:
    defaults: GenerationParams
    api_key: str | None = None
    cors_origins: list[str] = field(default_factory=list)
    max_body: int = 1 << 20
    worker: GenerationWorker | None = None
    model_id: str = "localspec"
    draft_id: str | None = None
    placement: dict[str, Any] | None = None  # where each model runs (session/placement.py)
    load_error: str | None = None
    # Control-token text in a /v1/completions prompt acts as control tokens (never in chat).
    parse_special: bool = False


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="localspec", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.localspec = state
    if state.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=state.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )

    @app.exception_handler(ApiError)
    async def api_error(request: Request, err: ApiError) -> JSONResponse:
        return JSONResponse(err.body, status_code=err.status, headers=err.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        # Starlette's own refusals (no such endpoint, wrong method) in OpenAI's shape too.
        if err.status_code == 404:
            error = ApiError(404, f"no endpoint {request.url.path}", code="not_found")
        else:
            error = ApiError(err.status_code, f"{request.method} {request.url.path}: {err.detail}")
        return JSONResponse(error.body, status_code=err.status_code, headers=err.headers)

    @app.get("/health")
    async def health() -> JSONResponse:
        if state.load_error:
            return JSONResponse({"status": "error", "message": state.load_error}, 500)
        if state.worker is None:
            return JSONResponse({"status": "loading"}, status_code=503)
        return JSONResponse({"status": "ok", "waiting": state.worker.waiting})

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        _authorize(state, request)
        _require_loaded(state)
        card = {"id": state.model_id, "object": "model", "created": 0, "owned_by": "localspec"}
        extra = {"draft": state.draft_id, "placement": state.placement}
        return {"object": "list", "data": [{**card, **extra}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        body = await _read_json(state, request)
        messages = chat_messages(body)
        params = generation_params(body, state.defaults)

        def start(session: Any, cancel: Any) -> Any:
            return session.chat(messages, params, cancel)

        return await _answer(state, request, body, Job(start, params), chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await _read_json(state, request)
        assert state.worker is not None
        session = state.worker.session
        suffix = body.get("suffix")
        if suffix is not None and not isinstance(suffix, str):
            raise ApiError(400, "suffix must be text", param="suffix")
        if suffix and not session.fim.infill:
            raise ApiError(
                400,
                f"suffix (fill-in-the-middle) needs a model with FIM tokens, and "
                f"{state.model_id} has none: use a code model trained for infill, such as "
                "Qwen2.5-Coder",
                param="suffix",
                code="unsupported_parameter",
            )
        prompts = completion_prompts(body, session.target.n_vocab, infill=bool(suffix))
        params = generation_params(body, state.defaults)

        def start(session: Any, cancel: Any) -> Any:
            token_lists = [
                p if isinstance(p, list)
                else session.infill_tokens(p, suffix) if suffix
                else session.text_tokens(p, raw=True, parse_special=state.parse_special)
                for p in prompts
            ]  # fmt: skip
            for tokens in token_lists:  # all fit (the engine's check) before the first runs
                session.check_prompt(tokens, params)
            return _in_turn(session, token_lists, params, cancel)

        return await _answer(state, request, body, Job(start, params), chat=False,
                             n_prompts=len(prompts))  # fmt: skip

    return app


def _in_turn(
    session: Any, token_lists: list[list[int]], params: GenerationParams, cancel: Any
) -> Iterator[Event]:
    """The prompts' generations one after another, each ending with its ``Finished``."""
    for tokens in token_lists:
        if cancel.is_set():  # the client left: the prompts still to come are not run
            return
        yield from session.generate(tokens, params, cancel)


def _authorize(state: ServerState, request: Request) -> None:
    if state.api_key is None:
        return
    given = request.headers.get("authorization", "")
    expected = f"Bearer {state.api_key}"
    if not hmac.compare_digest(given.encode(), expected.encode()):
        raise ApiError(
            401,
            "missing or wrong API key: send Authorization: Bearer KEY",
            type="authentication_error",
            code="invalid_api_key",
        )


async def _read_json(state: ServerState, request: Request) -> dict[str, Any]:
    _authorize(state, request)
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > state.max_body:
        raise ApiError(413, f"the request body is over {state.max_body} bytes", code="too_large")
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > state.max_body:
            raise ApiError(413, f"the request body is over {state.max_body} bytes",
                           code="too_large")  # fmt: skip
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ApiError(400, f"the request body is not valid JSON: {err}", code="bad_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="bad_json")
    _require_loaded(state)
    return body


def _require_loaded(state: ServerState) -> None:
    if state.worker is None:
        raise ApiError(503, "the models are still loading", type="server_error",
                       code="loading", headers={"Retry-After": "5"})  # fmt: skip


async def _next_event(job: Job, request: Request) -> Any:
    """The job's next event; cancels the job if the client went away while waiting."""
    while True:
        try:
            return await asyncio.to_thread(job.events.get, True, POLL_S)
        except queue.Empty:
            if await request.is_disconnected():
                job.cancel.set()
                return None


def _raise_for(item: Any, chat: bool) -> None:
    if isinstance(item, ContextOverflowError):
        raise ApiError(400, f"{item} ({item.hint})", code="context_length_exceeded",
                       param="messages" if chat else "prompt")  # fmt: skip
    if isinstance(item, UnsupportedByModelError):
        raise ApiError(400, f"{item} ({item.hint})", code="unsupported_parameter",
                       param="suffix")  # fmt: skip
    if isinstance(item, LocalspecError):
        raise ApiError(400, f"{item} ({item.hint})")
    if isinstance(item, BaseException):
        raise ApiError(500, f"generation failed: {item!r}", type="server_error")


async def _answer(
    state: ServerState, request: Request, body: dict[str, Any], job: Job, *, chat: bool,
    n_prompts: int = 1,
) -> Any:  # fmt: skip
    """The job's answer: one choice per prompt, in order, as JSON or as a stream."""
    assert state.worker is not None
    try:
        state.worker.submit(job)
    except QueueFull:
        raise ApiError(503, "the server is busy: every queue slot is taken", type="server_error",
                       code="queue_full", headers={"Retry-After": "2"}) from None  # fmt: skip
    try:
        first = await _next_event(job, request)  # waits for the turn; errors come first
        _raise_for(first, chat)
    except BaseException:
        job.cancel.set()
        raise
    head = {
        "id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24],
        "created": int(time.time()),
        "model": state.model_id,
    }
    if body.get("stream"):
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        frames = _stream(job, request, first, head, chat=chat, include_usage=include_usage,
                         n_prompts=n_prompts)  # fmt: skip
        return StreamingResponse(frames, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})  # fmt: skip
    finished: list[Finished] = []
    item = first
    while item is not None:
        _raise_for(item, chat)
        if isinstance(item, Finished):
            finished.append(item)
        item = await _next_event(job, request)
    if len(finished) < n_prompts:
        raise ApiError(499, "cancelled", code="cancelled")
    choices: list[dict[str, Any]] = []
    for index, done in enumerate(finished):
        reason = finish_reason(done.reason.value)
        if chat:
            choices.append({
                "index": index,
                "message": {"role": "assistant", "content": done.text},
                "finish_reason": reason,
                "logprobs": None,
            })  # fmt: skip
        else:
            choices.append(
                {"index": index, "text": done.text, "finish_reason": reason, "logprobs": None}
            )
    stats = GenerationStats.merged([done.stats for done in finished])
    return {
        **head,
        "object": "chat.completion" if chat else "text_completion",
        "choices": choices,
        "usage": usage(stats),
        "timings": timings(stats),
    }


def _sse(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()


async def _stream(
    job: Job, request: Request, first: Any, head: dict[str, Any], *, chat: bool,
    include_usage: bool, n_prompts: int = 1,
) -> AsyncIterator[bytes]:  # fmt: skip
    """Server-sent events; each chunk names its prompt's choice index. The last prompt's
    final chunk (or the usage chunk) carries ``timings`` for the whole request."""
    kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(index: int, text: str | None, reason: str | None, role: bool = False
              ) -> dict[str, Any]:  # fmt: skip
        if chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice: dict[str, Any] = {"index": index, "delta": delta, "finish_reason": reason}
        else:
            choice = {"index": index, "text": text or "", "finish_reason": reason}
        return {**head, "object": kind, "choices": [choice]}

    finished: list[Finished] = []
    try:
        if chat:
            yield _sse(chunk(0, "", None, role=True))
        item = first
        while item is not None:
            index = len(finished)  # the prompt whose events these are
            if isinstance(item, BaseException):
                yield _sse(ApiError(500, f"generation failed: {item}", type="server_error").body)
            elif isinstance(item, TokenEmitted) and item.text:
                yield _sse(chunk(index, item.text, None))
            elif isinstance(item, Finished):
                finished.append(item)
                if item.tail:
                    yield _sse(chunk(index, item.tail, None))
                last = chunk(index, None, finish_reason(item.reason.value))
                if len(finished) == n_prompts:
                    stats = GenerationStats.merged([done.stats for done in finished])
                    if include_usage:
                        last["usage"] = None
                        yield _sse(last)
                        last = {**head, "object": kind, "choices": [], "usage": usage(stats)}
                    last["timings"] = timings(stats)
                yield _sse(last)
            item = await _next_event(job, request)
        yield b"data: [DONE]\n\n"
    finally:  # the client went away (or we are done): let the worker move on
        job.cancel.set()
