"""Verification of a draft against the target's choices or logits, as pure functions.

Given what the target computed after ``[last, d1 .. dK]`` (K+1 positions), a verdict says
how many drafts survive and which token the target adds (the correction at the first
rejection, or the bonus token when all K survive):

- greedy: from the target's greedy choice after each position (token ids; no logits row
  is needed), accept the longest prefix with ``choice_i == d_i`` and add the next choice.
  The result is the target's own greedy decoding.
- sampled, from the target's logits rows (exact speculative sampling, Leviathan et al. 2023 / Chen
  et al. 2023): accept ``d_i`` with probability ``min(1, p(d_i) / q(d_i))``; at the first rejection
  draw from ``norm(max(0, p - q))``; if all survive draw the bonus from the last row. ``q`` is the
  draft's warped distribution, or ``None`` for a deterministic (n-gram) draft, which is a one-hot
  ``q``. This preserves the target's distribution exactly. A draft whose vocabulary is smaller than
  the target's gives a shorter ``q``: the ids it lacks have probability 0 under it, so ``q`` is
  padded with zeros (the drafter already cuts a longer one to the target's size).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from localspec.core.params import GenerationParams
from localspec.core.sampling import sample, warp


@dataclass(frozen=True)
class Verdict:
    accepted: int  # drafted tokens that survived
    token: int  # the target's own token appended after them

    def tokens(self, draft: Sequence[int]) -> list[int]:
        return [*draft[: self.accepted], self.token]


def verify_greedy(choices: Sequence[int], draft: Sequence[int]) -> Verdict:
    """``choices``: the target's greedy token after each of ``len(draft) + 1`` positions."""
    for i, d in enumerate(draft):
        if choices[i] != d:
            return Verdict(i, int(choices[i]))
    return Verdict(len(draft), int(choices[len(draft)]))


def fit(q: np.ndarray, size: int) -> np.ndarray:
    """``q`` over ``size`` ids: zeros for ids past its end, cut where it is longer."""
    if len(q) == size:
        return q
    if len(q) > size:
        return q[:size]
    return np.concatenate([q, np.zeros(size - len(q), dtype=q.dtype)])


def verify_sampled(
    target_probs: Callable[[int], np.ndarray],
    draft: Sequence[int],
    draft_probs: Sequence[np.ndarray] | None,
    rng: np.random.Generator,
    *,
    beyond: np.ndarray | None = None,
) -> Verdict:
    """Exact speculative sampling.

    ``target_probs(i)`` gives the warped target distribution p at row i (lazily, so rows
    past the first rejection are never warped); ``draft_probs[i]`` is q for ``draft[i]``,
    or ``draft_probs`` is None for a one-hot q. ``beyond``: the q of a drafted token that
    followed ``draft`` and was cut because p gives it nothing (a grammar forbids it); its
    rejection is certain, so when all of ``draft`` survives the token after it is drawn from
    ``norm(max(0, p - beyond))``, as verifying it would have (with a one-hot q that is p).
    """
    for i, d in enumerate(draft):
        p = target_probs(i)
        q_d = 1.0 if draft_probs is None else float(draft_probs[i][d])
        if q_d > 0.0 and rng.random() * q_d < p[d]:
            continue  # accepted with probability min(1, p/q)
        if draft_probs is None:
            residual = p.copy()
            residual[d] = 0.0
        else:
            residual = np.maximum(p - fit(draft_probs[i], len(p)), 0.0)
        total = residual.sum()
        # total == 0 only when p == q, where rejection has probability 0; guard rounding.
        return Verdict(i, sample(residual / total if total > 0 else p, rng))
    p = target_probs(len(draft))
    if beyond is not None:
        residual = np.maximum(p - fit(beyond, len(p)), 0.0)
        total = residual.sum()
        p = residual / total if total > 0 else p
    return Verdict(len(draft), sample(p, rng))


def verify_rows(
    rows: np.ndarray,
    draft: Sequence[int],
    draft_probs: Sequence[np.ndarray] | None,
    params: GenerationParams,
    rng: np.random.Generator,
) -> Verdict:
    """``verify_sampled`` over the target's logits rows, each warped by ``params`` only
    when it is reached."""
    warped: dict[int, np.ndarray] = {}

    def target_probs(i: int) -> np.ndarray:
        if i not in warped:
            warped[i] = warp(rows[i], params)
        return warped[i]

    return verify_sampled(target_probs, draft, draft_probs, rng)
