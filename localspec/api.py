"""The Python API: a target/draft pair loaded once, completing text and holding chats.

::

    import localspec

    with localspec.load() as pair:  # the default pair, as ``localspec complete`` loads it
        stream = pair.stream_complete("def fib(n):", max_tokens=30)
        for piece in stream.pieces():
            print(piece, end="", flush=True)
        print(stream.result.stats.decode_tokens_per_s)

The contract:

- ``load(target=None, draft=None, **options) -> Speculator`` loads a pair with the command
  line's model options, spelt as Python keywords (``ctx``, ``gpu_layers``, ``drafter``,
  ...), from the same cache and home as the command line (``LOCALSPEC_HOME``): a model
  fetched by one is there for the other.
- ``Speculator.complete(prompt, **options)`` and ``chat(messages, **options)`` return a
  ``Completion`` (text, token ids, finish reason, final ``GenerationStats``);
  ``stream_complete`` and ``stream_chat`` take the same arguments and return a ``Stream`` of
  the engine's own events (``localspec.core.events``) as they come. Streaming has methods
  of its own rather than a ``stream=True`` flag so that each method has one return type
  (which a reader, and a type checker, can tell from its name) and so the stream can carry
  what a generator cannot: ``cancel()``, the text so far, and the ``result`` at the end.
- The options of a generation are ``GenerationParams``' fields (``max_tokens``,
  ``temperature``, ``seed``, ``drafter``, ``stop``, ...), with ``prediction`` given as text.
  ``complete`` sends the prompt through the target's chat template, as the command line
  does, unless ``raw=True``; ``chat`` takes OpenAI-style messages.
- Greedy output (``temperature=0``, the default) is the target's own, whatever the drafter.
- Nothing is printed: loading reports to ``on_progress`` if given, and warnings are kept in
  ``Speculator.warnings`` and ``Completion.warnings``.
- Nothing of the user's is written unless asked: answers join the history of answers only
  with ``history=True``, and what ``auto`` learns of acceptance is saved for the next
  process only with ``learn=True`` (what the command line saved is still read, so a script
  starts warm). The measured costs of this machine are cached as the command line caches
  them: they describe the machine, not the user.
- Errors are ``localspec.errors.LocalspecError`` subclasses with ``message`` and ``hint``:
  ``UsageError`` for an option that cannot work (an unknown name, a bad value, a drafter
  the loaded pair cannot run), ``InputError`` for an unusable prompt, and loading's and
  generation's own as the command line reports them.
- One generation at a time: starting another ends the stream before it (after its current
  round, so the models stay consistent). A ``Speculator`` is not for several threads.
"""

from __future__ import annotations

import difflib
import os
import threading
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from localspec.backend.rpc import DEFAULT_TIMEOUT as DEFAULT_RPC_TIMEOUT
from localspec.backend.rpc import parse_endpoints
from localspec.core.events import EngineWarning, Event, Finished, FinishReason, TokenEmitted
from localspec.core.params import DrafterMode, GenerationParams
from localspec.core.stats import GenerationStats
from localspec.errors import ContextOverflowError, InputError, UsageError
from localspec.progress import OnProgress, Progress, ProgressKind
from localspec.session.open import open_session
from localspec.session.options import (
    Spelling,
    build_params,
    drafter_mode,
    model_options,
    parse_shares,
)
from localspec.session.placement import Placement, parse_layers
from localspec.session.session import Session

# How this front end names an option in an error, and where its options are described.
LOAD = Spelling("", "_", "see help(localspec.load)")
CALL = Spelling("", "_", "see help(localspec.Speculator.complete)")

# Options of a generation besides GenerationParams' fields, per method.
COMPLETE_OPTIONS = frozenset({"raw", "system", "parse_special"})
CHAT_OPTIONS = frozenset({"parse_special"})


