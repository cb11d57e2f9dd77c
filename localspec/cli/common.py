"""What every command shares: option definitions, the one place where errors become
``error:`` / ``hint:`` lines on stderr and an exit code (``fail``, ``cli_errors``), and how
progress reports (``localspec.progress``) are printed on stderr (``progress_line``)."""

from __future__ import annotations

import contextlib
import ipaddress
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from localspec.backend.rpc import DEFAULT_TIMEOUT as DEFAULT_RPC_TIMEOUT
from localspec.backend.rpc import parse_endpoints
from localspec.core.params import GenerationParams
from localspec.errors import (
    EXIT_CANCELLED,
    InputError,
    LocalspecError,
    UsageError,
    error_lines,
)
from localspec.progress import Progress, ProgressKind
from localspec.session.options import (
    build_params,
    command_line,
    drafter_mode,
    invalid_value,
    model_options,
    parse_shares,
)


def echo_error(error: BaseException) -> int:
    """Print ``error:`` and ``hint:`` lines on stderr; return the exit code to use."""
    lines, code = error_lines(error)
    for line in lines:
        typer.echo(line, err=True)
    return code


def progress_line(progress: Progress) -> str:
    """A progress report as a line: ``warning: text`` for a warning, the text and the share
    done of a download that knows it, the text otherwise."""
    if progress.kind is ProgressKind.WARNING:
        return f"warning: {progress.text}"
    if progress.fraction is not None:
        return f"{progress.text} {progress.fraction:.0%}"
    return progress.text


def echo_progress(progress: Progress) -> None:
    """Every progress report, on stderr (the commands that show their loading)."""
    typer.echo(progress_line(progress), err=True)


def fail(error: LocalspecError) -> typer.Exit:
    return typer.Exit(echo_error(error))


def usage_from(error: Any, command: str = "complete") -> UsageError:
    """A pydantic ``ValidationError`` of option values as a ``UsageError``."""
    return invalid_value(error, command_line(command))


@contextlib.contextmanager
def cli_errors(interrupted: str = "\ninterrupted") -> Iterator[None]:
    """Typed errors become messages and exit codes; Ctrl-C says ``interrupted`` and exits 130."""
    try:
        yield
    except LocalspecError as err:
        raise fail(err) from None
    except KeyboardInterrupt:
        typer.echo(interrupted, err=True)
        raise typer.Exit(EXIT_CANCELLED) from None


DrafterOpt = Annotated[
    str,
    typer.Option(
        help="auto (cost model), model, ngram, self (a draft of the target's own layers), "
        "lookahead (the target's own guesses; exact when sampling), or none (plain decoding)"
    ),
]
# Options shared by complete, chat and bench.
TemperatureOpt = Annotated[float, typer.Option(help="0 is greedy")]
TopKOpt = Annotated[int, typer.Option(help="sampling: keep the k most likely (0: off)")]
TopPOpt = Annotated[float, typer.Option(help="sampling: nucleus mass (1: off)")]
MinPOpt = Annotated[float, typer.Option(help="sampling: drop below min-p x top (0: off)")]
SeedOpt = Annotated[int | None, typer.Option(help="sampling seed")]
DraftMaxOpt = Annotated[int, typer.Option(help="longest draft per round")]
NoTreesOpt = Annotated[
    bool,
    typer.Option(
        "--no-trees",
        help="verify single draft chains only (auto otherwise verifies competing drafts as one "
        "draft tree when that is expected to pay; greedy decoding only)",
    ),
]
TargetOpt = Annotated[str | None, typer.Option(help="target: path, catalog name or repo:file")]
DraftOpt = Annotated[
    str | None,
    typer.Option(
        help="draft: path, catalog name or repo:file; self: derived from the target's layers"
    ),
]
ThreadsOpt = Annotated[int | None, typer.Option(help="CPU threads (default: all cores)")]
CtxOpt = Annotated[int, typer.Option(help="context size in tokens")]
GpuLayersOpt = Annotated[
    str | None,
    typer.Option(
        metavar="auto|all|N",
        help="target layers on the GPU (or on the --rpc workers): auto (default) puts all "
        "of them there when this build can offload and they fit, else runs on the CPU; "
        "all, 0 (the CPU) or a number of layers",
    ),
]
DraftGpuLayersOpt = Annotated[
    str | None,
    typer.Option(
        metavar="auto|all|N",
        help="draft layers on the GPU: auto (default) follows --gpu-layers in the memory "
        "the target leaves; 0 keeps the draft on the CPU",
    ),
]
RpcOpt = Annotated[
    str | None,
    typer.Option(
        "--rpc",
        metavar="HOST:PORT[,...]",
        help="run the target's layers on llama.cpp RPC workers (localspec worker on each "
        "machine); the draft stays on this one",
    ),
]
RpcSplitOpt = Annotated[
    str | None,
    typer.Option(
        "--rpc-split",
        metavar="N,N,...",
        help="share of the target's layers per --rpc worker, e.g. 3,1 (default: by each "
        "worker's free memory)",
    ),
]
RpcTimeoutOpt = Annotated[
    float,
    typer.Option(
        "--rpc-timeout",
        help="seconds one target evaluation may wait on the RPC workers before the answer "
        "ends with an error",
    ),
]
SystemOpt = Annotated[
    str | None, typer.Option("--system", help="system prompt, or @FILE to read it from a file")
]


