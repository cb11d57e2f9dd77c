"""The composition root: ``open_session(options, on_progress, on_lost)`` loads a
target/draft pair and returns the ``Session`` around it.

It reads as its two steps: plan the load (``plan.plan_load``: which files, where each model
runs, when the draft model loads, what is measured and learned), then carry the plan out:
connect to the RPC workers if any, load both models with the same context size, check that
the draft's vocabulary fits the target's (llama.cpp's rules), calibrate (this machine's
costs, measured once per pair and cached on disk: ``costcache``), restore what ``auto``
learned for the pair (``storage.learning``; a damaged or foreign state file is ignored with
a warning), open the prompt cache, and attach the user's datastores built with the target's
tokenizer and the history of answers (``storage``; a damaged store is left out with a
warning); the ``Session`` is built with all of it. A model loaded before a step fails is
freed before the error goes on. RPC workers lost mid-evaluation are reported to ``on_lost``
from another thread; by default that ends the process with a ``WorkersLostError``, reported
as every error is (``errors.exit_with``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localspec.backend.compat import check_vocabularies
from localspec.backend.llama import LlamaModel, LoadOptions, exact_kernels
from localspec.backend.rpc import RpcLink, attach
from localspec.core.costs import CostProfile
from localspec.core.engine import check_learned
from localspec.errors import IncompatibleModelsError, WorkersLostError, exit_with
from localspec.machine.calibrate import file_identity, machine_key
from localspec.machine.costcache import step_costs
from localspec.models.resources import model_name
from localspec.progress import OnProgress, ProgressKind, tell
from localspec.session.loading import DraftPlan, DraftSlot, Loading
from localspec.session.pair import ModelOptions
from localspec.session.plan import LoadPlan, plan_load

if TYPE_CHECKING:  # imported while the target loads (see _load_pair)
    from localspec.session.session import Session
    from localspec.storage.answers import KeptAnswers
    from localspec.storage.learning import LearningStore

# Modules the session needs once the target is loaded (the engine, its drafters, the
# stores): imported while it loads, which llama.cpp does without Python's lock.
WHILE_LOADING = ("localspec.session.session", "localspec.storage.answers")

LostHandler = Callable[[str], None]


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
    return open_planned(plan_load(options, on_progress), on_progress, on_lost)


def open_planned(
    plan: LoadPlan, on_progress: OnProgress | None, on_lost: LostHandler = _exit_on_loss
) -> Session:
    """Carry ``plan`` out: the pair loaded, and the ``Session`` around it."""
    rpc = _connect(plan, on_lost, on_progress)
    _warn_before_loading(plan, rpc, on_progress)
    target, slot, costs, costs_file = _load_pair(plan, rpc, on_progress)
    from localspec.session.prompt_state import open_prompt_state
    from localspec.session.session import Session

    draft = slot.model if slot is not None else None
    learned = _learned(plan, target, draft, costs, on_progress) if plan.restores_learning else None
    options = plan.options
    prompt_state = open_prompt_state(
        options.prompt_cache_tiers, options.prompt_cache_size, target, plan.draft,
        costs.plain_s if costs is not None else None,
    )  # fmt: skip
    try:
        answers, stores = _open_stores(target, options, on_progress)
    except BaseException:  # a --store that names nothing: the models are not kept loaded
        _free(target, slot, rpc)
        raise
    return Session(
        target, None, costs, costs_file, learned[0] if learned and plan.saves_learning else None,
        rpc=rpc, placement=plan.placement, slot=slot, derived=plan.derived,
        restored=learned[1] if learned else None, prompt_state=prompt_state, answers=answers,
        stores=stores,
    )  # fmt: skip


def _free(target: LlamaModel, slot: DraftSlot | None, rpc: RpcLink | None) -> None:
    """Free what was loaded for a session that will not open."""
    if rpc is not None and rpc.lost:
        return  # freeing a target whose workers are gone would wait on them forever
    target.close()
    if slot is not None:
        slot.close()
    if rpc is not None:
        rpc.close()


def _connect(
    plan: LoadPlan, on_lost: LostHandler, on_progress: OnProgress | None
) -> RpcLink | None:
    """The link to the RPC workers the target's layers go to; None without ``--rpc``."""
    if not plan.endpoints:
        return None
    tell(on_progress, f"connecting to RPC workers {', '.join(map(str, plan.endpoints))}")
    return attach(list(plan.endpoints), plan.options.rpc_timeout, on_lost)


def _warn_before_loading(
    plan: LoadPlan, rpc: RpcLink | None, on_progress: OnProgress | None
) -> None:
    for notice in plan.placement.notices:
        tell(on_progress, notice, ProgressKind.WARNING)
    if not rpc and not plan.placement.target.on_gpu:
        n_ctx = plan.options.n_ctx * plan.options.lanes
        memory_warning = _memory_warning(plan.target, plan.draft_now, n_ctx)
        if memory_warning:  # said before loading, which may be what runs out of memory
            tell(on_progress, memory_warning, ProgressKind.WARNING)


