"""Greedy choices made by llama.cpp where the logits are computed (its backend sampler).

``DeviceGreedy`` gives each sequence of a context a sampler chain whose one sampler adds to
llama.cpp's graph, for every output row: the token with the highest logit among the first
``vocab`` ids (``ggml_argmax``), and where ``confidence`` asks, that token's probability at
temperature 1 (``ggml_soft_max``). It hands llama.cpp nothing else of the row, so when every
output of a batch belongs to a sequence with a sampler, llama.cpp copies no logits row to
the host: only the token id (``llama_get_sampled_token_ith``) and the probability
(``llama_get_sampled_probs_ith``) come back. (llama.cpp's own greedy sampler hands the row
on as its sampled logits, which llama.cpp then copies whole.)

Rules:

- the context is created with ``n_outputs_max_per_seq`` at least the most outputs one
  sequence has in a batch (every sequence id of a token counts), else the decode fails;
- the chains are given in the context's parameters, so its first graph plan includes them;
  while they are attached no logits rows are available (``llama_get_logits`` is stale):
  ``detach`` first, which a later ``attach`` undoes with new chains (llama.cpp initialises a
  chain once). Either makes llama.cpp plan its graph again at the next decode;
- equal top logits: the backend's argmax decides (the CPU's takes the last of them, CUDA's
  one given by its thread layout), where ``np.argmax`` on the host takes the first. Both
  are a function of the row alone, so batch-invariant logits (exact mode) keep greedy output
  independent of batching either way.

The sampler's graph is built in Python (ctypes callbacks into the ggml libllama links), once
per graph llama.cpp builds, not per token it reuses it for.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterable

import llama_cpp

NAME = b"localspec-greedy"
_VP = ctypes.c_void_p
# ggml's graph-building functions this module calls: name, argument types, result type.
_GGML = (
    ("ggml_argmax", [_VP, _VP], _VP),
    ("ggml_view_1d", [_VP, _VP, ctypes.c_int64, ctypes.c_size_t], _VP),
    ("ggml_reshape_2d", [_VP, _VP, ctypes.c_int64, ctypes.c_int64], _VP),
    ("ggml_nelements", [_VP], ctypes.c_int64),
    ("ggml_soft_max", [_VP, _VP], _VP),
    ("ggml_get_rows", [_VP, _VP, _VP], _VP),
)
_ggml: ctypes.CDLL | None = None


def ggml() -> ctypes.CDLL:
    """ggml's graph functions through libllama's handle, so that they resolve in the libggml
    libllama itself links (the wheel ships a second copy under another name: see
    ``backend/rpc.py._ggml``), with the functions above typed."""
    global _ggml
    if _ggml is None:
        from llama_cpp import llama_cpp as bindings

        lib = bindings._lib
        for name, args, result in _GGML:
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, result
        _ggml = lib
    return _ggml


class _Sampler:
    """One sampler's interface: the callbacks llama.cpp calls, kept alive with it."""

    def __init__(self, vocab: int, confidence: bool) -> None:
        self.vocab, self.confidence = vocab, confidence
        self.lib = ggml()
        iface = llama_cpp.llama_sampler_i()
        iface.name = llama_cpp.llama_sampler_i_name(lambda _s: NAME)
        iface.apply = llama_cpp.llama_sampler_i_apply(self._apply)
        iface.backend_init = llama_cpp.llama_sampler_i_backend_init(lambda _s, _b, _n: True)
        iface.backend_apply = llama_cpp.llama_sampler_i_backend_apply(self._backend_apply)
        self.iface = iface

    def _backend_apply(self, _smpl, ctx, _graph, data) -> None:
        """The graph for one output row: its argmax (and probability); no row handed on."""
        lib, d = self.lib, data.contents
        n = min(self.vocab, lib.ggml_nelements(d.logits))
        row = lib.ggml_view_1d(ctx, d.logits, n, 0)
        d.sampled = lib.ggml_argmax(ctx, row)
        if self.confidence:
            probs = lib.ggml_reshape_2d(ctx, lib.ggml_soft_max(ctx, row), 1, n)
            d.probs = lib.ggml_get_rows(ctx, probs, d.sampled)
        d.logits = None

    def _apply(self, _smpl, cur_p) -> None:
        """On the host (a chain llama.cpp could not put on the device): the first of the
        highest logits."""
        arr = cur_p.contents
        best = 0
        for i in range(1, arr.size):
            if arr.data[i].logit > arr.data[best].logit:
                best = i
        arr.selected = best


