"""``localspec serve``: an OpenAI-compatible HTTP server with speculative decoding behind it.

Binds 127.0.0.1 by default. The server starts at once (``/health`` says ``loading``) and
loads the pair in the background (progress on stderr); a key from ``--api-key`` or
``LOCALSPEC_API_KEY`` is then required on every endpoint but ``/health``. Binding another
address without a key prints a warning. ``--parse-special`` lets control-token text in a
raw completion prompt act as control tokens (editors that write a model's FIM tokens into the
prompt themselves need it); chat messages keep such text as text whatever the option says.
"""

from __future__ import annotations

import os
import threading
from typing import Annotated

import typer

from localspec.cli.common import (
    DEFAULT_RPC_TIMEOUT,
    CtxOpt,
    DrafterOpt,
    DraftGpuLayersOpt,
    DraftMaxOpt,
    DraftOpt,
    ExactOpt,
    GpuLayersOpt,
    MinPOpt,
    NoHistoryOpt,
    NoStoreOpt,
    NoTreesOpt,
    RpcOpt,
    RpcSplitOpt,
    RpcTimeoutOpt,
    SeedOpt,
    StoreOpt,
    TargetOpt,
    TemperatureOpt,
    ThreadsOpt,
    TopKOpt,
    TopPOpt,
    cli_errors,
    echo_error,
    echo_progress,
    is_loopback,
    pair_settings,
    parse_generation,
    store_settings,
)


def serve(
    host: Annotated[str, typer.Option(help="address to bind (loopback by default)")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port")] = 8080,
    api_key: Annotated[
        str | None,
        typer.Option(envvar="LOCALSPEC_API_KEY", help="require Authorization: Bearer KEY"),
    ] = None,
    cors_origin: Annotated[
        list[str] | None, typer.Option(help="allow browser requests from this origin (repeat)")
    ] = None,
    queue_size: Annotated[int, typer.Option(help="requests that may wait; more get 503")] = 16,
    max_body: Annotated[int, typer.Option(help="largest request body in bytes")] = 1 << 20,
    max_tokens: Annotated[int, typer.Option(help="default new tokens at most")] = 512,
    parse_special: Annotated[
        bool,
        typer.Option(
            help="let control tokens written in a /v1/completions prompt (e.g. <|fim_prefix|>) "
            "act as such"
        ),
    ] = False,
    temperature: TemperatureOpt = 0.0,
    top_k: TopKOpt = 40,
    top_p: TopPOpt = 0.95,
    min_p: MinPOpt = 0.05,
    seed: SeedOpt = None,
    drafter: DrafterOpt = "auto",
    draft_max: DraftMaxOpt = 16,
    no_trees: NoTreesOpt = False,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    threads: ThreadsOpt = None,
    ctx: CtxOpt = 4096,
    gpu_layers: GpuLayersOpt = None,
    draft_gpu_layers: DraftGpuLayersOpt = None,
    rpc: RpcOpt = None,
    rpc_timeout: RpcTimeoutOpt = DEFAULT_RPC_TIMEOUT,
    rpc_split: RpcSplitOpt = None,
    exact: ExactOpt = False,
    store: StoreOpt = None,
    no_store: NoStoreOpt = False,
    no_history: NoHistoryOpt = False,
) -> None:
    """Serve the pair over an OpenAI-compatible API (/v1/chat/completions, /v1/completions)."""
    import uvicorn

    from localspec.serve.app import ServerState, create_app

    with cli_errors():
        params, options = parse_generation(
            drafter,
            {
                **pair_settings(
                    target,
                    draft,
                    threads,
                    ctx,
                    gpu_layers,
                    exact,
                    rpc,
                    rpc_timeout,
                    rpc_split,
                    draft_gpu_layers=draft_gpu_layers,
                ),
                **store_settings(store, no_store, no_history),
            },
            max_tokens=max_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            seed=seed,
            draft_max=draft_max,
            trees=not no_trees,
        )
    if not is_loopback(host) and not api_key:
        typer.echo(
            f"warning: serving on {host} without an API key: anyone who can reach it can use "
            "it; pass --api-key or set LOCALSPEC_API_KEY",
            err=True,
        )
    state = ServerState(
        defaults=params,
        api_key=api_key or None,
        cors_origins=list(cors_origin or []),
        max_body=max_body,
        parse_special=parse_special,
    )
    threading.Thread(
        target=load_into, args=(state, options, queue_size), daemon=True, name="loader"
    ).start()
    typer.echo(f"serving on http://{host}:{port}/v1 (loading the models)", err=True)
    uvicorn.run(create_app(state), host=host, port=port, log_level="warning")
    if state.worker is not None:
        state.worker.stop()
        state.worker.session.close()


def load_into(state, options, queue_size: int) -> None:  # noqa: ANN001
    from localspec.serve.worker import GenerationWorker
    from localspec.session.session import open_session

    try:
        session = open_session(options, on_progress=echo_progress)
    except Exception as err:  # typed errors and bugs alike: said in one line, as the CLI does
        state.load_error = str(err)
        os._exit(echo_error(err))  # the server cannot do anything without its models
    state.model_id = session.target.path.stem
    state.draft_id = session.draft.path.stem if session.draft is not None else None
    state.placement = session.placement.to_dict() if session.placement else None
    worker = GenerationWorker(session, max_queue=queue_size)
    worker.start()
    state.worker = worker
    typer.echo("ready", err=True)
