"""The composition root: ``open_session(options, on_progress, on_lost)`` loads a
target/draft pair and returns the ``Session`` around it.

It reads as its steps: resolve the model references (``pair.resolve_pair``: paths, catalog
names, Hub references; the default pair when none is given), connect to the RPC workers if
any, plan where each model runs (``plan_placement``), load both models with the same
context size, check that the draft's vocabulary fits the target's (llama.cpp's rules),
calibrate (this machine's costs, measured once per pair and cached on disk:
``costcache``), restore what ``auto`` learned for the pair (``storage.learning``; a damaged
or foreign state file is ignored with a warning), and attach the user's datastores built
with the target's tokenizer and the history of answers (``storage``; a damaged store is
left out with a warning). A model loaded before a step fails is freed before the error goes
on. RPC workers lost mid-evaluation are reported to ``on_lost`` from another thread; by
default that ends the process with a ``WorkersLostError``, reported as every error is
(``errors.exit_with``).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from localspec.backend.compat import check_vocabularies
from localspec.backend.devices import gpu_devices, gpu_hardware
from localspec.backend.llama import LlamaModel, LoadOptions, exact_kernels
from localspec.backend.rpc import RpcLink, attach, parse_endpoints
from localspec.core.costs import CostProfile
from localspec.core.engine import check_learned
from localspec.core.params import GenerationParams
from localspec.errors import IncompatibleModelsError, UsageError, WorkersLostError, exit_with
from localspec.machine.calibrate import file_identity, machine_key
from localspec.machine.costcache import cached_costs, step_costs
from localspec.machine.placement import ALL, ModelPlace, Placement, place
from localspec.models.resources import footprint, model_name
from localspec.progress import OnProgress, ProgressKind, tell
from localspec.session.loading import DraftDecision, DraftPlan, DraftSlot, Loading, plan_draft
from localspec.session.pair import (
    AUTO_LANES_CPU,
    AUTO_LANES_GPU,
    SELF_DRAFT,
    ModelOptions,
    resolve_pair,
)

if TYPE_CHECKING:  # imported while the target loads (see _load_pair)
    from localspec.session.session import Session
    from localspec.storage.learning import LearningStore

# Modules the session needs once the target is loaded (the engine, its drafters, the
# stores): imported while it loads, which llama.cpp does without Python's lock.
WHILE_LOADING = ("localspec.session.session", "localspec.storage.answers")

DEVICE_VERIFY = "LOCALSPEC_DEVICE_VERIFY"  # auto, 1 or 0: see device_verification

LostHandler = Callable[[str], None]
# The draft length the draft model is judged by before loading it: the drafter's default.
DEFAULT_DRAFT_MAX = GenerationParams.model_fields["draft_max"].default


def _exit_on_loss(message: str) -> None:
    """The default answer to lost RPC workers: the evaluation waiting on them never returns,
    so report the loss as any error is reported and end the process (what was streamed
    stays written)."""
    exit_with(WorkersLostError(message))


def open_session(
    options: ModelOptions,
    on_progress: OnProgress | None = None,
    on_lost: LostHandler = _exit_on_loss,
) -> Session:
    """Load the pair, telling ``on_progress`` each step, wait and warning (``Progress``
    values, see localspec/progress.py). With ``options.rpc``, the target's layers go to
    those workers; ``on_lost`` is called (from another thread) if they fail mid-evaluation,
    which then never returns: see backend/rpc.py."""
    if options.calibrate and options.stores:
        from localspec.storage.library import Library

        Library().check_exist(options.stores)  # a misspelt --store fails before any load
    if options.exact:
        exact_kernels()  # process-wide, so before anything evaluates (deriving a self-draft)
    target_path, draft_path = resolve_pair(options, on_progress)
    rpc = _connect(options, on_lost, on_progress)
    if options.lanes == 0:  # auto: what suits where the target runs
        lanes = _auto_lanes(options, target_path, draft_path)
        options = options.model_copy(update={"lanes": lanes})
    placement = plan_placement(options, target_path, draft_path)
    cached = cached_costs(options, placement, target_path, draft_path)
    measuring = options.calibrate and (options.recalibrate or cached is None)
    decision = _draft_decision(options, draft_path, cached, measuring)
    loaded_draft = draft_path if decision and decision.plan is not DraftPlan.ON_DEMAND else None
    _warn_before_loading(options, placement, rpc, target_path, loaded_draft, on_progress)
    target, slot, costs, costs_file = _load_pair(
        options, placement, rpc, target_path, draft_path, decision, measuring, on_progress
    )
    from localspec.session.prompt_state import open_prompt_state
    from localspec.session.session import Session

    learning: tuple[LearningStore, str] | None = None
    restored: dict | None = None
    if options.calibrate and options.learn:
        draft = slot.model if slot is not None else None
        paths = (target_path, draft_path)
        learning, restored = _learned(target, draft, costs, placement, paths, on_progress)
    prompt_state = open_prompt_state(
        options.prompt_cache_tiers, options.prompt_cache_size, target, draft_path,
        costs.plain_s if costs is not None else None,
    )  # fmt: skip
    session = Session(
        target, None, costs, costs_file, learning, rpc=rpc, placement=placement, slot=slot,
        derived=options.draft == SELF_DRAFT, restored=restored, prompt_state=prompt_state,
    )  # fmt: skip
    try:
        _open_stores(session, options, on_progress)
    except BaseException:  # a --store that names nothing: the models are not kept loaded
        session.close()
        raise
    return session


def _auto_lanes(options: ModelOptions, target_path: Path, draft_path: Path | None) -> int:
    """Generations at once where none were asked for: several where the target runs on a GPU
    (one batch verifies their rounds for little more than one), else two (an editor's
    completions beside a chat: the cores run one generation at full speed already)."""
    single = plan_placement(options.model_copy(update={"lanes": 1}), target_path, draft_path)
    return AUTO_LANES_GPU if single.target.on_gpu else AUTO_LANES_CPU


def _connect(
    options: ModelOptions, on_lost: LostHandler, on_progress: OnProgress | None
) -> RpcLink | None:
    """The link to the RPC workers the target's layers go to; None without ``--rpc``."""
    if not options.rpc:
        return None
    endpoints = parse_endpoints(list(options.rpc))
    tell(on_progress, f"connecting to RPC workers {', '.join(map(str, endpoints))}")
    return attach(endpoints, options.rpc_timeout, on_lost)


