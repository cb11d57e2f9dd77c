"""The HTTP front end: OpenAI's chat and completion endpoints over a ``GenerationWorker``.

``create_app(state)`` builds a FastAPI app. ``ServerState`` holds the worker once the pair is
loaded (``/health`` answers ``loading`` until then, and every other endpoint a 503). Every
request first passes ``access.Guard`` (its ``Host`` and ``Origin``); every endpoint but
``/health`` then requires ``Authorization: Bearer KEY`` when keys are set (``/health`` says
how many requests wait only to a caller with a key), and the key names the client a job
runs for (the worker keeps clients apart, see serve/worker.py). A POST
body must be ``application/json`` of at most ``max_body`` bytes; every field is checked
before a job is queued, what needs the loaded pair (a drafter without its draft model, a
prompt the context cannot hold: the session's preflight) as the job starts, before its
first event; every refusal has OpenAI's error shape. An internal failure is
logged with an id and answered with that id, never with its text. A streamed answer is sent
as server-sent events; the first event (or error) is awaited before the response starts, so
a request that cannot run gets a proper status. A client that disconnects, streamed or not,
cancels its job; the engine stops after its current round. ``timings`` (llama.cpp-server's
figures, with the drafts and the cache reuse) are left out when ``state.timings`` is off.
The endpoints are the functions named after them below, which read the ``ServerState``
from the app; serve/replies.py turns a job's events into the answer.

``/v1/completions`` takes several prompts (text or token ids; one choice each, generated one
after another, ``usage`` and ``timings`` summed) and a ``suffix``: fill-in-the-middle through
the target's FIM tokens (``Session.infill_tokens``), a 400 naming ``suffix`` for a model
without them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from localspec.core.drafting.prediction import prediction_counts
from localspec.core.events import Event, Finished
from localspec.core.params import GenerationParams
from localspec.errors import ConflictingOptionsError
from localspec.serve.access import Access, Guard, client_of
from localspec.serve.errors import ApiError
from localspec.serve.openai_shapes import (
    chat_messages,
    completion_prompts,
    generation_params,
    prediction_text,
    stream_flags,
)
from localspec.serve.replies import (
    Asked,
    cancel_on_disconnect,
    internal,
    next_event,
    raise_for,
    refusal,
    streamed_answer,
    whole_answer,
)
from localspec.serve.worker import GenerationWorker, Job, QueueFull
from localspec.session.preflight import check_options
from localspec.session.session import Session

JSON_TYPE = "application/json"
# A prediction longer than this many contexts cannot be copied by any answer: refused.
PREDICTION_CONTEXTS = 4


@dataclass
class ServerState:
    defaults: GenerationParams
    access: Access = field(default_factory=Access)
    max_body: int = 1 << 20
    max_tokens_limit: int | None = None  # the most new tokens a request may ask for
    speculative_overrides: bool = True  # a request may set speculative.* (within limits)
    timings: bool = True  # False (--no-timings): answers carry no ``timings`` object
    worker: GenerationWorker | None = None
    model_id: str = "localspec"
    draft_id: str | None = None
    placement: dict[str, Any] | None = None  # where each model runs (session/placement.py)
    load_error: str | None = None
    loading: bool = False  # the pair is being loaded (cli/serve.py's loader thread)
    loader: threading.Thread | None = None  # that thread: it stops at its next step
    closing: bool = False  # told to stop: a pair loaded now is freed, not served
    # Control-token text in a /v1/completions prompt acts as control tokens (never in chat).
    parse_special: bool = False


def _with_prediction(
    session: Session, params: GenerationParams, text: str | None, asked: Asked
) -> GenerationParams:
    """``params`` drafting from the request's prediction ``text``, read with the target's
    tokenizer in the worker (the session is the worker's); a 400 naming ``prediction`` when
    it has more than ``PREDICTION_CONTEXTS`` contexts of tokens."""
    if text is None:
        return params
    tokens = session.plain_tokens(text)
    limit = PREDICTION_CONTEXTS * session.n_ctx
    if len(tokens) > limit:
        raise ApiError(400, f"the prediction has {len(tokens)} tokens; this server reads at "
                       f"most {limit} ({PREDICTION_CONTEXTS} times its context)",
                       param="prediction", code="prediction_too_long")  # fmt: skip
    asked.predicted.append(tuple(tokens))
    return params.model_copy(update={"prediction": tuple(tokens)})


def _counted(events: Iterator[Event], asked: Asked) -> Iterator[Event]:
    """The events, each answer's use of the prediction counted (``Asked.counts``) before its
    ``Finished`` is handed on: in the worker, never on the event loop."""
    for event in events:
        if isinstance(event, Finished) and asked.predicted:
            asked.counts.append(prediction_counts(asked.predicted[0], event.token_ids))
        yield event


def _check_options(params: GenerationParams, predicted: str | None) -> None:
    """Options that cannot go together (``session.preflight``), refused before a job is
    queued: a prediction is drafted from by ``auto`` only (with another drafter it would be
    ignored, and its counts would say nothing of the answer)."""
    try:
        check_options(params, prediction=predicted is not None)
    except ConflictingOptionsError as error:
        raise refusal(error, chat=False) or error from None


def create_app(state: ServerState) -> FastAPI:
    app = FastAPI(title="localspec", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.localspec = state  # what the endpoints serve (see _state)
    if state.access.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=list(state.access.cors_origins),
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "Content-Type"],
        )
    # Added last, so outermost: a refused request reaches neither CORS nor an endpoint.
    app.add_middleware(Guard, access=lambda: state.access)
    app.exception_handler(ApiError)(api_error)
    app.exception_handler(StarletteHTTPException)(http_error)
    app.exception_handler(Exception)(internal_error)
    app.get("/health")(health)
    app.get("/v1/models")(models)
    app.post("/v1/chat/completions")(chat_completions)
    app.post("/v1/completions")(completions)
    return app


def _state(request: Request) -> ServerState:
    return request.app.state.localspec


async def api_error(request: Request, err: ApiError) -> JSONResponse:
    return JSONResponse(err.body, status_code=err.status, headers=err.headers)


async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
    # Starlette's own refusals (no such endpoint, wrong method) in OpenAI's shape too.
    if err.status_code == 404:
        error = ApiError(404, f"no endpoint {request.url.path}", code="not_found")
    else:
        error = ApiError(err.status_code, f"{request.method} {request.url.path}: {err.detail}")
    return JSONResponse(error.body, status_code=err.status_code, headers=err.headers)


async def internal_error(request: Request, err: Exception) -> JSONResponse:
    error = internal(err)
    return JSONResponse(error.body, status_code=error.status)


async def health(request: Request) -> JSONResponse:
    state = _state(request)
    if state.load_error:
        return JSONResponse({"status": "error", "message": "the models could not be "
                             "loaded; the server's log says why"}, 500)  # fmt: skip
    if state.worker is None:
        return JSONResponse({"status": "loading"}, status_code=503)
    try:  # how busy the server is, to its clients only: /health needs no key
        client_of(state.access, request.headers.get("authorization"))
    except ApiError:
        return JSONResponse({"status": "ok"})
    return JSONResponse({"status": "ok", "waiting": state.worker.waiting})


async def models(request: Request) -> dict[str, Any]:
    state = _state(request)
    client_of(state.access, request.headers.get("authorization"))
    _require_loaded(state)
    card = {"id": state.model_id, "object": "model", "created": 0, "owned_by": "localspec"}
    extra = {"draft": state.draft_id, "placement": state.placement}
    return {"object": "list", "data": [{**card, **extra}]}


async def chat_completions(request: Request) -> Any:
    state = _state(request)
    client = client_of(state.access, request.headers.get("authorization"))
    body = await _read_json(state, request)
    messages = chat_messages(body)
    params = generation_params(
        body, state.defaults, state.max_tokens_limit, state.speculative_overrides
    )
    predicted = prediction_text(body)
    _check_options(params, predicted)
    stream, include_usage = stream_flags(body)
    asked = Asked(chat=True, stream=stream, include_usage=include_usage)

    def start(session: Session, cancel: threading.Event) -> Iterator[Event]:
        chosen = _with_prediction(session, params, predicted, asked)
        return _counted(session.chat(messages, chosen, cancel), asked)

    return await _answer(state, request, Job(start, params, client=client), asked)


async def completions(request: Request) -> Any:
    state = _state(request)
    client = client_of(state.access, request.headers.get("authorization"))
    body = await _read_json(state, request)
    assert state.worker is not None
    session = state.worker.session
    suffix = _suffix(state, session, body)
    prompts = completion_prompts(body, session.target.n_vocab, infill=bool(suffix))
    params = generation_params(
        body, state.defaults, state.max_tokens_limit, state.speculative_overrides
    )
    predicted = prediction_text(body)
    _check_options(params, predicted)
    stream, include_usage = stream_flags(body)
    asked = Asked(False, stream, include_usage, n_prompts=len(prompts))

    def start(session: Session, cancel: threading.Event) -> Iterator[Event]:
        chosen = _with_prediction(session, params, predicted, asked)
        token_lists = [
            p if isinstance(p, list)
            else session.infill_tokens(p, suffix) if suffix
            else session.text_tokens(p, raw=True, parse_special=state.parse_special)
            for p in prompts
        ]  # fmt: skip
        for tokens in token_lists:  # all can run (the session's preflight) before the first
            session.preflight(tokens, chosen)
        return _counted(_in_turn(session, token_lists, chosen, cancel), asked)

    return await _answer(state, request, Job(start, params, client=client), asked)


def _suffix(state: ServerState, session: Session, body: dict[str, Any]) -> str | None:
    """The request's ``suffix``, checked: text, and only for a model with FIM tokens."""
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
    return suffix


async def _answer(state: ServerState, request: Request, job: Job, asked: Asked) -> Any:
    """The job's answer: one choice per prompt, in order, as JSON or as a stream."""
    assert state.worker is not None
    try:
        state.worker.submit(job)
    except QueueFull:
        raise ApiError(503, "the server is busy: every queue slot is taken", type="server_error",
                       code="queue_full", headers={"Retry-After": "2"}) from None  # fmt: skip
    watcher = asyncio.create_task(cancel_on_disconnect(request, job))
    try:
        first = await next_event(job)  # waits for the turn; errors come first
        raise_for(first, asked.chat)
        head = {
            "id": ("chatcmpl-" if asked.chat else "cmpl-") + uuid.uuid4().hex[:24],
            "created": int(time.time()),
            "model": state.model_id,
        }
        if asked.stream:  # from here the response watches its client itself
            frames = streamed_answer(job, first, head, asked, state.timings)
            return StreamingResponse(frames, media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})  # fmt: skip
        return await whole_answer(job, first, head, asked, state.timings)
    except BaseException:
        job.cancel.set()
        raise
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


def _in_turn(
    session: Session,
    token_lists: list[list[int]],
    params: GenerationParams,
    cancel: threading.Event,
) -> Iterator[Event]:
    """The prompts' generations one after another, each ending with its ``Finished``."""
    for tokens in token_lists:
        if cancel.is_set():  # the client left: the prompts still to come are not run
            return
        yield from session.generate(tokens, params, cancel)


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
