"""The arguments of ``localspec bench``, typed: what ``bench.run.run_bench`` runs with.

One field per option of the bench's own, with the option's name and its value as given
(``modes``, ``categories``, ``store`` as typed, unparsed; ``run.py`` checks them), and
``pair``: the model options every model-loading command shares, already checked, which the
bench completes with what its modes need.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from localspec.session.pair import ModelOptions


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
    fresh: bool
    trace: bool
    native_bin: Path | None
    native_flags: str
    repeat: int
    out: Path | None
    chart: bool
    warmup: bool
    pair: ModelOptions
    rpc_delay: float | None = None  # ms added to each round trip to the --rpc workers
