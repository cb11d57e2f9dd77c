"""A mode's controller and the drafters it weighs, what they learned, and how many are kept.

A ``Planner`` is kept per mode and limits across generations (``SpecDecoder.planner_for``),
so what its drafters learn carries from answer to answer. ``learned()`` is their evidence as
plain data, one entry per drafter by name; ``restore_drafters`` starts drafters from such
data, discounted, each from its own entry: a drafter without one (added after the data was
saved) starts afresh, and malformed data raises before anything is used.

``Planners`` holds them by ``planner_key`` (the mode and the limits a planner is built
with), at most ``MAX_PLANNERS``: past that the least recently used goes (a server's
requests can each name limits of their own), never the home planner. The home planner is
the one whose learning is the pair's, saved for the next process: the front end names it
(a server: its defaults), else it is the first generation's.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from localspec.core.controller import Controller
from localspec.core.drafting.base import Drafter
from localspec.core.params import GenerationParams

RESTORE_KEEP = 0.5  # what a new process keeps of the evidence an earlier one saved
MAX_PLANNERS = 8  # planners of other limits than the home one's are rebuilt past this

PlannerKey = tuple[Any, ...]


@dataclass
class Planner:
    controller: Controller
    drafters: dict[str, Drafter]
    params: GenerationParams  # the mode and limits its drafters were built for

    def learned(self) -> dict[str, Any]:
        """What the drafters learned, as plain data: one entry per drafter."""
        return {"drafters": {name: d.learned() for name, d in self.drafters.items()}}

    def end(self) -> None:
        """A generation is over: drafters with the ``Ends`` capability free what only its
        answer needed (a prediction's index)."""
        for drafter in self.drafters.values():
            getattr(drafter, "end", lambda: None)()


def restore_drafters(drafters: dict[str, Drafter], data: Any, keep: float) -> None:
    """Each drafter from its entry of ``Planner.learned()`` data, discounted to ``keep``.
    Raises ``ValueError``, ``KeyError`` or ``TypeError`` on malformed data."""
    entries = data["drafters"]
    if not isinstance(entries, dict):
        raise ValueError("the drafters' entries must be a mapping")
    for name, drafter in drafters.items():
        if name in entries:
            drafter.restore(entries[name], keep)


def planner_key(params: GenerationParams) -> PlannerKey:
    """What a planner is built with: its mode, the drafters it leaves out, their limits and
    draft trees."""
    return (
        params.drafter, params.left_out, params.draft_max, params.ngram_draft_max,
        params.draft_min, params.trees,
    )  # fmt: skip


class Planners:
    """The planners of a decoder, built on first use by ``build`` (module docstring)."""

    def __init__(self, build: Callable[[GenerationParams], Planner]) -> None:
        self._build = build
        self._kept: OrderedDict[PlannerKey, Planner] = OrderedDict()  # least recent first
        self.home: PlannerKey | None = None

    def get(self, params: GenerationParams) -> Planner:
        key = planner_key(params)
        if self.home is None:
            self.home = key
        planner = self._kept.pop(key, None) or self._build(params)
        self._kept[key] = planner
        while len(self._kept) > MAX_PLANNERS:
            del self._kept[next(k for k in self._kept if k != self.home)]
        return planner

    def is_home(self, params: GenerationParams) -> bool:
        return planner_key(params) == self.home

    def __iter__(self) -> Iterator[Planner]:
        return iter(list(self._kept.values()))

    def __len__(self) -> int:
        return len(self._kept)

    def clear(self) -> None:
        """Every planner goes (the home one is still the home one when built again)."""
        self._kept.clear()
