"""``localspec models ...``: list, pull, remove, locate, check, requantize models and derive
self-drafts from a target's own layers (``list`` shows them, whose target changed or is gone
too, and ``rm`` removes them by name).

Contract: ``models_app`` is a Typer sub-app. Every command turns a ``LocalspecError`` into
``error: <message>`` and ``hint: <hint>`` on stderr and exits with the error's
``exit_code``; an interrupted pull exits 130 and says how to resume. Tables and paths go to
stdout, so ``localspec models path NAME`` composes with other commands.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from localspec.backend.quantize import ftype_for, quantize
from localspec.cli.common import cli_errors, echo_progress, signals_interrupt
from localspec.cli.groups import option_groups
from localspec.errors import ModelNotFoundError
from localspec.models import catalog, fetch, paths
from localspec.models.derive import compact_layers, parse_layers
from localspec.models.derived import derived_folders, remove_derived
from localspec.models.resources import human
from localspec.options.model import Threads
from localspec.progress import Progress, ProgressKind

# The self-draft module loads llama.cpp when imported, the vocabulary check when it runs:
# both are imported only by their command, so ``localspec --help`` and ``localspec models
# list`` start without llama.cpp.
if TYPE_CHECKING:
    from localspec.models.selfdraft import Derived

models_app = typer.Typer(
    name="models",
    help="Manage GGUF models: the catalog of known target/draft pairs, downloads, checks.",
    no_args_is_help=True,
)


def _cli_errors():
    return cli_errors("interrupted; run the same command again to resume")


def _role_of(name: str) -> catalog.Role:
    entry = catalog.load_catalog().get(name)
    return entry.role if entry is not None else "target"


def verification(entry: catalog.ModelEntry) -> str:
    """Whose sha256 downloads of ``entry`` are checked against (every source checks one)."""
    return ", ".join(dict.fromkeys(source.verification for source in entry.sources))


@models_app.command("list")
def list_models() -> None:
    """Show the catalog, what is on disk, and GGUF files in the Hugging Face cache."""
    with _cli_errors():
        cat = catalog.load_catalog()
        out = Console(highlight=False, soft_wrap=False)
        table = Table(title="catalog (localspec models pull NAME)", title_justify="left")
        table.add_column("name", no_wrap=True)
        table.add_column("role", no_wrap=True)
        table.add_column("size", no_wrap=True, justify="right")
        table.add_column("on disk", no_wrap=True)
        table.add_column("sha256 from", no_wrap=True)
        table.add_column("description", ratio=1)
        on_disk: dict[str, Path] = {}
        for entry in cat.models.values():
            where = catalog.locate_model(entry.name)
            if where is not None:
                on_disk[entry.name] = where
            default = entry.name in (cat.defaults.target, cat.defaults.draft)
            table.add_row(
                entry.name + (" *" if default else ""),
                entry.role,
                human(entry.size),
                "yes" if where else "-",
                verification(entry),
                entry.description + (f" (draft: {entry.draft})" if entry.draft else ""),
            )
        out.print(table)
        out.print("* default pair; sha256 from: whose digest every download is checked against")
        for name, where in on_disk.items():
            out.print(f"{name}: {where}", soft_wrap=True)
        registry = catalog.load_registry()
        if registry:
            local = Table(title="made on this machine", title_justify="left")
            for col in ("name", "from", "quant", "path"):
                local.add_column(col, overflow="fold")
            for name, info in sorted(registry.items()):
                local.add_row(
                    name, str(info.get("base")), str(info.get("quant")), str(info.get("path"))
                )
            out.print(local)
        _list_derived(out)
        found = catalog.find_hf_cache_ggufs()
        if found:
            hf = Table(
                title="in the Hugging Face cache (use as repo_id:filename)", title_justify="left"
            )
            for col in ("reference", "size", "path"):
                hf.add_column(col, overflow="fold")
            for item in found:
                hf.add_row(f"{item.repo_id}:{item.filename}", human(item.size), str(item.path))
            out.print(hf)


def _list_derived(out: Console) -> None:
    """The self-drafts derived from targets, those whose target changed or is gone too."""
    folders = derived_folders()
    if not folders:
        return
    table = Table(title="derived self-drafts (localspec models rm NAME)", title_justify="left")
    for col in ("name", "state", "size", "target"):
        table.add_column(col, overflow="fold")
    for folder in folders:
        table.add_row(folder.name, folder.state, human(folder.bytes), folder.target or "-")
    out.print(table)


@models_app.command()
def pull(
    names: Annotated[list[str], typer.Argument(help="catalog names or repo_id:file.gguf")],
) -> None:
    """Download models (resumes an interrupted download), then print their paths."""
    with _cli_errors():
        for name in names:
            path = catalog.resolve_model(name, _role_of(name), progress=True)
            typer.echo(str(path))


@models_app.command()
def path(name: Annotated[str, typer.Argument(help="catalog name, local name or file")]) -> None:
    """Print where a model is on disk (never downloads)."""
    with _cli_errors():
        found = catalog.locate_model(name)
        if found is None:
            if catalog.load_catalog().get(name) is None and not catalog.load_registry().get(name):
                raise catalog.not_found(name)
            raise ModelNotFoundError(
                f"{name} is not on this machine yet", f"localspec models pull {name}"
            )
        typer.echo(str(found))


@models_app.command()
def rm(
    name: Annotated[
        str, typer.Argument(help="catalog name, a model made by optimize or a derived draft")
    ],
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")] = False,
) -> None:
    """Delete a downloaded, optimized or derived model from localspec's cache."""
    with _cli_errors():
        local = catalog.load_registry().get(name)
        if local is not None:
            target = Path(local.get("path", ""))
        elif catalog.load_catalog().get(name) is not None:
            target = catalog.cached_path(name)
        elif any(folder.name == name for folder in derived_folders()):
            _remove_derived(name, yes)
            return
        else:
            raise catalog.not_found(name)
        leftovers = paths.downloads_dir(name)
        if not target.exists() and not leftovers.exists() and local is None:
            raise ModelNotFoundError(
                f"{name} is not in localspec's cache ({target})",
                "`localspec models list` shows what is on disk",
            )
        size = target.stat().st_size if target.exists() else 0
        if not yes and not typer.confirm(f"delete {target} ({human(size)})?"):
            typer.echo("nothing deleted")
            raise typer.Exit(1)
        target.unlink(missing_ok=True)
        for partial in fetch.partial_files(name):
            partial.unlink(missing_ok=True)
        shutil.rmtree(leftovers, ignore_errors=True)
        if local is not None:
            catalog.unregister_local(name)
        typer.echo(f"deleted {target}")
        hf_copy = catalog.locate_model(name) if local is None else None
        if hf_copy is not None:
            typer.echo(f"note: a copy remains in the Hugging Face cache: {hf_copy}")