def _warn_before_loading(
    options: ModelOptions,
    placement: Placement,
    rpc: RpcLink | None,
    target_path: Path,
    draft_path: Path | None,
    on_progress: OnProgress | None,
) -> None:
    for notice in placement.notices:
        tell(on_progress, notice, ProgressKind.WARNING)
    if not rpc and not placement.target.on_gpu:
        memory_warning = _memory_warning(target_path, draft_path, options.n_ctx * options.lanes)
        if memory_warning:  # said before loading, which may be what runs out of memory
            tell(on_progress, memory_warning, ProgressKind.WARNING)


def _draft_decision(
    options: ModelOptions,
    draft_path: Path | None,
    cached: CostProfile | None,
    measuring: bool,
) -> DraftDecision | None:
    """When the draft model is loaded (session/loading.py), from the costs cached for
    the pair; None without one."""
    if draft_path is None:
        return None
    optional = options.draft_on_demand
    return plan_draft(cached, DEFAULT_DRAFT_MAX, optional=optional, measuring=measuring)


def _load_pair(
    options: ModelOptions,
    placement: Placement,
    rpc: RpcLink | None,
    target_path: Path,
    draft_path: Path | None,
    decision: DraftDecision | None,
    measuring: bool,
    on_progress: OnProgress | None,
) -> tuple[LlamaModel, DraftSlot | None, CostProfile | None, Path | None]:
    """The target loaded, the draft loaded now, or in the background, or left for later as
    ``decision`` says (checked against the target once loaded), and their costs; what was
    loaded is freed again if a later step fails."""
    load = LoadOptions(
        n_ctx=options.n_ctx,
        lanes=options.lanes,
        n_threads=options.threads,
        n_gpu_layers=placement.target.n_gpu_layers,
        flash_attn=options.flash_attn,
        warm_up=measuring,  # the steps measured now must not pay the first pass's mapping
        device_greedy=device_verification(),
    )
    # Only the target needs batch-invariant kernels: what the draft proposes never changes
    # what the target accepts, so the draft keeps the fast ones.
    target_load = replace(_target_load(options, load), exact=options.exact)
    _say_loading(options, placement, rpc, target_path, on_progress)
    loading = Loading(lambda: _load_target(target_load, rpc, target_path))
    try:
        for module in WHILE_LOADING:
            importlib.import_module(module)
    finally:
        target = loading.result()
    slot = None
    try:
        if draft_path is not None and decision is not None:
            # Its lanes evaluate on the target's lanes' thread (backend/lanes.py).
            draft_load = replace(load, greedy_confidence=True, greedy_vocab=target.n_vocab,
                                 scheduler=target.shared.scheduler)  # fmt: skip
            slot = _draft_slot(
                options, draft_load, placement, target, draft_path, decision, on_progress
            )
        draft = slot.model if slot is not None else None
        costs, costs_file = step_costs(
            options, placement, target, draft, target_path, draft_path, on_progress
        )
    except BaseException:
        target.close()
        if slot is not None:
            slot.close()
        raise
    if slot is not None and decision is not None and decision.plan is DraftPlan.BACKGROUND:
        slot.start()
    return target, slot, costs, costs_file