class DeviceGreedy:
    """Greedy samplers for sequences ``0 .. seqs - 1`` of a context: given to it at its
    creation (``configs``, then ``bind``), as llama.cpp prefers, or attached later."""

    def __init__(self, seqs: int, vocab: int, *, confidence: bool = False) -> None:
        self.seqs = seqs
        self.sampler = _Sampler(vocab, confidence)
        self.ctx = None
        self._chains: list = []
        self._configs: ctypes.Array | None = None  # alive while the context uses them

    @property
    def vocab(self) -> int:
        return self.sampler.vocab

    @property
    def confidence(self) -> bool:
        return self.sampler.confidence

    def configs(self) -> tuple[ctypes.Array, int]:
        """The chains as ``llama_context_params.samplers`` and ``n_samplers``; kept alive
        here for as long as the context uses them."""
        self._chains = [self._chain() for _ in range(self.seqs)]
        configs = (llama_cpp.llama_sampler_seq_config * self.seqs)()
        for seq, chain in enumerate(self._chains):
            configs[seq].seq_id = seq
            configs[seq].sampler = ctypes.cast(chain, ctypes.c_void_p)
        self._configs = configs
        return configs, self.seqs

    def bind(self, ctx) -> None:
        """The context created with ``configs``."""
        self.ctx = ctx

    def _chain(self):
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        smpl = llama_cpp.llama_sampler_init(ctypes.byref(self.sampler.iface), None)
        llama_cpp.llama_sampler_chain_add(chain, smpl)  # the chain frees it
        return chain

    def attach(self) -> bool:
        """Give every sequence of the bound context a chain (anew after ``detach``); False,
        and none attached, where llama.cpp cannot run one on the backend."""
        if self._chains:
            return True
        for seq in range(self.seqs):
            self._chains.append(self._chain())
            if not llama_cpp.llama_set_sampler(self.ctx, seq, self._chains[-1]):
                self.detach()
                return False
        return True

    def detach(self) -> None:
        """Back to logits rows for every sequence; the chains are freed."""
        for seq in range(len(self._chains)):
            llama_cpp.llama_set_sampler(self.ctx, seq, None)
        self.free()

    def free(self) -> None:
        """Free the chains without telling the context (after ``llama_free``)."""
        for chain in self._chains:
            llama_cpp.llama_sampler_free(chain)
        self._chains = []
        self._configs = None

    def tokens(self, n: int) -> list[int]:
        """The chosen token of each of the last decode's last ``n`` outputs (-1 where
        llama.cpp sampled none: its backend could not take the chains)."""
        return self.tokens_at(range(-n, 0))

    def probabilities(self, n: int) -> list[float]:
        """The chosen tokens' probabilities (``confidence``), in the same order."""
        return self.probabilities_at(range(-n, 0))

    def tokens_at(self, at: Iterable[int]) -> list[int]:
        """``tokens`` of the outputs ``at``: the batch's token indices, or from the end of
        its outputs where negative (llama.cpp's ``_ith`` indices)."""
        get = llama_cpp.llama_get_sampled_token_ith
        return [get(self.ctx, i) for i in at]

    def probabilities_at(self, at: Iterable[int]) -> list[float]:
        """``probabilities`` of the outputs ``at`` (as ``tokens_at``)."""
        get = llama_cpp.llama_get_sampled_probs_ith
        found = [get(self.ctx, i) for i in at]
        return [p[0] if p else 0.0 for p in found]  # NULL where none was sampled