def _remove_derived(name: str, yes: bool) -> None:
    folder = next(f for f in derived_folders() if f.name == name)
    if not yes and not typer.confirm(f"delete {folder.path} ({human(folder.bytes)})?"):
        typer.echo("nothing deleted")
        raise typer.Exit(1)
    typer.echo(f"deleted {remove_derived(name).path}")


@models_app.command()
def check(
    target: Annotated[str, typer.Argument(help="target: name, repo_id:file or path")],
    draft: Annotated[str, typer.Argument(help="draft: name, repo_id:file or path")],
) -> None:
    """Check that a draft can serve a target (same vocabulary); exit 1 if it cannot."""
    with _cli_errors():
        from localspec.backend.compat import check_pair

        target_path = catalog.resolve_model(target, "target")
        draft_path = catalog.resolve_model(draft, "draft")
        report = check_pair(target_path, draft_path)
        if report.compatible:
            typer.echo(f"compatible: {draft} can draft for {target}")
            for reason in report.reasons:
                typer.echo(f"  note: {reason}")
            return
        typer.echo(f"not compatible: {draft} cannot draft for {target}", err=True)
        for reason in report.reasons:
            typer.echo(f"  - {reason}", err=True)
        raise typer.Exit(1)


@models_app.command()
def optimize(
    name: Annotated[str, typer.Argument(help="catalog name, local name or .gguf path")],
    qtype: Annotated[
        str, typer.Option("--type", "-t", help="llama.cpp quantization type")
    ] = "Q4_0",
    threads: Annotated[int, typer.Option(help="threads for llama.cpp; 0 picks")] = 0,
    verbose: Annotated[bool, typer.Option("--verbose", help="show llama.cpp's log")] = False,
) -> None:
    """Requantize a model (Q4_0 runs fastest on many CPUs) and register it as NAME-q4_0."""
    with _cli_errors():
        ftype_for(qtype)  # reject a bad type before any download
        src = catalog.resolve_model(name, _role_of(name))
        base = (
            name
            if catalog.load_catalog().get(name) or catalog.load_registry().get(name)
            else src.stem
        )
        new_name = f"{base}-{qtype.lower()}"
        dst = paths.ensure_dir(paths.models_dir()) / f"{new_name}.gguf"
        typer.echo(f"quantizing {src} to {qtype.upper()} ...", err=True)
        quantize(src, dst, qtype, threads=threads, verbose=verbose)
        catalog.register_local(new_name, dst, base=base, quant=qtype.upper())
        typer.echo(f"{new_name}: {dst} ({human(dst.stat().st_size)})")
        typer.echo(f"it now resolves by name: {new_name}", err=True)


