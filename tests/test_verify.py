"""Greedy and exact sampled verification over hand-built logits and distributions."""

from __future__ import annotations

import numpy as np
import pytest

from localspec.core.verify import Verdict, verify_greedy, verify_sampled


def test_greedy_all_accepted_plus_bonus():
    v = verify_greedy([3, 4, 5, 6], [3, 4, 5])
    assert v == Verdict(accepted=3, token=6)
    assert v.tokens([3, 4, 5]) == [3, 4, 5, 6]


def test_greedy_first_token_rejected_gives_correction():
    v = verify_greedy([2, 4, 5], [3, 4])
    assert v == Verdict(accepted=0, token=2)
    assert v.tokens([3, 4]) == [2]


def test_greedy_rejection_in_the_middle():
    assert verify_greedy([3, 1, 5, 6], [3, 4, 5]) == Verdict(1, 1)


def test_greedy_empty_draft_is_a_plain_step():
    assert verify_greedy([7], []) == Verdict(0, 7)


def test_sampled_one_hot_draft_accepted_when_target_is_certain():
    p = np.array([0.0, 1.0, 0.0])
    rng = np.random.default_rng(0)
    v = verify_sampled(lambda i: p, [1, 1], None, rng)
    assert v.accepted == 2 and v.token == 1


def test_sampled_impossible_draft_always_rejected_and_corrected_from_residual():
    p = np.array([0.5, 0.5, 0.0])
    q = np.array([0.0, 0.0, 1.0])
    for seed in range(50):
        v = verify_sampled(lambda i: p, [2], [q], np.random.default_rng(seed))
        assert v.accepted == 0 and v.token in (0, 1)


def test_sampled_residual_excludes_overdrafted_mass():
    # q puts more mass on token 0 than p: after a rejection of token 0, the residual
    # max(0, p - q) is zero at 0, so the correction is never 0.
    p = np.array([0.2, 0.8])
    q = np.array([0.9, 0.1])
    seen = set()
    for seed in range(200):
        v = verify_sampled(lambda i: p, [0], [q], np.random.default_rng(seed))
        if v.accepted == 0:
            seen.add(v.token)
    assert seen == {1}


def _first_token_distribution(p, q, n, one_hot_draft=None):
    counts = np.zeros(len(p))
    rng = np.random.default_rng(12345)
    for _ in range(n):
        if one_hot_draft is None:
            d = int(rng.choice(len(q), p=q))
            v = verify_sampled(lambda i: p, [d], [q], rng)
        else:
            v = verify_sampled(lambda i: p, [one_hot_draft], None, rng)
        counts[v.tokens([d] if one_hot_draft is None else [one_hot_draft])[0]] += 1
    return counts / n


@pytest.mark.parametrize(
    "q",
    [
        np.array([0.1, 0.2, 0.3, 0.25, 0.15]),
        np.array([0.7, 0.05, 0.05, 0.1, 0.1]),
        np.array([0.0, 0.0, 0.5, 0.5, 0.0]),
    ],
)
def test_speculative_sampling_preserves_target_distribution(q):
    """Total variation between emitted and target distribution stays within sampling error.

    With n samples over 5 outcomes the expected TV distance is below ~0.01 for n=40000;
    the seeded run makes the check deterministic, and a wrong algorithm (e.g. emitting the
    draft unconditionally) lands at TV >= 0.1 for these p, q.
    """
    p = np.array([0.3, 0.1, 0.05, 0.25, 0.3])
    got = _first_token_distribution(p, q, 40000)
    assert 0.5 * np.abs(got - p).sum() < 0.015


def test_one_hot_ngram_draft_preserves_target_distribution():
    p = np.array([0.3, 0.1, 0.05, 0.25, 0.3])
    got = _first_token_distribution(p, None, 40000, one_hot_draft=3)
    assert 0.5 * np.abs(got - p).sum() < 0.015


def test_two_position_draft_preserves_joint_distribution():
    """The first two emitted tokens follow p0 x p1 (the target's own sequence law)."""
    p_rows = [np.array([0.6, 0.3, 0.1]), np.array([0.2, 0.5, 0.3]), np.array([0.1, 0.1, 0.8])]
    q_rows = [np.array([0.3, 0.3, 0.4]), np.array([0.6, 0.2, 0.2])]
    rng = np.random.default_rng(7)
    counts = np.zeros((3, 3))
    n = 60000
    for _ in range(n):
        d = [int(rng.choice(3, p=q_rows[0])), int(rng.choice(3, p=q_rows[1]))]
        v = verify_sampled(lambda i: p_rows[i], d, q_rows, rng)
        toks = v.tokens(d)
        if len(toks) == 1:  # rejected at position 0: the next token comes from the next round
            toks.append(int(rng.choice(3, p=p_rows[1])))
        counts[toks[0], toks[1]] += 1
    expected = np.outer(p_rows[0], p_rows[1])
    assert 0.5 * np.abs(counts / n - expected).sum() < 0.015
