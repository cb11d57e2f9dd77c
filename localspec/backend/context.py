"""One llama.cpp context and all its lanes share (``SharedContext``).

``SharedContext(weights, options)`` creates the context of ``options.lanes`` lanes, each a
context of ``n_ctx`` tokens and a range of ``1 + tree_seqs`` sequences (``first_seq``), in
one unified cache. It owns what the lanes share: the context, its batch, its memory
handle, the device's greedy samplers (``DeviceGreedy``, backend/device_greedy.py), the
lanes' scheduler (``LaneScheduler``, backend/lanes.py: its own where it has several lanes,
or the one ``options.scheduler`` names, whose thread then evaluates its lanes too) and the
gathering of several lanes' slices into one batch (``evaluate_slices``). A lane is a handle
onto it (``LlamaLane``, backend/llama.py); ``close`` frees it all, once.

Every ``llama_decode`` of the context goes through ``decode``: on the scheduler's thread
where there is one, timed for an RPC link (``busy_since``, backend/rpc.py), and waited for
(a GPU's or an RPC worker's decode returns before it is done). Logits rows are read-only
views of llama.cpp's own buffer (``rows``), valid until the next decode.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import llama_cpp
import numpy as np

from localspec.backend.device_greedy import DeviceGreedy
from localspec.backend.kernels import note_decoded
from localspec.backend.lanes import LaneScheduler, Slice
from localspec.backend.runtime import recent_llama_log
from localspec.backend.weights import LoadOptions, Weights
from localspec.core.cached_model import greedy_ids
from localspec.core.sampling import top_probabilities
from localspec.errors import BackendError

# Exact mode keeps keys and values in bf16. llama.cpp's CPU flash attention has two kernels
# for f16/f32 caches that sum in another order than its row-by-row kernel: a split over the
# cache for a lone query row once it holds 512 cells, and a tiled one from 64 query rows.
# Any other cache type always takes the row-by-row kernel.
GGML_TYPE_BF16 = 30
LLAMA_MAX_SEQ = 256  # llama.cpp's cap on sequence ids (src/llama-cparams.h)


def _stateful(model: llama_cpp.llama_model_p) -> bool:
    """Whether the model keeps a recurrent state per sequence (recurrent or hybrid)."""
    return bool(llama_cpp.llama_model_is_recurrent(model)) or bool(
        llama_cpp.llama_model_is_hybrid(model)
    )


class SharedContext:
    """A context and what its lanes share (see the module docstring)."""

    def __init__(self, weights: Weights, options: LoadOptions) -> None:
        if options.lanes < 1:
            raise ValueError(f"lanes must be 1 or more, not {options.lanes}")
        self.weights = weights
        self.exact = options.exact
        self.lanes = options.lanes
        self.device: DeviceGreedy | None = None  # greedy choices on the device
        self.tree_seqs = 0  # leaves a draft tree may have (see _tree_capacity)
        cparams = self._context_params(options)
        ctx = llama_cpp.llama_init_from_model(weights.model, cparams)
        if not ctx:
            if self.device is not None:
                self.device.free()
            raise BackendError(
                f"llama.cpp could not create a context of {options.n_ctx} tokens for "
                f"{weights.path.name}: {recent_llama_log() or 'no reason given'}",
                "try a smaller --ctx",
            )
        self.ctx = ctx
        self.memory = llama_cpp.llama_get_memory(ctx)
        self.n_ctx = llama_cpp.llama_n_ctx(ctx) // self.lanes  # a lane's
        self.n_batch = cparams.n_batch
        self.batch = llama_cpp.llama_batch_init(self.n_batch, 0, cparams.n_seq_max)
        if self.device is not None:
            self.device.bind(ctx)
        # A draft model's lanes evaluate on its target's scheduler's thread, never gathered.
        self._owns_scheduler = options.scheduler is None and self.lanes > 1
        self.scheduler = LaneScheduler() if self._owns_scheduler else options.scheduler
        self.busy_since: float | None = None  # monotonic start of a running llama_decode
        # What a saved sequence of this context depends on besides the model file (see
        # LlamaLane.state_recipe).
        self.recipe = {
            "exact": self.exact, "flash_attn": options.flash_attn or self.exact,
            "gpu_layers": options.n_gpu_layers, "tensor_split": list(options.tensor_split),
            "llama_cpp": llama_cpp.__version__,
        }  # fmt: skip
        # The last view of the logits buffer: its address, its rows, the view (see rows).
        self._logits: tuple[int, int, np.ndarray] | None = None

    def first_seq(self, lane: int) -> int:
        """Lane ``lane``'s sequence of committed tokens (its tree leaves' follow it)."""
        if not 0 <= lane < self.lanes:
            raise ValueError(f"lane {lane} of a context with {self.lanes} lane(s)")
        return lane * (1 + self.tree_seqs)

    @property
    def gathers(self) -> bool:
        """Whether its lanes' batches may be gathered: it has a scheduler of its own."""
        return self._owns_scheduler

    def _context_params(self, options: LoadOptions) -> Any:
        """llama.cpp's context parameters for ``options``; sets ``tree_seqs``, ``device``."""
        threads = options.n_threads or os.cpu_count() or 1
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_batch = min(options.n_batch, options.n_ctx)
        cparams.n_ubatch = min(options.n_ubatch, cparams.n_batch)
        cparams.n_ctx = options.n_ctx * self.lanes
        model = self.weights.model
        self.tree_seqs = self._tree_capacity(options, cparams.n_batch, _stateful(model))
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
            vocab = options.greedy_vocab or self.weights.n_vocab
            self.device = DeviceGreedy(
                cparams.n_seq_max, vocab, confidence=options.greedy_confidence
            )
            cparams.samplers, cparams.n_samplers = self.device.configs()
            cparams.n_outputs_max_per_seq = cparams.n_batch  # a batch may be one sequence's
        return cparams

    def _greedy_on_device(self, options: LoadOptions) -> bool:
        """Whether greedy choices are made by the backend sampler (see ``LoadOptions``)."""
        if options.device_greedy is not None:
            return options.device_greedy
        offloaded = options.n_gpu_layers > llama_cpp.llama_model_n_layer(self.weights.model)
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

    # -- the device's samplers --------------------------------------------------------------

    def device_for(self, confidence: bool, vocab: int) -> DeviceGreedy | None:
        """The device's samplers, attached and able to answer (set up anew when they were
        set up for other questions); None where the backend cannot run them, from then on."""
        device = self.device
        if device is None:
            return None
        if device.vocab != vocab or (confidence and not device.confidence):
            device.detach()
            device = DeviceGreedy(device.seqs, vocab, confidence=confidence)
            device.bind(self.ctx)
            self.device = device
        if not device.attach():
            self.device = None
        return self.device

    def want_rows(self) -> None:
        """Rows are wanted next: the samplers are detached, so llama.cpp copies them again."""
        if self.device is not None:
            self.device.detach()

    def vocab_asked(self) -> int:
        return self.device.vocab if self.device is not None else self.weights.n_vocab

    def device_choices(self, n: int) -> tuple[list[int], list[float]]:
        """The device's choices for the last decode's last ``n`` outputs."""
        device = self.device
        if device is None or not n:
            return [], []
        probs = device.probabilities(n) if device.confidence else []
        return device.tokens(n), probs

    # -- batches and decodes ----------------------------------------------------------------

    def fill(self, j: int, token: int, pos: int, seqs: Sequence[int], out: bool = True) -> None:
        """Row ``j`` of the batch: ``token`` at ``pos`` in ``seqs``, with logits if ``out``."""
        b = self.batch
        b.token[j] = token
        b.pos[j] = pos
        b.n_seq_id[j] = len(seqs)
        for k, s in enumerate(seqs):
            b.seq_id[j][k] = s
        b.logits[j] = out

    def write(self, part: list[Slice]) -> list[int]:
        """The batch filled with ``part``'s slices in order; each slice's first index."""
        starts: list[int] = []
        j = 0
        for work in part:
            starts.append(j)
            for row in zip(work.tokens, work.positions, work.seqs, work.outputs, strict=True):
                self.fill(j, *row)
                j += 1
        self.batch.n_tokens = j
        return starts

    def call(self, work: Callable[..., Any], *args: Any) -> Any:
        """``work(*args)`` where this context's evaluations run: another lane may be
        evaluating (backend/lanes.py)."""
        scheduler = self.scheduler
        return scheduler.call(work, *args) if scheduler is not None else work(*args)

    def decode(self, pos: int, want: int, *, greedy: bool = False) -> Any:
        """``llama_decode`` of the batch as filled, waited for; the logits buffer when
        ``want`` rows are wanted (not with ``greedy``), else None."""
        return self.call(self._decode_now, pos, want, greedy)

    def _decode_now(self, pos: int, want: int, greedy: bool) -> Any:
        self.busy_since = time.monotonic()  # an RPC link times evaluations (backend/rpc.py)
        rc = llama_cpp.llama_decode(self.ctx, self.batch)
        if rc != 0:
            self.busy_since = None
            raise BackendError(
                f"llama.cpp decode failed (code {rc}) at position {pos}: {recent_llama_log(2)}",
                "the context may be full; try a larger --ctx or a shorter prompt",
            )
        note_decoded()
        # Wait for the evaluation to finish (a GPU's or an RPC worker's decode returns
        # before) inside the timed and watched span; llama_get_logits waits too.
        ptr = None
        if greedy or not want:
            llama_cpp.llama_synchronize(self.ctx)
        else:
            ptr = llama_cpp.llama_get_logits(self.ctx)
        self.busy_since = None
        return ptr

    def rows(self, ptr: Any, want: int) -> np.ndarray:
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
        view = np.ctypeslib.as_array(ptr, shape=(want, self.weights.n_vocab))
        view.flags.writeable = False
        self._logits = (address, want, view)
        return view

    def evaluate_slices(self, slices: list[Slice]) -> tuple[list[Any], float]:
        """Several lanes' slices evaluated in as few ``llama_decode`` calls as the batch
        allows (device choices first, then rows); each slice's rows (its own copy) or
        device choices, and the seconds the decodes took."""
        results: list[Any] = [None] * len(slices)
        seconds = 0.0
        order = sorted(range(len(slices)), key=lambda i: not slices[i].device)
        for pack in _packs(order, slices, self.n_batch):
            part = [slices[i] for i in pack]
            device = part[0].device and self.device_for(part[0].confidence, self.vocab_asked())
            if not device:
                self.want_rows()
            starts = self.write(part)
            want = sum(s.n_outputs for s in part)
            t0 = time.perf_counter()
            ptr = self.decode(part[0].positions[0], want, greedy=bool(device))
            seconds += time.perf_counter() - t0
            view = self.rows(ptr, want) if ptr is not None else None
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

    def _choices_at(self, start: int, work: Slice) -> tuple[list[int], list[float]]:
        """The device's choices for ``work``'s outputs, ``work`` filled from ``start``."""
        device = self.device
        assert device is not None
        at = [start + j for j, out in enumerate(work.outputs) if out]
        return device.tokens_at(at), device.probabilities_at(at) if work.confidence else []

    # -- lifetime ---------------------------------------------------------------------------

    def close(self) -> None:
        """Free the batch, the context and the samplers, and end the scheduler's thread
        where it is this context's own."""
        self._logits = None  # a view of a buffer llama_free releases
        if self._owns_scheduler and self.scheduler is not None:
            self.scheduler.close()
        if self.batch is not None:
            llama_cpp.llama_batch_free(self.batch)
            self.batch = None
        if self.ctx:
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        if self.device is not None:
            self.device.free()  # its chains outlive the context that used them
            self.device = None


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