def load(
    target: str | os.PathLike[str] | None = None,
    draft: str | os.PathLike[str] | None = None,
    *,
    drafter: str | DrafterMode = DrafterMode.AUTO,
    threads: int | None = None,
    ctx: int = 4096,
    gpu_layers: str | int | None = None,
    draft_gpu_layers: str | int | None = None,
    exact: bool = False,
    rpc: str | Sequence[str] | None = None,
    rpc_timeout: float = DEFAULT_RPC_TIMEOUT,
    rpc_split: str | Sequence[float] | None = None,
    stores: Sequence[str] | None = None,
    history: bool = False,
    learn: bool = False,
    calibrate: bool | None = None,
    on_progress: OnProgress | None = None,
) -> Speculator:
    """Load a target/draft pair, as ``localspec complete`` does with the same options.

    ``target``, ``draft``: a path, a catalog name or ``repo:file`` (None: the default pair,
    or the target's recommended draft); ``draft="self"`` or ``drafter="self"``: a draft
    derived from the target's own layers. ``drafter``: the generations' default (auto,
    model, ngram, self, lookahead, none); it decides what is loaded (``ngram``, ``lookahead``
    and ``none`` load no draft model) and whether this machine's costs are measured
    (``auto``, ``lookahead``; ``calibrate`` overrides that). ``threads``: CPU threads (None:
    all cores). ``ctx``: context size in tokens. ``gpu_layers``, ``draft_gpu_layers``:
    ``"auto"`` (None), ``"all"`` (-1), 0 (the CPU) or a number of layers. ``exact``: greedy
    output identical to plain decoding's token for token (slower kernels). ``rpc``,
    ``rpc_timeout``, ``rpc_split``: the target's layers on llama.cpp RPC workers (a lost
    worker ends the process, as on the command line: its evaluation never returns).
    ``stores``: the datastores ``auto`` drafts from (None: every one built with the
    target's tokenizer, the history included; ``()``: none). ``history``: add each answer
    to the history of answers. ``learn``: save what ``auto`` learned for the next process.
    ``on_progress``: called with each ``localspec.progress.Progress`` of the loading.
    """
    mode = drafter_mode(drafter, LOAD)
    fields = _pair_fields(
        target, draft, threads, ctx, gpu_layers, draft_gpu_layers, exact, rpc, rpc_timeout,
        rpc_split, stores, history, calibrate,
    )  # fmt: skip
    options = model_options(mode, spelling=LOAD, **fields)
    warnings: list[str] = []

    def told(progress: Progress) -> None:
        if progress.kind is ProgressKind.WARNING:
            warnings.append(progress.text)
        if on_progress is not None:
            on_progress(progress)

    # A callback of its own also keeps downloads from drawing progress bars on the terminal.
    session = open_session(options, on_progress=told)
    if not learn:
        # What was learned is restored (a warm start) but this script's answers add nothing.
        session.learning = None
    return Speculator(session, mode, warnings)


def _pair_fields(
    target: Any, draft: Any, threads: int | None, ctx: int, gpu_layers: Any,
    draft_gpu_layers: Any, exact: bool, rpc: Any, rpc_timeout: float, rpc_split: Any,
    stores: Any, history: bool, calibrate: bool | None,
) -> dict[str, Any]:  # fmt: skip
    """The ``ModelOptions`` fields of ``load``'s arguments."""
    fields = dict(
        target=_reference(target),
        draft=_reference(draft),
        threads=threads,
        n_ctx=ctx,
        n_gpu_layers=parse_layers(gpu_layers, "gpu_layers"),
        draft_gpu_layers=parse_layers(draft_gpu_layers, "draft_gpu_layers"),
        exact=exact,
        rpc=tuple(map(str, parse_endpoints(rpc))) if rpc else (),
        rpc_timeout=rpc_timeout,
        rpc_split=parse_shares(rpc_split, LOAD),
        stores=(stores,) if isinstance(stores, str) else stores,
        history=history,
        show_download_progress=False,
    )
    if calibrate is not None:
        fields["calibrate"] = calibrate
    return fields


def _reference(value: Any) -> Any:
    """A model given as a ``pathlib.Path`` is its path's text; anything else is validated
    as the command line's text is."""
    return os.fspath(value) if isinstance(value, os.PathLike) else value


