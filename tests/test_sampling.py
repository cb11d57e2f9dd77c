"""Sampling warps: each filter keeps what it should and the result is a distribution."""

from __future__ import annotations

import numpy as np

from localspec.core.params import GenerationParams
from localspec.core.sampling import sample, top_probability, warp

LOGITS = np.log(np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04]))


def params(**kw):
    base = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    base.update(kw)
    return GenerationParams(**base)


def test_no_filters_at_temperature_one_is_softmax():
    np.testing.assert_allclose(warp(LOGITS, params()), np.exp(LOGITS), rtol=1e-9)


def test_top_k_keeps_k_most_likely():
    p = warp(LOGITS, params(top_k=2))
    np.testing.assert_allclose(p[:2], [0.4 / 0.65, 0.25 / 0.65])
    assert p[2:].sum() == 0


def test_top_p_keeps_smallest_prefix_reaching_mass():
    p = warp(LOGITS, params(top_p=0.7))
    assert (p > 0).sum() == 3  # 0.4 + 0.25 < 0.7 <= 0.8


def test_min_p_drops_tokens_below_fraction_of_top():
    p = warp(LOGITS, params(min_p=0.3))  # threshold 0.12
    assert (p > 0).tolist() == [True, True, True, False, False, False]


def test_temperature_sharpens_and_flattens():
    cold = warp(LOGITS, params(temperature=0.5))
    hot = warp(LOGITS, params(temperature=2.0))
    assert cold[0] > 0.4 > hot[0]
    for p in (cold, hot):
        assert abs(p.sum() - 1) < 1e-12


def test_sample_follows_probabilities():
    rng = np.random.default_rng(0)
    p = np.array([0.1, 0.0, 0.6, 0.3])
    draws = np.bincount([sample(p, rng) for _ in range(20000)], minlength=4) / 20000
    assert draws[1] == 0
    np.testing.assert_allclose(draws, p, atol=0.015)


def test_top_probability():
    assert abs(top_probability(LOGITS) - 0.4) < 1e-9


def test_a_temperature_too_small_to_divide_by_is_greedy():
    # Logits divided by 1e-308 overflow: every probability would be NaN and the sampler
    # would return the vocabulary's last id.
    for tiny in (1e-308, 5e-324, 1e-7):
        assert params(temperature=tiny).greedy
    p = warp(LOGITS, params(temperature=1e-6))  # the smallest that samples still warps
    assert np.isfinite(p).all() and p[0] == 1.0
    assert sample(p, np.random.default_rng(0)) == 0
