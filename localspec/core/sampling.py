"""Logits -> warped probability distributions, pure numpy.

The draft's q and the target's p must be warped identically for exact speculative
sampling, so both go through ``warp``. Order follows llama.cpp's default sampler chain:
top-k, top-p, min-p (all on the temperature-1 distribution), then temperature.
``warp`` returns a dense float64 vector over the whole vocabulary that sums to 1.
"""

from __future__ import annotations

import numpy as np

from localspec.core.params import GenerationParams


def softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64, copy=False)
    e = np.exp(x - x.max())
    return e / e.sum()


def warp(logits: np.ndarray, params: GenerationParams) -> np.ndarray:
    """The sampling distribution for ``logits`` under ``params`` (temperature > 0)."""
    logits = np.asarray(logits, dtype=np.float64)
    n = logits.shape[-1]
    keep = np.arange(n)
    if 0 < params.top_k < n:
        keep = np.argpartition(-logits, params.top_k - 1)[: params.top_k]
    vals = logits[keep]
    order = np.argsort(-vals, kind="stable")
    keep, vals = keep[order], vals[order]
    probs = softmax(vals)
    if params.top_p < 1.0:
        # Keep the smallest prefix whose mass reaches top_p (at least one token).
        cut = int(np.searchsorted(np.cumsum(probs), params.top_p)) + 1
        keep, vals, probs = keep[:cut], vals[:cut], probs[:cut]
    if params.min_p > 0.0:
        mask = probs >= params.min_p * probs[0]
        keep, vals = keep[mask], vals[mask]
    out = np.zeros(n, dtype=np.float64)
    out[keep] = softmax(vals / params.temperature)
    return out


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one token id from a probability vector."""
    cdf = np.cumsum(probs)
    u = rng.random() * cdf[-1]
    return int(min(np.searchsorted(cdf, u, side="right"), len(probs) - 1))


def top_probability(logits: np.ndarray) -> float:
    """Probability of the most likely token at temperature 1 (draft confidence)."""
    x = np.asarray(logits, dtype=np.float64)
    m = x.max()
    return float(1.0 / np.exp(x - m).sum())


def top_probabilities(rows: np.ndarray) -> list[float]:
    """``top_probability`` of each row."""
    return [top_probability(row) for row in rows]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64)
    shifted = x - x.max()
    return shifted - np.log(np.exp(shifted).sum())
