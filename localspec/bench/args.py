"""The arguments of ``localspec bench``, typed: what ``bench.run.run_bench`` runs with.

One field per option of the command, with the option's own name and its value as given
(``modes``, ``categories``, ``store`` as typed, unparsed); ``run.py`` checks them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BenchArgs:
    """The options of ``localspec bench``, as typed."""

    categories: str | None
    limit: int | None
    prompts: Path | None
    modes: str
    store: list[str] | None
    max_tokens: int
    temperature: float
    seed: int | None
    raw: bool
    cold: bool
    trace: bool
    native_bin: Path | None
    native_flags: str
    repeat: int
    out: Path | None
    chart: bool
    warmup: bool
    target: str | None
    draft: str | None
    threads: int | None
    ctx: int
    gpu_layers: str | None
    draft_gpu_layers: str | None
    rpc: str | None
    rpc_timeout: float
    rpc_split: str | None
    exact: bool
