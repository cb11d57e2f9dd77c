"""The HTTP front end: OpenAI's chat and completion endpoints over a ``GenerationWorker``.

``create_app(state)`` builds a FastAPI app. ``ServerState`` (serve/state.py) holds the worker
once the pair is loaded, with the facts of the pair the endpoints read (``/health`` answers
``loading`` until then, and every other endpoint a 503); no endpoint touches the session,
which is the worker's. Every
request first passes ``access.Guard`` (its ``Host`` and ``Origin``); every endpoint but
``/health`` then requires ``Authorization: Bearer KEY`` when keys are set (``/health`` says
how many requests wait only to a caller with a key), and the key names the client a job
runs for (the worker keeps clients apart, see serve/worker.py). A POST
body must be ``application/json`` of at most ``max_body`` bytes, sent within
``body_timeout_s`` (``--body-timeout``: a 408 after; a client that leaves while sending it
is one line in the log, a 499), read once into a typed
request (serve/requests.py) whose every field is checked before a job is queued, and what
needs the loaded pair (a drafter without its draft model, a prompt the context cannot
hold: the session's preflight) as the job starts, before its first event; every refusal
has OpenAI's error shape. An internal failure is
logged with an id and answered with that id, never with its text. A streamed answer is sent
as server-sent events; the first event (or error) is awaited before the response starts, so
a request that cannot run gets a proper status. A client that disconnects, streamed or not,
cancels its job; the engine stops after its current round. ``timings`` (llama.cpp-server's
figures, with the drafts and the cache reuse) are left out when ``state.timings`` is off.
``/metrics`` is what the worker counted (serve/metrics.py) in Prometheus' text format.
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
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from localspec.core.drafting.prediction import prediction_counts
from localspec.core.events import Event, Finished
from localspec.core.params import GenerationParams
from localspec.serve.access import Guard, client_of
from localspec.serve.errors import ApiError
from localspec.serve.replies import (
    Asked,
    cancel_on_disconnect,
    internal,
    next_event,
    raise_for,
    streamed_answer,
    whole_answer,
)
from localspec.serve.requests import (
    ApiRequest,
    CompletionRequest,
    chat_request,
    completion_request,
)
from localspec.serve.state import ServerState
from localspec.serve.worker import Job, QueueFull
from localspec.session.session import Session

JSON_TYPE = "application/json"
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"  # Prometheus' text format
# A prediction longer than this many contexts cannot be copied by any answer: refused.
PREDICTION_CONTEXTS = 4
Parsed = TypeVar("Parsed", bound=ApiRequest)
log = logging.getLogger("localspec.serve")


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
    app.get("/metrics")(metrics)
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
    if state.load_error is not None:
        return JSONResponse({"status": "error", "message": "the models could not be "
                             "loaded; the server's log says why"}, 500)  # fmt: skip
    if state.worker is None:
        return JSONResponse({"status": "loading"}, status_code=503)
    try:  # how busy the server is, to its clients only: /health needs no key
        client_of(state.access, request.headers.get("authorization"))
    except ApiError:
        return JSONResponse({"status": "ok"})
    worker = state.worker
    return JSONResponse({"status": "ok", "waiting": worker.waiting, "running": worker.running,
                         "parallel": worker.lanes})  # fmt: skip


async def metrics(request: Request) -> PlainTextResponse:
    """What the server has done, in Prometheus' text format (serve/metrics.py); its key
    is required as for every endpoint but ``/health``."""
    state = _state(request)
    client_of(state.access, request.headers.get("authorization"))
    _require_loaded(state)
    worker = state.worker
    assert worker is not None
    text = worker.metrics.render(worker.waiting, worker.running, worker.lanes)
    return PlainTextResponse(text, media_type=METRICS_TYPE)


async def models(request: Request) -> dict[str, Any]:
    state = _state(request)
    client_of(state.access, request.headers.get("authorization"))
    _require_loaded(state)
    card = {"id": state.model_id, "object": "model", "created": 0, "owned_by": "localspec"}
    extra = {"draft": state.draft_id, "placement": state.placement}
    return {"object": "list", "data": [{**card, **extra}]}


async def chat_completions(request: Request) -> Any:
    state, client, chat = await _parsed(request, chat_request)
    asked = chat.asked()

    def start(session: Session, cancel: threading.Event) -> Iterator[Event]:
        params = _with_prediction(session, chat.params, chat.prediction, asked)
        events = session.chat(chat.messages, params, cancel, grammar=chat.grammar, tools=chat.tools)
        return _counted(events, asked)

    return await _answer(state, request, Job(start, chat.params, client=client), asked)


async def completions(request: Request) -> Any:
    state, client, completion = await _parsed(request, completion_request)
    asked = completion.asked()

    def start(session: Session, cancel: threading.Event) -> Iterator[Event]:
        params = _with_prediction(session, completion.params, completion.prediction, asked)
        token_lists = [_prompt_tokens(session, completion, p) for p in completion.prompts]
        for tokens in token_lists:  # all can run (the session's preflight) before the first
            session.preflight(tokens, params)
        events = _in_turn(session, token_lists, params, cancel, completion.grammar)
        return _counted(events, asked)

    # A fill-in-the-middle is an editor's: someone typing waits for it (serve/worker.py).
    job = Job(
        start,
        completion.params,
        client=client,
        interactive=bool(completion.suffix),
        prompts=len(completion.prompts),
    )
    return await _answer(state, request, job, asked)


async def _parsed(
    request: Request, parse: Callable[[dict[str, Any], ServerState], Parsed]
) -> tuple[ServerState, str, Parsed]:
    """The server's state, the request's client (its key checked first) and the request
    as ``parse`` reads its body: once, each field checked, before any job is queued."""
    state = _state(request)
    client = client_of(state.access, request.headers.get("authorization"))
    # Off the event loop: a schema's conversion to a grammar is bounded, but not free.
    parsed = await asyncio.to_thread(parse, await _read_json(state, request), state)
    return state, client, parsed


def _prompt_tokens(session: Session, completion: CompletionRequest, prompt: str | list[int]
                   ) -> list[int]:  # fmt: skip
    """One prompt's tokens, in the worker: token ids as given, a fill-in-the-middle between
    the model's FIM tokens, or text read raw."""
    if isinstance(prompt, list):
        return prompt
    if completion.suffix:
        return session.infill_tokens(prompt, completion.suffix)
    return session.text_tokens(prompt, raw=True, parse_special=completion.parse_special)


