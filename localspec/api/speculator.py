"""A loaded pair as a script uses it: ``Speculator``'s completions and chats.

Contract: each call checks its keywords (``GenerationParams``' fields, ``prediction`` as
text, the prompt's own options: ``raw``, ``system``, ``parse_special``, and a chat's
``tools`` and ``tool_choice`` in OpenAI's shapes, ``session.tools``) and its prompt before
anything runs, raising ``UsageError`` or ``InputError``; a prompt the context cannot
hold is a ``ContextOverflowError``, and a text past ``input_limit(n_ctx)`` bytes (more than a
context could hold) an ``InputError`` before it is tokenized. Starting a generation ends the
stream before it; while another thread reads that stream, starting one is a ``UsageError``.
``close()`` may come from any thread at any moment: a call still reading its prompt or
starting its stream finishes that first (the models are never freed under it), a call that
begins once ``close`` has is a ``UsageError``, then the stream is cancelled, its round waited
for, and the models freed. See the package's docstring for the whole API.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from localspec.api.stream import Completion, Stream
from localspec.core.params import DrafterMode, GenerationParams
from localspec.core.preflight import check_options
from localspec.errors import (
    ConflictingOptionsError,
    ContextOverflowError,
    InputError,
    LocalspecError,
    MissingDraftError,
    UsageError,
)
from localspec.machine.placement import Placement
from localspec.options.generation import build_params, drafter_mode
from localspec.options.model import Spelling
from localspec.session.constraints import constraint
from localspec.session.session import Session
from localspec.session.tools import NONE, Tools, call_grammar, read_tools, template_message

# How a generation's call names an option in an error, and where its options are described.
CALL = Spelling("", "_", "see help(localspec.Speculator.complete)")

# Options of a generation besides GenerationParams' fields, per method.
CONSTRAINTS = frozenset({"grammar", "json_schema"})
TOOLS = frozenset({"tools", "tool_choice"})  # a chat's only: tools go through its template
COMPLETE_OPTIONS = frozenset({"raw", "system", "parse_special"}) | CONSTRAINTS
CHAT_OPTIONS = frozenset({"parse_special"}) | CONSTRAINTS | TOOLS
# A text longer than this many UTF-8 bytes per context token (at least MIN_INPUT_BYTES) holds
# more tokens than the context: refused before the tokenizer reads it.
BYTES_PER_CONTEXT_TOKEN = 16
MIN_INPUT_BYTES = 1 << 20


def input_limit(n_ctx: int) -> int:
    """The most bytes of text a call reads for a context of ``n_ctx`` tokens."""
    return max(BYTES_PER_CONTEXT_TOKEN * n_ctx, MIN_INPUT_BYTES)


class Speculator:
    """A loaded pair (``load``): completions and chats until ``close()``; a context
    manager that closes it."""

    def __init__(self, session: Session, drafter: DrafterMode, warnings: list[str]) -> None:
        self._session: Session | None = session
        self.drafter = drafter  # the generations' default
        self.target = session.target_label
        self.draft = session.draft_label  # None without a draft model
        self.n_ctx = session.n_ctx
        self.placement: Placement | None = session.placement  # where each model runs, why
        self._load_warnings = warnings
        self._said: list[str] = []  # the warnings among its generations' events
        self._stream: Stream | None = None
        # Calls using the session outside a stream (reading a prompt, starting a stream):
        # ``close`` waits for them, and once it has begun no call begins.
        self._lock = threading.Condition()
        self._users = 0
        self._closing = False

    def __repr__(self) -> str:
        state = " closed" if self._session is None else ""
        return (
            f"<Speculator target={self.target!r} draft={self.draft!r} "
            f"drafter={self.drafter.value!r}{state}>"
        )

    @property
    def closed(self) -> bool:
        return self._session is None

    @property
    def warnings(self) -> list[str]:
        """What went wrong without stopping anything, from loading on: the load's warnings,
        then each ``EngineWarning`` its generations' streams passed on."""
        return list(dict.fromkeys([*self._load_warnings, *self._said]))

    # -- generation -----------------------------------------------------------------------

    def complete(self, prompt: str, **options: Any) -> Completion:
        """The completion of ``prompt``; see ``stream_complete`` for the options."""
        return self.stream_complete(prompt, **options).finish()

    def stream_complete(self, prompt: str, **options: Any) -> Stream:
        """The completion of ``prompt``, as it comes.

        Options: ``GenerationParams``' fields, ``max_tokens`` (512), ``temperature`` (0:
        greedy), ``top_k`` (40), ``top_p`` (0.95), ``min_p`` (0.05), ``seed``, ``drafter``
        (the pair's), ``draft_max`` (16), ``stop`` (a string or several), ``trees``,
        ``trace``, ...; ``prediction``: text the answer will mostly be, drafted from by
        ``auto``; ``raw``: send the prompt as is, without the chat template; ``system``: a
        system prompt before it; ``parse_special``: let control tokens in the text act as
        such; ``json_schema``: a JSON schema (a dict, or its JSON text) the answer must
        match, or ``grammar``: a GBNF grammar (llama.cpp's) it must match."""
        with _api_words(), self._using() as session:
            prompt_options, params = self._parse(session, options, COMPLETE_OPTIONS)
            text = _prompt_text(prompt)
            raw = bool(prompt_options.get("raw", False))
            system = prompt_options.get("system")
            self._bound("the prompt", [text, system if isinstance(system, str) else ""])
            tokens = session.text_tokens(
                text,
                raw=raw,
                parse_special=bool(prompt_options.get("parse_special", False)),
                system=system if system and system.strip() else None,
            )
            return self._start(session, tokens, params, _constraint(prompt_options))

    def chat(self, messages: Sequence[Mapping[str, Any]], **options: Any) -> Completion:
        """The assistant's next message; see ``stream_chat``."""
        return self.stream_chat(messages, **options).finish()

    def stream_chat(self, messages: Sequence[Mapping[str, Any]], **options: Any) -> Stream:
        """The assistant's next message after ``messages`` (OpenAI-style: ``{"role":
        "system" | "user" | "assistant" | "tool", "content": text}``, an assistant's with
        the ``tool_calls`` it made), through the target's chat template, as it comes.
        Options: as ``stream_complete``'s, but ``parse_special`` only (no ``raw``, no
        ``system``: a system message says it), and ``tools``: functions the model may call
        (OpenAI's ``[{"type": "function", "function": {"name", "description",
        "parameters"}}]``) with ``tool_choice``: ``"auto"`` (the default: text, or calls),
        ``"none"``, ``"required"`` or ``{"type": "function", "function": {"name": ...}}``.
        The calls come back as the result's ``tool_calls``, its finish reason
        ``tool_calls``."""
        with _api_words(), self._using() as session:
            prompt_options, params = self._parse(session, options, CHAT_OPTIONS)
            listed = _messages(messages)
            tools, shown = _tools(session, prompt_options)
            self._bound("the conversation", [*_message_texts(listed), shown])
            tokens = session.chat_tokens(
                listed,
                parse_special=bool(prompt_options.get("parse_special", False)),
                tools=tools.shown if tools is not None and tools.shown else None,
            )
            return self._start(session, tokens, params, _constraint(prompt_options), tools)

    def _bound(self, what: str, texts: Sequence[Any]) -> None:
        """An ``InputError`` when ``texts`` hold more bytes than a context could hold
        tokens (``input_limit``), before any tokenizer reads them."""
        limit = input_limit(self.n_ctx)
        size = 0
        for text in texts:
            if isinstance(text, str):
                size += len(text) if len(text) > limit else len(text.encode("utf-8", "replace"))
            if size > limit:
                raise InputError(
                    f"{what} is larger than {limit:,} bytes, more than a context of "
                    f"{self.n_ctx:,} tokens can hold",
                    "give a shorter text, or load with a larger ctx",
                )

    def _parse(
        self, session: Session, options: dict[str, Any], prompt_names: frozenset[str]
    ) -> tuple[dict[str, Any], GenerationParams]:
        """``(the prompt's options, the generation's params)`` of a call's keywords."""
        known = set(GenerationParams.model_fields) | prompt_names
        for name in options:
            if name in TOOLS and name not in known:
                raise UsageError(
                    f"{name} is a chat's option: complete() takes no tools",
                    "give the prompt as a message: pair.chat([{'role': 'user', "
                    "'content': prompt}], tools=[...])",
                )
            if name not in known:
                raise _unknown_option(name, known)
        prompt = {name: options.pop(name) for name in prompt_names if name in options}
        prediction = options.pop("prediction", None)
        mode = drafter_mode(options.pop("drafter", None) or self.drafter, CALL)
        if isinstance(options.get("stop"), str):
            options["stop"] = (options["stop"],)  # one stop string, as OpenAI's API takes it
        params = build_params(spelling=CALL, drafter=mode, **options)
        system = prompt.get("system")
        if system is not None and not isinstance(system, str):
            raise UsageError(f"system must be text, not {type(system).__name__}", CALL.help)
        raw = bool(prompt.get("raw", False))
        check_options(params, raw=raw, system=system, prediction=prediction is not None)
        if prediction is not None:
            prediction = self._prediction(session, prediction)
            params = params.model_copy(update={"prediction": prediction})
        return prompt, params

    def _prediction(self, session: Session, text: Any) -> tuple[int, ...]:
        if not isinstance(text, str):
            raise UsageError(
                f"prediction must be text, not {type(text).__name__}",
                "give the text the answer will mostly copy",
            )
        if not text.strip():
            raise InputError("the prediction is empty", "give the text the answer will mostly copy")
        self._bound("the prediction", [text])
        return tuple(session.plain_tokens(text))

    def _start(
        self,
        session: Session,
        tokens: list[int],
        params: GenerationParams,
        grammar: str | None = None,
        tools: Tools | None = None,
    ) -> Stream:
        self._check_thread()
        self._end_stream()
        # The session's preflight runs here: a request it cannot run fails at the call.
        cancel = threading.Event()
        events = session.generate(tokens, params, cancel, grammar=grammar, tools=tools)
        # The calls are read out of the answer only when the model was shown the tools.
        names = tools.names if tools is not None and tools.choice != NONE else ()
        self._stream = Stream(events, cancel, self._said.append, tools=names)
        return self._stream

    def _end_stream(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            stream.close()

    def _check_thread(self) -> None:
        """A generation starts only where the one running is read, or once it is over."""
        stream = self._stream
        here = threading.current_thread()
        if stream is not None and stream.running and stream.reader not in (None, here):
            raise UsageError(
                f"a generation is running in another thread ({stream.reader.name})",
                "one generation at a time: finish or close its stream first, or give each "
                "thread a pair of its own",
            )

    @contextlib.contextmanager
    def _using(self) -> Iterator[Session]:
        """The session, held open while inside (``close`` waits for it)."""
        with self._lock:
            if self._session is None or self._closing:
                raise UsageError("this pair is closed", "load it again with localspec.load()")
            self._users += 1
            session = self._session
        try:
            yield session
        finally:
            with self._lock:
                self._users -= 1
                self._lock.notify_all()

    # -- closing --------------------------------------------------------------------------

    def close(self) -> None:
        """Free both models, from any thread: a call reading its prompt or starting its
        stream finishes that first, then an unfinished stream ends (after the round another
        thread may be running). Harmless when closed, or closing in another thread."""
        with self._lock:
            if self._session is None or self._closing:
                return
            self._closing = True  # no call begins from now on
            while self._users:
                self._lock.wait()
        try:
            self._end_stream()
        finally:
            with self._lock:
                session, self._session = self._session, None
            if session is not None:
                session.close()

    def __enter__(self) -> Speculator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def _api_words() -> Iterator[None]:
    """A request's refusal (``core.preflight``) in the API's words: its options as
    ``n_ctx``' keyword ``ctx``, ``drafter=``, ``raw``."""
    try:
        yield
    except LocalspecError as error:
        raise _worded(error) from None


def _worded(error: LocalspecError) -> LocalspecError:
    if error.worded:
        return error
    if isinstance(error, ContextOverflowError):
        hint = "shorten the prompt (or drop the oldest messages), or load with a larger ctx"
        return error.reworded(error.message, hint)
    if isinstance(error, MissingDraftError):
        setting = CALL.setting(error.option, error.drafter)
        if error.derived:
            message = (
                f"{setting} drafts with a draft derived from the target's own layers, "
                "which this pair did not load"
            )
            return error.reworded(message, "load the pair with localspec.load(drafter='self')")
        message = f"{setting} needs a draft model, and this pair has none"
        hint = "load the pair with drafter='auto' or 'model', or use drafter='ngram'"
        return error.reworded(message, hint)
    if isinstance(error, ConflictingOptionsError) and error.option == "prediction":
        message = f"prediction is drafted from by drafter='auto', not {error.value!r}"
        return error.reworded(message, "drop drafter, or prediction")
    return error


def _prompt_text(prompt: Any) -> str:
    if not isinstance(prompt, str):
        raise UsageError(f"the prompt must be text, not {type(prompt).__name__}", CALL.help)
    if not prompt.strip():
        raise InputError("the prompt is empty", "give the text to complete")
    return prompt


def _messages(messages: Any) -> list[dict[str, Any]]:
    """OpenAI-style messages as the chat template takes them (each a dict of its own), as
    the server reads them: tool results, and an assistant's calls with their arguments."""
    if isinstance(messages, str | bytes) or not isinstance(messages, Sequence):
        raise UsageError(
            "messages must be a list of {'role': ..., 'content': ...} dicts",
            "for a single prompt, use complete()",
        )
    if not all(isinstance(m, Mapping) for m in messages):
        raise UsageError(
            "each message must be a dict with a role and a content",
            "e.g. {'role': 'user', 'content': 'Hello'}",
        )
    listed = [template_message(m, f"messages[{i}]") for i, m in enumerate(messages)]
    if not any(m["content"].strip() or m.get("tool_calls") for m in listed):
        raise InputError("the conversation is empty", "give at least one message with text")
    return listed


def _message_texts(listed: list[dict[str, Any]]) -> list[str]:
    """The texts a conversation sends the template: contents and earlier calls."""
    texts = [m["content"] for m in listed]
    texts += [json.dumps(m["tool_calls"], default=str) for m in listed if m.get("tool_calls")]
    return texts


def _tools(session: Session, prompt_options: dict[str, Any]) -> tuple[Tools | None, str]:
    """A chat's ``tools`` and ``tool_choice`` in OpenAI's shapes, checked before anything
    runs (each refusal a ``UsageError`` naming the keyword), and their JSON text (what the
    template shows the model, bounded with the conversation)."""
    hint = "see help(localspec.Speculator.stream_chat)"
    try:
        tools = read_tools(prompt_options.get("tools"), prompt_options.get("tool_choice"))
    except UsageError as error:
        raise error.reworded(error.message, hint) from None
    if tools is None or tools.choice == NONE:
        return tools, ""
    for name in sorted(CONSTRAINTS):
        if prompt_options.get(name) is not None:
            raise UsageError(
                f"tools and {name} are both given",
                f"give one: a call's arguments follow its function's parameters, not {name}",
            )
    try:
        shown = json.dumps(tools.shown)
    except (TypeError, ValueError) as e:
        raise UsageError(f"tools: must be JSON data ({e})", hint) from None
    session.tool_call_token()  # a template that takes no tools says so
    try:
        call_grammar(tools)  # a function's parameters the converter cannot take: refused now
    except UsageError as error:
        hint = "give each function's parameters as a JSON schema"
        raise error.reworded(error.message, hint) from None
    return tools, shown


def _unknown_option(name: str, known: set[str]) -> UsageError:
    close = difflib.get_close_matches(name, sorted(known), n=1)
    hint = f"did you mean {close[0]}?" if close else f"options: {', '.join(sorted(known))}"
    return UsageError(f"unknown option {name!r}", hint)


def _constraint(prompt_options: dict[str, Any]) -> str | None:
    """GBNF from a call's ``grammar`` or ``json_schema``, checked before anything runs."""
    return constraint(
        grammar=prompt_options.get("grammar"), json_schema=prompt_options.get("json_schema")
    )
