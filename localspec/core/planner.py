"""A mode's controller and the drafters it weighs, and what they learned, out and in.

A ``Planner`` is kept per mode and limits across generations (``SpecDecoder.planner_for``),
so what its drafters learn carries from answer to answer. ``learned()`` is their evidence as
plain data, one entry per drafter by name; ``restore_drafters`` starts drafters from such
data, discounted, each from its own entry: a drafter without one (added after the data was
saved) starts afresh, and malformed data raises before anything is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from localspec.core.controller import Controller
from localspec.core.drafting.base import Drafter
from localspec.core.params import GenerationParams

RESTORE_KEEP = 0.5  # what a new process keeps of the evidence an earlier one saved


@dataclass
class Planner:
    controller: Controller
    drafters: dict[str, Drafter]
    params: GenerationParams  # the mode and limits its drafters were built for

    def learned(self) -> dict[str, Any]:
        """What the drafters learned, as plain data: one entry per drafter."""
        return {"drafters": {name: d.learned() for name, d in self.drafters.items()}}


def restore_drafters(drafters: dict[str, Drafter], data: Any, keep: float) -> None:
    """Each drafter from its entry of ``Planner.learned()`` data, discounted to ``keep``.
    Raises ``ValueError``, ``KeyError`` or ``TypeError`` on malformed data."""
    entries = data["drafters"]
    if not isinstance(entries, dict):
        raise ValueError("the drafters' entries must be a mapping")
    for name, drafter in drafters.items():
        if name in entries:
            drafter.restore(entries[name], keep)
