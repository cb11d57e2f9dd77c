"""``localspec datastore ...``: index your own files for retrieval drafting, and manage the
stores and the history of answers (storage/library.py says where they live).

Contract: ``datastore_app`` is a Typer sub-app. Every command turns a ``LocalspecError`` into
``error: <message>`` and ``hint: <hint>`` on stderr and exits with the error's code; Ctrl-C
exits 130 and leaves every store as it was. Summaries and tables go to stdout, progress to
stderr. ``add`` loads only the target's tokenizer (``vocab_only``), fetching the model
first if it is not on this machine; ``list`` and ``stats`` never fetch a model, and ``list``
loads the target's tokenizer only when its fingerprint is not cached yet.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from localspec.cli.common import cli_errors, echo_progress
from localspec.cli.groups import option_groups
from localspec.errors import DatastoreError, LocalspecError, UsageError
from localspec.models.catalog import locate_model, resolve_model
from localspec.models.resources import human
from localspec.options.model import Target
from localspec.storage.fingerprint import cached_fingerprint
from localspec.storage.indexing import (
    MAX_ADD_TOKENS,
    add_files,
    default_name,
    describe_skipped,
    time_lookups,
)
from localspec.storage.library import (
    FINGERPRINTS_FILE,
    HISTORY,
    HISTORY_ENV,
    Library,
    check_name,
    disk_bytes,
    vocabulary_fingerprint,
)
from localspec.storage.sources import scan

# The llama.cpp backend is imported only when a command needs the target's tokenizer:
# ``localspec --help`` and the other commands start without it.

DEFAULT_MAX_FILE_SIZE = 1 << 20

datastore_app = typer.Typer(
    name="datastore",
    help="Index your files (and keep your answers) for auto to draft from; all on this machine.",
    no_args_is_help=True,
)


@datastore_app.command()
@option_groups
def add(
    paths: Annotated[list[str], typer.Argument(help="files and directories to index")],
    name: Annotated[
        str | None, typer.Option(help="the store's name (default: the first path's base name)")
    ] = None,
    max_file_size: Annotated[
        int, typer.Option(metavar="BYTES", min=1, help="skip files larger than this")
    ] = DEFAULT_MAX_FILE_SIZE,
    max_tokens: Annotated[
        int,
        typer.Option(metavar="N", min=1, help="stop, writing nothing, past this many tokens read"),
    ] = MAX_ADD_TOKENS,
    target: Target = None,
) -> None:
    """Index text and code files with the target's tokenizer (.gitignore is respected)."""
    with cli_errors("\ninterrupted; the store is as it was"):
        from localspec.backend.llama import LlamaModel

        found = scan(paths, max_file_size)
        store = name if name is not None else default_name(found.roots[0])
        check_name(store)
        model_path = resolve_model(target, "target")
        tokenizer = LlamaModel(model_path, vocab_only=True)
        try:
            fingerprint = vocabulary_fingerprint(tokenizer)

            def tokenize(text: str) -> list[int]:
                return tokenizer.tokenize(text, add_special=False, parse_special=False)

            result = add_files(
                Library(), store, fingerprint, str(model_path), found, tokenize, echo_progress,
                max_tokens,
            )  # fmt: skip
        finally:
            tokenizer.close()
    changes = [f"{result.replaced} replaced"] if result.replaced else []
    if result.removed:
        changes.append(f"{result.removed} dropped: no longer on disk")
    typer.echo(
        f"datastore {store!r}: indexed {result.indexed:,} files"
        + (f" ({', '.join(changes)})" if changes else "")
    )
    size = disk_bytes(Library().root / store)
    typer.echo(f"  now {result.documents:,} files, {result.tokens:,} tokens, {human(size)}")
    skipped = sum(result.skipped.values())
    if skipped:
        typer.echo(f"  skipped {skipped:,} files: {describe_skipped(result.skipped)}")


@datastore_app.command("list")
@option_groups
def list_stores(target: Target = None) -> None:
    """Show the stores and the history: size, sources, and whether the target can use them."""
    with cli_errors():
        library = Library()
        fingerprint, compared = _target_fingerprint(target)
        out = Console(highlight=False, soft_wrap=False)
        table = Table(title=Text(f"datastores in {library.root}"), title_justify="left")
        for column in ("name", "files", "tokens", "size", "tokenizer"):
            table.add_column(column, no_wrap=True, justify="right" if column != "name" else "left")
        table.add_column("sources", ratio=1, overflow="fold")

        def matches(other: str | None) -> str:
            if fingerprint is None:
                return "unknown"
            return "target's" if other == fingerprint else "other"

        # Names, paths and problems are the files' own text: shown as text, never markup.
        for info in library.infos():
            m = info.manifest
            if m is None:
                table.add_row(Text(info.name), "-", "-", human(info.bytes), "-", Text(info.problem))
                continue
            sources = Text("\n".join(map(str, _listed(m.get("sources")))))
            row = (_count(m.get("files")), _count(m.get("tokens")), human(info.bytes),
                   matches(m["tokenizer"]), sources)  # fmt: skip
            table.add_row(Text(info.name), *row)
        on, problem = library.history_setting()
        for key, client, history in library.histories():
            documents, tokens = history.summary()
            size = human(disk_bytes(history.directory))
            whose = f"answers of serve client {client}" if client else "your answers"
            what = f"{whose} (history {'on' if on else 'off'})"
            table.add_row(HISTORY, f"{documents:,}", f"{tokens:,}", size, matches(key), what)
        out.print(table)
        if problem:
            out.print(Text(f"warning: {problem}"))
        out.print(Text(f"tokenizer: {compared}"))
        out.print(
            f"history: {'on' if on else 'off'}"
            + ("" if on else " (localspec datastore history on to keep answers)")
        )


