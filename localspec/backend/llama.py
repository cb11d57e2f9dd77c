"""Load a GGUF model with llama.cpp and drive it token by token.

``LlamaModel`` is a ``CachedModel``: ``forward`` evaluates a batch on sequence 0 and returns
logits only for the positions asked for (prefill asks for none), and rolls the KV cache back
with ``llama_memory_seq_rm``. Asked for greedy choices (``greedy_after``, ``greedy_tree``),
it lets llama.cpp's backend sampler pick them where the logits are computed
(``backend/sampling.py``): only token ids come back, no logits row (``greedy_where`` is
``"device"``). It does so by default where its output layer runs on a GPU (or an RPC
worker); on the CPU a row's copy is a memcpy, and llama.cpp's sampling graph costs more than
it saves (a scalar argmax over the vocabulary and a padded copy of the logits, about half a
millisecond a step with Qwen2.5's vocabulary), so there it reads rows
(``LoadOptions.device_greedy`` chooses either way). Its rows are read-only views of
llama.cpp's own logits buffer (``borrowed_rows``): ``forward`` copies them unless the caller
borrows them, which the engine does for rows it consumes before the next evaluation (no copy
of n_vocab floats a row on every step). It verifies draft trees too (``forward_tree``), with
sequence ids as branch tags in one unified cache (``backend/trees.py``). Its vocabulary side
(tokenizing, token bytes, GGUF metadata, fill-in-the-middle tokens) is ``LlamaVocabulary``
(backend/vocab.py).

Importing this module leaves llama.cpp alone: the first load initialises it
(``runtime.ensure_backend``). llama.cpp's own log lines are captured, not printed; the last
ones explain a failed load.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

from localspec.backend.lanes import Slice, Turns
from localspec.backend.runtime import clear_llama_log, ensure_backend, recent_llama_log
from localspec.backend.sampling import DeviceGreedy
from localspec.backend.trees import TreeBatches
from localspec.backend.vocab import LlamaVocabulary
from localspec.core.cached_model import DEVICE, HOST, CachedModel, Greedy, greedy_ids
from localspec.core.sampling import top_probabilities
from localspec.errors import BackendError, ModelFileError

# Exact mode keeps keys and values in bf16. llama.cpp's CPU flash attention has two kernels
# for f16/f32 caches that sum in another order than its row-by-row kernel: a split over the
# cache for a lone query row once it holds 512 cells, and a tiled one from 64 query rows.
# Any other cache type always takes the row-by-row kernel.
GGML_TYPE_BF16 = 30
# Set to "0", llama.cpp's CPU backend skips its tiled K-quant matmul (taken for batches of 8
# rows or more), whose sums differ from the per-row dot products. Read once per process, at
# the first matrix multiplication.
TILED_MM_SWITCH = "GGML_CPU_TILED_MM"
# Rows of the load-time check: the tiled matmul starts at 8.
EXACT_CHECK_ROWS = 9
# Leaves of the largest draft tree one pass verifies: each leaf takes a sequence id of its
# own, besides sequence 0, which holds the committed tokens.
MAX_TREE_SEQS = 8
LLAMA_MAX_SEQ = 256  # llama.cpp's cap on sequence ids (src/llama-cparams.h)
_decoded = False  # whether this process has evaluated anything yet (see exact_kernels)
_tiled_off = False  # whether the switch was off when llama.cpp read it, at the first decode
_switched = False  # whether exact_kernels set the switch (rather than the user)


def _note_decoded() -> None:
    global _decoded, _tiled_off
    if not _decoded:
        _decoded = True
        _tiled_off = os.environ.get(TILED_MM_SWITCH) == "0"


def exact_kernels() -> None:
    """Choose llama.cpp's batch-invariant CPU kernels for this process, before any decode.

    The tiled-matmul switch is read once per process, so it can no longer change after a
    first evaluation; ``BackendError`` then, unless it was already off at that evaluation
    (what the environment says now does not matter any more)."""
    if _decoded:
        if _tiled_off:
            return
        raise BackendError(
            "exact mode must be chosen before this process evaluates anything",
            "start a new process with --exact",
        )
    if os.environ.get(TILED_MM_SWITCH) == "0":
        return
    os.environ[TILED_MM_SWITCH] = "0"
    global _switched
    _switched = True


def default_kernels_environ() -> dict[str, str]:
    """This process's environment without the switch ``exact_kernels`` set, for child
    processes (llama.cpp's own tools in the bench) that should run their usual kernels."""
    env = dict(os.environ)
    if _switched:
        env.pop(TILED_MM_SWITCH, None)
    return env


def _stateful(model: llama_cpp.llama_model_p) -> bool:
    """Whether the model keeps a recurrent state per sequence (recurrent or hybrid)."""
    return bool(llama_cpp.llama_model_is_recurrent(model)) or bool(
        llama_cpp.llama_model_is_hybrid(model)
    )


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
    # Batch-invariant logits (see exact_kernels): no weight repacking, no tiled matmul,
    # flash attention over a bf16 cache. Slower; greedy output then does not depend on
    # how tokens were batched.
    exact: bool = False
    # Leaves a draft tree may have (see MAX_TREE_SEQS); 0 gives a one-sequence context that
    # cannot verify trees. Ignored in exact mode and for recurrent or hybrid models.
    tree_seqs: int = MAX_TREE_SEQS
    # Evaluate one token once loaded, so that the first step timed is like the others (see
    # _warm_up); a load whose steps are not timed now (costs already measured) spares it.
    warm_up: bool = True
    # Greedy choices made by llama.cpp's backend sampler (token ids only come back): None
    # where the output layer is offloaded (see the module docstring), or always, or never.
    # Set up at load for what this model is asked: the target's ids, or a draft model's ids
    # among its target's first ``greedy_vocab`` ids (0: all) with their probabilities.
    device_greedy: bool | None = None
    greedy_confidence: bool = False
    greedy_vocab: int = 0
    # Generations the context holds at once (backend/lanes.py): a sequence range and a
    # context of ``n_ctx`` tokens each, in one unified cache.
    lanes: int = 1


class LlamaModel(LlamaVocabulary, TreeBatches, CachedModel):
    def __init__(
        self,
        path: Path,
        options: LoadOptions = LoadOptions(),
        *,
        vocab_only: bool = False,
        abort: Callable[[], bool] | None = None,
    ) -> None:
        """Load weights and create a context; ``vocab_only`` loads just the tokenizer.
        ``abort`` is polled while the weights load: once it returns true, llama.cpp stops
        the load and this raises ``ModelFileError`` (a background load nobody waits for)."""
        super().__init__()
        self._home = self  # the model that owns the context (a lane's: lane 0's)
        self._turns: Turns | None = None  # how the lanes share the context (see use_turns)
        self._gather_here = True  # whether this context's batches are gathered (use_turns)
        self.lanes = 1
        self._seq0 = 0  # this lane's sequence of committed tokens
        self.compute_seconds = 0.0  # time inside llama_decode (the bench, the stats' overhead)
        self.refills = 0  # rollbacks done by re-evaluating the prefix (see _remove_from)
        self.busy_since: float | None = None  # monotonic start of a running llama_decode
        self.path = Path(path)
        if not self.path.is_file():  # the models layer checks the header before a load
            raise ModelFileError(f"model file not found: {self.path}", "check the path")
        self._model = None
        self._ctx = None
        self._batch = None
        self._device: DeviceGreedy | None = None  # greedy choices on the device
        # The last view of the logits buffer: its address, its rows, the view (see _rows).
        self._logits: tuple[int, int, np.ndarray] | None = None
        self._pieces = {}  # token_bytes, once per token
        self._eog = {}  # is_eog, once per token
        self.exact = options.exact and not vocab_only
        self.tree_seqs = 0  # leaves a draft tree may have (see _tree_capacity)
        self._load_weights(options, vocab_only, abort)
        if vocab_only:
            self.n_ctx = 0
            return
        self._create_context(options)
        # What a saved sequence of this context depends on besides the model file (see
        # state_recipe).
        self._recipe = {
            "exact": self.exact, "flash_attn": options.flash_attn or self.exact,
            "gpu_layers": options.n_gpu_layers, "tensor_split": list(options.tensor_split),
            "llama_cpp": llama_cpp.__version__,
        }  # fmt: skip
        if self.exact:
            self._check_batch_invariance()
        # Device greedy choices are set up by the warm-up pass, which a load whose costs are
        # already measured spares otherwise.
        if options.warm_up or self._device is not None:
            self._warm_up(options)

    def _load_weights(
        self, options: LoadOptions, vocab_only: bool, abort: Callable[[], bool] | None = None
    ) -> None:
        ensure_backend()
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = options.n_gpu_layers
        mparams.vocab_only = vocab_only
        progress = None  # the callback, alive while llama.cpp loads
        if abort is not None:
            # llama.cpp stops loading when its progress callback returns false.
            progress = llama_cpp.llama_progress_callback(lambda done, data: not abort())
            mparams.progress_callback = progress
        if options.tensor_split:
            split = list(options.tensor_split)[: llama_cpp.LLAMA_MAX_DEVICES]
            split += [0.0] * (llama_cpp.LLAMA_MAX_DEVICES - len(split))
            self._split = (ctypes.c_float * len(split))(*split)  # alive while loading
            mparams.tensor_split = self._split
        if self.exact:
            exact_kernels()
            # Repacked weights take GEMV kernels for one row and GEMM kernels for more.
            mparams.use_extra_bufts = False
        clear_llama_log()
        model = llama_cpp.llama_model_load_from_file(str(self.path).encode(), mparams)
        del progress  # llama.cpp calls it no more
        if not model and abort is not None and abort():
            raise ModelFileError(f"the load of {self.path.name} was stopped")
        if not model:
            raise ModelFileError(
                f"llama.cpp could not load {self.path}: {recent_llama_log() or 'no reason given'}",
                "the file may be truncated or corrupt; download it again",
            )
        self._model = model
        self._vocab = llama_cpp.llama_model_get_vocab(model)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(self._vocab)

    def _create_context(self, options: LoadOptions) -> None:
        cparams = self._context_params(options)
        ctx = llama_cpp.llama_init_from_model(self._model, cparams)
        if not ctx:
            self.close()
            raise BackendError(
                f"llama.cpp could not create a context of {options.n_ctx} tokens for "
                f"{self.path.name}: {recent_llama_log() or 'no reason given'}",
                "try a smaller --ctx",
            )
        self._ctx = ctx
        self._memory = llama_cpp.llama_get_memory(ctx)
        self.n_ctx = llama_cpp.llama_n_ctx(ctx) // self.lanes
        self.n_batch = cparams.n_batch
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, cparams.n_seq_max)
        if self._device is not None:
            self._device.bind(ctx)

    @property
    def greedy_where(self) -> str:  # type: ignore[override]
        return DEVICE if self._device is not None else HOST

    # The device's samplers are the context's, whichever lane sets them up.
    @property
    def _device(self) -> DeviceGreedy | None:
        return self._home.__dict__.get("_device_greedy")

    @_device.setter
    def _device(self, device: DeviceGreedy | None) -> None:
        self._home.__dict__["_device_greedy"] = device

    # -- lanes (backend/lanes.py) -----------------------------------------------------------

    def lane(self, i: int) -> LlamaModel:
        """Lane ``i`` of this context (0: this model itself): a model of its own, with its
        own cached tokens, over the same context and weights. Freed with lane 0."""
        if not 0 <= i < self.lanes:
            raise ValueError(f"lane {i} of a context with {self.lanes} lane(s)")
        if i == 0:
            return self
        lanes = self.__dict__.setdefault("_lane_models", {})
        if i not in lanes:
            view = copy.copy(self)
            CachedModel.__init__(view)
            view._seq0 = i * (1 + self.tree_seqs)
            view._logits = None
            view.compute_seconds = 0.0
            view.refills = 0
            view.busy_since = None
            view.__dict__.pop("_lane_models", None)
            lanes[i] = view
        return lanes[i]

    def use_turns(self, turns: Turns | None, *, gather: bool = True) -> None:
        """The lanes of this context run under ``turns``, their evaluations on its thread,
        their batches gathered where ``turns.gather`` and ``gather`` say so; None: each lane
        evaluates on its own."""
        home = self._home
        home._turns, home._gather_here = turns, gather
        for view in home.__dict__.get("_lane_models", {}).values():
            view._turns, view._gather_here = turns, gather

    def _context_params(self, options: LoadOptions):
        """llama.cpp's context parameters for ``options``; sets ``tree_seqs``."""
        threads = options.n_threads or os.cpu_count() or 1
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = options.n_ctx
        cparams.n_batch = min(options.n_batch, options.n_ctx)
        cparams.n_ubatch = min(options.n_ubatch, cparams.n_batch)
        if options.lanes < 1:
            raise ValueError(f"lanes must be 1 or more, not {options.lanes}")
        self.lanes = options.lanes
        cparams.n_ctx = options.n_ctx * self.lanes
        self.tree_seqs = self._tree_capacity(options, cparams.n_batch, _stateful(self._model))
        cparams.n_seq_max = self.lanes * (1 + self.tree_seqs)
        # One cache for all sequences, a sequence id being a tag on a cell: without it
        # llama.cpp splits the context into n_seq_max streams of n_ctx / n_seq_max cells.
        cparams.kv_unified = cparams.n_seq_max > 1
        cparams.n_threads = threads
        cparams.n_threads_batch = options.n_threads_batch or threads
        cparams.flash_attn_type = (
            llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
            if options.flash_attn or self.exact
            else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
        )
        if self.exact:
            cparams.type_k = cparams.type_v = GGML_TYPE_BF16
        if self._greedy_on_device(options):
            vocab = options.greedy_vocab or self.n_vocab
            self._device = DeviceGreedy(
                cparams.n_seq_max, vocab, confidence=options.greedy_confidence
            )
            cparams.samplers, cparams.n_samplers = self._device.configs()
            cparams.n_outputs_max_per_seq = cparams.n_batch  # a batch may be one sequence's
        return cparams

    def _greedy_on_device(self, options: LoadOptions) -> bool:
        """Whether greedy choices are made by the backend sampler (see ``LoadOptions``)."""
        if options.device_greedy is not None:
            return options.device_greedy
        offloaded = options.n_gpu_layers > llama_cpp.llama_model_n_layer(self._model)
        return offloaded and bool(llama_cpp.llama_supports_gpu_offload())

    def _tree_capacity(self, options: LoadOptions, n_batch: int, stateful: bool) -> int:
        """Sequence ids for tree leaves: none in exact mode (batch invariance is checked for
        chains only) nor for recurrent or hybrid models, whose state per sequence cannot
        drop a branch. llama.cpp keeps a logits row per sequence, and at most n_batch."""
        if options.tree_seqs < 0:
            raise ValueError(f"tree_seqs must be 0 or more, not {options.tree_seqs}")
        if self.exact or stateful:
            return 0
        per_lane = LLAMA_MAX_SEQ // self.lanes - 1
        return max(0, min(options.tree_seqs, per_lane, n_batch - 1))

    def _warm_up(self, options: LoadOptions) -> None:
        """Evaluate one token with logits and forget it, as llama.cpp's tools do before
        timing: the first pass maps every weight (the output layer too, which a prefill
        without logits never touches) and picks kernels, which the first step would pay.
        With device greedy choices, the pass sets their samplers up as this model will be
        asked (see ``LoadOptions``)."""
        first = [self.vocab_info().bos if self.vocab_info().bos >= 0 else 0]
        if self._device is not None:
            found = self.greedy(
                first, 1, confidence=options.greedy_confidence, vocab=options.greedy_vocab
            )
            if found.ids[0] < 0 and self._device is not None:  # the backend took no chain
                self._device.detach()
                self._device = None
        else:
            self.forward(first, 1)
        self.reset()
        self.evaluated_tokens = 0
        self.compute_seconds = 0.0

    def _check_batch_invariance(self, rows: int = EXACT_CHECK_ROWS) -> None:
        """Exact mode's promise, checked on this model and machine before it is relied on:
        ``rows`` tokens evaluated one by one give bitwise the logits of the same tokens in
        one batch. Some weight types (f32, f16) take kernels that depend on the batch."""
        vocab = self.vocab_info()
        tokens = [(vocab.bos if vocab.bos >= 0 else 0)] + [
            (17 * i + 3) % self.n_vocab for i in range(rows)
        ]
        alone = np.concatenate([self.forward(tokens[: i + 2], 1) for i in range(rows)])
        self.truncate(1)
        batch = self.forward(tokens, rows)
        self.reset()
        self.evaluated_tokens = 0
        self.compute_seconds = 0.0
        if not np.array_equal(alone, batch):
            gap = float(np.max(np.abs(alone - batch)))
            self.close()
            raise BackendError(
                f"exact mode is not available for {self.path.name} on this machine: its "
                f"logits depend on the batch (up to {gap:.3g} apart)",
                "use a K-quant of the model (e.g. Q4_K_M), or run without --exact",
            )

    # -- evaluation ---------------------------------------------------------------------

    # Rows are views of llama.cpp's logits buffer, which the next llama_decode overwrites.
    borrowed_rows = True

    def _evaluate(self, tokens: list[int], n_logits: int) -> np.ndarray:
        if n_logits and self._device is not None:
            self._device.detach()  # rows are wanted: llama.cpp copies them again
        start = len(self.cached)
        total = len(tokens)
        first_logit = total - n_logits  # index in ``tokens`` of the first logits row
        rows: list[np.ndarray] = []
        for off in range(0, total, self.n_batch):
            size = min(self.n_batch, total - off)
            chunk = tokens[off : off + size] if size < total else tokens
            out = self._decode(chunk, start + off, first_logit - off)
            if out is not None:
                # Only the last chunk's rows outlive the decodes after them as views.
                rows.append(out if off + size == total else out.copy())
        if not rows:
            return np.empty((0, self.n_vocab), dtype=np.float32)
        return rows[0] if len(rows) == 1 else np.concatenate(rows)

    def _evaluate_greedy(self, tokens: list[int], n: int, confidence: bool, vocab: int) -> Greedy:
        device = self._device_for(confidence, vocab)
        if device is None:
            return super()._evaluate_greedy(tokens, n, confidence, vocab)
        start, total = len(self.cached), len(tokens)
        ids: list[int] = []
        probs: list[float] = []
        for off in range(0, total, self.n_batch):
            chunk = tokens[off : off + self.n_batch]
            found = self._decode(chunk, start + off, total - n - off, greedy=True)
            ids += found[0]
            probs += found[1]
        return Greedy(ids, probs if confidence else None)

    def _device_for(self, confidence: bool, vocab: int) -> DeviceGreedy | None:
        """The device's samplers, attached and able to answer (set up anew when they were
        set up for other questions); None where the backend cannot run them, from then on."""
        device = self._device
        if device is None:
            return None
        if device.vocab != vocab or (confidence and not device.confidence):
            device.detach()
            device = DeviceGreedy(device.seqs, vocab, confidence=confidence)
            device.bind(self._ctx)
            self._device = device
        if not device.attach():
            self._device = None
        return self._device

    def _decode(self, chunk: list[int], pos: int, first_logit: int, *, greedy: bool = False) -> Any:
        """One ``llama_decode`` of ``chunk`` at positions ``pos``...; logits rows for its
        tokens from index ``first_logit`` on (none when it is past the chunk's end), or
        with ``greedy`` the device's choices for them (ids, and probabilities where its
        samplers give them). A lane that gathers parks it with the other lanes' instead."""
        want = max(0, len(chunk) - max(0, first_logit))
        try:
            if self._gathers:
                outputs = [j >= first_logit for j in range(len(chunk))]
                positions = list(range(pos, pos + len(chunk)))
                return self._gathered(Slice(list(chunk), positions, [(self._seq0,)] * len(chunk),
                                            outputs, device=greedy))  # fmt: skip
            b = self._batch
            assert b is not None
            b.n_tokens = len(chunk)
            token, position, n_seq_id, seq_id, logits = (
                b.token, b.pos, b.n_seq_id, b.seq_id, b.logits
            )  # fmt: skip
            seq = self._seq0
            for j, tok in enumerate(chunk):
                token[j] = tok
                position[j] = pos + j
                n_seq_id[j] = 1
                seq_id[j][0] = seq
                logits[j] = j >= first_logit
            rows = self._run_batch(pos, want, greedy=greedy)
            return self._device_choices(want) if greedy else rows
        except BackendError:
            # Drop whatever part of the batch made it in, so the cache matches ``cached``.
            rm_from = min(pos, len(self.cached))
            self._remove_from(rm_from)
            del self.cached[rm_from:]
            self.changes += 1
            raise

    def _device_choices(self, n: int) -> tuple[list[int], list[float]]:
        """The device's choices for the last decode's last ``n`` outputs."""
        device = self._device
        if device is None or not n:
            return [], []
        probs = device.probabilities(n) if device.confidence else []
        return device.tokens(n), probs

    def _gathered(self, work: Slice) -> Any:
        """``work`` evaluated with the other lanes' parked batches (backend/lanes.py): its
        rows, or its device choices; its share of the time counted as this lane's."""
        if work.device and self._device is not None:
            work.confidence = self._device.confidence
        assert self._turns is not None
        result, share_s = self._turns.park(work, self._home._evaluate_slices)
        self.compute_seconds += share_s
        return result

    def _evaluate_slices(self, slices: list[Slice]) -> tuple[list[Any], float]:
        """Several lanes' slices evaluated in as few ``llama_decode`` calls as the batch
        allows (device choices first, then rows); each slice's rows (its own copy) or
        device choices, and the seconds the decodes took. Called on the context's owner."""
        results: list[Any] = [None] * len(slices)
        seconds = 0.0
        order = sorted(range(len(slices)), key=lambda i: not slices[i].device)
        for pack in _packs(order, slices, self.n_batch):
            part = [slices[i] for i in pack]
            device = part[0].device and self._device_for(part[0].confidence, self._vocab_asked())
            if not device and self._device is not None:
                self._device.detach()  # rows are wanted: llama.cpp copies them again
            starts = self._write(part)
            want = sum(s.n_outputs for s in part)
            t0 = time.perf_counter()
            ptr = self._llama_decode(part[0].positions[0], want, greedy=bool(device))
            seconds += time.perf_counter() - t0
            view = self._rows(ptr, want) if ptr is not None else None
            offset = 0
            for i, work, start in zip(pack, part, starts, strict=True):
                n = work.n_outputs
                if device:
                    results[i] = self._choices_at(start, work)
                elif work.device:  # the device could not choose: from the rows
                    assert view is not None
                    rows = view[offset : offset + n]
                    results[i] = (greedy_ids(rows), top_probabilities(rows) if work.confidence
                                  else [])  # fmt: skip
                else:
                    results[i] = view[offset : offset + n].copy() if view is not None else None
                offset += n
        return results, seconds

    def _vocab_asked(self) -> int:
        return self._device.vocab if self._device is not None else self.n_vocab

    def _write(self, part: list[Slice]) -> list[int]:
        """The batch filled with ``part``'s slices in order; each slice's first index."""
        assert self._batch is not None
        starts: list[int] = []
        j = 0
        for work in part:
            starts.append(j)
            for row in zip(work.tokens, work.positions, work.seqs, work.outputs, strict=True):
                self._fill(j, *row)
                j += 1
        self._batch.n_tokens = j
        return starts

    def _choices_at(self, start: int, work: Slice) -> tuple[list[int], list[float]]:
        """The device's choices for ``work``'s outputs, ``work`` filled from ``start``."""
        device = self._device
        assert device is not None
        at = [start + j for j, out in enumerate(work.outputs) if out]
        return device.tokens_at(at), device.probabilities_at(at) if work.confidence else []

    def _run_batch(self, pos: int, want: int, *, greedy: bool = False) -> np.ndarray | None:
        """``llama_decode`` of the batch as filled, timed; its ``want`` logits rows (none
        with ``greedy``: the device's choices are read from ``_device``)."""
        t0 = time.perf_counter()
        ptr = self._llama_decode(pos, want, greedy=greedy)
        self.compute_seconds += time.perf_counter() - t0
        return self._rows(ptr, want) if ptr is not None else None

    def _llama_decode(self, pos: int, want: int, *, greedy: bool = False) -> Any:
        """``llama_decode`` of the batch as filled, waited for; the logits buffer when
        ``want`` rows are wanted (not with ``greedy``), else None. A lane's runs on the
        lanes' evaluating thread (backend/lanes.py)."""
        if self._turns is not None:
            return self._turns.call(self._decode_now, pos, want, greedy)
        return self._decode_now(pos, want, greedy)

    def _decode_now(self, pos: int, want: int, greedy: bool) -> Any:
        home = self._home
        home.busy_since = time.monotonic()  # an RPC link times evaluations (backend/rpc.py)
        rc = llama_cpp.llama_decode(self._ctx, self._batch)
        if rc != 0:
            home.busy_since = None
            raise BackendError(
                f"llama.cpp decode failed (code {rc}) at position {pos}: {recent_llama_log(2)}",
                "the context may be full; try a larger --ctx or a shorter prompt",
            )
        _note_decoded()
        # Wait for the evaluation to finish (a GPU's or an RPC worker's decode returns
        # before) inside the timed and watched span; llama_get_logits waits too.
        ptr = None
        if greedy or not want:
            llama_cpp.llama_synchronize(self._ctx)
        else:
            ptr = llama_cpp.llama_get_logits(self._ctx)
        home.busy_since = None
        return ptr

    def _rows(self, ptr, want: int) -> np.ndarray:
        """The first ``want`` rows of the logits buffer at ``ptr`` as a read-only view,
        valid until the next ``llama_decode`` on this context, which overwrites the buffer
        (and moves it when it needs more rows). Building a view through ctypes costs more
        than a small model's step leaves to spare, so the last one is kept while the buffer
        stays where it is."""
        address = ctypes.addressof(ptr.contents)  # a tenth of what ctypes.cast costs
        last = self._logits
        if last is not None and last[0] == address and last[1] >= want:
            return last[2][:want]
        # The buffer holds at least this batch's ``want`` rows; never more is read.
        view = np.ctypeslib.as_array(ptr, shape=(want, self.n_vocab))
        view.flags.writeable = False
        self._logits = (address, want, view)
        return view

    def _remove_from(self, n: int) -> None:
        if llama_cpp.llama_memory_seq_rm(self._memory, self._seq0, n, -1):
            return
        # Recurrent and hybrid caches cannot drop a suffix (llama.cpp says so by returning
        # false): clear the sequence and evaluate the kept prefix again, which is slow but
        # never lets the cache and ``cached`` part ways.
        keep = self.cached[:n]
        if self.lanes == 1:
            llama_cpp.llama_memory_clear(self._memory, True)
        else:  # the other lanes' sequences stay
            llama_cpp.llama_memory_seq_rm(self._memory, self._seq0, -1, -1)
        self.refills += 1
        for off in range(0, len(keep), self.n_batch):
            chunk = keep[off : off + self.n_batch]
            self._decode(chunk, off, len(chunk))

    # -- saved sequences (storage/prompt_cache.py) -------------------------------------------

    def state_recipe(self) -> dict[str, Any]:
        """What this context's saved sequences depend on besides the model file: the cache's
        type and attention path (exact mode runs others), where the layers run, and
        llama.cpp's version. A state is restored only into a context of the same recipe."""
        return dict(self._recipe)

    def sequence_state(self) -> bytes | memoryview:
        """llama.cpp's bytes of this lane's sequence, which holds ``cached``: what
        ``restore_sequence`` takes back, into a context of the same model and runtime."""
        self._settle()
        if not self.cached:
            return b""
        return self._on_context_thread(self._read_state)

    def restore_sequence(self, tokens: list[int], state: bytes | memoryview) -> bool:
        """Make the cache hold ``tokens`` from ``state`` (``sequence_state`` after them).
        False, the cache left empty, where llama.cpp refuses the bytes or they do not hold
        ``tokens``' positions: the tokens are then evaluated as they would be without."""
        self._settle()
        self.truncate(0)
        if not tokens or len(tokens) > self.n_ctx or not state:
            return False
        if not self._on_context_thread(self._write_state, state, len(tokens)):
            llama_cpp.llama_memory_seq_rm(self._memory, self._seq0, -1, -1)
            return False
        self.cached = list(tokens)
        self.changes += 1
        return True

    def _on_context_thread(self, work: Callable[..., Any], *args: Any) -> Any:
        """``work`` where this context's evaluations run: another lane may be evaluating."""
        return self._turns.call(work, *args) if self._turns is not None else work(*args)

    def _read_state(self) -> memoryview:
        size = llama_cpp.llama_state_seq_get_size(self._ctx, self._seq0)
        buffer = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(self._ctx, buffer, size, self._seq0)
        if not written:
            raise BackendError(f"llama.cpp could not copy the state of {self.path.name}")
        # A view of the one copy (tens of megabytes for a long prompt), not a second one.
        return memoryview(buffer).cast("B")[:written]

    def _write_state(self, state: bytes | memoryview, n_tokens: int) -> bool:
        source = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        if not llama_cpp.llama_state_seq_set_data(self._ctx, source, len(state), self._seq0):
            return False
        last = llama_cpp.llama_memory_seq_pos_max(self._memory, self._seq0)
        return last == n_tokens - 1

    # -- lifetime -----------------------------------------------------------------------

    def close(self) -> None:
        self._logits = None  # a view of a buffer llama_free releases
        if self._home is not self:
            return  # a lane: lane 0 frees the context
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        if self._device is not None:
            self._device.free()  # its chains outlive the context that used them
            self._device = None
        if self._model:
            llama_cpp.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter shutdown llama_cpp may be gone
            self.close()


def _packs(order: list[int], slices: list[Slice], n_batch: int) -> list[list[int]]:
    """``order``'s slices in runs that one batch holds: each at most ``n_batch`` tokens,
    device choices and rows apart."""
    packs: list[list[int]] = []
    size = 0
    for i in order:
        work = slices[i]
        if packs and size + len(work) <= n_batch and slices[packs[-1][0]].device == work.device:
            packs[-1].append(i)
            size += len(work)
        else:
            packs.append([i])
            size = len(work)
    return packs
