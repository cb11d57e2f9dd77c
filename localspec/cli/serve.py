"""``localspec serve``: an OpenAI-compatible HTTP server with speculative decoding behind it.

Binds 127.0.0.1 by default. The server starts at once (``/health`` says ``loading``) and
loads the pair in the background (progress on stderr). Keys come from ``--api-key``
(repeatable), ``--api-key-file`` (one per line) and ``LOCALSPEC_API_KEY``; with any, every
endpoint but ``/health`` requires one, and each key is a client of its own (serve/clients.py).
A key given on the command line is visible to every user of the machine (``ps``), which a
warning says. Binding another address without a key prints a warning. Only requests naming
this server as ``Host`` (``--allowed-host`` adds names) and from no web page but those
``--cors-origin`` lists are answered (serve/access.py).

By default no client's answer is drafted from anything but its own prompt: ``--store NAME``
shares datastores with every client, ``--history`` keeps each client's answers in a history
of its own. ``--no-timings`` leaves the ``timings`` figures out of every answer;
``--no-speculative-overrides`` refuses a request's ``speculative`` settings (by default a
request may set them within the server's own draft limits).
``--parse-special`` lets control-token text in a raw completion prompt act as control tokens
(editors that write a model's FIM tokens into the prompt themselves need it); chat messages
keep such text as text whatever the option says. Ctrl-C (or SIGTERM) cancels the running
generation, and the models are freed only once it has ended; while the pair loads, the
loading stops at its next step (between a self-draft's candidates, say), which leaves
nothing half-written.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import click
import typer

from localspec.cli.common import cli_errors, echo_error, echo_progress, is_loopback
from localspec.cli.groups import option_groups
from localspec.environment import gathering
from localspec.errors import UsageError
from localspec.options.generation import DraftingChoice, SamplingChoice
from localspec.options.model import ModelChoice
from localspec.options.stores import PromptCacheChoice, SharedStoreChoice
from localspec.progress import Progress
from localspec.serve.access import Access
from localspec.session.pair import MAX_LANES as MAX_PARALLEL
from localspec.storage.prompt_cache import MEMORY

if TYPE_CHECKING:  # imported when the server starts (see below)
    from localspec.serve.app import ServerState
    from localspec.serve.worker import GenerationWorker
    from localspec.session.pair import ModelOptions

# The longest a server waits for a request's body: an hour is past any link a client
# would wait on, and a slot held longer is one a slow sender took from the others.
MAX_BODY_TIMEOUT_S = 3600.0

# The session module loads llama.cpp, and the server's app and clients the web framework and
# numpy, so they are imported only when the server starts (the session by its loading
# thread): ``localspec --help`` and the other commands start without them.


@option_groups
def serve(
    host: Annotated[str, typer.Option(help="address to bind (loopback by default)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port")] = 8080,
    api_key: Annotated[
        list[str] | None,
        typer.Option(
            envvar="LOCALSPEC_API_KEY",
            help="require Authorization: Bearer KEY (repeat for several clients; prefer "
            "--api-key-file or LOCALSPEC_API_KEY: a command line is visible to every user)",
        ),
    ] = None,
    api_key_file: Annotated[
        Path | None, typer.Option(help="a file of API keys, one per line (# comments)")
    ] = None,
    allowed_host: Annotated[
        list[str] | None,
        typer.Option(help="also answer requests naming this Host (repeat; * for any)"),
    ] = None,
    cors_origin: Annotated[
        list[str] | None, typer.Option(help="allow browser requests from this origin (repeat)")
    ] = None,
    parallel: Annotated[
        str,
        typer.Option(
            help="generations at once, each with a context of --ctx tokens; auto: 4 with the "
            "target on a GPU, 2 on the CPU"
        ),
    ] = "auto",
    queue_size: Annotated[
        int, typer.Option(min=1, help="requests that may wait; more get 503")
    ] = 16,
    max_body: Annotated[int, typer.Option(min=1, help="largest request body in bytes")] = 1 << 20,
    body_timeout: Annotated[
        str,
        typer.Option(
            metavar="SECONDS",
            help="time a request's whole body has to arrive (a 408 after); more than 0, at "
            f"most {MAX_BODY_TIMEOUT_S:g}",
        ),
    ] = "30",
    max_tokens: Annotated[int, typer.Option(min=1, help="default new tokens at most")] = 512,
    max_tokens_limit: Annotated[
        int | None,
        typer.Option(min=1, help="the most new tokens a request may ask for (default: --ctx)"),
    ] = None,
    history: Annotated[
        bool,
        typer.Option(
            "--history", help="keep each client's answers in a history of its own, to draft from"
        ),
    ] = False,
    no_timings: Annotated[
        bool, typer.Option("--no-timings", help="leave the timings figures out of answers")
    ] = False,
    speculative_overrides: Annotated[
        bool,
        typer.Option(
            help="let a request set speculative.* (its drafter, shorter drafts); its drafts "
            "are never longer than this server's own"
        ),
    ] = True,
    parse_special: Annotated[
        bool,
        typer.Option(
            help="let control tokens written in a /v1/completions prompt (e.g. <|fim_prefix|>) "
            "act as such"
        ),
    ] = False,
    *,
    sampling: SamplingChoice,
    drafting: DraftingChoice,
    model: ModelChoice,
    stores: SharedStoreChoice,
    cache: PromptCacheChoice,
) -> None:
    """Serve the pair over an OpenAI-compatible API (/v1/chat/completions, /v1/completions)."""
    from localspec.serve.app import ServerState
    from localspec.serve.server import run

    with cli_errors():
        params = sampling.params(drafting, max_tokens=max_tokens)
        # In memory only: each client's prompts are its own, and end with the server.
        options = model.options(params.drafter, **stores.fields(), **cache.fields((MEMORY,)))
        gather = gathering()  # a bad value is said before anything loads
        body_timeout_s = parse_body_timeout(body_timeout)
        keys = read_keys(api_key or [], api_key_file)
        # With several clients, what auto learns from one client's answers would shape
        # another's next start: restored, not saved.
        update = {"lanes": parse_parallel(parallel), "save_learning": len(keys) <= 1}
        options = options.model_copy(update=update)
    _warn_of_exposure(host, keys)
    state = ServerState(
        defaults=params,
        access=Access(host, tuple(allowed_host or ()), tuple(cors_origin or ()), keys),
        max_body=max_body,
        body_timeout_s=body_timeout_s,
        max_tokens_limit=max_tokens_limit or model.ctx,
        timings=not no_timings,
        speculative_overrides=speculative_overrides,
        parse_special=parse_special,
        loading=True,
    )
    _log_to_stderr()
    state.loader = threading.Thread(
        target=load_into,
        args=(state, options, queue_size, history, gather),
        daemon=True,
        name="loader",
    )
    state.loader.start()
    typer.echo(f"serving on http://{host}:{port}/v1 (loading the models)", err=True)
    freed = run(state, host, port)
    if state.load_error is not None:  # the server stopped: it has nothing to serve
        raise typer.Exit(echo_error(state.load_error))
    if not freed:
        # A thread may still use the models (or is loading them): freeing them, as the
        # interpreter's exit would, could crash; the system takes them back instead.
        what = "the models were still loading" if state.loading else "a generation did not stop"
        typer.echo(f"warning: {what} in time; exiting without freeing the models", err=True)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def _warn_of_exposure(host: str, keys: tuple[str, ...]) -> None:
    """Warn of a key others can read, and of a server others can reach without one."""
    if _from_command_line("api_key"):
        typer.echo(
            "warning: --api-key on the command line is visible to every user of this machine "
            "(ps); use --api-key-file or LOCALSPEC_API_KEY",
            err=True,
        )
    if not is_loopback(host) and not keys:
        typer.echo(
            f"warning: serving on {host} without an API key: anyone who can reach it can use "
            "it; pass --api-key-file or set LOCALSPEC_API_KEY",
            err=True,
        )


def parse_parallel(value: str) -> int:
    """``--parallel``: a number of generations, or auto (0: the session decides)."""
    text = value.strip().lower()
    if text == "auto":
        return 0
    if not text.isdigit() or not 1 <= int(text) <= MAX_PARALLEL:
        raise UsageError(
            f"--parallel {value!r} is neither auto nor a number from 1 to {MAX_PARALLEL}",
            "e.g. --parallel 4, or --parallel 1 to serve one request at a time",
        )
    return int(text)


def parse_body_timeout(value: str) -> float:
    """``--body-timeout``: seconds, more than 0 and at most ``MAX_BODY_TIMEOUT_S`` (a number
    that is not finite would hold a half-sent body for ever, or let none arrive)."""
    try:
        seconds = float(value.strip())
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= MAX_BODY_TIMEOUT_S:  # NaN fails this too
        raise UsageError(
            f"--body-timeout {value!r} is not a number of seconds above 0 and at most "
            f"{MAX_BODY_TIMEOUT_S:g}",
            "e.g. --body-timeout 30 (the default), or more for clients on slow links",
        )
    return seconds


def read_keys(given: list[str], key_file: Path | None) -> tuple[str, ...]:
    """The API keys: those given, and a file's lines (blank lines and ``#`` comments
    skipped). ``UsageError`` for an unreadable file, one without keys, or a key with
    spaces in it."""
    keys = [k.strip() for k in given if k.strip()]
    if key_file is not None:
        try:
            lines = key_file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as err:
            reason = getattr(err, "strerror", None) or str(err)
            raise UsageError(f"cannot read --api-key-file {key_file}: {reason}",
                             "give a UTF-8 text file with one key per line") from None  # fmt: skip
        found = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
        if not found:
            raise UsageError(f"--api-key-file {key_file} holds no key", "write one key per line")
        keys += found
    for key in keys:
        if any(c.isspace() for c in key):
            raise UsageError("an API key has spaces in it", "use keys without white space")
    return tuple(dict.fromkeys(keys))


def _from_command_line(parameter: str) -> bool:
    context = click.get_current_context(silent=True)
    if context is None:
        return False
    return context.get_parameter_source(parameter) == click.core.ParameterSource.COMMANDLINE


def _log_to_stderr() -> None:
    """The server's own log (internal errors, with their id and traceback) on stderr."""
    logger = logging.getLogger("localspec.serve")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("localspec serve: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


def lanes_summary(worker: GenerationWorker) -> str:
    """One line on how many generations run at once, and whether their rounds are gathered."""
    if worker.lanes == 1:
        return "one generation at a time"
    how = "gathered into one evaluation" if worker.gather else "evaluated in turn"
    return f"{worker.lanes} generations at once, their rounds {how}"


class StoppedLoading(BaseException):
    """The server was told to stop while loading: raised from a progress report, so that
    the loading unwinds from that step (a self-draft's candidates removed) as from Ctrl-C.
    Not an ``Exception``: no step takes it for a failure of its own."""


def load_into(
    state: ServerState,
    options: ModelOptions,
    queue_size: int,
    history: bool = False,
    gather: bool | None = None,
) -> None:
    """Load the pair, then serve it (``ServerState.serve_with``). A failure is left in
    ``state.load_error``, which stops the server (serve/server.py); ``serve`` then says it
    and exits with its code."""
    from localspec.serve.clients import keep_apart
    from localspec.serve.worker import GenerationWorker
    from localspec.session.open import open_session

    def progress(report: Progress) -> None:
        if state.closing:
            raise StoppedLoading
        echo_progress(report)

    try:
        session = open_session(options, on_progress=progress)
    except StoppedLoading:
        state.loading = False
        return
    except Exception as err:  # typed errors and bugs alike: said in one line, as the CLI does
        state.loading = False
        state.load_error = err  # the server stops, and serve says why and exits with its code
        return
    if state.closing:  # stopped while loading: nobody will use the pair
        session.close()
        state.loading = False
        return
    session.learn_with(state.defaults)  # a request's own limits learn apart, unsaved
    worker = GenerationWorker(
        session, max_queue=queue_size, on_client=keep_apart(history), gather=gather
    )
    worker.start()
    state.serve_with(worker)
    state.loading = False
    if session.slot is not None:  # whether the draft model was loaded, and why
        typer.echo(session.slot.summary(), err=True)
    typer.echo(lanes_summary(worker), err=True)
    typer.echo("ready", err=True)