def _count(value: object) -> str:
    return f"{value:,}" if type(value) is int else "?"


def _listed(value: object) -> list:
    return value if isinstance(value, list) else []


def _target_fingerprint(target: str | None) -> tuple[str | None, str]:
    """The target's tokenizer fingerprint if its file is on this machine, and what the
    tokenizer column compares with. Never fetches a model."""
    from localspec.backend.llama import LlamaModel

    try:
        path = locate_model(target, "target")
    except LocalspecError:
        path = None
    label = target or "the default target"
    if path is None:
        return None, f"unknown: {label} is not on this machine (pass --target REF)"
    found = cached_fingerprint(path, Library().root / FINGERPRINTS_FILE)
    if found is None:
        try:
            model = LlamaModel(path, vocab_only=True)
        except LocalspecError as err:
            return None, f"unknown: {path.name} could not be read ({err})"
        try:
            found = vocabulary_fingerprint(model)
        finally:
            model.close()
    return found, f'"target\'s" means built with the tokenizer of {path.name}'


@datastore_app.command()
def rm(name: Annotated[str, typer.Argument(help="a store's name, or history")]) -> None:
    """Delete a store (rm history forgets every answer kept)."""
    with cli_errors():
        existed = Library().remove(name)
    if name == HISTORY:
        typer.echo("forgot the history of answers" if existed else "no history was kept")
    else:
        typer.echo(f"deleted datastore {name!r}")


@datastore_app.command()
def stats(
    name: Annotated[str | None, typer.Argument(help="a store, or history (default: all)")] = None,
    lookups: Annotated[int, typer.Option(min=1, help="lookups to time per store")] = 1000,
) -> None:
    """Documents, tokens, size, and the time of a drafter's lookup in each store."""
    with cli_errors():
        library = Library()
        chosen = _indexes(library, name)
        if not chosen:
            raise UsageError("there is no datastore yet", "localspec datastore add PATH")
        for label, corpora, size, problem in chosen:
            if problem:
                typer.echo(f"{label}: {problem}")
                continue
            documents = sum(c.documents for c in corpora)
            tokens = sum(len(c) for c in corpora)
            typer.echo(f"{label}: {documents:,} documents, {tokens:,} tokens, {human(size)}")
            times = time_lookups(corpora[0], lookups) if corpora else []
            if times:
                median = statistics.median(times) * 1000
                p95 = statistics.quantiles(times, n=20)[-1] * 1000 if len(times) > 1 else median
                typer.echo(
                    f"  lookup (longest match, then 16-token continuations; {len(times)} "
                    f"contexts from the store): median {median:.3f} ms, p95 {p95:.3f} ms"
                )


Indexes = list[tuple[str, list, int, str]]


def _indexes(library: Library, name: str | None) -> Indexes:
    """``(label, corpora, bytes on disk, problem)`` of the stores ``stats`` reports on. A
    damaged store is an error when named, a line of the report otherwise."""
    chosen: Indexes = []
    if name is None or name != HISTORY:
        for store in [name] if name is not None else library.names():
            size = disk_bytes(library.root / store)
            try:
                chosen.append((store, [library.index(store, verify=True)], size, ""))
            except DatastoreError as err:
                if name is not None:
                    raise
                chosen.append((store, [], size, f"{err.message} ({err.hint})"))
    if name is None or name == HISTORY:
        for key, client, history in library.histories():
            whose = f", serve client {client}" if client else ""
            label, size = f"history ({key[:8]}{whose})", disk_bytes(history.directory)
            try:
                chosen.append((label, history.open(), size, ""))
            except OSError as err:
                fix = "forget it with: localspec datastore rm history"
                chosen.append((label, [], size, f"could not be read ({err}); {fix}"))
    return chosen


@datastore_app.command()
def history(
    state: Annotated[str | None, typer.Argument(metavar="[on|off]", help="on or off")] = None,
) -> None:
    """Keep each answer (on, the default) for auto to draft from later, or stop (off)."""
    with cli_errors():
        library = Library()
        if state is not None:
            if state not in ("on", "off"):
                raise UsageError(f"invalid state {state!r}", "localspec datastore history on|off")
            problem = library.set_history(state == "on")
            if problem:
                raise DatastoreError(problem, f"check the permissions of {library.root}")
        on = library.history_enabled()
    where = Path(library.root) / HISTORY
    if on:
        typer.echo(f"history: on; answers are kept in {where} (on this machine only)")
    else:
        typer.echo(
            "history: off; answers are not kept "
            "(`localspec datastore rm history` forgets the ones kept before)"
        )
    if state == "on" and not on:
        typer.echo(f"note: {HISTORY_ENV}=0 in the environment keeps it off")
