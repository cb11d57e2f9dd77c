"""``localspec prompt-cache list|clear``: the prompt states kept on disk (session/prompt_state.py).

Contract: ``prompt_cache_app`` is a Typer sub-app. ``list`` prints one row per saved prompt
(tokens of the target's and the draft model's, size, last use) and the folder's total against
its bound; ``clear`` deletes them all and says how many. Neither loads a model.
"""

from __future__ import annotations

import os
import time
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from localspec.cli.common import cli_errors
from localspec.errors import UsageError
from localspec.models.paths import prompt_cache_dir
from localspec.models.resources import human
from localspec.session.sizes import PROMPT_CACHE_SIZE_ENV, default_bounds, size_in_bytes
from localspec.storage.prompt_cache import DiskTier

prompt_cache_app = typer.Typer(
    name="prompt-cache",
    help="The prompts kept on disk so that they are never evaluated twice.",
    no_args_is_help=True,
)


def disk_bound() -> int:
    """The disk tier's bound as a command without options sees it."""
    env = os.environ.get(PROMPT_CACHE_SIZE_ENV)
    if env:
        size = size_in_bytes(env)
        if size is None:
            raise UsageError(
                f"{PROMPT_CACHE_SIZE_ENV}={env!r} is not a size", "give e.g. 64MB, 2GB or 0 (off)"
            )
        return size
    return default_bounds(prompt_cache_dir())[1]


@prompt_cache_app.command("list")
def list_command(
    limit: Annotated[int, typer.Option(help="show at most this many, the latest used first")] = 50,
) -> None:
    """List the saved prompts, the latest used first, with the folder's size and bound."""
    with cli_errors():
        tier = DiskTier(prompt_cache_dir(), disk_bound())
        listed = tier.listing()
        table = Table(title=f"prompt cache ({tier.root})")
        for column in ("tokens", "draft tokens", "size", "last used"):
            table.add_column(column, justify="right")
        now = time.time()
        for item in listed[: max(0, limit)]:
            table.add_row(
                str(item.tokens), str(item.draft_tokens or "-"), human(item.nbytes),
                _ago(now - item.used),
            )  # fmt: skip
        console = Console()
        if listed:
            console.print(table)
        total = sum(item.nbytes for item in listed)
        console.print(
            f"{len(listed)} saved prompt(s), {human(total)} of {human(tier.limit)} "
            f"(--prompt-cache-size or ${PROMPT_CACHE_SIZE_ENV} sets the bound)"
        )


@prompt_cache_app.command("clear")
def clear_command() -> None:
    """Delete every saved prompt."""
    with cli_errors():
        removed = DiskTier(prompt_cache_dir(), 0).clear()
        typer.echo(f"deleted {removed} saved prompt(s)")


def _ago(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit} ago"
    return "just now"
