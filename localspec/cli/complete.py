"""``localspec complete``: stream a completion of a file or stdin to stdout.

stdout carries only the generated text, streamed as it comes; progress, warnings and
``--stats`` go to stderr; ``--json`` replaces the stream with one JSON object. The first
Ctrl-C stops generation after the current round and still reports; a second one stops at
once. Exit codes: 0, 130 when cancelled, a typed error's own code otherwise.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from localspec.cli import PROCESS, STARTED
from localspec.cli.common import SystemOpt, cli_errors, echo_progress, read_system
from localspec.cli.constraint_files import GrammarOpt, JsonSchemaOpt, read_constraint
from localspec.cli.groups import option_groups
from localspec.core.events import EngineWarning, Event, Finished, TokenEmitted
from localspec.core.params import GenerationParams
from localspec.core.preflight import check_options
from localspec.core.stats import GenerationStats, PredictionUse, prediction_use
from localspec.errors import EXIT_CANCELLED, InputError, WorkersLostError, exit_with
from localspec.options.generation import DraftingChoice, SamplingChoice
from localspec.options.model import ModelChoice
from localspec.options.stores import PromptCacheChoice, StoreChoice
from localspec.progress import Progress, ProgressKind
from localspec.storage.prompt_cache import DISK
from localspec.storage.textfile import decode_utf8, read_bounded

# The session module loads llama.cpp, so it is imported only when a completion runs:
# ``localspec --help`` and the other commands start without it.

# A token is a few bytes of text: a prompt of more than this many bytes per token of context
# cannot fit, so it is refused before it is read whole (or tokenized).
BYTES_PER_CONTEXT_TOKEN = 16
MIN_INPUT_LIMIT = 1 << 20


def input_limit(n_ctx: int) -> int:
    return max(BYTES_PER_CONTEXT_TOKEN * n_ctx, MIN_INPUT_LIMIT)


def _too_large(source: str, limit: int) -> InputError:
    return InputError(
        f"the input from {source} is larger than {limit:,} bytes, more than a context of "
        f"{limit // BYTES_PER_CONTEXT_TOKEN:,} tokens can hold",
        "give a shorter prompt, or a larger --ctx",
    )


def read_prompt(file: str | None, limit: int = MIN_INPUT_LIMIT) -> str:
    """The prompt as text; at most ``limit`` bytes are read (more is an ``InputError``)."""
    if file in (None, "-"):
        if sys.stdin is None:
            raise InputError("no input: stdin is closed", "pass a FILE argument")
        if sys.stdin.isatty():
            typer.echo("reading the prompt from the terminal; end it with Ctrl-D", err=True)
        data = sys.stdin.buffer.read(limit + 1)
        source = "stdin"
    else:
        data, source = read_bounded(Path(file), limit, "input"), str(file)
    text = _decoded(data, source, limit)
    if not text.strip():
        raise InputError(f"the input from {source} is empty", "give a prompt on stdin or as a FILE")
    return text


def read_prediction(file: str, limit: int = MIN_INPUT_LIMIT) -> str:
    """``--prediction``'s text: what the answer will mostly be (at most ``limit`` bytes)."""
    text = _decoded(read_bounded(Path(file), limit, "prediction"), file, limit)
    if not text.strip():
        raise InputError(
            f"the prediction file {file} is empty", "give the text the answer will mostly copy"
        )
    return text


def _decoded(data: bytes, source: str, limit: int) -> str:
    if len(data) > limit:
        raise _too_large(source, limit)
    return decode_utf8(data, source)


@contextmanager
def ctrl_c_cancels() -> Iterator[threading.Event]:
    """First Ctrl-C asks the engine to stop after this round; a second one interrupts."""
    cancel = threading.Event()

    def handler(signum: int, frame: Any) -> None:
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield cancel
    finally:
        signal.signal(signal.SIGINT, previous)


def human_stats(stats: GenerationStats, reason: str) -> str:
    lines = [
        f"finish: {reason}; prompt {stats.prompt_tokens} tokens in {stats.prefill_s:.2f}s; "
        f"generated {stats.generated_tokens} tokens in {stats.decode_s:.2f}s "
        f"({stats.decode_tokens_per_s:.1f} tok/s)",
        f"drafted {stats.drafted}, accepted {stats.accepted} "
        f"(acceptance {stats.acceptance_rate:.0%}); {stats.rounds} target passes, "
        f"{stats.mean_accepted_length:.2f} tokens per pass",
    ]
    if stats.restored_tokens:
        lines.append(
            f"prompt cache: {stats.restored_tokens} tokens restored from {stats.restored_from}, "
            f"about {stats.restore_saved_s:.1f}s of evaluation spared"
        )
    origins = sorted(stats.by_origin.items())
    lines.append("tokens by origin: " + ", ".join(f"{k} {v}" for k, v in origins))
    for name, d in sorted(stats.by_drafter.items()):
        pos = " ".join(f"{x:.2f}" for x in d.per_position()[:8])
        lines.append(
            f"  {name:6} rounds {d.rounds:4}  drafted {d.drafted:5}  accepted "
            f"{d.accepted:5}  rate {d.acceptance_rate:.2f}  "
            f"tau {d.mean_accepted_length:.2f}" + (f"  per-position {pos}" if pos else "")
        )
    return "\n".join(lines)


