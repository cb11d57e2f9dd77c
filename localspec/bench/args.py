"""What ``bench.run.run_bench`` runs with: the bench's own options, as given
(``options.bench.BenchChoice``: the modes, categories and store as typed, unparsed;
``run.py`` checks them), and ``pair``: the model options every model-loading command
shares, already checked, which the bench completes with what its modes need.
"""

from __future__ import annotations

from dataclasses import dataclass

from localspec.options.bench import BenchChoice
from localspec.session.pair import ModelOptions


@dataclass(frozen=True)
class BenchArgs:
    """The options of ``localspec bench``: its own and the pair's."""

    bench: BenchChoice
    pair: ModelOptions