def _draft_slot(
    options: ModelOptions,
    load: LoadOptions,
    placement: Placement,
    target: LlamaModel,
    draft_path: Path,
    decision: DraftDecision,
    on_progress: OnProgress | None,
) -> DraftSlot:
    """The draft's slot: loaded and checked now (``NOW``), or with a loader that does so
    later, quietly, in whatever thread asks."""
    target_path = target.path

    def loader(abort: Callable[[], bool], report: OnProgress | None = None) -> LlamaModel:
        draft = _load_draft(options, load, placement, draft_path, target_path, report, abort)
        try:
            _check_vocabularies(target, draft, target_path, draft_path, report)
        except BaseException:
            draft.close()
            raise
        return draft

    if decision.plan is DraftPlan.NOW:
        model = loader(lambda: False, on_progress)
        return DraftSlot(draft_path, decision, model=model)
    return DraftSlot(draft_path, decision, loader, label=model_name(draft_path))


def device_verification() -> bool | None:
    """Where greedy choices are made (``LOCALSPEC_DEVICE_VERIFY``): ``auto``, the default
    (None: on the device where the output layer is offloaded, else from rows on the host),
    ``1`` (always on the device, the CPU's backend included) or ``0`` (always on the host)."""
    value = os.environ.get(DEVICE_VERIFY, "auto").strip().lower()
    if value not in ("auto", "0", "1"):
        raise UsageError(
            f"{DEVICE_VERIFY}={value!r} is neither auto, 0 nor 1",
            f"set {DEVICE_VERIFY}=0 to verify on the host, or unset it",
        )
    return None if value == "auto" else value == "1"


def _target_load(options: ModelOptions, load: LoadOptions) -> LoadOptions:
    """The target's load options: with ``--rpc-split``, its layers shared among the workers
    as told (one non-negative share per worker, else a ``UsageError``)."""
    if not options.rpc_split:
        return load
    if len(options.rpc_split) != len(options.rpc) or min(options.rpc_split) < 0:
        raise UsageError(
            f"--rpc-split gives {len(options.rpc_split)} shares for {len(options.rpc)} worker(s)",
            "give one non-negative share per --rpc worker, e.g. --rpc-split 3,1",
        )
    return replace(load, tensor_split=options.rpc_split)


def _say_loading(
    options: ModelOptions,
    placement: Placement,
    rpc: RpcLink | None,
    target_path: Path,
    on_progress: OnProgress | None,
) -> None:
    where = f" onto {len(options.rpc)} RPC worker(s)" if rpc else ""
    if not rpc and placement.target.on_gpu:
        where = f" onto {placement.target.summary()}"
    tell(on_progress, f"loading target {target_path.name}{where}")


def _load_target(load: LoadOptions, rpc: RpcLink | None, target_path: Path) -> LlamaModel:
    target = LlamaModel(target_path, load)
    if rpc is not None:
        rpc.watch(target)
    return target