@option_groups
def complete(
    file: Annotated[
        str | None, typer.Argument(help="prompt file; - or nothing reads stdin")
    ] = None,
    max_tokens: Annotated[int, typer.Option(help="new tokens at most")] = 512,
    *,
    sampling: SamplingChoice,
    drafting: DraftingChoice,
    raw: Annotated[
        bool, typer.Option(help="send the text as is, without the chat template")
    ] = False,
    parse_special: Annotated[
        bool,
        typer.Option(help="let control tokens in the text (e.g. <|im_start|>) act as such"),
    ] = False,
    system: SystemOpt = None,
    prediction: Annotated[
        str | None,
        typer.Option(
            metavar="FILE",
            help="what the answer will mostly be (the file an edit rewrites): auto drafts "
            "from it from the first token (OpenAI's predicted outputs)",
        ),
    ] = None,
    grammar: GrammarOpt = None,
    json_schema: JsonSchemaOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="print one JSON object instead")] = False,
    stats: Annotated[bool, typer.Option(help="print a summary to stderr at the end")] = False,
    trace: Annotated[
        bool, typer.Option(help="with --json: every round's drafter, length, result and timing")
    ] = False,
    model: ModelChoice,
    stores: StoreChoice,
    cache: PromptCacheChoice,
) -> None:
    """Generate a completion of FILE (or stdin): the target's own output, faster."""
    with cli_errors():
        params = sampling.params(drafting, max_tokens=max_tokens, trace=trace)
        options = model.options(params.drafter, **stores.fields(), **cache.fields((DISK,)))
        system_prompt = read_system(system)
        check_options(params, raw=raw, system=system_prompt, prediction=bool(prediction))
        prompt = read_prompt(file, input_limit(model.ctx))
        predicted = read_prediction(prediction, input_limit(model.ctx)) if prediction else None
        constrained = read_constraint(grammar, json_schema)
        code = run_complete(
            prompt,
            params,
            options,
            raw=raw,
            parse_special=parse_special,
            json_out=json_out,
            stats=stats,
            system=system_prompt,
            prediction=predicted,
            grammar=constrained,
        )
    raise typer.Exit(code)


def print_warnings(progress: Progress) -> None:
    """Keep stderr quiet during loading except for warnings (e.g. not enough memory) and
    the noticeable waits (the one-time measurement of this machine)."""
    if progress.kind in (ProgressKind.WARNING, ProgressKind.WAIT):
        echo_progress(progress)


def run_complete(
    prompt: str,
    params: GenerationParams,
    options: Any,
    *,
    raw: bool,
    parse_special: bool = False,
    json_out: bool,
    stats: bool,
    system: str | None = None,
    prediction: str | None = None,
    grammar: str | None = None,
) -> int:
    """``prediction``: the text the answer will mostly be, drafted from (``--prediction``).
    ``grammar``: GBNF the answer must match (``--grammar``, ``--json-schema``)."""
    from localspec.session.open import open_session

    running = _Running()
    lost = _on_lost(running, exact=options.exact, json_out=json_out)
    opening = time.perf_counter()
    session = open_session(options, on_progress=print_warnings, on_lost=lost)
    running.loaded(opening)
    placement = session.placement
    slot = session.slot
    verification = session.verification
    try:
        if prediction is not None:
            predicted = tuple(session.plain_tokens(prediction))
            params = params.model_copy(update={"prediction": predicted})
        finished = _stream(
            lambda cancel: session.complete(
                prompt,
                params,
                raw=raw,
                parse_special=parse_special,
                cancel=cancel,
                system=system,
                grammar=grammar,
            ),
            running,
            json_out=json_out,
        )
    finally:
        # A process that ends with this command leaves the models to the system.
        session.close(free=not PROCESS.ends_with_command)
    reason = finished.reason.value if finished else "cancelled"
    totals = finished.stats if finished else running
    if json_out:
        record = _record(finished, running, totals, reason, options.exact, placement)
        record["timing"] = running.timing()
        if slot is not None:
            record["stats"]["draft_model"] = slot.to_dict()
        record["stats"]["verification"] = verification
        if params.prediction:  # as OpenAI's usage counts it, and what the answer made of it
            record["prediction"] = {
                **_prediction_usage(params.prediction, record["token_ids"]),
                **_prediction_use(params.prediction, record["token_ids"], totals).to_dict(),
            }
        sys.stdout.write(json.dumps(record) + "\n")
    else:
        _write_tail(finished)
    if stats:
        typer.echo(human_stats(totals, reason), err=True)
        if params.prediction:
            ids = list(finished.token_ids) if finished else running.token_ids
            typer.echo(_prediction_use(params.prediction, ids, totals).summary(), err=True)
        typer.echo(running.timing_line(), err=True)
        if placement:
            typer.echo(f"{placement.summary()} ({placement.reason})", err=True)
        if slot is not None:
            typer.echo(slot.summary(), err=True)
    return EXIT_CANCELLED if reason == "cancelled" else 0


