"""Properties of raytrain_hetero.core.kernel_split: the kernels each rank of a conv split owns."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytrain_hetero.core.allocation import makespan
from raytrain_hetero.core.kernel_split import (
    channel_offsets,
    kernel_cost_models,
    proposed_resplit,
    split_kernels,
)
from raytrain_hetero.errors import HeteroError, ModelParallelError

PROPERTY_SETTINGS = settings(max_examples=150, deadline=None)
kernel_costs = st.floats(min_value=1e-4, max_value=1.0, allow_nan=False, allow_infinity=False)


@st.composite
def split_problems(draw, max_ranks: int = 5, max_kernels: int = 1600):
    ranks = draw(st.integers(min_value=1, max_value=max_ranks))
    costs = draw(st.lists(kernel_costs, min_size=ranks, max_size=ranks))
    kernels = draw(st.integers(min_value=ranks, max_value=max_kernels))
    return kernels, costs


@PROPERTY_SETTINGS
@given(split_problems())
def test_every_rank_owns_at_least_one_kernel_and_all_kernels_are_owned(problem):
    kernels, costs = problem
    split = split_kernels(kernels, costs)
    assert len(split) == len(costs)
    assert sum(split) == kernels
    assert min(split) >= 1
    offsets = channel_offsets(split)
    assert offsets[0] == 0 and offsets[-1] == kernels
    assert all(b - a == k for a, b, k in zip(offsets[:-1], offsets[1:], split, strict=True))


@PROPERTY_SETTINGS
@given(split_problems(max_ranks=3, max_kernels=14))
def test_split_is_makespan_optimal_against_brute_force(problem):
    kernels, costs = problem
    models = kernel_cost_models(costs)
    best = min(
        makespan(candidate, models)
        for candidate in itertools.product(range(1, kernels + 1), repeat=len(costs))
        if sum(candidate) == kernels
    )
    assert makespan(split_kernels(kernels, costs), models) <= best * (1 + 1e-12)


@PROPERTY_SETTINGS
@given(split_problems())
def test_a_faster_rank_never_owns_fewer_kernels(problem):
    kernels, costs = problem
    split = split_kernels(kernels, costs)
    for i, j in itertools.permutations(range(len(costs)), 2):
        if costs[i] < costs[j]:
            assert split[i] >= split[j]


@PROPERTY_SETTINGS
@given(split_problems(max_ranks=4), st.integers(min_value=0, max_value=3), st.floats(1.1, 8.0))
def test_speeding_up_a_rank_never_takes_kernels_from_it(problem, which, factor):
    kernels, costs = problem
    which %= len(costs)
    faster = list(costs)
    faster[which] = costs[which] / factor
    assert split_kernels(kernels, faster)[which] >= split_kernels(kernels, costs)[which]


def test_marques_shapes_split_in_proportion_to_speed():
    # Speeds 1, 1/2, 1/4 (per-kernel costs 1, 2, 4): 1500 kernels split 4:2:1.
    assert split_kernels(1500, [1.0, 2.0, 4.0]) == (858, 428, 214)
    assert split_kernels(5, [4.0, 4.0, 1.0]) == (1, 1, 3)


def test_fewer_kernels_than_ranks_is_a_clear_error():
    with pytest.raises(ModelParallelError, match="at least one kernel"):
        split_kernels(2, [1.0, 1.0, 1.0])
    with pytest.raises(ModelParallelError, match="no ranks"):
        split_kernels(4, [])
    with pytest.raises(ModelParallelError, match="invalid per-kernel costs"):
        split_kernels(4, [1.0, float("nan")])
    with pytest.raises(ModelParallelError, match="at least one kernel"):
        channel_offsets([3, 0])
    assert issubclass(ModelParallelError, HeteroError)


def test_resplit_only_when_the_gain_clears_the_threshold():
    equal = (50, 50)
    # Rank 1 became 2x slower: proportional (67, 33) predicts 67 vs 100 -> 33% better.
    assert proposed_resplit(equal, [1.0, 2.0], min_gain=0.1) == (67, 33)
    assert proposed_resplit(equal, [1.0, 2.0], min_gain=0.5) is None
    # Noise-level change: nothing to do.
    assert proposed_resplit(equal, [1.0, 1.01], min_gain=0.05) is None
    assert proposed_resplit((67, 33), [1.0, 2.0], min_gain=0.0) is None
    with pytest.raises(ModelParallelError):
        proposed_resplit(equal, [1.0], min_gain=0.1)
