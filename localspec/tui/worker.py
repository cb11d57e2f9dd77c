"""What runs in the chat's worker threads, and the news they post: plain data, no Textual.

``load_session`` calls the session factory and posts its ``Progress`` reports as
``LoadProgress``, then
``SessionReady`` or ``LoadFailed``; ``WorkersLost`` whenever the target's RPC workers fail
(the evaluation waiting on them then never returns). ``run_generation`` checks that the
prompt leaves the answer room (dropping the oldest turns when allowed), streams the Session's
events as ``EngineEvent``s and always ends with ``GenerationEnded``. A prompt that does not
fit, by that check or the session's own, is one ``ContextOverflowError`` and one
``ContextOverflow`` with the error's figures. Neither function touches the UI: they only call
``post``, which must be safe to call from any thread (the app hands the news to its own
thread). Every news of a generation carries its number, so the chat can ignore a stopped
generation's late events after a new conversation started.

Errors become news here, worded by ``localspec.errors.describe`` as in the CLI, so the UI
never shows a traceback.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from localspec.core.events import Event, Finished, RoundCompleted
from localspec.core.params import GenerationParams
from localspec.errors import ContextOverflowError, describe
from localspec.progress import OnProgress, Progress
from localspec.tui.conversation import Turn, build_messages, turns_to_drop

# Room an answer needs at least: a prompt that leaves less is reported as an overflow.
MIN_ANSWER_ROOM = 128


class ChatSession(Protocol):
    """The part of ``localspec.session.session.Session`` the TUI uses."""

    target_label: str
    draft_label: str | None
    target_path: Path | None  # the model files, as resolved
    draft_path: Path | None
    n_ctx: int

    def chat(
        self,
        messages: list[dict[str, str]],
        params: GenerationParams,
        cancel: threading.Event | None = None,
        *,
        grammar: str | None = None,
    ) -> Any: ...

    def count_chat_tokens(self, messages: list[dict[str, str]]) -> int: ...

    def plain_tokens(self, text: str) -> list[int]: ...

    def plain_tokens_per_s(self) -> float | None: ...

    @property
    def draft_summary(self) -> str | None:
        """Whether the draft model was loaded, and why."""

    def close(self) -> None: ...


# (what to tell the progress of loading, what to call if the target's RPC workers are
# lost) -> the session
SessionFactory = Callable[[OnProgress, Callable[[str], None]], ChatSession]


@dataclass(frozen=True)
class LoadProgress:
    progress: Progress


@dataclass(frozen=True)
class SessionReady:
    session: ChatSession
    plain_tokens_per_s: float | None


@dataclass(frozen=True)
class LoadFailed:
    message: str
    hint: str


@dataclass(frozen=True)
class WorkersLost:
    message: str


@dataclass(frozen=True)
class EngineEvent:
    gen: int
    event: Event
    plain_tokens_per_s: float | None


@dataclass(frozen=True)
class TurnsDropped:
    gen: int
    count: int


@dataclass(frozen=True)
class ContextOverflow:
    gen: int
    n_tokens: int
    n_ctx: int
    alone: bool  # the new message does not fit even without any history


@dataclass(frozen=True)
class GenerationFailed:
    gen: int
    message: str
    hint: str


@dataclass(frozen=True)
class GenerationEnded:
    gen: int


WorkerNews = (
    LoadProgress
    | SessionReady
    | LoadFailed
    | WorkersLost
    | EngineEvent
    | TurnsDropped
    | ContextOverflow
    | GenerationFailed
    | GenerationEnded
)
Post = Callable[[WorkerNews], Any]


def describe_error(error: BaseException) -> tuple[str, str]:
    """Message and hint, as every front end words them (``localspec.errors.describe``)."""
    message, hint, _ = describe(error)
    return message, hint


def load_session(factory: SessionFactory, post: Post, closing: threading.Event) -> None:
    try:
        session = factory(lambda p: post(LoadProgress(p)), lambda m: post(WorkersLost(m)))
        plain = session.plain_tokens_per_s()
    except Exception as error:  # noqa: BLE001 - every failure becomes a message in the app
        post(LoadFailed(*describe_error(error)))
        return
    if closing.is_set():  # the app quit while the models were loading
        session.close()
        return
    post(SessionReady(session, plain))


@dataclass
class GenerationRequest:
    gen: int
    system: str | None
    turns: list[Turn]  # the turns in context, oldest first
    user: str
    params: GenerationParams
    cancel: threading.Event
    allow_drop: bool = False  # drop the oldest turns instead of reporting an overflow
    grammar: str | None = None  # GBNF the answer must match (``/schema``)


def prompt_limit(n_ctx: int, params: GenerationParams) -> int:
    return n_ctx - min(params.max_tokens, MIN_ANSWER_ROOM)


def run_generation(
    session: ChatSession, lock: threading.Lock, request: GenerationRequest, post: Post
) -> None:
    gen = request.gen
    # One generation at a time: a stopped one may still be finishing its round.
    with lock:
        try:
            messages = _fit_prompt(session, request, post)
            if not request.cancel.is_set():
                answer = session.chat(
                    messages, request.params, request.cancel, grammar=request.grammar
                )
                for event in answer:
                    plain = None
                    if isinstance(event, RoundCompleted | Finished):
                        plain = session.plain_tokens_per_s()
                    post(EngineEvent(gen, event, plain))
        except ContextOverflowError as error:
            # The dialog shows the error's figures, whichever check found no room.
            alone = _too_long_alone(session, request)
            post(ContextOverflow(gen, error.n_tokens, error.n_ctx, alone))
        except Exception as error:  # noqa: BLE001 - shown in the app, the chat goes on
            post(GenerationFailed(gen, *describe_error(error)))
        finally:
            post(GenerationEnded(gen))


def _fit_prompt(
    session: ChatSession, request: GenerationRequest, post: Post
) -> list[dict[str, str]]:
    """The prompt's messages, the oldest turns dropped first when allowed; raises
    ``ContextOverflowError`` when it leaves the answer no room."""
    limit = prompt_limit(session.n_ctx, request.params)
    turns = request.turns
    if request.allow_drop:
        fit = turns_to_drop(request.system, turns, request.user, session.count_chat_tokens, limit)
        if fit is None:
            alone = build_messages(request.system, [], request.user)
            raise _no_room(session.count_chat_tokens(alone), session.n_ctx)
        dropped, _ = fit
        if dropped:
            post(TurnsDropped(request.gen, dropped))
        return build_messages(request.system, turns[dropped:], request.user)
    messages = build_messages(request.system, turns, request.user)
    n_tokens = session.count_chat_tokens(messages)
    if n_tokens > limit:
        raise _no_room(n_tokens, session.n_ctx)
    return messages


def _no_room(n_tokens: int, n_ctx: int) -> ContextOverflowError:
    return ContextOverflowError(
        f"the conversation has {n_tokens} tokens and leaves the answer no room in {n_ctx}",
        "start a new conversation or drop the oldest turns",
        n_tokens=n_tokens,
        n_ctx=n_ctx,
    )


def _too_long_alone(session: ChatSession, request: GenerationRequest) -> bool:
    """Whether the new message overflows even without any history (only cancelling helps)."""
    if not request.turns:
        return True
    alone = build_messages(request.system, [], request.user)
    return session.count_chat_tokens(alone) > prompt_limit(session.n_ctx, request.params)
