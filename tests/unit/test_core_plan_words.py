"""A plan's slices in words (raytrain_hetero.core.plan_words): pure, no Ray, no torch."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from raytrain_hetero.core.allocation import CostModel, allocate
from raytrain_hetero.core.plan_words import (
    STARVED_FIXED_SHARE,
    describe_costs,
    explain_slices,
    starved_ranks,
)


def test_the_seen_92_to_1_case_says_the_slow_rank_is_held_back_by_its_fixed_cost():
    # A fast worker whose whole step at 86 samples (5.3 ms) is shorter than the slowest
    # worker's fixed cost per step alone (6 ms): the planner rightly gives it the minimum.
    costs = [CostModel(0.001, 0.00005), CostModel(0.002, 0.0004), CostModel(0.006, 0.0016)]
    slices = allocate(96, costs)
    assert slices[2] == 1
    words = explain_slices(slices, costs)
    assert "r2 gets 1: its fixed cost per step alone (6.00 ms)" in words
    assert "so every sample more would lengthen every step" in words
    assert [rank for rank, _, _ in starved_ranks(slices, costs)] == [2]


def test_each_rank_step_is_its_fixed_plus_per_sample_cost():
    text = describe_costs([86, 10], [CostModel(0.0006, 45e-6), CostModel(0.0009, 0.0004)])
    assert text == "r0 86 x 45 us + 0.60 ms = 4.47 ms; r1 10 x 400 us + 0.90 ms = 4.90 ms"


costs_strategy = st.lists(
    st.builds(
        CostModel,
        st.floats(0.0, 0.05, allow_nan=False),
        st.floats(1e-6, 0.01, allow_nan=False),
    ),
    min_size=1,
    max_size=6,
)


@given(costs=costs_strategy, extra=st.integers(0, 500))
def test_a_rank_is_called_starved_only_at_the_minimum_slice_with_a_large_fixed_cost(costs, extra):
    slices = allocate(len(costs) + extra, costs)
    steps = [c.alpha + c.beta * b for b, c in zip(slices, costs)]
    for rank, fixed, longest in starved_ranks(slices, costs):
        assert slices[rank] <= 1
        assert fixed == costs[rank].alpha
        assert longest == max(t for r, t in enumerate(steps) if r != rank)
        assert fixed >= STARVED_FIXED_SHARE * longest
    # Every rank is described once, in rank order, with its slice.
    described = re.findall(r"r(\d+) (\d+) x", describe_costs(slices, costs))
    assert [(int(r), int(b)) for r, b in described] == list(enumerate(slices))


@given(costs=costs_strategy)
def test_equal_workers_are_never_called_starved(costs):
    same = [costs[0]] * len(costs)
    slices = allocate(10 * len(same), same)
    assert starved_ranks(slices, same) == []