def read_system(value: str | None) -> str | None:
    """``--system``'s text: as given, or the UTF-8 contents of ``@FILE``; blank is none."""
    if value is None:
        return None
    if value.startswith("@"):
        path = Path(value[1:]).expanduser()
        try:
            value = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InputError(f"system prompt file not found: {path}", "check the path") from None
        except UnicodeDecodeError:
            raise InputError(
                f"system prompt file {path} is not UTF-8 text", "convert it to UTF-8"
            ) from None
        except OSError as err:
            raise InputError(
                f"cannot read the system prompt file {path}: {err.strerror or err}",
                "check the path and its permissions",
            ) from None
    return value if value.strip() else None


ExactOpt = Annotated[
    bool,
    typer.Option(
        "--exact",
        help="greedy output identical to plain decoding's, token for token, whatever the "
        "drafter (batch-invariant kernels; slower)",
    ),
]


StoreOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--store",
        metavar="NAME",
        help="draft from this datastore (repeatable; default: every store built with the "
        "target's tokenizer, the history of answers included)",
    ),
]
NoStoreOpt = Annotated[bool, typer.Option("--no-store", help="draft from no datastore")]
NoHistoryOpt = Annotated[
    bool, typer.Option("--no-history", help="do not add answers to the history store")
]


def store_settings(store: list[str] | None, no_store: bool, no_history: bool) -> dict[str, Any]:
    """The ModelOptions fields of --store, --no-store and --no-history."""
    if store and no_store:
        raise UsageError("--store and --no-store contradict each other", "give one of them")
    stores = () if no_store else (tuple(store) if store else None)
    return {"stores": stores, "history": not no_history}


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine only (servers bind it unless told otherwise)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def pair_settings(
    target: str | None, draft: str | None, threads: int | None, ctx: int,
    gpu_layers: str | None, exact: bool, rpc: str | None = None,
    rpc_timeout: float = DEFAULT_RPC_TIMEOUT, rpc_split: str | None = None,
    draft_gpu_layers: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """The ModelOptions fields of the options every model-loading command shares."""
    from localspec.session.placement import parse_layers

    return dict(
        target=target,
        draft=draft,
        threads=threads,
        n_ctx=ctx,
        n_gpu_layers=parse_layers(gpu_layers),
        draft_gpu_layers=parse_layers(draft_gpu_layers, "--draft-gpu-layers"),
        exact=exact,
        rpc=tuple(map(str, parse_endpoints(rpc))) if rpc else (),
        rpc_timeout=rpc_timeout,
        rpc_split=parse_shares(rpc_split),
    )


def parse_generation(
    drafter: str, models: dict[str, Any], **sampling: Any
) -> tuple[GenerationParams, Any]:
    """Validate the options every generating command shares -> (params, ModelOptions).
    ``sampling`` holds the GenerationParams fields (max_tokens, temperature, ...)."""
    mode = drafter_mode(drafter)
    return build_params(drafter=mode, **sampling), model_options(mode, **models)
