"""Models loading beside other work: the target in a thread while the process finishes its
set-up (``Loading``), and a pair's draft model at once, in the background, or only when a
drafter needs it (``DraftSlot``).

``Loading(load)`` runs ``load()`` in a thread and ``result()`` waits for it (raising its
error): llama.cpp's load runs without Python's lock, so the imports and set-up that do not
need the model go on beside it. Where the process's entry allows it, the interpreter
switches threads more often while it runs (session/switching.py).

A draft model costs a second load (about a second for a 0.5B model on a small CPU) and,
where no draft of it can pay, buys nothing. ``plan_draft`` decides from the drafter asked
for and this machine's cached costs for the pair (``DraftPlan``):

- ``NOW``: loaded before the session opens: a drafter that cannot run without it was asked
  for, or this machine's costs for the pair are not measured yet (measuring them times a
  draft step);
- ``BACKGROUND``: the cached costs say a draft of it could pay: loaded in a thread while
  the target reads the prompt and answers; the engine takes it up between two rounds once
  it is there (``DraftSlot`` is the engine's ``PendingModel``);
- ``ON_DEMAND``: the cached costs say no draft of it can pay here: not loaded, unless a
  drafter that needs it is asked for later (a server's request, the Python API), which
  then waits for the load.

``DraftSlot`` holds the model through that life: ``model`` (loaded or None, never
waiting), ``wait()`` (loads it now if it was left for later), ``summary()`` and
``to_dict()`` (what was loaded and why, for ``--stats`` and ``--json``; still so once the
slot is closed). A background load
still running when the slot closes is aborted (``abort()`` is the loader's progress test),
so a short answer does not wait for it; the model is freed at ``close``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from localspec.core.costs import CostProfile
from localspec.core.drafting.model import could_pay_at
from localspec.session.switching import load_begins, load_ends


class Loading:
    """``load()`` running in a daemon thread (see the module docstring)."""

    def __init__(self, load: Callable[[], Any]) -> None:
        self._value: Any = None
        self._error: BaseException | None = None
        # The switch interval is short while it loads, where the process's entry allows it.
        self._switched = load_begins()
        self._thread = threading.Thread(target=self._run, args=(load,), name="load", daemon=True)
        try:
            self._thread.start()
        except BaseException:
            self._ended()
            raise

    def _run(self, load: Callable[[], Any]) -> None:
        try:
            self._value = load()
        except BaseException as err:  # handed to the caller of result()
            self._error = err
        finally:  # as soon as the load ends, whether or not anyone asks for its result
            self._ended()

    def _ended(self) -> None:
        if self._switched:
            load_ends()

    def result(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


class DraftPlan(StrEnum):
    NOW = "now"
    BACKGROUND = "background"
    ON_DEMAND = "on demand"


@dataclass(frozen=True)
class DraftDecision:
    plan: DraftPlan
    reason: str


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def plan_draft(
    costs: CostProfile | None, draft_max: int, *, optional: bool, measuring: bool
) -> DraftDecision:
    """When to load a pair's draft model. ``optional``: the drafter asked for may draft
    without it (``auto``); ``measuring``: this machine's costs will be measured at load
    (none cached, or asked to measure again); ``costs``: those cached for the pair."""
    if not optional:
        return DraftDecision(DraftPlan.NOW, "the drafter asked for drafts with it")
    if measuring or costs is None or costs.draft_step_s is None:
        return DraftDecision(
            DraftPlan.NOW, "loaded to measure this machine's costs for the pair (once)"
        )
    figures = (
        f"a draft step {_ms(costs.draft_step_s)}, a plain step {_ms(costs.plain_s)}, "
        f"verifying one draft {_ms(costs.verify(1))}"
    )
    if could_pay_at(costs, draft_max):
        return DraftDecision(
            DraftPlan.BACKGROUND,
            f"a draft of it could pay at this machine's measured costs ({figures}): "
            "loaded while the target answers",
        )
    return DraftDecision(
        DraftPlan.ON_DEMAND,
        f"no draft of it can pay at this machine's measured costs ({figures}): "
        "not loaded unless a drafter needs it",
    )


# Loads the model; polls its argument (true: give up) while it loads.
Loader = Callable[[Callable[[], bool]], Any]


class DraftSlot:
    """A pair's draft model and its load; see the module docstring."""

    def __init__(
        self,
        path: Path,
        decision: DraftDecision,
        loader: Loader | None = None,
        *,
        model: Any = None,
        label: str | None = None,
    ) -> None:
        """``model``: already loaded (``NOW``); else ``loader`` loads it when asked."""
        self.path = Path(path)
        self.decision = decision
        self._loader = loader
        self._model = model
        self._label = label
        self._error: BaseException | None = None
        self._closing = threading.Event()
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._opened = time.monotonic()
        self.load_s: float | None = None  # how long the load took, once it has run
        self.ready_after_s: float | None = None  # since the slot opened, once loaded
        self._loaded = model is not None  # it was loaded (still so once closed and freed)
        # Called with the model once a load that was left for later or runs in the
        # background has loaded it, before the engine can take it up (a prompt's saved
        # state restored into it: session/prompt_state.py).
        self.on_loaded: Callable[[Any], None] | None = None
        if model is not None:
            self._done.set()

    # -- the engine's PendingModel ---------------------------------------------------------

    @property
    def settled(self) -> bool:
        return self._done.is_set()

    @property
    def problem(self) -> str:
        return "" if self._error is None else str(self._error)

    def ready(self) -> Any:
        return self._model if self._done.is_set() else None

    def wait(self) -> Any:
        """The model, loaded now if it was left for later (or waited for while it loads);
        raises the load's error."""
        with self._lock:
            started = self._thread is not None or self._done.is_set()
            if not started:
                self._load()
        if self._thread is not None:
            self._thread.join()
        if self._model is None:
            raise self._error or RuntimeError("the draft model's load was stopped")
        return self._model

    # -- the session's view ----------------------------------------------------------------

    @property
    def model(self) -> Any:
        """The loaded model, or None (not loaded, still loading, or failed); never waits."""
        return self.ready()

    @property
    def label(self) -> str:
        if self._model is not None:
            return self._model.description()
        return self._label or self.path.stem

    def start(self) -> None:
        """Begin a background load (``BACKGROUND``); the thread is a daemon, so a process
        that ends does not wait for it."""
        with self._lock:
            if self._thread is not None or self._done.is_set():
                return
            self._thread = threading.Thread(target=self._load, name="draft-load", daemon=True)
            self._thread.start()

    def _load(self) -> None:
        assert self._loader is not None
        started = time.monotonic()
        try:
            model = self._loader(self._closing.is_set)
        except BaseException as err:  # kept for wait() and said by the engine
            self._error = err
        else:
            if self._closing.is_set():  # loaded after all, but nobody will draft with it
                model.close()
            else:
                prepare = self.on_loaded
                if prepare is not None:
                    prepare(model)
                self._model, self._loaded = model, True
                self.load_s = time.monotonic() - started
                self.ready_after_s = time.monotonic() - self._opened
        finally:
            self._done.set()

    def state(self) -> str:
        """What became of it: read after ``close`` too (a record of the answer it served)."""
        if self._loaded:
            return "loaded"
        if self._error is not None:
            return "failed"
        if self._thread is not None and not self._done.is_set():
            return "loading"
        return "not loaded"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "path": str(self.path),
            "plan": self.decision.plan.value,
            "state": self.state(),
            "reason": self.decision.reason,
        }
        if self.load_s is not None:
            out["load_s"] = round(self.load_s, 4)
        if self.decision.plan is DraftPlan.BACKGROUND and self.ready_after_s is not None:
            out["ready_after_s"] = round(self.ready_after_s, 4)
        if self._error is not None:
            out["problem"] = str(self._error)
        return out

    def summary(self) -> str:
        """One line for ``--stats``: what became of the draft model, and why."""
        name, state = self.path.name, self.state()
        if self.decision.plan is DraftPlan.BACKGROUND:
            if state == "loaded":
                done = (
                    f", ready {self.ready_after_s:.2f}s after start" if self.ready_after_s else ""
                )
                what = f"loaded in the background{done}"
            elif state == "failed":
                what = f"its background load failed ({self.problem})"
            else:
                what = "still loading in the background when the answer ended"
            return f"draft model {name}: {what}; {self.decision.reason}"
        if self.decision.plan is DraftPlan.ON_DEMAND and state != "loaded":
            return f"draft model {name}: not loaded; {self.decision.reason}"
        return f"draft model {name}: loaded; {self.decision.reason}"

    def close(self, *, free: bool = True) -> None:
        """Abort a load under way, then free the model (unless ``free`` is false: the
        process is about to end)."""
        self._closing.set()
        if self._thread is not None:
            self._thread.join()
        model, self._model = self._model, None
        if model is not None and free:
            model.close()


class LaneSlot:
    """Lane ``lane``'s view of a pair's draft slot (backend/lanes.py): the same load, and once
    loaded that model's lane. The slot itself (lane 0's) frees the model."""

    def __init__(self, slot: DraftSlot, lane: int) -> None:
        self.slot = slot
        self.lane = lane
        self.path = slot.path
        self.decision = slot.decision

    @property
    def settled(self) -> bool:
        return self.slot.settled

    @property
    def problem(self) -> str:
        return self.slot.problem

    def ready(self) -> Any:
        model = self.slot.ready()
        return model.lane(self.lane) if model is not None else None

    def wait(self) -> Any:
        return self.slot.wait().lane(self.lane)

    @property
    def model(self) -> Any:
        return self.ready()

    @property
    def label(self) -> str:
        return self.slot.label

    def summary(self) -> str:
        return self.slot.summary()

    def to_dict(self) -> dict[str, Any]:
        return self.slot.to_dict()

    def close(self, *, free: bool = True) -> None:
        """Nothing: lane 0's slot frees the model."""