async def _answer(state: ServerState, request: Request, job: Job, asked: Asked) -> Any:
    """The job's answer: one choice per prompt, in order, as JSON or as a stream."""
    worker = state.worker
    assert worker is not None
    job.events.bind(asyncio.get_running_loop())  # waited for here, on no thread
    try:
        worker.submit(job)
    except QueueFull:
        raise ApiError(503, "the server is busy: every queue slot is taken", type="server_error",
                       code="queue_full", headers={"Retry-After": "2"}) from None  # fmt: skip
    watcher = asyncio.create_task(cancel_on_disconnect(request, job, worker.withdraw))
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
        worker.withdraw(job)
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
    grammar: str | None = None,
) -> Iterator[Event]:
    """The prompts' generations one after another, each ending with its ``Finished``."""
    for tokens in token_lists:
        if cancel.is_set():  # the client left: the prompts still to come are not run
            return
        yield from session.generate(tokens, params, cancel, grammar=grammar)


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
    try:
        async with asyncio.timeout(state.body_timeout_s):  # a half-sent body is not held
            raw = await _read_body(state, request)
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {state.body_timeout_s:g} s",
                       code="body_timeout") from None  # fmt: skip
    except ClientDisconnect:  # nobody reads the answer: one line in the log, no traceback
        log.warning("a client left while sending its request body (499)")
        raise ApiError(499, "the client left while sending its body", code="cancelled") from None
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


async def _read_body(state: ServerState, request: Request) -> bytearray:
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > state.max_body:
            raise _too_large(state)
    return raw


def _require_loaded(state: ServerState) -> None:
    if state.worker is None:
        raise ApiError(503, "the models are still loading", type="server_error",
                       code="loading", headers={"Retry-After": "5"})  # fmt: skip
