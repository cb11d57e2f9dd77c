"""Which pair to load: ``ModelOptions`` (the model references and how to load them) and
``resolve_pair``, which turns the references into files.

``resolve_pair(options, on_progress)`` resolves paths, catalog names and Hub references (the
default pair when none is given; fetched on first use), picks the draft a catalog target
is paired with when no ``--draft`` is given (``NO_DRAFT`` where its family has none, or where
a target file's header names another tokenizer than the default draft's). A draft of the
target's own layers (``SELF_DRAFT``: ``derives_draft``) is not resolved here but derived by a
step of its own, ``derive_self_draft`` (once per target, then cached), when the load's plan
says so (session/plan.py). Nothing is loaded here.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from localspec.backend.rpc import DEFAULT_TIMEOUT
from localspec.progress import OnProgress, ProgressKind, tell

MAX_LANES = 64  # generations at once, at most
MAX_THREADS = 512  # llama.cpp's own limit (GGML_MAX_N_THREADS): past it, it crashes
# A context past any model's trained one: a larger --ctx is a mistake, not a wish (the input
# a context can hold is read into memory before the model loads).
MAX_CTX = 1 << 21
AUTO_LANES_GPU = 4  # with the target on a GPU, where one batch verifies several rounds
AUTO_LANES_CPU = 2  # on the CPU, whose cores one generation fills: an editor and a chat


class ModelOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    target: str | None = None  # path, catalog name or repo_id:filename; None = default
    # A path, catalog name or repo_id:filename; "self" (SELF_DRAFT): a draft derived from the
    # target's own layers (localspec models derive-draft), derived on first use and cached.
    draft: str | None = None
    use_draft: bool = True  # False skips loading the draft model (drafter none / ngram)
    # True where the drafter may draft without the draft model (auto): it is loaded only
    # where this machine's costs say it may pay, or once a drafter needs it (loading.py).
    draft_on_demand: bool = False
    threads: int | None = Field(None, ge=1, le=MAX_THREADS)
    n_ctx: int = Field(4096, ge=64, le=MAX_CTX)
    # Generations the pair runs at once (a server's --parallel): a context of n_ctx tokens
    # each, in one cache per model (backend/lanes.py); 0: as suits where the target runs.
    lanes: int = Field(1, ge=0, le=MAX_LANES)
    # The target's layers on the GPU: None is auto (all where they fit, see
    # machine/placement.py; with rpc, all on the workers), -1 all, n that many.
    n_gpu_layers: int | None = Field(None, ge=-1)
    # The draft's: None follows the target's policy in the room it leaves; with rpc the
    # draft stays on this machine's CPU.
    draft_gpu_layers: int | None = Field(None, ge=-1)
    flash_attn: bool = True
    # llama.cpp RPC workers ("host:port") that run the target's offloaded layers; the draft
    # stays on this machine's CPU. An evaluation waiting longer than rpc_timeout is a loss.
    rpc: tuple[str, ...] = ()
    rpc_timeout: float = Field(DEFAULT_TIMEOUT, gt=0)
    rpc_split: tuple[float, ...] = ()  # share of the layers per worker; () by their memory
    # Batch-invariant target kernels: greedy output identical to plain decoding's, token
    # for token, whatever was drafted (slower; see backend.llama.exact_kernels).
    exact: bool = False
    calibrate: bool = True  # measure (or load cached) step costs for the controller
    recalibrate: bool = False  # measure even when a cached profile exists
    learn: bool = True  # restore and save what auto learned, per pair (with calibrate)
    # Datastores auto drafts from: None, every store built with the target's tokenizer
    # (the history of answers included); (), none; else those names ("history" included).
    stores: tuple[str, ...] | None = None
    history: bool = True  # add each finished answer to the history store (if it is on)
    show_download_progress: bool = True
    # The prompt cache's tiers (session/prompt_state.py): "memory" for a running process,
    # "disk" for what outlives it; () keeps none. Each bounded by prompt_cache_size bytes
    # (None: from this machine's memory and free disk).
    prompt_cache_tiers: tuple[str, ...] = ()
    prompt_cache_size: int | None = Field(None, ge=0)
    # Where greedy choices are made: None as suits where the output layer runs, True on the
    # device, False from rows on the host (a front end reads LOCALSPEC_DEVICE_VERIFY).
    device_verify: bool | None = None
    # Save what auto learns for the next session (with learn): False restores it and saves
    # nothing (a script's, a server's of several clients).
    save_learning: bool = True


def resolve_pair(
    options: ModelOptions, on_progress: OnProgress | None = None
) -> tuple[Path, Path | None]:
    """The target's file and the draft's (None: no draft model, or one that
    ``derives_draft`` says is derived from the target)."""
    from localspec.models.catalog import resolve_model

    # A front end that draws its own screen (no rich bars) gets a fetch's notes and shares.
    shown = True if options.show_download_progress else (on_progress or False)
    tell(on_progress, "locating the target model (fetched on first use, which can take minutes)")
    target = resolve_model(options.target, "target", progress=shown)
    draft = None
    if options.use_draft:
        ref = options.draft if options.draft else _paired_draft(options.target)
        if ref is None and options.target:  # a file or Hub reference: the default draft?
            ref = _default_draft_for(target, on_progress)
        if ref not in (NO_DRAFT, SELF_DRAFT):
            tell(on_progress, "locating the draft model (fetched on first use)")
            draft = resolve_model(ref, "draft", progress=shown)
    return target, draft


NO_DRAFT = ""  # a target whose model family has no draft: auto drafts by copying alone
SELF_DRAFT = "self"  # --draft self: a draft of the target's own layers


def derives_draft(options: ModelOptions) -> bool:
    """Whether the pair's draft is derived from the target's own layers (``--draft self``)."""
    return options.use_draft and options.draft == SELF_DRAFT


def derive_self_draft(target: Path, threads: int | None, on_progress: OnProgress | None) -> Path:
    """The target's derived draft: cached, or measured and written now (once per target)."""
    from localspec.models.selfdraft import cached_derived, derived_draft

    if cached_derived(target) is None:
        tell(on_progress, "deriving a draft from the target's own layers (once per target; "
             "measures which layers to keep, about two minutes)")  # fmt: skip
    return derived_draft(target, threads=threads, on_progress=on_progress).path


