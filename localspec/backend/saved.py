"""A lane's sequence saved and restored as llama.cpp's bytes (the prompt cache's states,
storage/prompt_cache.py): functions over (the shared context, the lane's sequence), run
where the context's evaluations run (``SharedContext.call``: another lane may be
evaluating)."""

from __future__ import annotations

import ctypes

import llama_cpp

from localspec.backend.context import SharedContext
from localspec.errors import BackendError


def read_state(shared: SharedContext, seq: int) -> memoryview:
    """llama.cpp's bytes of sequence ``seq``: a view of the one copy (tens of megabytes for
    a long prompt), not a second one."""
    return shared.call(_read, shared, seq)


def write_state(shared: SharedContext, seq: int, state: bytes | memoryview, n_tokens: int) -> bool:
    """Sequence ``seq`` made from ``state``; whether llama.cpp took the bytes and they hold
    ``n_tokens`` positions. Where not, the sequence is left empty."""
    if shared.call(_write, shared, seq, state, n_tokens):
        return True
    llama_cpp.llama_memory_seq_rm(shared.memory, seq, -1, -1)
    return False


def _read(shared: SharedContext, seq: int) -> memoryview:
    size = llama_cpp.llama_state_seq_get_size(shared.ctx, seq)
    buffer = (ctypes.c_uint8 * size)()
    written = llama_cpp.llama_state_seq_get_data(shared.ctx, buffer, size, seq)
    if not written:
        raise BackendError(f"llama.cpp could not copy the state of {shared.weights.path.name}")
    return memoryview(buffer).cast("B")[:written]


def _write(shared: SharedContext, seq: int, state: bytes | memoryview, n_tokens: int) -> bool:
    source = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
    if not llama_cpp.llama_state_seq_set_data(shared.ctx, source, len(state), seq):
        return False
    last = llama_cpp.llama_memory_seq_pos_max(shared.memory, seq)
    return last == n_tokens - 1
