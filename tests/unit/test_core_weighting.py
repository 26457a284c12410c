"""Properties of raytrain_hetero.core.weighting: count weights give the exact global mean."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from raytrain_hetero.core.weighting import gradient_scale, proportional_weights, uniform_weights
from raytrain_hetero.errors import ConfigError

finite_values = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False)


@st.composite
def uneven_splits(draw):
    """A float64 array (the per-sample 'gradients') and an uneven split into >= 1 ranks."""
    counts = draw(st.lists(st.integers(min_value=1, max_value=40), min_size=1, max_size=8))
    samples = draw(hnp.arrays(np.float64, sum(counts), elements=finite_values))
    bounds = np.cumsum(counts)[:-1]
    return counts, np.split(samples, bounds)


@settings(max_examples=200, deadline=None)
@given(uneven_splits())
def test_proportional_weights_give_the_global_mean(split):
    counts, parts = split
    weights = proportional_weights(counts)
    weighted = sum(w * part.mean() for w, part in zip(weights, parts))
    expected = np.concatenate(parts).mean()
    scale = max(1.0, float(np.max(np.abs(np.concatenate(parts)))))
    # Relative to the data's magnitude: the global mean itself can cancel to ~0.
    assert abs(weighted - expected) <= 1e-12 * scale


@settings(max_examples=200, deadline=None)
@given(uneven_splits())
def test_gradient_scale_with_sum_allreduce_gives_the_global_mean(split):
    counts, parts = split
    total = sum(counts)
    reduced = sum(
        gradient_scale(n, total, len(counts), "proportional") * part.mean()
        for n, part in zip(counts, parts)
    )
    scale = max(1.0, float(np.max(np.abs(np.concatenate(parts)))))
    assert abs(reduced - np.concatenate(parts).mean()) <= 1e-12 * scale


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=16).filter(any))
def test_weights_sum_to_one(counts):
    assert sum(proportional_weights(counts)) == pytest.approx(1.0, rel=1e-12)
    assert sum(uniform_weights(counts)) == pytest.approx(1.0, rel=1e-12)


def test_uniform_weights_are_biased_when_counts_differ():
    # A fast rank with 30 samples of value 1 and a slow rank with 10 samples of value 0:
    # the true mean is 0.75, the HDP-style 1/world_size average says 0.5.
    parts = [np.ones(30), np.zeros(10)]
    counts = [30, 10]
    true_mean = np.concatenate(parts).mean()
    proportional = sum(w * p.mean() for w, p in zip(proportional_weights(counts), parts))
    uniform = sum(w * p.mean() for w, p in zip(uniform_weights(counts), parts))
    assert true_mean == pytest.approx(0.75)
    assert proportional == pytest.approx(0.75, rel=1e-15)
    assert uniform == pytest.approx(0.5)
    assert abs(uniform - true_mean) > 0.2


def test_uniform_equals_proportional_when_counts_are_equal():
    assert uniform_weights([7, 7, 7]) == pytest.approx(proportional_weights([7, 7, 7]))


def test_proportional_weights_values():
    assert proportional_weights([3, 1, 0]) == (0.75, 0.25, 0.0)
    assert uniform_weights([3, 1, 0]) == pytest.approx((1 / 3, 1 / 3, 1 / 3))


def test_gradient_scale_values():
    assert gradient_scale(30, 40, 2, "proportional") == pytest.approx(0.75)
    assert gradient_scale(30, 40, 2, "uniform") == pytest.approx(0.5)
    assert gradient_scale(0, 40, 2, "proportional") == 0.0


@pytest.mark.parametrize("weights", [proportional_weights, uniform_weights])
@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        ([], "counts is empty"),
        ([3, -1], r"counts\[1\] must be a non-negative integer"),
        ([0, 0], "sum to zero"),
        ([1.5, 2], r"counts\[0\] must be a non-negative integer"),
        ([True, 2], r"counts\[0\] must be a non-negative integer"),
    ],
)
def test_weights_reject_bad_counts(weights, counts, expected):
    with pytest.raises(ConfigError, match=expected):
        weights(counts)


def test_weights_errors_are_value_errors():
    with pytest.raises(ValueError):
        proportional_weights([])


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((1, 2, 2, "mean"), "weighting must be one of"),
        ((1, 2, 2, "Proportional"), "weighting must be one of"),
        ((-1, 2, 2, "proportional"), "rank_count must be a non-negative integer"),
        ((1, 0, 2, "proportional"), "global_count must be >= 1"),
        ((3, 2, 2, "proportional"), "rank_count 3 exceeds global_count 2"),
        ((1, 2, 0, "uniform"), "world_size must be an integer >= 1"),
        ((1, 2, 1.0, "uniform"), "world_size must be an integer >= 1"),
        ((1.0, 2, 2, "proportional"), "rank_count must be a non-negative integer"),
    ],
)
def test_gradient_scale_rejects_bad_inputs(args, expected):
    with pytest.raises(ConfigError, match=expected):
        gradient_scale(*args)