def _on_lost(running: _Running, *, exact: bool, json_out: bool) -> Callable[[str], None]:
    """What to do when the RPC workers are lost: the evaluation waits on them for good, so
    report what was written (``--json``) and end."""

    def lost(message: str) -> None:
        if json_out:
            record = {
                "text": running.text,
                "token_ids": running.token_ids,
                "finish_reason": "error",
                "error": message,
                "exact": exact,
                "stats": running.to_dict(),
            }
            sys.stdout.write(json.dumps(record) + "\n")
        exit_with(WorkersLostError(message))

    return lost


def _record(
    finished: Finished | None,
    running: _Running,
    totals: GenerationStats,
    reason: str,
    exact: bool,
    placement: Any,
) -> dict[str, Any]:
    """``--json``'s object: the answer (what was gathered, when cut short), its totals and
    where the models ran."""
    return {
        "text": finished.text if finished else running.text,
        "token_ids": list(finished.token_ids) if finished else running.token_ids,
        "finish_reason": reason,
        "exact": exact,
        "stats": {
            **totals.to_dict(),
            **({"placement": placement.to_dict()} if placement else {}),
        },
    }


def _prediction_use(
    prediction: tuple[int, ...], token_ids: list[int], totals: GenerationStats
) -> PredictionUse:
    return prediction_use(prediction, token_ids, totals.origins)


def _prediction_usage(prediction: tuple[int, ...], token_ids: list[int]) -> dict[str, int]:
    from localspec.core.drafting.prediction import prediction_counts

    accepted, rejected = prediction_counts(prediction, token_ids)
    return {
        "tokens": len(prediction),
        "accepted_prediction_tokens": accepted,
        "rejected_prediction_tokens": rejected,
    }


def _write_tail(finished: Finished | None) -> None:
    """The text held back until the end (a possible stop string), and a newline on a
    terminal."""
    out = sys.stdout
    if finished and finished.tail:
        out.write(finished.tail)
    if out.isatty():
        out.write("\n")
    out.flush()


class _Running(GenerationStats):
    """Totals as the events come, plus the text and ids, for a generation cut short, and
    when the models were loaded and the first token came (from the command's start)."""

    def __init__(self) -> None:
        super().__init__()
        self.pieces: list[str] = []
        self.token_ids: list[int] = []
        self.load_s: float | None = None  # opening the session: resolving, loading, costs
        self.loaded_at: float | None = None
        self.first_token_at: float | None = None
        self.first_token_unix: float | None = None

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def loaded(self, opening: float) -> None:
        now = time.perf_counter()
        self.load_s, self.loaded_at = now - opening, now - STARTED

    def token(self) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter() - STARTED
            self.first_token_unix = time.time()

    def timing(self) -> dict[str, float | None]:
        """``--json``'s ``timing``: seconds from the command's start (and the first
        token's wall-clock time, for a caller that timed the process from outside)."""
        return {
            "load_s": _rounded(self.load_s),
            "loaded_s": _rounded(self.loaded_at),
            "first_token_s": _rounded(self.first_token_at),
            "total_s": _rounded(time.perf_counter() - STARTED),
            "first_token_unix": self.first_token_unix,
        }

    def timing_line(self) -> str:
        first = self.first_token_at
        return (
            f"time from start: models ready at {self.loaded_at or 0:.2f}s "
            f"(loading took {self.load_s or 0:.2f}s), first token at "
            + (f"{first:.2f}s" if first is not None else "none")
            + f", done at {time.perf_counter() - STARTED:.2f}s"
        )


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 4)


def _stream(
    start: Callable[[threading.Event], Iterator[Event]], running: _Running, *, json_out: bool
) -> Finished | None:
    """Run ``start(cancel)``'s events, printing the answer as it comes. The first Ctrl-C
    sets ``cancel`` (the engine stops after its round); a second one stops at once with
    what was gathered."""
    out = sys.stdout
    finished: Finished | None = None
    with ctrl_c_cancels() as cancel:
        try:
            for event in start(cancel):
                running.observe(event)
                if isinstance(event, TokenEmitted):
                    running.token()
                    running.pieces.append(event.text)
                    running.token_ids.append(event.token_id)
                    if not json_out:
                        out.write(event.text)
                        out.flush()
                elif isinstance(event, EngineWarning):
                    typer.echo(f"warning: {event.message}", err=True)
                elif isinstance(event, Finished):
                    finished = event
        except KeyboardInterrupt:
            pass  # second Ctrl-C: report what was gathered
    return finished
