"""A GGUF file's weights and vocabulary loaded by llama.cpp (``load_weights``), and the
options of a load (``LoadOptions``: the weights', and the context's its lanes share, see
backend/context.py).

Importing this module leaves llama.cpp alone: a load initialises it
(``runtime.ensure_backend``). llama.cpp's own log lines are captured, not printed; the last
ones explain a failed load. ``Weights.free`` frees them, once.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import llama_cpp

from localspec.backend.kernels import exact_kernels
from localspec.backend.runtime import clear_llama_log, ensure_backend, recent_llama_log
from localspec.errors import ModelFileError

if TYPE_CHECKING:
    from localspec.backend.lanes import LaneScheduler

# Leaves of the largest draft tree one pass verifies: each leaf takes a sequence id of its
# own, besides sequence 0, which holds the committed tokens.
MAX_TREE_SEQS = 8


@dataclass(frozen=True)
class LoadOptions:
    n_ctx: int = 4096
    n_threads: int | None = None  # None: all cores
    n_threads_batch: int | None = None
    n_gpu_layers: int = 0
    # Share of the offloaded layers per device, in llama.cpp's device order (RPC workers
    # first); empty: by each device's free memory.
    tensor_split: tuple[float, ...] = ()
    n_batch: int = 512
    n_ubatch: int = 512
    flash_attn: bool = True
    # Batch-invariant logits (see backend/kernels.py): no weight repacking, no tiled matmul,
    # flash attention over a bf16 cache. Slower; greedy output then does not depend on
    # how tokens were batched.
    exact: bool = False
    # Leaves a draft tree may have (see MAX_TREE_SEQS); 0 gives a one-sequence context that
    # cannot verify trees. Ignored in exact mode and for recurrent or hybrid models.
    tree_seqs: int = MAX_TREE_SEQS
    # Evaluate one token once loaded, so that the first step timed is like the others (see
    # LlamaModel._warm_up); a load whose steps are not timed now (costs already measured)
    # spares it.
    warm_up: bool = True
    # Greedy choices made by llama.cpp's backend sampler (token ids only come back): None
    # where the output layer is offloaded (see backend/llama.py), or always, or never.
    # Set up at load for what this model is asked: the target's ids, or a draft model's ids
    # among its target's first ``greedy_vocab`` ids (0: all) with their probabilities.
    device_greedy: bool | None = None
    greedy_confidence: bool = False
    greedy_vocab: int = 0
    # Generations the context holds at once (backend/lanes.py): a sequence range and a
    # context of ``n_ctx`` tokens each, in one unified cache.
    lanes: int = 1
    # The scheduler of the lanes these run beside (a draft model's: its target's), on whose
    # thread this context's lanes evaluate, never gathered; None: a context of several lanes
    # has a scheduler of its own.
    scheduler: LaneScheduler | None = field(default=None, compare=False)


@dataclass(eq=False)
class Weights:
    """llama.cpp's model and vocabulary handles of one file, and the answers per token its
    vocabulary keeps (a vocabulary never changes: every lane shares them)."""

    path: Path
    model: Any
    vocab: Any
    n_vocab: int
    pieces: dict[tuple[int, bool], bytes] = field(default_factory=dict)  # token_bytes
    eog: dict[int, bool] = field(default_factory=dict)  # is_eog

    def free(self) -> None:
        if self.model:
            llama_cpp.llama_model_free(self.model)
            self.model = None


def load_weights(
    path: Path, options: LoadOptions, vocab_only: bool, abort: Callable[[], bool] | None
) -> Weights:
    """Load ``path``'s weights (``vocab_only``: just its tokenizer). ``abort`` is polled while
    they load: once it returns true, llama.cpp stops and this raises ``ModelFileError``."""
    if not path.is_file():  # the models layer checks the header before a load
        raise ModelFileError(f"model file not found: {path}", "check the path")
    ensure_backend()
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = options.n_gpu_layers
    mparams.vocab_only = vocab_only
    progress = None  # the callback, alive while llama.cpp loads
    if abort is not None:
        # llama.cpp stops loading when its progress callback returns false.
        progress = llama_cpp.llama_progress_callback(lambda done, data: not abort())
        mparams.progress_callback = progress
    split = None  # alive while loading
    if options.tensor_split:
        shares = list(options.tensor_split)[: llama_cpp.LLAMA_MAX_DEVICES]
        shares += [0.0] * (llama_cpp.LLAMA_MAX_DEVICES - len(shares))
        split = (ctypes.c_float * len(shares))(*shares)
        mparams.tensor_split = split
    if options.exact and not vocab_only:
        exact_kernels()
        # Repacked weights take GEMV kernels for one row and GEMM kernels for more.
        mparams.use_extra_bufts = False
    clear_llama_log()
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
    del progress, split  # llama.cpp calls and reads them no more
    if not model and abort is not None and abort():
        raise ModelFileError(f"the load of {path.name} was stopped")
    if not model:
        raise ModelFileError(
            f"llama.cpp could not load {path}: {recent_llama_log() or 'no reason given'}",
            "the file may be truncated or corrupt; download it again",
        )
    vocab = llama_cpp.llama_model_get_vocab(model)
    return Weights(path, model, vocab, llama_cpp.llama_vocab_n_tokens(vocab))
