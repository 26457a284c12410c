"""core.memory: the memory cap from (fixed, per-sample, budget), the peak fit, the micro-batch
split. Property-tested: the cap is the largest batch that fits, and no larger one does."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytrain_hetero.core.memory import (
    MemoryModel,
    fit_memory_model,
    memory_cap,
    micro_batch_sizes,
)
from raytrain_hetero.errors import AllocationError

PROPERTY_SETTINGS = settings(max_examples=200, deadline=None)
BYTES = st.floats(min_value=0.0, max_value=1e12, allow_nan=False, allow_infinity=False)


@PROPERTY_SETTINGS
@given(fixed=BYTES, per_sample=BYTES, budget=BYTES)
def test_cap_is_the_largest_batch_that_fits(fixed, per_sample, budget):
    cap = memory_cap(fixed, per_sample, budget)
    if cap is None:  # only when no countable batch reaches the budget
        assert fixed + per_sample * 2**53 <= budget
        return
    assert cap >= 0
    if cap > 0:
        assert fixed + per_sample * cap <= budget
    assert fixed + per_sample * (cap + 1) > budget


@PROPERTY_SETTINGS
@given(fixed=BYTES, per_sample=st.floats(1e-3, 1e9), budget=BYTES, more=BYTES)
def test_cap_grows_with_the_budget(fixed, per_sample, budget, more):
    assert memory_cap(fixed, per_sample, budget + more) >= memory_cap(fixed, per_sample, budget)


def test_cap_examples():
    assert memory_cap(100.0, 10.0, 200.0) == 10
    assert memory_cap(100.0, 10.0, 209.0) == 10
    assert memory_cap(100.0, 10.0, 99.0) == 0  # not even the fixed part fits
    assert memory_cap(100.0, 0.0, 150.0) is None
    with pytest.raises(AllocationError, match="per_sample_bytes"):
        memory_cap(0.0, -1.0, 10.0)
    with pytest.raises(AllocationError, match="finite"):
        memory_cap(0.0, 1.0, math.inf)


@PROPERTY_SETTINGS
@given(n=st.integers(1, 5000), cap=st.one_of(st.none(), st.integers(1, 600)))
def test_micro_batches_cover_the_slice_within_the_cap(n, cap):
    parts = micro_batch_sizes(n, cap)
    assert sum(parts) == n
    assert max(parts) - min(parts) <= 1 and list(parts) == sorted(parts, reverse=True)
    if cap is None or n <= cap:
        assert parts == (n,)
    else:
        assert max(parts) <= cap and len(parts) == math.ceil(n / cap)  # the fewest


def test_micro_batch_split_refuses_nonsense():
    with pytest.raises(AllocationError):
        micro_batch_sizes(0, 4)
    with pytest.raises(AllocationError):
        micro_batch_sizes(5, 0)


@PROPERTY_SETTINGS
@given(
    fixed=st.floats(0.0, 1e9),
    per_sample=st.floats(0.0, 1e7),
    sizes=st.lists(st.integers(1, 512), min_size=2, max_size=5, unique=True),
)
def test_fit_recovers_an_exact_affine_peak(fixed, per_sample, sizes):
    model = fit_memory_model(sizes, [fixed + per_sample * b for b in sizes])
    for b in sizes:
        assert model.peak(b) == pytest.approx(fixed + per_sample * b, rel=1e-6, abs=1e-3)


@PROPERTY_SETTINGS
@given(
    sizes=st.lists(st.integers(1, 512), min_size=2, max_size=5, unique=True),
    peaks=st.lists(st.floats(0.0, 1e10), min_size=5, max_size=5),
)
def test_fit_is_never_negative(sizes, peaks):
    model = fit_memory_model(sizes, peaks[: len(sizes)])
    assert model.fixed_bytes >= 0 and model.per_sample_bytes >= 0


def test_fit_clamps_noise_conservatively():
    # A falling peak (noise) is a fixed cost at the worst measurement.
    assert fit_memory_model([4, 8], [200.0, 100.0]) == MemoryModel(200.0, 0.0)
    # A negative intercept becomes a pure per-sample cost through the worst ratio.
    model = fit_memory_model([2, 4], [100.0, 400.0])
    assert model.fixed_bytes == 0 and model.per_sample_bytes == 100.0
    with pytest.raises(AllocationError, match="distinct"):
        fit_memory_model([4, 4], [1.0, 2.0])


@PROPERTY_SETTINGS
@given(
    sizes=st.lists(st.integers(1, 512), min_size=2, max_size=5, unique=True),
    peaks=st.lists(st.floats(0.0, 1e10), min_size=5, max_size=5),
)
def test_fit_never_predicts_less_than_a_measurement(sizes, peaks):
    model = fit_memory_model(sizes, peaks[: len(sizes)])
    for b, p in zip(sizes, peaks):
        assert model.peak(b) >= p * (1 - 1e-9) - 1e-3


def test_fit_covers_a_peak_above_the_least_squares_line():
    # Least squares through (1, 2), (2, 8), (3, 8) is 3b + 0 and would predict 6 at b=2.
    model = fit_memory_model([1, 2, 3], [2.0, 8.0, 8.0])
    assert model.per_sample_bytes == pytest.approx(3.0)
    assert model.fixed_bytes == pytest.approx(2.0)
    # A non-monotone noise pattern with a flat trend is a fixed cost at the worst peak.
    assert fit_memory_model([1, 2, 3], [10.0, 20.0, 10.0]) == MemoryModel(20.0, 0.0)


def test_fit_rejects_a_batch_size_below_one():
    with pytest.raises(AllocationError, match="Invalid memory measurements"):
        fit_memory_model([0, 4], [1.0, 2.0])