def _load_pair(
    plan: LoadPlan, rpc: RpcLink | None, on_progress: OnProgress | None
) -> tuple[LlamaModel, DraftSlot | None, CostProfile | None, Path | None]:
    """The target loaded, the draft loaded now, or in the background, or left for later as
    the plan says (checked against the target once loaded), and their costs; what was
    loaded is freed again if a later step fails."""
    _say_loading(plan, rpc, on_progress)
    loading = Loading(lambda: _load_target(plan.target_load, rpc, plan.target))
    try:
        for module in WHILE_LOADING:
            importlib.import_module(module)
    finally:
        target = loading.result()
    slot = None
    try:
        if plan.draft is not None and plan.decision is not None:
            slot = _draft_slot(plan, target, on_progress)
        draft = slot.model if slot is not None else None
        costs, costs_file = step_costs(
            plan.options, plan.placement, target, draft, plan.target, plan.draft, on_progress
        )
    except BaseException:
        target.close()
        if slot is not None:
            slot.close()
        raise
    if slot is not None and slot.decision.plan is DraftPlan.BACKGROUND:
        slot.start()
    return target, slot, costs, costs_file


def _draft_slot(plan: LoadPlan, target: LlamaModel, on_progress: OnProgress | None) -> DraftSlot:
    """The draft's slot: loaded and checked now (``NOW``), or with a loader that does so
    later, quietly, in whatever thread asks."""
    draft_path, decision = plan.draft, plan.decision
    assert draft_path is not None and decision is not None
    load = plan.draft_load(target.n_vocab, target.shared.scheduler)

    def loader(abort: Callable[[], bool], report: OnProgress | None = None) -> LlamaModel:
        draft = _load_draft(plan, load, report, abort)
        try:
            _check_vocabularies(target, draft, report)
        except BaseException:
            draft.close()
            raise
        return draft

    if decision.plan is DraftPlan.NOW:
        model = loader(lambda: False, on_progress)
        return DraftSlot(draft_path, decision, model=model)
    return DraftSlot(draft_path, decision, loader, label=model_name(draft_path))


def _say_loading(plan: LoadPlan, rpc: RpcLink | None, on_progress: OnProgress | None) -> None:
    where = f" onto {len(plan.endpoints)} RPC worker(s)" if rpc else ""
    if not rpc and plan.placement.target.on_gpu:
        where = f" onto {plan.placement.target.summary()}"
    tell(on_progress, f"loading target {plan.target.name}{where}")


def _load_target(load: LoadOptions, rpc: RpcLink | None, target_path: Path) -> LlamaModel:
    target = LlamaModel(target_path, load)
    if rpc is not None:
        rpc.watch(target)
    return target


def _load_draft(
    plan: LoadPlan,
    load: LoadOptions,
    on_progress: OnProgress | None,
    abort: Callable[[], bool] | None = None,
) -> LlamaModel:
    draft_path, draft_place = plan.draft, plan.placement.draft
    assert draft_path is not None and draft_place is not None
    where = f" onto {draft_place.summary()}" if draft_place.on_gpu else ""
    tell(on_progress, f"loading draft {draft_path.name}{where}")
    if plan.derived:  # a file localspec wrote: its hint says re-derive
        from localspec.models.selfdraft import load_derived

        return load_derived(draft_path, load, str(plan.target), abort=abort)
    return LlamaModel(draft_path, load, abort=abort)


def _check_vocabularies(
    target: LlamaModel, draft: LlamaModel, on_progress: OnProgress | None
) -> None:
    tell(on_progress, "checking that the draft's vocabulary fits the target's")
    report = check_vocabularies(target, draft)
    if not report.compatible:
        raise IncompatibleModelsError(
            f"draft {draft.path.name} cannot draft for target {target.path.name}: "
            + report.summary(),
            "pick a draft of the target's model family (localspec models list), "
            "or run without one: --drafter ngram",
        )


def _open_stores(
    target: LlamaModel, options: ModelOptions, on_progress: OnProgress | None
) -> tuple[list[KeptAnswers], list[tuple[str, Any]]]:
    """The histories answers are kept in and drafted from (whether it is on is read at each
    answer), and the datastores auto may draft from. The tokenizer's fingerprint is
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
        return [], []

    def warn(text: str) -> None:
        tell(on_progress, text, ProgressKind.WARNING)

    fingerprint = vocabulary_fingerprint(target, warn)
    answers = [
        KeptAnswers(library, fingerprint, keep=options.history, draft=history, named=named_history)
    ]
    if not stores:
        return answers, []
    opened = library.open(fingerprint, store_names)
    for warning in opened.warnings:
        warn(warning)
    return answers, list(opened.stores)


def learning_store() -> LearningStore:
    from localspec.models.paths import cache_root
    from localspec.storage.learning import LearningStore

    return LearningStore(cache_root() / "learning")


def _learned(
    plan: LoadPlan,
    target: LlamaModel,
    draft: LlamaModel | None,
    costs: CostProfile | None,
    on_progress: OnProgress | None,
) -> tuple[tuple[LearningStore, str], dict | None]:
    """Where what the auto controller learns for this pair is kept, where it runs now (the
    same laptop with and without its GPU keeps two), and what earlier sessions learned
    there, to start from (None when nothing, or nothing usable, was kept)."""
    from localspec.statefiles import STATE_ERRORS

    store = learning_store()
    paths = (plan.target, plan.draft)
    key = machine_key(*(file_identity(path) for path in paths), *plan.placement.key())
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
