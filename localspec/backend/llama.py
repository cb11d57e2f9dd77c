"""Load a GGUF model with llama.cpp and drive it token by token.

``LlamaLane`` is a ``CachedModel`` over one lane of a ``SharedContext`` (backend/context.py):
``forward`` evaluates a batch on the lane's first sequence and returns logits only for the
positions asked for (prefill asks for none), and rolls the KV cache back with
``llama_memory_seq_rm``. ``LlamaModel`` loads a file: its weights (backend/weights.py), a
context of ``LoadOptions.lanes`` lanes, and itself as lane 0, the context's owner, which
frees it all; ``lane(i)`` is lane i's handle, ``LlamaLane(shared, i)``.

Asked for greedy choices (``greedy_after``, ``greedy_tree``), a lane lets llama.cpp's backend
sampler pick them where the logits are computed (backend/device_greedy.py): only token ids
come back, no logits row (``greedy_where`` is ``"device"``). It does so by default where its
output layer runs on a GPU (or an RPC worker); on the CPU a row's copy is a memcpy, and
llama.cpp's sampling graph costs more than it saves (a scalar argmax over the vocabulary and
a padded copy of the logits, about half a millisecond a step with Qwen2.5's vocabulary), so
there it reads rows (``LoadOptions.device_greedy`` chooses either way). Its rows are
read-only views of llama.cpp's own logits buffer (``borrowed_rows``): ``forward`` copies
them unless the caller borrows them, which the engine does for rows it consumes before the
next evaluation (no copy of n_vocab floats a row on every step). It verifies draft trees
too (``forward_tree``), with sequence ids as branch tags in one unified cache
(backend/trees.py). Its vocabulary side (tokenizing, token bytes, GGUF metadata,
fill-in-the-middle tokens) is ``LlamaVocabulary`` (backend/vocab.py).

A lane of several runs under its context's scheduler (backend/lanes.py): ``turn`` holds its
turn, during which its batches may be gathered with the other lanes' (``Turn.park``), and
``pass_on`` lets the others run between rounds.

Importing this module leaves llama.cpp alone: the first load initialises it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

from localspec.backend.context import SharedContext
from localspec.backend.kernels import TILED_MM_SWITCH, default_kernels_environ, exact_kernels
from localspec.backend.lanes import LaneClock, Slice, Turn
from localspec.backend.saved import read_state, write_state
from localspec.backend.trees import drop_leaves, keep_path, tree_slice
from localspec.backend.vocab import LlamaVocabulary
from localspec.backend.weights import MAX_TREE_SEQS, LoadOptions, Weights, load_weights
from localspec.core.cached_model import DEVICE, HOST, CachedModel, Greedy, greedy_ids
from localspec.core.tree import DraftTree
from localspec.errors import BackendError

__all__ = [
    "MAX_TREE_SEQS", "TILED_MM_SWITCH", "LlamaLane", "LlamaModel", "LoadOptions",
    "default_kernels_environ", "exact_kernels",
]  # fmt: skip
# Rows of the load-time check: the tiled matmul starts at 8.
EXACT_CHECK_ROWS = 9
DEFAULTS = LoadOptions()


class LlamaLane(LlamaVocabulary, CachedModel):
    """Lane ``index`` of ``shared``: its own cached tokens over the context's sequences
    from ``shared.first_seq(index)`` (see the module docstring)."""

    shared: SharedContext
    # Rows are views of llama.cpp's logits buffer, which the next llama_decode overwrites.
    borrowed_rows = True

    def __init__(self, shared: SharedContext, index: int) -> None:
        super().__init__()
        self._use_weights(shared.weights)
        self.shared = shared
        self._seq0 = shared.first_seq(index)  # this lane's sequence of committed tokens
        self.exact = shared.exact
        self.lanes, self.tree_seqs = shared.lanes, shared.tree_seqs
        self.n_ctx, self.n_batch = shared.n_ctx, shared.n_batch
        self.clock = LaneClock()  # its own work, its waits for the turn left out
        self._turn: Turn | None = None  # the turn it holds (see turn)

    def _use_weights(self, weights: Weights) -> None:
        """The vocabulary's handles (backend/vocab.py) and this lane's counters."""
        self.path = weights.path
        self._model, self._vocab, self.n_vocab = weights.model, weights.vocab, weights.n_vocab
        self._pieces, self._eog = weights.pieces, weights.eog
        self.compute_seconds = 0.0  # time inside llama_decode (the bench, the stats' overhead)
        self.refills = 0  # rollbacks done by re-evaluating the prefix (see _remove_from)

    @property
    def greedy_where(self) -> str:  # type: ignore[override]
        return DEVICE if self.shared.device is not None else HOST

    @property
    def busy_since(self) -> float | None:
        """Monotonic start of a running llama_decode of its context (backend/rpc.py)."""
        return self.shared.busy_since

    # -- turns (backend/lanes.py) -----------------------------------------------------------

    @property
    def scheduled(self) -> bool:
        """Whether it runs under a scheduler (its context has several lanes)."""
        return self.shared.scheduler is not None

    @contextlib.contextmanager
    def turn(
        self, *, first: bool = False, client: str = "", gather: bool = False
    ) -> Iterator[Turn]:
        """Hold this lane's turn among its context's lanes (waiting for it first), timed by
        ``clock``: ``first``, ``client`` and ``gather`` as ``LaneScheduler.turn`` takes them
        (gathering only where the context's own scheduler runs it)."""
        scheduler = self.shared.scheduler
        assert scheduler is not None, "a lane of one takes no turns"
        gather = gather and self.shared.gathers
        with scheduler.turn(self.clock, first=first, client=client, gather=gather) as held:
            self._turn = held
            try:
                yield held
            finally:
                self._turn = None

    def pass_on(self) -> None:
        """Between rounds: the turn it holds goes to the lanes waiting first (none held:
        nothing to do)."""
        if self._turn is not None:
            self._turn.pass_on()

    @property
    def _gathers(self) -> bool:
        """Whether its next batch is gathered with other lanes': not while no other lane
        has anything to evaluate."""
        turn, scheduler = self._turn, self.shared.scheduler
        return turn is not None and turn.gather and scheduler is not None and not scheduler.alone

    # -- evaluation ---------------------------------------------------------------------

    def _evaluate(self, tokens: list[int], n_logits: int) -> np.ndarray:
        if n_logits:
            self.shared.want_rows()
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
        if self.shared.device_for(confidence, vocab) is None:
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
            b = self.shared.batch
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
            return self.shared.device_choices(want) if greedy else rows
        except BackendError:
            # Drop whatever part of the batch made it in, so the cache matches ``cached``.
            rm_from = min(pos, len(self.cached))
            self._remove_from(rm_from)
            del self.cached[rm_from:]
            self.changes += 1
            raise

    def _gathered(self, work: Slice) -> Any:
        """``work`` evaluated with the other lanes' parked batches (backend/lanes.py): its
        rows, or its device choices; its share of the time counted as this lane's."""
        device = self.shared.device
        if work.device and device is not None:
            work.confidence = device.confidence
        assert self._turn is not None
        result, share_s = self._turn.park(work, self.shared.evaluate_slices)
        self.compute_seconds += share_s
        return result

    def _run_batch(self, pos: int, want: int, *, greedy: bool = False) -> np.ndarray | None:
        """``llama_decode`` of the batch as filled, timed; its ``want`` logits rows (none
        with ``greedy``: the device's choices are read from the shared context)."""
        t0 = time.perf_counter()
        ptr = self.shared.decode(pos, want, greedy=greedy)
        self.compute_seconds += time.perf_counter() - t0
        return self.shared.rows(ptr, want) if ptr is not None else None

    def _remove_from(self, n: int) -> None:
        memory = self.shared.memory
        if llama_cpp.llama_memory_seq_rm(memory, self._seq0, n, -1):
            return
        # Recurrent and hybrid caches cannot drop a suffix (llama.cpp says so by returning
        # false): clear the sequence and evaluate the kept prefix again, which is slow but
        # never lets the cache and ``cached`` part ways.
        keep = self.cached[:n]
        if self.lanes == 1:
            llama_cpp.llama_memory_clear(memory, True)
        else:  # the other lanes' sequences stay
            llama_cpp.llama_memory_seq_rm(memory, self._seq0, -1, -1)
        self.refills += 1
        for off in range(0, len(keep), self.n_batch):
            chunk = keep[off : off + self.n_batch]
            self._decode(chunk, off, len(chunk))

    # -- draft trees (backend/trees.py) -----------------------------------------------------

    @property
    def supports_trees(self) -> bool:
        return self.tree_seqs > 0

    def _evaluate_tree(self, start: int, last: int, tree: DraftTree) -> np.ndarray:
        self.shared.want_rows()
        rows = self._run_tree(start, last, tree, greedy=False)
        assert rows is not None
        return rows

    def _evaluate_tree_greedy(self, start: int, last: int, tree: DraftTree) -> list[int]:
        if self.shared.device_for(False, self.shared.vocab_asked()) is None:
            return greedy_ids(self._evaluate_tree(start, last, tree))
        return self._run_tree(start, last, tree, greedy=True)[0]

    def _run_tree(self, start: int, last: int, tree: DraftTree, *, greedy: bool) -> Any:
        work = tree_slice(self.shared, self._seq0, start, last, tree, greedy=greedy)
        try:
            if self._gathers:
                return self._gathered(work)
            self.shared.write([work])
            rows = self._run_batch(start, len(work), greedy=greedy)
            return self.shared.device_choices(len(work)) if greedy else rows
        except BackendError:  # back to the committed prefix, ``start`` tokens
            drop_leaves(self.shared, self._seq0, len(tree.leaves()))
            self._remove_from(start)
            raise

    def _keep_path(self, start: int, tree: DraftTree, path: list[int]) -> None:
        keep_path(self.shared, self._seq0, start, tree, path)

    # -- saved sequences (storage/prompt_cache.py) -------------------------------------------

    def state_recipe(self) -> dict[str, Any]:
        """What this context's saved sequences depend on besides the model file: the cache's
        type and attention path (exact mode runs others), where the layers run, and
        llama.cpp's version. A state is restored only into a context of the same recipe."""
        return dict(self.shared.recipe)

    def sequence_state(self) -> bytes | memoryview:
        """llama.cpp's bytes of this lane's sequence, which holds ``cached``: what
        ``restore_sequence`` takes back, into a context of the same model and runtime."""
        self._settle()
        if not self.cached:
            return b""
        return read_state(self.shared, self._seq0)

    def restore_sequence(self, tokens: list[int], state: bytes | memoryview) -> bool:
        """Make the cache hold ``tokens`` from ``state`` (``sequence_state`` after them).
        False, the cache left empty, where llama.cpp refuses the bytes or they do not hold
        ``tokens``' positions: the tokens are then evaluated as they would be without."""
        self._settle()
        self.truncate(0)
        if not tokens or len(tokens) > self.n_ctx or not state:
            return False
        if not write_state(self.shared, self._seq0, state, len(tokens)):
            return False
        self.cached = list(tokens)
        self.changes += 1
        return True

    def close(self) -> None:
        """Nothing: lane 0, the ``LlamaModel`` loaded, frees the context."""


class LlamaModel(LlamaLane):
    """A GGUF file loaded: lane 0 of its context, which it owns (see the module docstring)."""

    def __init__(
        self,
        path: Path | str,
        options: LoadOptions = DEFAULTS,
        *,
        vocab_only: bool = False,
        abort: Callable[[], bool] | None = None,
    ) -> None:
        """Load weights and create a context; ``vocab_only`` loads just the tokenizer.
        ``abort`` is polled while the weights load: once it returns true, llama.cpp stops
        the load and this raises ``ModelFileError`` (a background load nobody waits for)."""
        weights = load_weights(Path(path), options, vocab_only, abort)
        self._weights: Weights | None = weights
        self._lanes: dict[int, LlamaLane] = {}  # the other lanes (lane 0 is this model)
        if vocab_only:
            CachedModel.__init__(self)
            self._use_weights(weights)
            self.n_ctx, self.exact, self.lanes = 0, False, 1
            return
        try:
            shared = SharedContext(weights, options)
        except BaseException:
            self.close()
            raise
        super().__init__(shared, 0)
        self._lanes = {i: LlamaLane(shared, i) for i in range(1, shared.lanes)}
        if self.exact:
            self._check_batch_invariance()
        # Device greedy choices are set up by the warm-up pass, which a load whose costs are
        # already measured spares otherwise.
        if options.warm_up or shared.device is not None:
            self._warm_up(options)

    def lane(self, i: int) -> LlamaLane:
        """Lane ``i`` of this context (0: this model itself): a model of its own, with its
        own cached tokens, over the same context and weights. Freed with lane 0."""
        if i == 0:
            return self
        if i not in self._lanes:
            raise ValueError(f"lane {i} of a context with {self.lanes} lane(s)")
        return self._lanes[i]

    def _warm_up(self, options: LoadOptions) -> None:
        """Evaluate one token with logits and forget it, as llama.cpp's tools do before
        timing: the first pass maps every weight (the output layer too, which a prefill
        without logits never touches) and picks kernels, which the first step would pay.
        With device greedy choices, the pass sets their samplers up as this model will be
        asked (see ``LoadOptions``)."""
        first = [self.vocab_info().bos if self.vocab_info().bos >= 0 else 0]
        shared = self.shared
        if shared.device is not None:
            found = self.greedy(
                first, 1, confidence=options.greedy_confidence, vocab=options.greedy_vocab
            )
            if found.ids[0] < 0 and shared.device is not None:  # the backend took no chain
                shared.device.detach()
                shared.device = None
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

    def close(self) -> None:
        """Free the context (every lane's), then the weights; once."""
        shared: SharedContext | None = getattr(self, "shared", None)  # None: vocabulary only
        if shared is not None:
            shared.close()
        weights, self._weights = self._weights, None
        if weights is not None:
            weights.free()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter shutdown llama_cpp may be gone
            self.close()
