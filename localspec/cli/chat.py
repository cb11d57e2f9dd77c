"""``localspec chat``: the terminal chat (see ``localspec.tui``) with the shared options."""

from __future__ import annotations

from typing import Annotated

import typer

from localspec.cli.common import (
    DEFAULT_RPC_TIMEOUT,
    CtxOpt,
    DrafterOpt,
    DraftMaxOpt,
    DraftOpt,
    ExactOpt,
    GpuLayersOpt,
    MinPOpt,
    RpcOpt,
    RpcSplitOpt,
    RpcTimeoutOpt,
    SeedOpt,
    SystemOpt,
    TargetOpt,
    TemperatureOpt,
    ThreadsOpt,
    TopKOpt,
    TopPOpt,
    cli_errors,
    pair_settings,
    parse_generation,
    read_system,
)


def chat(
    max_tokens: Annotated[int, typer.Option(help="new tokens per answer at most")] = 1024,
    temperature: TemperatureOpt = 0.0,
    top_k: TopKOpt = 40,
    top_p: TopPOpt = 0.95,
    min_p: MinPOpt = 0.05,
    seed: SeedOpt = None,
    drafter: DrafterOpt = "auto",
    draft_max: DraftMaxOpt = 16,
    target: TargetOpt = None,
    draft: DraftOpt = None,
    threads: ThreadsOpt = None,
    ctx: CtxOpt = 4096,
    gpu_layers: GpuLayersOpt = None,
    rpc: RpcOpt = None,
    rpc_timeout: RpcTimeoutOpt = DEFAULT_RPC_TIMEOUT,
    rpc_split: RpcSplitOpt = None,
    exact: ExactOpt = False,
    system: SystemOpt = None,
) -> None:
    """Chat in the terminal, with live acceptance stats and tokens coloured by origin."""
    with cli_errors():
        # The speedup estimate needs this machine's plain step time, so always calibrate;
        # download bars would garble the screen, so the app shows its own progress lines.
        params, options = parse_generation(
            drafter,
            {
                **pair_settings(
                    target, draft, threads, ctx, gpu_layers, exact, rpc, rpc_timeout, rpc_split
                ),
                "show_download_progress": False,
            },
            max_tokens=max_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            seed=seed,
            draft_max=draft_max,
        )
        options = options.model_copy(update={"calibrate": True})
        system_prompt = read_system(system)
    from localspec.session.session import open_session
    from localspec.tui import run_chat

    raise typer.Exit(
        run_chat(
            lambda progress, on_lost: open_session(options, progress, on_lost),
            params,
            system_prompt,
        )
    )
