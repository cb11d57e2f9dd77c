"""``localspec chat``: the terminal chat (see ``localspec.tui``) with the shared options.

``--recent`` lists the saved conversations and exits; ``--resume FILE|last|N`` continues
one (a damaged or foreign file is a one-line error before any model loads). A resumed
conversation keeps its system prompt and sampling settings unless the command line gives
them; the models are the ones the command line names (the app warns when they differ from
the conversation's). ``--no-save`` turns off the autosave after each answer.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

import typer

from localspec.cli.common import SystemOpt, cli_errors, read_system
from localspec.cli.groups import option_groups
from localspec.models.paths import conversations_dir
from localspec.options.generation import DraftingChoice, SamplingChoice
from localspec.options.model import ModelChoice
from localspec.options.stores import PromptCacheChoice, StoreChoice
from localspec.storage import conversations
from localspec.storage.prompt_cache import DISK, MEMORY

# The session module loads llama.cpp, and the terminal app Textual, so both are imported only
# once a chat starts: ``localspec --help`` and the other commands start without them.

# Options a resumed conversation takes from its file unless the command line sets them.
RESUMED_SETTINGS = ("max_tokens", "temperature", "top_k", "top_p", "min_p", "seed", "drafter")


@option_groups
def chat(
    context: typer.Context,
    max_tokens: Annotated[int, typer.Option(help="new tokens per answer at most")] = 1024,
    *,
    sampling: SamplingChoice,
    drafting: DraftingChoice,
    model: ModelChoice,
    stores: StoreChoice,
    cache: PromptCacheChoice,
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
    if recent:
        print_recent()
        return
    saved = resume_path = None
    with cli_errors():
        if resume is not None:
            resume_path = conversations.resolve_resume(resume)
            saved = conversations.read_conversation(resume_path)
            max_tokens, sampling, drafting = _resumed(
                context, saved.settings, max_tokens, sampling, drafting
            )
        params = sampling.params(drafting, max_tokens=max_tokens)
        # The speedup estimate needs this machine's plain step time, so always calibrate;
        # download bars would garble the screen, so the app shows its own progress lines.
        options = model.options(
            params.drafter,
            **stores.fields(),
            **cache.fields((MEMORY, DISK)),
            show_download_progress=False,
        ).model_copy(update={"calibrate": True})
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


def _resumed(
    context: typer.Context,
    settings: conversations.ChatSettings,
    max_tokens: int,
    sampling: SamplingChoice,
    drafting: DraftingChoice,
) -> tuple[int, SamplingChoice, DraftingChoice]:
    """The options a resumed conversation takes from its file: those the command line
    (or the environment) does not set."""
    saved = {
        name: value
        for name, value in settings.model_dump().items()
        if name in RESUMED_SETTINGS and not _given(context, name)
    }
    max_tokens = saved.pop("max_tokens", max_tokens)
    if "drafter" in saved:
        drafting = dataclasses.replace(drafting, drafter=saved.pop("drafter"))
    return max_tokens, dataclasses.replace(sampling, **saved), drafting


def _given(ctx: typer.Context, name: str) -> bool:
    """Whether the command line (or the environment) set this option."""
    source: Any = ctx.get_parameter_source(name)
    # By name: typer may carry its own copy of click's ParameterSource.
    return getattr(source, "name", None) in ("COMMANDLINE", "ENVIRONMENT", "PROMPT")


def print_recent() -> None:
    """The recent conversations, newest first: number (for --resume), last update, turns,
    the first message (cut) and the file."""
    found = conversations.recent()
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