# The tokenizer (GGUF ``tokenizer.ggml.model`` and ``.pre``) of each catalog family's models,
# as llama.cpp's converter writes it: a target's header says whether the default draft fits.
FAMILY_TOKENIZERS = {"qwen2": ("gpt2", "qwen2"), "llama3": ("gpt2", "llama-bpe"),
                     "smollm2": ("gpt2", "smollm")}  # fmt: skip


def _default_draft_for(target: Path, on_progress: OnProgress | None) -> str | None:
    """None (the catalog's default draft) for a target file or Hub reference whose header
    names the default draft's tokenizer, or where that draft is on this machine already (its
    load checks the vocabularies); ``NO_DRAFT`` where the header says it cannot fit, so that
    it is never downloaded only to be refused (auto drafts by copying without it)."""
    from localspec.models.catalog import default_name, load_catalog, locate_model
    from localspec.models.gguf import read_metadata

    name = default_name("draft")
    entry = load_catalog().get(name)
    wanted = FAMILY_TOKENIZERS.get(entry.family) if entry is not None else None
    if wanted is None or locate_model(name, "draft") is not None:
        return None
    try:
        header = read_metadata(target)
    except (OSError, ValueError):  # the target's load says what is wrong with it
        return None
    found = (header.get("tokenizer.ggml.model"), header.get("tokenizer.ggml.pre"))
    if found == wanted:
        return None
    tell(on_progress, f"no draft model: the default draft {name} does not share "
         f"{target.name}'s tokenizer (auto drafts by copying; --draft names one that does)",
         ProgressKind.WARNING)  # fmt: skip
    return NO_DRAFT


def _paired_draft(target: str | None) -> str | None:
    """The draft for a target named without ``--draft``: a catalog target's (or a model
    optimized from one) recommended draft, ``NO_DRAFT`` where its family has none; None
    (the catalog's default draft) for the default target, a file or a Hub reference."""
    from localspec.models.catalog import load_catalog, load_registry, pair_for

    if not target or (load_catalog().get(target) is None and target not in load_registry()):
        return None
    return pair_for(target) or NO_DRAFT
