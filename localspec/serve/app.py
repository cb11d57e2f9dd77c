"""The HTTP front end: OpenAI's chat and completion endpoints over a ``GenerationWorker``.

``create_app(state)`` builds a FastAPI app. ``ServerState`` holds the worker once the pair is
loaded (``/health`` answers ``loading`` until then, and every other endpoint a 503). Every
request first passes ``access.Guard`` (its ``Host`` and ``Origin``); every endpoint but
``/health`` then requires ``Authorization: Bearer KEY`` when keys are set, and the key names
the client a job runs for (the worker keeps clients apart, see serve/worker.py). A POST
body must be ``application/json`` of at most ``max_body`` bytes; every field is checked
before a job is queued, and every refusal has OpenAI's error shape. An internal failure is
logged with an id and answered with that id, never with its text. A streamed answer is sent
as server-sent events; the first event (or error) is awaited before the response starts, so
a request that cannot run gets a proper status. A client that disconnects, streamed or not,
cancels its job; the engine stops after its current round. ``timings`` (llama.cpp-server's
figures, with the drafts and the cache reuse) are left out when ``state.timings`` is off.

``/v1/completions`` takes several prompts (text or token ids; one choice each, generated one
after another, ``usage`` and ``timings`` summed) and a ``suffix``: fill-in-the-middle through
the target's FIM tokens (``Session.infill_tokens``), a 400 naming ``suffix`` for a model
without them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
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

from localspec.core.drafting.prediction import prediction_counts
from localspec.core.events import Event, Finished, TokenEmitted
from localspec.core.params import GenerationParams
from localspec.core.stats import GenerationStats
from localspec.errors import ContextOverflowError, LocalspecError, UnsupportedByModelError
from localspec.serve.access import Access, Guard, client_of
from localspec.serve.openai_shapes import (
    ApiError,
    chat_messages,
    completion_prompts,
    finish_reason,
    generation_params,
    prediction_text,
    stream_flags,
    timings,
    usage,
)
from localspec.serve.worker import GenerationWorker, Job, QueueFull

POLL_S = 0.1  # how often a request waiting on its job's events checks that it still wants them
JSON_TYPE = "application/json"
log = logging.getLogger("localspec.serve")


@dataclass
class ServerState:
    defaults: GenerationParams
    access: Access = field(default_factory=Access)
    max_body: int = 1 << 20
    max_tokens_limit: int | None = None  # the most new tokens a request may ask for
    timings: bool = True  # False (--no-timings): answers carry no ``timings`` object
    worker: GenerationWorker | None = None
    model_id: str = "localspec"
    draft_id: str | None = None
    derived_draft: bool = False  # the draft was derived from the target (--draft self)
    placement: dict[str, Any] | None = None  # where each model runs (session/placement.py)
    load_error: str | None = None
    loading: bool = False  # the pair is being loaded (cli/serve.py's loader thread)
    closing: bool = False  # told to stop: a pair loaded now is freed, not served
    # Control-token text in a /v1/completions prompt acts as control tokens (never in chat).
    parse_special: bool = False


@dataclass(frozen=True)
class Asked:
    """What a request asked for besides its prompts. ``predicted`` receives the tokens of
    its prediction (if it gave one) once the worker has read it, for the usage's counts."""

    chat: bool
    stream: bool = False
    include_usage: bool = False
    n_prompts: int = 1
    predicted: list[list[int]] = field(default_factory=list)


def _with_prediction(
    session: Any, params: GenerationParams, text: str | None, asked: Asked
) -> GenerationParams:
    """``params`` drafting from the request's prediction ``text`` (read with the target's
    tokenizer, in the worker: the session is the worker's)."""
    if text is None:
        return params
    tokens = session.plain_tokens(text)
    asked.predicted.append(tokens)
    return params.model_copy(update={"prediction": tuple(tokens)})


