"""Command-line options shared by complete, chat, bench and calibrate, defined once."""

from __future__ import annotations

from typing import Annotated

import typer

DrafterOpt = Annotated[
    str, typer.Option(help="auto (cost model), model, ngram, or none (plain decoding)")
]
# Options shared by complete, chat and bench.
TemperatureOpt = Annotated[float, typer.Option(help="0 is greedy")]
TopKOpt = Annotated[int, typer.Option(help="sampling: keep the k most likely (0: off)")]
TopPOpt = Annotated[float, typer.Option(help="sampling: nucleus mass (1: off)")]
MinPOpt = Annotated[float, typer.Option(help="sampling: drop below min-p x top (0: off)")]
SeedOpt = Annotated[int | None, typer.Option(help="sampling seed")]
DraftMaxOpt = Annotated[int, typer.Option(help="longest draft per round")]
TargetOpt = Annotated[str | None, typer.Option(help="target: path, catalog name or repo:file")]
DraftOpt = Annotated[str | None, typer.Option(help="draft: path, catalog name or repo:file")]
ThreadsOpt = Annotated[int | None, typer.Option(help="CPU threads (default: all cores)")]
CtxOpt = Annotated[int, typer.Option(help="context size in tokens")]
GpuLayersOpt = Annotated[int, typer.Option(help="layers to offload to a GPU (-1: all)")]
