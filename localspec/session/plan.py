"""A load planned as one value: ``plan_load(options, on_progress)`` turns the options into a
frozen ``LoadPlan``, which ``open.open_session`` then carries out.

The plan says which files make the pair, whether the draft is the target's own layers,
where each model runs (``plan_placement``), which RPC workers the target's layers go to,
how each model is loaded (context, lanes, threads, kernels, where greedy choices are made),
when the draft model loads (``loading.plan_draft``, from the costs cached for the pair),
whether this machine's costs are measured, and whether what ``auto`` learns is restored and
saved. Planning loads no model: it resolves the references (``pair.resolve_pair``, which
fetches a model on first use), derives the target's own draft where the options ask for it
(``pair.derive_self_draft``, its own step: once per target, then cached), settles the
number of lanes (auto: as suits where the target runs), and reads the devices, the models'
headers and the cached costs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from localspec.backend.devices import gpu_devices, gpu_hardware
from localspec.backend.lanes import LaneScheduler
from localspec.backend.llama import LoadOptions
from localspec.backend.rpc import Endpoint, parse_endpoints
from localspec.core.params import GenerationParams
from localspec.errors import UsageError
from localspec.machine.costcache import cached_costs
from localspec.machine.placement import ALL, ModelPlace, Placement, place
from localspec.models.resources import footprint
from localspec.progress import OnProgress
from localspec.session.loading import DraftDecision, DraftPlan, plan_draft
from localspec.session.pair import (
    AUTO_LANES_CPU,
    AUTO_LANES_GPU,
    ModelOptions,
    derive_self_draft,
    derives_draft,
    resolve_pair,
)

# The draft length the draft model is judged by before loading it: the drafter's default.
DEFAULT_DRAFT_MAX = GenerationParams.model_fields["draft_max"].default


@dataclass(frozen=True)
class LoadPlan:
    """What loading the pair will do; see the module docstring."""

    options: ModelOptions  # as given, their lanes settled
    target: Path
    draft: Path | None  # None: no draft model
    derived: bool  # the draft is the target's own layers (``--draft self``)
    placement: Placement
    endpoints: tuple[Endpoint, ...]  # the RPC workers the target's layers go to
    load: LoadOptions  # both models': context, lanes, threads, where greedy choices are made
    target_load: LoadOptions  # the target's: its layers, their shares among the workers
    decision: DraftDecision | None  # when the draft model loads; None without one
    measuring: bool  # this machine's costs for the pair are measured at load
    restores_learning: bool  # what auto learned for the pair is read and started from
    saves_learning: bool  # what auto learns is saved for the next session

    @property
    def draft_now(self) -> Path | None:
        """The draft model loaded before the session opens, or in the background."""
        on_demand = self.decision is None or self.decision.plan is DraftPlan.ON_DEMAND
        return None if on_demand else self.draft

    def draft_load(self, n_vocab: int, scheduler: LaneScheduler | None = None) -> LoadOptions:
        """The draft's load options, once the target (with ``n_vocab`` tokens) is loaded: the
        confidence of its greedy choices measured over the target's vocabulary, and its
        lanes evaluated under the target's lanes' ``scheduler`` (backend/lanes.py)."""
        assert self.placement.draft is not None
        return replace(
            self.load, greedy_confidence=True, greedy_vocab=n_vocab,
            n_gpu_layers=self.placement.draft.n_gpu_layers, scheduler=scheduler,
        )  # fmt: skip


def plan_load(options: ModelOptions, on_progress: OnProgress | None = None) -> LoadPlan:
    """The plan of loading the pair ``options`` name (see the module docstring)."""
    target, draft = resolve_pair(options, on_progress)
    derives = derives_draft(options)
    if derives:
        draft = derive_self_draft(target, options.threads, on_progress)
    if options.lanes == 0:  # auto: what suits where the target runs
        options = options.model_copy(update={"lanes": _auto_lanes(options, target, draft)})
    placement = plan_placement(options, target, draft)
    cached = cached_costs(options, placement, target, draft)
    measuring = options.calibrate and (options.recalibrate or cached is None)
    decision = None
    if draft is not None:
        optional = options.draft_on_demand
        decision = plan_draft(cached, DEFAULT_DRAFT_MAX, optional=optional, measuring=measuring)
    load = LoadOptions(
        n_ctx=options.n_ctx,
        lanes=options.lanes,
        n_threads=options.threads,
        n_gpu_layers=placement.target.n_gpu_layers,
        flash_attn=options.flash_attn,
        warm_up=measuring,  # the steps measured now must not pay the first pass's mapping
        device_greedy=options.device_verify,
    )
    learns = options.calibrate and options.learn
    return LoadPlan(
        options, target, draft, derives, placement,
        tuple(parse_endpoints(list(options.rpc))) if options.rpc else (), load,
        _target_load(options, load), decision, measuring, learns,
        learns and options.save_learning,
    )  # fmt: skip


def _auto_lanes(options: ModelOptions, target_path: Path, draft_path: Path | None) -> int:
    """Generations at once where none were asked for: several where the target runs on a GPU
    (one batch verifies their rounds for little more than one), else two (an editor's
    completions beside a chat: the cores run one generation at full speed already)."""
    single = plan_placement(options.model_copy(update={"lanes": 1}), target_path, draft_path)
    return AUTO_LANES_GPU if single.target.on_gpu else AUTO_LANES_CPU


def _target_load(options: ModelOptions, load: LoadOptions) -> LoadOptions:
    """The target's load options: batch-invariant kernels with ``--exact`` (only the
    target's: what the draft proposes never changes what the target accepts, so the draft
    keeps the fast ones), and with ``--rpc-split`` its layers shared among the workers as
    told (one non-negative share per worker, else a ``UsageError``)."""
    load = replace(load, exact=options.exact)
    if not options.rpc_split:
        return load
    if len(options.rpc_split) != len(options.rpc) or min(options.rpc_split) < 0:
        raise UsageError(
            f"--rpc-split gives {len(options.rpc_split)} shares for {len(options.rpc)} worker(s)",
            "give one non-negative share per --rpc worker, e.g. --rpc-split 3,1",
        )
    return replace(load, tensor_split=options.rpc_split)


def plan_placement(options: ModelOptions, target_path: Path, draft_path: Path | None) -> Placement:
    """Where each model of the pair will run, from the devices this build sees now (see
    machine/placement.py). With RPC workers the target goes to them (all its layers unless
    told otherwise) and the draft stays on this machine's CPU: its steps are many and
    small, and a network round trip for each would cost more than the step."""
    n_ctx = options.n_ctx * options.lanes  # every lane's context is in the cache
    target = footprint(target_path, n_ctx)
    draft = footprint(draft_path, n_ctx) if draft_path is not None else None
    if options.rpc:
        request = ALL if options.n_gpu_layers is None else options.n_gpu_layers
        layers = target.layers if request == ALL else min(request, target.layers)
        return Placement(
            ModelPlace(layers, target.layers, "RPC workers" if layers else "CPU"),
            ModelPlace(0, draft.layers, "CPU") if draft else None,
            "--rpc: the target's layers run on the workers, the draft on this machine",
        )
    return place(
        options.n_gpu_layers, options.draft_gpu_layers, target, draft, gpu_devices(),
        gpu_hardware(),
    )  # fmt: skip