def _check_drafter(state: ServerState, params: GenerationParams) -> None:
    if params.drafter.needs_draft_model and state.draft_id is None:
        raise ApiError(400, f"speculative.drafter is {params.drafter}, but this server has no "
                       "draft model: use auto, ngram or lookahead",
                       param="speculative.drafter")  # fmt: skip
    if params.drafter.derives_draft and not state.derived_draft:
        raise ApiError(400, "speculative.drafter is self, but this server's draft was not "
                       "derived from the target (serve --draft self): use auto or model",
                       param="speculative.drafter")  # fmt: skip


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="localspec", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.localspec = state
    if state.access.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(state.access.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    # Added last, so outermost: a refused request reaches neither CORS nor an endpoint.
    app.add_middleware(Guard, access=lambda: state.access)

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

    @app.exception_handler(Exception)
    async def internal_error(request: Request, err: Exception) -> JSONResponse:
        error = internal(err)
        return JSONResponse(error.body, status_code=error.status)

    @app.get("/health")
    async def health() -> JSONResponse:
        if state.load_error:
            return JSONResponse({"status": "error", "message": "the models could not be "
                                 "loaded; the server's log says why"}, 500)  # fmt: skip
        if state.worker is None:
            return JSONResponse({"status": "loading"}, status_code=503)
        return JSONResponse({"status": "ok", "waiting": state.worker.waiting})

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        client_of(state.access, request.headers.get("authorization"))
        _require_loaded(state)
        card = {"id": state.model_id, "object": "model", "created": 0, "owned_by": "localspec"}
        extra = {"draft": state.draft_id, "placement": state.placement}
        return {"object": "list", "data": [{**card, **extra}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        client = client_of(state.access, request.headers.get("authorization"))
        body = await _read_json(state, request)
        messages = chat_messages(body)
        params = generation_params(body, state.defaults, state.max_tokens_limit)
        _check_drafter(state, params)
        predicted = prediction_text(body)
        stream, include_usage = stream_flags(body)
        asked = Asked(chat=True, stream=stream, include_usage=include_usage)

        def start(session: Any, cancel: Any) -> Any:
            chosen = _with_prediction(session, params, predicted, asked)
            return session.chat(messages, chosen, cancel)

        return await _answer(state, request, Job(start, params, client=client), asked)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        client = client_of(state.access, request.headers.get("authorization"))
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
        params = generation_params(body, state.defaults, state.max_tokens_limit)
        _check_drafter(state, params)
        predicted = prediction_text(body)
        stream, include_usage = stream_flags(body)
        asked = Asked(False, stream, include_usage, n_prompts=len(prompts))

        def start(session: Any, cancel: Any) -> Any:
            chosen = _with_prediction(session, params, predicted, asked)
            token_lists = [
                p if isinstance(p, list)
                else session.infill_tokens(p, suffix) if suffix
                else session.text_tokens(p, raw=True, parse_special=state.parse_special)
                for p in prompts
            ]  # fmt: skip
            for tokens in token_lists:  # all fit (the engine's check) before the first runs
                session.check_prompt(tokens, chosen)
            return _in_turn(session, token_lists, chosen, cancel)

        return await _answer(state, request, Job(start, params, client=client), asked)

    return app


def _in_turn(
    session: Any, token_lists: list[list[int]], params: GenerationParams, cancel: Any
) -> Iterator[Event]:
    """The prompts' generations one after another, each ending with its ``Finished``."""
    for tokens in token_lists:
        if cancel.is_set():  # the client left: the prompts still to come are not run
            return
        yield from session.generate(tokens, params, cancel)


def internal(err: BaseException) -> ApiError:
    """A failure of the server itself: logged here with an id, answered with the id only
    (its text may name files or objects of this machine)."""
    ref = uuid.uuid4().hex[:8]
    log.error("internal error %s: %r", ref, err, exc_info=err)
    return ApiError(500, f"internal error {ref}; the server's log has the details",
                    type="server_error", code="internal_error")  # fmt: skip


def _too_large(state: ServerState) -> ApiError:
    return ApiError(413, f"the request body is over {state.max_body} bytes", code="too_large")


async def _read_json(state: ServerState, request: Request) -> dict[str, Any]:
    """The body as a JSON object: ``application/json`` (a web page can send other types
    without asking first), at most ``max_body`` bytes, parsed without letting a crafted
    document (nested too deep, numbers too long) fail as anything but a 400."""
    media = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media != JSON_TYPE:
        raise ApiError(415, f"the request body must be sent as Content-Type: {JSON_TYPE}",
                       code="unsupported_media_type")  # fmt: skip
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > state.max_body:
        raise _too_large(state)
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > state.max_body:
            raise _too_large(state)
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError) as err:  # JSONDecodeError, bad UTF-8, long integers
        why = (
            err.msg
            if isinstance(err, json.JSONDecodeError)
            else "it is nested too deep"
            if isinstance(err, RecursionError)
            else "it has a number too long or bad UTF-8"
        )
        raise ApiError(400, f"the request body is not valid JSON: {why}", code="bad_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="bad_json")
    _require_loaded(state)
    return body


def _require_loaded(state: ServerState) -> None:
    if state.worker is None:
        raise ApiError(503, "the models are still loading", type="server_error",
                       code="loading", headers={"Retry-After": "5"})  # fmt: skip


async def _next_event(job: Job) -> Any:
    """The job's next event, or None once it is over (or cancelled: nobody waits for it)."""
    while not job.cancel.is_set():
        try:
            return await asyncio.to_thread(job.events.get, True, POLL_S)
        except queue.Empty:
            continue
    return None


async def _cancel_on_disconnect(request: Request, job: Job) -> None:
    """Cancel the job when the client goes away. Its body is read by then, so the next
    message the server sends is the disconnect (or the end of the response)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancel.set()
            return


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
        raise internal(item)


async def _answer(state: ServerState, request: Request, job: Job, asked: Asked) -> Any:
    """The job's answer: one choice per prompt, in order, as JSON or as a stream."""
    assert state.worker is not None
    try:
        state.worker.submit(job)
    except QueueFull:
        raise ApiError(503, "the server is busy: every queue slot is taken", type="server_error",
                       code="queue_full", headers={"Retry-After": "2"}) from None  # fmt: skip
    watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
    try:
        first = await _next_event(job)  # waits for the turn; errors come first
        _raise_for(first, asked.chat)
        head = {
            "id": ("chatcmpl-" if asked.chat else "cmpl-") + uuid.uuid4().hex[:24],
            "created": int(time.time()),
            "model": state.model_id,
        }
        if asked.stream:  # from here the response watches its client itself
            frames = _stream(state, job, first, head, asked)
            return StreamingResponse(frames, media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})  # fmt: skip
        return await _whole(state, job, first, head, asked)
    except BaseException:
        job.cancel.set()
        raise
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


async def _whole(
    state: ServerState, job: Job, first: Any, head: dict[str, Any], asked: Asked
) -> dict[str, Any]:
    """A non-streamed answer: every event gathered, then one JSON object."""
    finished: list[Finished] = []
    item = first
    while item is not None:
        _raise_for(item, asked.chat)
        if isinstance(item, Finished):
            finished.append(item)
        item = await _next_event(job)
    if len(finished) < asked.n_prompts:
        raise ApiError(499, "cancelled", code="cancelled")
    choices: list[dict[str, Any]] = []
    for index, done in enumerate(finished):
        reason = finish_reason(done.reason.value)
        if asked.chat:
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
    answer = {
        **head,
        "object": "chat.completion" if asked.chat else "text_completion",
        "choices": choices,
        "usage": usage(stats, _predicted(asked, finished)),
    }
    if state.timings:
        answer["timings"] = timings(stats, len(finished))
    return answer


def _predicted(asked: Asked, finished: list[Finished]) -> tuple[int, int] | None:
    """The prediction's accepted and rejected tokens over every answer, if it had one."""
    if not asked.predicted:
        return None
    counts = [prediction_counts(asked.predicted[0], list(done.token_ids)) for done in finished]
    return sum(a for a, _ in counts), sum(r for _, r in counts)


def _sse(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()


async def _stream(
    state: ServerState, job: Job, first: Any, head: dict[str, Any], asked: Asked
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
    try:
        if asked.chat:
            yield _sse(chunk(0, "", None, role=True))
        item = first
        while item is not None:
            index = len(finished)  # the prompt whose events these are
            if isinstance(item, BaseException):
                yield _sse(internal(item).body)
            elif isinstance(item, TokenEmitted) and item.text:
                yield _sse(chunk(index, item.text, None))
            elif isinstance(item, Finished):
                finished.append(item)
                if item.tail:
                    yield _sse(chunk(index, item.tail, None))
                last = chunk(index, None, finish_reason(item.reason.value))
                if len(finished) == asked.n_prompts:
                    stats = GenerationStats.merged([done.stats for done in finished])
                    if asked.include_usage:
                        last["usage"] = None
                        yield _sse(last)
                        shown = usage(stats, _predicted(asked, finished))
                        last = {**head, "object": kind, "choices": [], "usage": shown}
                    if state.timings:
                        last["timings"] = timings(stats, len(finished))
                yield _sse(last)
            item = await _next_event(job)
        yield b"data: [DONE]\n\n"
    finally:  # the client went away (or we are done): let the worker move on
        job.cancel.set()