@models_app.command("derive-draft")
@option_groups
def derive_draft(
    target: Annotated[
        str | None,
        typer.Argument(help="catalog name, local name or file (default: the default target)"),
    ] = None,
    layers: Annotated[
        str | None,
        typer.Option(help="derive exactly these layers, e.g. 0-7,20-27 (no measurement)"),
    ] = None,
    refresh: Annotated[bool, typer.Option("--refresh", help="measure and derive again")] = False,
    threads: Threads = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="print only the derived file's path")
    ] = False,
) -> None:
    """Derive a draft from the target's own layers (a self-draft), measuring which to keep.

    Each candidate subset of layers is derived, loaded and measured against the target on
    this machine; the best is kept in localspec's cache and its path printed last on
    stdout. Measured once per target; --refresh measures again.
    """
    with _cli_errors(), signals_interrupt():
        from localspec.models.selfdraft import derived_draft

        wanted = parse_layers(layers) if layers is not None else None
        path = catalog.resolve_model(target, "target")
        if not quiet:
            typer.echo(f"target: {path}", err=True)
        shown = _quiet_progress if quiet else echo_progress
        found = derived_draft(
            path, threads=threads, on_progress=shown, layers=wanted, refresh=refresh
        )
        if not quiet:
            _show_derived(found)
        typer.echo(str(found.path))


def _quiet_progress(progress: Progress) -> None:
    """A quiet run still says why it waits (the measurement), on stderr."""
    if progress.kind in (ProgressKind.WAIT, ProgressKind.WARNING):
        echo_progress(progress)


def _show_derived(found: Derived) -> None:
    """The candidates as measured, the chosen one marked, and whether drafting pays."""
    out = Console(highlight=False, soft_wrap=False)
    if found.candidates:
        table = Table(
            title=f"self-draft candidates ({found.n_layers} target layers; * chosen)",
            title_justify="left",
        )
        # Fits 80 columns (a pipe's width): long layer lists fold onto more lines.
        table.add_column("", no_wrap=True)
        table.add_column("candidate", no_wrap=True)
        table.add_column("layers kept", overflow="fold", ratio=1)
        for col in ("agree", "step", "speedup", "k"):
            table.add_column(col, no_wrap=True, justify="right")
        for c in found.candidates:
            table.add_row(
                "*" if c.layers == found.layers else "",
                c.label,
                f"{compact_layers(c.layers)} ({len(c.layers)})",
                f"{c.agreement:.0%}",
                f"{c.step_ratio:.2f}",
                f"{c.expected_speedup:.2f}x",
                str(c.draft_length),
            )
        out.print(table)
        out.print(
            "agree: share of drafts the target accepts (greedy); step: a draft step in target "
            "steps; speedup: expected over plain decoding, at the best k drafts per round",
            soft_wrap=True,
        )
    typer.echo(f"layers kept: {compact_layers(found.layers)} of {found.n_layers}")
    typer.echo(_verdict(found))


def _verdict(found: Derived) -> str:
    if found.expected_speedup is None:
        return (
            "not measured (--layers given): run without --layers to see whether a "
            "self-draft can pay on this machine"
        )
    if found.expected_speedup > 1:
        return (
            f"a self-draft can pay on this machine: expected {found.expected_speedup:.2f}x "
            f"plain decoding with {found.draft_length} draft(s) per round"
        )
    return (
        f"a self-draft is not expected to pay on this machine: at best "
        f"{found.expected_speedup:.2f}x plain decoding (its steps and the target's verify "
        "batches cost more than its agreement wins back)"
    )


def main() -> None:  # pragma: no cover - for `python -m localspec.cli.models`
    models_app(prog_name="localspec models")


if __name__ == "__main__":  # pragma: no cover
    main()
