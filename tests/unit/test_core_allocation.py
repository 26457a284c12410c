"""Properties of raytrain_hetero.core.allocation: feasibility, optimality, monotonicity, fits."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytrain_hetero.core import allocation as allocation_module
from raytrain_hetero.core.allocation import (
    CostModel,
    allocate,
    fit_cost_model,
    makespan,
    proportional_slices,
)
from raytrain_hetero.errors import AllocationError

PROPERTY_SETTINGS = settings(max_examples=150, deadline=None)
# Optimality is exact up to float rounding of the step times themselves.
MAKESPAN_TOLERANCE = 1e-12

alphas = st.floats(min_value=0.0, max_value=5.0, allow_nan=False, allow_infinity=False)
betas = st.floats(min_value=1e-3, max_value=1.0, allow_nan=False, allow_infinity=False)
cost_models = st.builds(CostModel, alpha=alphas, beta=betas)


@st.composite
def slicing_problems(draw, max_workers: int = 6, max_cap: int = 60, max_total: int = 10_000):
    """A feasible (total, costs, caps, min_slice) request, caps possibly partly None."""
    n_workers = draw(st.integers(min_value=1, max_value=max_workers))
    costs = draw(st.lists(cost_models, min_size=n_workers, max_size=n_workers))
    min_slice = draw(st.integers(min_value=1, max_value=3))
    caps = draw(
        st.none()
        | st.lists(
            st.none() | st.integers(min_value=min_slice, max_value=max_cap),
            min_size=n_workers,
            max_size=n_workers,
        )
    )
    if caps is not None and all(c is not None for c in caps):
        upper = sum(caps)
    else:
        upper = n_workers * min_slice + 300
    minimum = n_workers * min_slice
    total = draw(st.integers(min_value=minimum, max_value=max(minimum, min(upper, max_total))))
    return total, costs, caps, min_slice


def _assert_feasible(slices, total, caps, min_slice):
    assert sum(slices) == total
    assert all(isinstance(b, int) for b in slices)
    assert all(b >= min_slice for b in slices)
    if caps is not None:
        assert all(cap is None or b <= cap for b, cap in zip(slices, caps))


def _equal_split(total: int, n_workers: int) -> list[int]:
    base, extra = divmod(total, n_workers)
    return [base + (i < extra) for i in range(n_workers)]


# --- CostModel -----------------------------------------------------------------------------


def test_cost_model_time_and_throughput():
    model = CostModel(alpha=0.5, beta=0.25)
    assert model.time(4) == pytest.approx(1.5)
    assert model.samples_per_second == pytest.approx(4.0)


@pytest.mark.parametrize(
    ("alpha", "beta", "field"),
    [
        (-0.1, 1.0, "alpha"),
        (math.nan, 1.0, "alpha"),
        (0.0, 0.0, "beta"),
        (0.0, -1.0, "beta"),
        (0.0, math.inf, "beta"),
    ],
)
def test_cost_model_rejects_invalid_parameters(alpha, beta, field):
    with pytest.raises(AllocationError, match=field):
        CostModel(alpha=alpha, beta=beta)


# --- allocate: invariants --------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(slicing_problems())
def test_allocate_is_feasible(problem):
    total, costs, caps, min_slice = problem
    slices = allocate(total, costs, caps=caps, min_slice=min_slice)
    assert len(slices) == len(costs)
    _assert_feasible(slices, total, caps, min_slice)


@PROPERTY_SETTINGS
@given(slicing_problems(), st.data())
def test_faster_worker_never_gets_smaller_slice(problem, data):
    total, costs, caps, min_slice = problem
    worker = data.draw(st.integers(min_value=0, max_value=len(costs) - 1))
    speedup = data.draw(st.floats(min_value=0.05, max_value=0.95))
    faster_costs = list(costs)
    faster_costs[worker] = dataclasses.replace(costs[worker], beta=costs[worker].beta * speedup)
    before = allocate(total, costs, caps=caps, min_slice=min_slice)
    after = allocate(total, faster_costs, caps=caps, min_slice=min_slice)
    assert after[worker] >= before[worker]


@PROPERTY_SETTINGS
@given(
    cost_models,
    st.integers(min_value=1, max_value=12),
    st.integers(min_value=1, max_value=3),
    st.data(),
)
def test_equal_cost_models_get_equal_slices(model, n_workers, min_slice, data):
    minimum = n_workers * min_slice
    total = data.draw(st.integers(min_value=minimum, max_value=minimum + 500))
    slices = allocate(total, [model] * n_workers, min_slice=min_slice)
    assert max(slices) - min(slices) <= 1
    # Extra units go to the lower ranks.
    assert list(slices) == sorted(slices, reverse=True)


@PROPERTY_SETTINGS
@given(slicing_problems())
def test_allocate_beats_proportional_and_equal_split(problem):
    total, costs, caps, min_slice = problem
    best = makespan(allocate(total, costs, caps=caps, min_slice=min_slice), costs)
    by_speed = proportional_slices(
        total, [c.samples_per_second for c in costs], caps=caps, min_slice=min_slice
    )
    _assert_feasible(by_speed, total, caps, min_slice)
    assert best <= makespan(by_speed, costs) + MAKESPAN_TOLERANCE
    equal = _equal_split(total, len(costs))
    if caps is None or all(cap is None or b <= cap for b, cap in zip(equal, caps)):
        assert best <= makespan(equal, costs) + MAKESPAN_TOLERANCE


@settings(max_examples=200, deadline=None)
@given(slicing_problems(max_workers=3, max_cap=12, max_total=12))
def test_allocate_matches_brute_force_optimum(problem):
    total, costs, caps, min_slice = problem
    bounds = [total if cap is None else min(total, cap) for cap in (caps or [None] * len(costs))]
    candidates = [
        split
        for split in itertools.product(*(range(min_slice, upper + 1) for upper in bounds))
        if sum(split) == total
    ]
    assert candidates, "the strategy should only produce feasible problems"
    optimum = min(makespan(split, costs) for split in candidates)
    slices = allocate(total, costs, caps=caps, min_slice=min_slice)
    _assert_feasible(slices, total, caps, min_slice)
    assert makespan(slices, costs) <= optimum + MAKESPAN_TOLERANCE


def _reference_greedy(total, costs, caps, min_slice):
    """The textbook algorithm allocate fast-forwards: one unit at a time, ties to lowest index."""
    slices = [min_slice] * len(costs)
    caps = caps or [None] * len(costs)
    for _ in range(total - sum(slices)):
        open_workers = [i for i, cap in enumerate(caps) if cap is None or slices[i] < cap]
        best = min(open_workers, key=lambda i: (costs[i].time(slices[i] + 1), i))
        slices[best] += 1
    return tuple(slices)


@PROPERTY_SETTINGS
@given(slicing_problems(max_total=400))
def test_allocate_equals_one_unit_at_a_time_greedy(problem):
    total, costs, caps, min_slice = problem
    assert allocate(total, costs, caps=caps, min_slice=min_slice) == _reference_greedy(
        total, costs, caps, min_slice
    )


@settings(max_examples=50, deadline=None)
@given(slicing_problems(max_total=400))
def test_heap_fallback_equals_vectorised_top_up(problem):
    total, costs, caps, min_slice = problem
    vectorised = allocate(total, costs, caps=caps, min_slice=min_slice)
    original = allocation_module._MAX_TOP_UP_WINDOW
    allocation_module._MAX_TOP_UP_WINDOW = 0  # force the heap path
    try:
        with_heap = allocate(total, costs, caps=caps, min_slice=min_slice)
    finally:
        allocation_module._MAX_TOP_UP_WINDOW = original
    assert with_heap == vectorised


def test_degenerate_float_costs_still_allocate():
    # beta so small that alpha + beta * b rounds to alpha: every unit "costs" the same.
    costs = [CostModel(1.0, 1e-17), CostModel(1.0, 1e-17), CostModel(0.0, 1.0)]
    slices = allocate(1000, costs)
    assert sum(slices) == 1000 and slices[2] == 1
    assert abs(slices[0] - slices[1]) <= 1


def test_affine_model_beats_speed_proportional_split_when_overheads_differ():
    # Same per-sample speed, but worker 1 pays one extra second per step (e.g. slow launch
    # or host sync). A speed-proportional split ignores that and gives both 50 samples.
    costs = [CostModel(alpha=0.0, beta=0.01), CostModel(alpha=1.0, beta=0.01)]
    naive = proportional_slices(100, [c.samples_per_second for c in costs])
    assert naive == (50, 50)
    slices = allocate(100, costs)
    assert slices == (99, 1)
    assert makespan(slices, costs) == pytest.approx(1.01)
    assert makespan(naive, costs) == pytest.approx(1.5)
    assert makespan(slices, costs) < makespan(naive, costs) - 0.4


def test_allocate_respects_caps_and_moves_overflow():
    costs = [CostModel(0.0, 0.001), CostModel(0.0, 0.01), CostModel(0.0, 0.01)]
    uncapped = allocate(120, costs)
    assert uncapped[0] > 40
    capped = allocate(120, costs, caps=[40, None, None])
    assert capped[0] == 40
    assert capped[1:] == (40, 40)


def test_allocate_single_worker_takes_everything():
    assert allocate(17, [CostModel(0.3, 0.2)]) == (17,)


def test_allocate_accepts_numpy_integers():
    slices = allocate(
        np.int64(10), [CostModel(0, 1)] * 2, caps=[np.int64(6), None], min_slice=np.int64(2)
    )
    assert slices == (5, 5)


def test_allocate_large_cluster_is_consistent():
    # A coarse scale check (not a timing test): many workers, big batch, still feasible and
    # at least as good as the speed-proportional split.
    rng = np.random.default_rng(7)
    costs = [
        CostModel(float(a), float(b))
        for a, b in zip(rng.uniform(0, 0.05, 2000), rng.uniform(1e-4, 1e-2, 2000))
    ]
    caps = [int(c) if c % 3 else None for c in rng.integers(100, 600, 2000)]
    slices = allocate(300_000, costs, caps=caps, min_slice=2)
    _assert_feasible(slices, 300_000, caps, 2)
    speeds = [c.samples_per_second for c in costs]
    naive = proportional_slices(300_000, speeds, caps=caps, min_slice=2)
    assert makespan(slices, costs) <= makespan(naive, costs)


# --- allocate / proportional_slices: errors --------------------------------------------------


@pytest.mark.parametrize("split", [allocate, proportional_slices])
def test_total_below_minimum_names_the_fix(split):
    second = [CostModel(0, 1)] * 3 if split is allocate else [1.0, 1.0, 1.0]
    with pytest.raises(AllocationError) as info:
        split(5, second, min_slice=2)
    message = str(info.value)
    assert "5" in message and "6" in message
    assert "raise the global batch" in message and "fewer workers" in message


@pytest.mark.parametrize("split", [allocate, proportional_slices])
def test_total_above_caps_names_the_fix(split):
    second = [CostModel(0, 1)] * 2 if split is allocate else [1.0, 1.0]
    with pytest.raises(AllocationError) as info:
        split(25, second, caps=[10, 12])
    message = str(info.value)
    assert "25" in message and "22" in message
    assert "raise max_batch" in message


def test_allocate_rejects_empty_costs():
    with pytest.raises(AllocationError, match="no workers"):
        allocate(10, [])


def test_allocate_rejects_caps_length_mismatch():
    with pytest.raises(AllocationError, match="caps has 1 entries but there are 2 workers"):
        allocate(10, [CostModel(0, 1)] * 2, caps=[5])


@pytest.mark.parametrize("min_slice", [0, -1])
def test_allocate_rejects_min_slice_below_one(min_slice):
    with pytest.raises(AllocationError, match="min_slice must be >= 1"):
        allocate(10, [CostModel(0, 1)] * 2, min_slice=min_slice)


def test_allocate_rejects_cap_below_min_slice():
    with pytest.raises(AllocationError, match=r"caps\[1\]=1 is below min_slice=2"):
        allocate(10, [CostModel(0, 1)] * 2, caps=[None, 1], min_slice=2)


@pytest.mark.parametrize("total", [10.5, "10", True])
def test_allocate_rejects_non_integer_total(total):
    with pytest.raises(AllocationError, match="total"):
        allocate(total, [CostModel(0, 1)])


@pytest.mark.parametrize("shares", [[1.0, 0.0], [1.0, -2.0], [1.0, math.nan]])
def test_proportional_slices_rejects_bad_shares(shares):
    with pytest.raises(AllocationError, match="shares must be finite and > 0"):
        proportional_slices(10, shares)


# --- proportional_slices -------------------------------------------------------------------


def test_proportional_slices_largest_remainder_ties_to_lower_index():
    assert proportional_slices(10, [1, 1, 1]) == (4, 3, 3)
    assert proportional_slices(10, [1, 2, 2]) == (2, 4, 4)
    assert proportional_slices(7, [1, 1, 1, 1]) == (2, 2, 2, 1)


def test_proportional_slices_redistributes_overflow_proportionally():
    # Worker 0 wants 60 but is capped at 20; the other 80 split 1:3 between workers 1 and 2.
    assert proportional_slices(100, [6, 1, 3], caps=[20, None, None]) == (20, 20, 60)


def test_proportional_slices_raises_tiny_shares_to_min_slice():
    assert proportional_slices(100, [1000, 1], min_slice=5) == (95, 5)


@PROPERTY_SETTINGS
@given(slicing_problems(), st.data())
def test_proportional_slices_is_feasible_and_close_to_shares(problem, data):
    total, costs, caps, min_slice = problem
    shares = data.draw(
        st.lists(
            st.floats(min_value=0.01, max_value=100.0), min_size=len(costs), max_size=len(costs)
        )
    )
    slices = proportional_slices(total, shares, caps=caps, min_slice=min_slice)
    _assert_feasible(slices, total, caps, min_slice)
    if caps is None and min_slice == 1:
        ideal = np.asarray(shares) * total / sum(shares)
        # Without bounds in play, largest remainder moves no slice by a whole unit from its
        # ideal (when min_slice lifts a small share, the others shrink, so skip those cases).
        if np.all(ideal >= 1):
            assert np.all(np.abs(np.asarray(slices) - ideal) < 1)


# --- makespan --------------------------------------------------------------------------------


def test_makespan_ignores_empty_slices():
    costs = [CostModel(5.0, 1.0), CostModel(0.0, 1.0)]
    assert makespan([0, 3], costs) == pytest.approx(3.0)
    assert makespan([0, 0], costs) == 0.0


def test_makespan_validates_inputs():
    with pytest.raises(AllocationError, match="one slice per cost model"):
        makespan([1], [CostModel(0, 1)] * 2)
    with pytest.raises(AllocationError, match=">= 0"):
        makespan([-1, 2], [CostModel(0, 1)] * 2)


# --- fit_cost_model --------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(
    st.floats(min_value=0.0, max_value=1.0),
    st.floats(min_value=1e-4, max_value=1e-1),
    st.lists(st.integers(min_value=1, max_value=1024), min_size=2, max_size=8, unique=True),
)
def test_fit_recovers_exact_affine_costs(alpha, beta, sizes):
    seconds = [alpha + beta * b for b in sizes]
    fitted = fit_cost_model(sizes, seconds)
    assert fitted.beta == pytest.approx(beta, rel=1e-8)
    assert fitted.alpha == pytest.approx(alpha, rel=1e-8, abs=1e-9)


def test_fit_recovers_costs_from_noisy_timings():
    rng = np.random.default_rng(1234)
    alpha, beta = 0.05, 0.002
    sizes = np.repeat([8, 16, 32, 64, 128, 256], 5)
    seconds = (alpha + beta * sizes) * (1 + rng.normal(0, 0.01, sizes.size))
    fitted = fit_cost_model(sizes.tolist(), seconds.tolist())
    assert fitted.beta == pytest.approx(beta, rel=0.03)
    assert fitted.alpha == pytest.approx(alpha, abs=0.01)


def test_fit_clamps_negative_intercept_through_origin():
    # Super-linear timings give a negative intercept; the fit goes through the origin instead.
    fitted = fit_cost_model([10, 20], [0.5, 1.5])
    assert fitted.alpha == 0.0
    assert fitted.beta == pytest.approx((10 * 0.5 + 20 * 1.5) / (10**2 + 20**2))


def test_fit_falls_back_to_observed_speed_when_time_does_not_grow():
    fitted = fit_cost_model([8, 16, 32], [0.4, 0.4, 0.3])
    assert fitted.alpha == 0.0
    assert fitted.beta == pytest.approx(np.mean([0.4 / 8, 0.4 / 16, 0.3 / 32]))


@pytest.mark.parametrize(
    ("sizes", "seconds", "expected"),
    [
        ([8, 16], [0.1], "one timing per batch size"),
        ([8, 8, 8], [0.1, 0.1, 0.1], ">= 2 distinct batch sizes"),
        ([8], [0.1], ">= 2 distinct batch sizes"),
        ([8, 16], [0.1, math.nan], "timings must be finite and > 0"),
        ([8, 16], [0.1, 0.0], "timings must be finite and > 0"),
        ([8, 16], [0.1, -0.2], "timings must be finite and > 0"),
        ([0, 16], [0.1, 0.2], "batch sizes must be finite and > 0"),
    ],
)
def test_fit_rejects_unusable_probes(sizes, seconds, expected):
    with pytest.raises(AllocationError, match=expected):
        fit_cost_model(sizes, seconds)
