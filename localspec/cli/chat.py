"""``localspec chat``: the terminal chat (see ``localspec.tui``) with the shared options.

``--recent`` lists the saved conversations and exits; ``--resume FILE|last|N`` continues
one (a damaged or foreign file is a one-line error before any model loads). A resumed
conversation keeps its system prompt and sampling settings unless the command line gives
them; the models are the ones the command line names (the app warns when they differ from
the conversation's). ``--no-save`` turns off the autosave after each answer.
"""

from __future__ import annotations

from typing import Annotated, Any

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
    store_settings,
)

# Options a resumed conversation takes from its file unless the command line sets them.
RESUMED_SETTINGS = ("max_tokens", "temperature", "top_k", "top_p", "min_p", "seed", "drafter")


def chat(
    context: typer.Context,
    max_tokens: Annotated[int, typer.Option(help="new tokens per answer at most")] = 1024,
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
    system: SystemOpt = None,
    resume: Annotated[
        str | None,
        typer.Option(
            "--resume",
            metavar="FILE|last|N",
            help="continue a saved conversation: a file, the last one, or a number of --recent",
        ),
    ] = None,
    recent: Annotated[
        bool, typer.Option("--recent", help="list the recent conversations and exit")
    ] = False,
    no_save: Annotated[
        bool, typer.Option("--no-save", help="do not save the conversation after each answer")
    ] = False,
) -> None:
    """Chat in the terminal, with live acceptance stats and tokens coloured by origin."""
    from localspec.storage.conversations import read_conversation, resolve_resume

    if recent:
        print_recent()
        return
    saved = resume_path = None
    with cli_errors():
        if resume is not None:
            resume_path = resolve_resume(resume)
            saved = read_conversation(resume_path)
            given = {
                name: value
                for name, value in saved.settings.model_dump().items()
                if name in RESUMED_SETTINGS and not _given(context, name)
            }
            max_tokens = given.get("max_tokens", max_tokens)
            temperature = given.get("temperature", temperature)
            top_k = given.get("top_k", top_k)
            top_p = given.get("top_p", top_p)
            min_p = given.get("min_p", min_p)
            seed = given.get("seed", seed)
            drafter = given.get("drafter", drafter)
        # The speedup estimate needs this machine's plain step time, so always calibrate;
        # download bars would garble the screen, so the app shows its own progress lines.
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
                "show_download_progress": False,
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
        options = options.model_copy(update={"calibrate": True})
        system_prompt = read_system(system)
        if saved is not None and system is None:
            system_prompt = saved.system
    from localspec.session.open import open_session
    from localspec.tui import run_chat

    raise typer.Exit(
        run_chat(
            lambda progress, on_lost: open_session(options, progress, on_lost),
            params,
            system_prompt,
            resume=saved,
            resume_path=resume_path,
            autosave=not no_save,
        )
    )


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether the command line (or the environment) set this option."""
    source: Any = ctx.get_parameter_source(name)
    # By name: typer may carry its own copy of click's ParameterSource.
    return getattr(source, "name", None) in ("COMMANDLINE", "ENVIRONMENT", "PROMPT")


def print_recent() -> None:
    """The recent conversations, newest first: number (for --resume), last update, turns,
    the first message (cut) and the file."""
    from localspec.models.paths import conversations_dir
    from localspec.storage.conversations import recent

    found = recent()
    if not found:
        typer.echo(f"no saved conversations in {conversations_dir()}")
        return
    for index, item in enumerate(found, 1):
        c = item.conversation
        turns = f"{item.turns} turn{'s' if item.turns != 1 else ''}"
        typer.echo(
            f"{index:>2}  {c.updated:%Y-%m-%d %H:%M}  {turns:>9}  "
            f"{item.first_line(40):<40}  {item.path}"
        )
