"""The target's ceiling: the most any lossless speculative method could reach on this machine.

``measure_ceiling(model, context, depth)`` times batches of ``CEILING_BATCHES`` tokens with
logits for every position after a context (``ceiling_context``) against a plain step after
the same context; ``BenchRunner.ceilings`` measures it per category, at the depth where that
category's answers run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

CEILING_BATCHES = (16, 32, 64)  # up to the longest draft worth verifying (n-gram copies)
CEILING_CONTEXT = 256  # sample context the ceiling batches are verified after


def ceiling_batches(n_ctx: int, context_tokens: int) -> list[int]:
    """The batch sizes ``measure_ceiling`` times: ``CEILING_BATCHES`` capped at the room the
    sample context leaves."""
    room = max(1, n_ctx - context_tokens)
    return list(dict.fromkeys(min(b, room) for b in CEILING_BATCHES))


def ceiling_context(context: Sequence[int], depth: int | None, n_ctx: int) -> list[int]:
    """The context to time batches after, leaving room for a batch: ``context`` up to
    ``CEILING_CONTEXT`` tokens, or when a ``depth`` is given, ``context`` repeated to that
    many tokens (attention costs the same whatever the tokens are)."""
    room = n_ctx - CEILING_BATCHES[0]
    if depth is None:
        return list(context)[: max(1, min(CEILING_CONTEXT, room))]
    depth = max(1, min(depth, room))
    context = list(context) or [0]
    return (context * (depth // len(context) + 1))[:depth]


def measure_ceiling(
    model: Any, context: Sequence[int], depth: int | None = None, reps: int = 3
) -> dict[str, Any]:
    """The target's best throughput over batches of 16, 32 and 64 tokens with logits for
    every position after ``context`` (``ceiling_context``: its first ``CEILING_CONTEXT``
    tokens, or ``depth`` tokens when given), each the
    fastest of ``reps`` after a warm-up, vs a plain step after the same context.

    This bounds any lossless speculative method at that depth on this machine: no round can
    emit more than the batch it verified, and no batch worth verifying is cheaper per token
    than the best one here. ``batch`` is the size that gave the best tokens/s; ``by_batch``
    lists all; ``depth`` is the context measured after.
    """
    base = ceiling_context(context, depth, model.n_ctx)
    sizes = ceiling_batches(model.n_ctx, len(base))
    extra = (base * (max(sizes) // len(base) + 2))[: max(sizes)]

    def timed(n: int) -> float:
        model.forward(base, 0)
        t0 = time.perf_counter()
        model.forward(base + extra[:n], n)
        return time.perf_counter() - t0

    def fastest(n: int) -> float:
        timed(n)  # warm-up
        return min(timed(n) for _ in range(reps))

    timings = [(size, fastest(size)) for size in sizes]
    plain_s = fastest(1)
    model.reset()
    batch, batch_s = max(timings, key=lambda t: t[0] / t[1])
    return {
        "batch": batch,
        "batch_s": round(batch_s, 6),
        "tokens_per_s": round(batch / batch_s, 3),
        "plain_tokens_per_s": round(1 / plain_s, 3),
        "ceiling_ratio": round(batch * plain_s / batch_s, 3),
        "depth": len(base),
        "by_batch": [
            {"batch": n, "batch_s": round(s, 6), "tokens_per_s": round(n / s, 3)}
            for n, s in timings
        ],
    }