@dataclass(frozen=True)
class Completion:
    """One finished generation. ``text`` is the answer (a stop string cut off);
    ``token_ids`` are the tokens generated; ``stats`` the generation's own totals."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason  # eos, length, stop or cancelled
    stats: GenerationStats
    warnings: tuple[str, ...] = ()

    @property
    def message(self) -> dict[str, str]:
        """The answer as a chat message, to append to the conversation."""
        return {"role": "assistant", "content": self.text}


class Stream:
    """The events of one generation, as the engine yields them: one ``PrefillDone``; per
    round one or more ``TokenEmitted`` and a ``RoundCompleted``; maybe ``EngineWarning``;
    one ``Finished``. Read it once, event by event (iterate it) or as text (``pieces()``).

    The answer's text is every ``TokenEmitted.text`` followed by ``Finished.tail`` (text
    held back while it might have begun a stop string); ``pieces()`` yields both, and
    ``result`` is the ``Completion`` once ``Finished`` has passed (None before)."""

    def __init__(
        self, events: Iterator[Event], cancel: threading.Event, warnings: Callable[[], list[str]]
    ) -> None:
        self._events = events
        self._cancel = cancel
        self._session_warnings = warnings
        self._seen = self._observe()
        self._started = False
        self._pieces: list[str] = []
        self._warnings: list[str] = []
        self.result: Completion | None = None

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> Event:
        self._started = True
        return next(self._seen)

    def _observe(self) -> Generator[Event, None, None]:
        for event in self._events:
            if isinstance(event, TokenEmitted):
                self._pieces.append(event.text)
            elif isinstance(event, EngineWarning):
                self._warnings.append(event.message)
            elif isinstance(event, Finished):
                self._pieces.append(event.tail)
                self.result = self._completion(event)
            yield event

    def _completion(self, finished: Finished) -> Completion:
        warnings = dict.fromkeys([*self._warnings, *self._session_warnings()])
        return Completion(
            finished.text, finished.token_ids, finished.reason, finished.stats, tuple(warnings)
        )

    def pieces(self) -> Iterator[str]:
        """The answer's text as it comes (the rest of it, if some events were read)."""
        for event in self:
            if isinstance(event, TokenEmitted) and event.text:
                yield event.text
            elif isinstance(event, Finished) and event.tail:
                yield event.tail

    @property
    def text(self) -> str:
        """The text so far; the whole answer once finished."""
        return self.result.text if self.result else "".join(self._pieces)

    def cancel(self) -> None:
        """Stop after the current round (from any thread); the stream still ends with
        ``Finished``, its reason ``cancelled``."""
        self._cancel.set()

    def finish(self) -> Completion:
        """Read the rest of the events; the ``Completion``."""
        for _ in self:
            pass
        assert self.result is not None  # the engine always ends with Finished
        return self.result

    def close(self) -> None:
        """End the generation: cancelled after its current round (so that the models'
        caches stay consistent), or never begun if nothing was read. Harmless when done."""
        if not self._started:
            self._started = True
            self._seen.close()
            return
        self.cancel()
        for _ in self:
            pass

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


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
        self._stream: Stream | None = None

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
        """What went wrong without stopping anything, from loading on."""
        session_warnings = self._session.warnings if self._session else []
        return list(dict.fromkeys([*self._load_warnings, *session_warnings]))

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
        such."""
        session = self._open()
        prompt_options, params = self._parse(options, COMPLETE_OPTIONS)
        text = _prompt_text(prompt)
        raw = bool(prompt_options.get("raw", False))
        system = prompt_options.get("system")
        if system is not None and not isinstance(system, str):
            raise UsageError(f"system must be text, not {type(system).__name__}", CALL.help)
        if system and system.strip() and raw:
            raise UsageError("a system prompt needs the chat template", "drop raw or system")
        tokens = session.text_tokens(
            text,
            raw=raw,
            parse_special=bool(prompt_options.get("parse_special", False)),
            system=system if system and system.strip() else None,
        )
        return self._start(tokens, params)

    def chat(self, messages: Sequence[Mapping[str, str]], **options: Any) -> Completion:
        """The assistant's next message; see ``stream_chat``."""
        return self.stream_chat(messages, **options).finish()

    def stream_chat(self, messages: Sequence[Mapping[str, str]], **options: Any) -> Stream:
        """The assistant's next message after ``messages`` (OpenAI-style: ``{"role":
        "system" | "user" | "assistant", "content": text}``), through the target's chat
        template, as it comes. Options: as ``stream_complete``'s, but ``parse_special``
        only (no ``raw``, no ``system``: a system message says it)."""
        session = self._open()
        prompt_options, params = self._parse(options, CHAT_OPTIONS)
        tokens = session.chat_tokens(
            _messages(messages), parse_special=bool(prompt_options.get("parse_special", False))
        )
        return self._start(tokens, params)

    def _parse(
        self, options: dict[str, Any], prompt_names: frozenset[str]
    ) -> tuple[dict[str, Any], GenerationParams]:
        """``(the prompt's options, the generation's params)`` of a call's keywords."""
        known = set(GenerationParams.model_fields) | prompt_names
        for name in options:
            if name not in known:
                raise _unknown_option(name, known)
        prompt = {name: options.pop(name) for name in prompt_names if name in options}
        prediction = options.pop("prediction", None)
        mode = drafter_mode(options.pop("drafter", None) or self.drafter, CALL)
        self._check_drafter(mode)
        if isinstance(options.get("stop"), str):
            options["stop"] = (options["stop"],)  # one stop string, as OpenAI's API takes it
        params = build_params(spelling=CALL, drafter=mode, **options)
        if prediction is not None:
            params = params.model_copy(update={"prediction": self._prediction(prediction, mode)})
        return prompt, params

    def _check_drafter(self, mode: DrafterMode) -> None:
        """A drafter this pair can run: the draft model it needs was loaded."""
        assert self._session is not None
        if mode.needs_draft_model and self._session.draft is None:
            raise UsageError(
                f"drafter={mode.value!r} needs a draft model, and this pair has none",
                "load the pair with drafter='auto' or 'model', or use drafter='ngram'",
            )
        if mode.derives_draft and not self.drafter.derives_draft:
            raise UsageError(
                "drafter='self' drafts with a draft derived from the target's own layers, "
                "which this pair did not load",
                "load the pair with localspec.load(drafter='self')",
            )

    def _prediction(self, text: Any, mode: DrafterMode) -> tuple[int, ...]:
        assert self._session is not None
        if not mode.uses_cost_model:
            raise UsageError(
                f"prediction is drafted from by drafter='auto', not {mode.value!r}",
                "drop drafter, or prediction",
            )
        if not isinstance(text, str):
            raise UsageError(
                f"prediction must be text, not {type(text).__name__}",
                "give the text the answer will mostly copy",
            )
        if not text.strip():
            raise InputError("the prediction is empty", "give the text the answer will mostly copy")
        return tuple(self._session.plain_tokens(text))

    def _start(self, tokens: list[int], params: GenerationParams) -> Stream:
        session = self._open()
        self._end_stream()
        # Checked now, so that a prompt the context cannot hold fails here, not mid-loop.
        if len(tokens) >= session.n_ctx:
            raise ContextOverflowError(
                f"the prompt has {len(tokens)} tokens but the context holds {session.n_ctx} "
                f"(at most {session.n_ctx - 1} prompt tokens, leaving room for one new token)",
                "shorten the prompt (or drop the oldest messages), or load with a larger ctx",
                n_tokens=len(tokens),
                n_ctx=session.n_ctx,
            )
        session.check_prompt(tokens, params)
        before = len(session.warnings)
        cancel = threading.Event()
        events = session.generate(tokens, params, cancel)
        self._stream = Stream(events, cancel, lambda: session.warnings[before:])
        return self._stream

    def _end_stream(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            stream.close()

    def _open(self) -> Session:
        if self._session is None:
            raise UsageError("this pair is closed", "load it again with localspec.load()")
        return self._session

    # -- closing --------------------------------------------------------------------------

    def close(self) -> None:
        """Free both models (an unfinished stream ends first). Harmless when closed."""
        if self._session is None:
            return
        try:
            self._end_stream()
        finally:
            session, self._session = self._session, None
            session.close()

    def __enter__(self) -> Speculator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _prompt_text(prompt: Any) -> str:
    if not isinstance(prompt, str):
        raise UsageError(f"the prompt must be text, not {type(prompt).__name__}", CALL.help)
    if not prompt.strip():
        raise InputError("the prompt is empty", "give the text to complete")
    return prompt


def _messages(messages: Any) -> list[dict[str, str]]:
    """OpenAI-style messages as the chat template takes them (each a dict of its own)."""
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
    listed = [dict(m) for m in messages]
    if not any(isinstance(m.get("content"), str) and m["content"].strip() for m in listed):
        raise InputError("the conversation is empty", "give at least one message with text")
    return listed


def _unknown_option(name: str, known: set[str]) -> UsageError:
    close = difflib.get_close_matches(name, sorted(known), n=1)
    hint = f"did you mean {close[0]}?" if close else f"options: {', '.join(sorted(known))}"
    return UsageError(f"unknown option {name!r}", hint)