def _load_draft(
    options: ModelOptions,
    load: LoadOptions,
    placement: Placement,
    draft_path: Path,
    target_path: Path,
    on_progress: OnProgress | None,
    abort: Callable[[], bool] | None = None,
) -> LlamaModel:
    draft_place = placement.draft
    assert draft_place is not None
    where = f" onto {draft_place.summary()}" if draft_place.on_gpu else ""
    tell(on_progress, f"loading draft {draft_path.name}{where}")
    draft_load = replace(load, n_gpu_layers=draft_place.n_gpu_layers)
    if options.draft == SELF_DRAFT:  # a file localspec wrote: its hint says re-derive
        from localspec.models.selfdraft import load_derived

        return load_derived(draft_path, draft_load, str(target_path), abort=abort)
    return LlamaModel(draft_path, draft_load, abort=abort)


def _check_vocabularies(
    target: LlamaModel,
    draft: LlamaModel,
    target_path: Path,
    draft_path: Path,
    on_progress: OnProgress | None,
) -> None:
    tell(on_progress, "checking that the draft's vocabulary fits the target's")
    report = check_vocabularies(target, draft)
    if not report.compatible:
        raise IncompatibleModelsError(
            f"draft {draft_path.name} cannot draft for target {target_path.name}: "
            + report.summary(),
            "pick a draft of the target's model family (localspec models list), "
            "or run without one: --drafter ngram",
        )


def _open_stores(session: Session, options: ModelOptions, on_progress: OnProgress | None) -> None:
    """Attach the datastores auto may draft from, and the history answers are kept in and
    drafted from (whether it is on is read at each answer). The tokenizer's fingerprint is
    computed only when a store or the history needs it."""
    from localspec.storage.answers import KeptAnswers
    from localspec.storage.library import HISTORY, Library, vocabulary_fingerprint

    library = Library()
    names = options.stores
    drafting = options.calibrate and names != ()  # calibrate: auto may run
    named_history = names is not None and HISTORY in names
    store_names = None if names is None else tuple(n for n in names if n != HISTORY)
    # Named stores are always opened, so that a name that does not exist is an error.
    stores = drafting and (bool(store_names) or (store_names is None and bool(library.names())))
    history = drafting and (names is None or named_history)
    if not (options.history or history or stores):
        return

    def warn(text: str) -> None:
        tell(on_progress, text, ProgressKind.WARNING)

    fingerprint = vocabulary_fingerprint(session.target, warn)
    session.answers = [
        KeptAnswers(library, fingerprint, keep=options.history, draft=history, named=named_history)
    ]
    if stores:
        opened = library.open(fingerprint, store_names)
        for warning in opened.warnings:
            warn(warning)
        if opened.stores:
            session.attach_stores(opened.stores)


def learning_store() -> LearningStore:
    from localspec.models.paths import cache_root
    from localspec.storage.learning import LearningStore

    return LearningStore(cache_root() / "learning")


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


def _learned(
    target: LlamaModel,
    draft: LlamaModel | None,
    costs: CostProfile | None,
    placement: Placement | None,
    paths: tuple[Path, Path | None],
    on_progress: OnProgress | None,
) -> tuple[tuple[LearningStore, str], dict | None]:
    """Where what the auto controller learns for this pair is kept, where it runs now (the
    same laptop with and without its GPU keeps two), and what earlier sessions learned
    there, to start from (None when nothing, or nothing usable, was kept)."""
    from localspec.statefiles import STATE_ERRORS

    store = learning_store()
    where = placement.key() if placement else ()
    key = machine_key(*(file_identity(path) for path in paths), *where)
    learned, problem = store.load(key)
    if problem:
        tell(on_progress, problem, ProgressKind.WARNING)
    if learned is None:
        return (store, key), None
    try:
        check_learned(learned, target, draft, costs)
    except STATE_ERRORS as err:  # crafted values: a number too large for a float ...
        tell(on_progress, f"ignoring malformed learned state ({err})", ProgressKind.WARNING)
        return (store, key), None
    return (store, key), learned


def _memory_warning(target: Path, draft: Path | None, n_ctx: int) -> str | None:
    from localspec.models.resources import estimate_memory

    needed, available = estimate_memory(target, draft, n_ctx)
    if available is None or needed <= available:
        return None
    gib = 1024**3
    return (
        f"the models and their KV caches need about {needed / gib:.1f} GiB, "
        f"but only {available / gib:.1f} GiB of memory is available"
    )
