"""What runs in the TUI's worker threads, and the messages they post to the UI.

``load_session`` calls the session factory and posts its ``Progress`` reports as
``LoadProgress``, then
``SessionReady`` or ``LoadFailed``; ``WorkersLost`` whenever the target's RPC workers fail
(the evaluation waiting on them then never returns). ``run_generation`` checks that the
prompt fits (dropping the oldest turns when allowed), streams the Session's events as
``EngineEvent``s and always ends with ``GenerationEnded``. Neither touches a widget: they
only call ``post``, which is ``App.post_message`` (thread-safe). Every message of a
generation carries its number, so the UI can ignore a stopped generation's late events
after a new conversation started.

Errors become messages here, worded by ``localspec.errors.describe`` as in the CLI, so the UI
never shows a traceback.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from textual.message import Message

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
    ) -> Any: ...

    def count_chat_tokens(self, messages: list[dict[str, str]]) -> int: ...

    def plain_tokens_per_s(self) -> float | None: ...

    def close(self) -> None: ...


# (what to tell the progress of loading, what to call if the target's RPC workers are
# lost) -> the session
SessionFactory = Callable[[OnProgress, Callable[[str], None]], ChatSession]
Post = Callable[[Message], Any]


class LoadProgress(Message):
    def __init__(self, progress: Progress) -> None:
        super().__init__()
        self.progress = progress


class SessionReady(Message):
    def __init__(self, session: ChatSession, plain_tokens_per_s: float | None) -> None:
        super().__init__()
        self.session = session
        self.plain_tokens_per_s = plain_tokens_per_s


class LoadFailed(Message):
    def __init__(self, message: str, hint: str) -> None:
        super().__init__()
        self.message = message
        self.hint = hint


class WorkersLost(Message):
    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message


class EngineEvent(Message):
    def __init__(self, gen: int, event: Event, plain_tokens_per_s: float | None) -> None:
        super().__init__()
        self.gen = gen
        self.event = event
        self.plain_tokens_per_s = plain_tokens_per_s


class TurnsDropped(Message):
    def __init__(self, gen: int, count: int) -> None:
        super().__init__()
        self.gen = gen
        self.count = count


class ContextOverflow(Message):
    def __init__(self, gen: int, n_tokens: int, n_ctx: int, alone: bool) -> None:
        super().__init__()
        self.gen = gen
        self.n_tokens = n_tokens
        self.n_ctx = n_ctx
        self.alone = alone  # the new message does not fit even without any history


class GenerationFailed(Message):
    def __init__(self, gen: int, message: str, hint: str) -> None:
        super().__init__()
        self.gen = gen
        self.message = message
        self.hint = hint


class GenerationEnded(Message):
    def __init__(self, gen: int) -> None:
        super().__init__()
        self.gen = gen


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
            if messages is not None and not request.cancel.is_set():
                for event in session.chat(messages, request.params, request.cancel):
                    plain = None
                    if isinstance(event, RoundCompleted | Finished):
                        plain = session.plain_tokens_per_s()
                    post(EngineEvent(gen, event, plain))
        except ContextOverflowError as error:
            post(ContextOverflow(gen, error.n_tokens, error.n_ctx, alone=False))
        except Exception as error:  # noqa: BLE001 - shown in the app, the chat goes on
            post(GenerationFailed(gen, *describe_error(error)))
        finally:
            post(GenerationEnded(gen))


def _fit_prompt(
    session: ChatSession, request: GenerationRequest, post: Post
) -> list[dict[str, str]] | None:
    limit = prompt_limit(session.n_ctx, request.params)
    turns = request.turns
    if request.allow_drop:
        fit = turns_to_drop(request.system, turns, request.user, session.count_chat_tokens, limit)
        if fit is None:
            alone = build_messages(request.system, [], request.user)
            n_alone = session.count_chat_tokens(alone)
            post(ContextOverflow(request.gen, n_alone, session.n_ctx, alone=True))
            return None
        dropped, _ = fit
        if dropped:
            post(TurnsDropped(request.gen, dropped))
        return build_messages(request.system, turns[dropped:], request.user)
    messages = build_messages(request.system, turns, request.user)
    n_tokens = session.count_chat_tokens(messages)
    if n_tokens > limit:
        alone_messages = build_messages(request.system, [], request.user)
        alone = not turns or session.count_chat_tokens(alone_messages) > limit
        post(ContextOverflow(request.gen, n_tokens, session.n_ctx, alone))
        return None
    return messages
