"""Branch placement decisions (pure): optimal, heavier branch on the faster rank, deterministic."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytrain_hetero.core import branch_placement
from raytrain_hetero.core.branch_placement import (
    BranchPlacement,
    costs_from_speeds,
    place_branches,
    placement_stage_times,
)
from raytrain_hetero.errors import ModelParallelError

PROPERTY_SETTINGS = settings(max_examples=150, deadline=None)
cost = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)
speed = st.floats(min_value=0.01, max_value=100.0, allow_nan=False)


def _brute_force(costs, heads) -> float:
    """Smallest makespan over the placements that give every rank a branch (or the head alone)."""
    world, n = len(costs), len(costs[0])
    best = float("inf")
    for head in range(world):
        for assignment in itertools.product(range(world), repeat=n):
            if len(set(assignment)) < min(world, n) or (n < world and head in assignment):
                continue
            stage = [0.0] * world
            for b, r in enumerate(assignment):
                stage[r] += costs[r][b]
            stage[head] += heads[head]
            best = min(best, max(stage))
    return best


@st.composite
def problems(draw):
    n = draw(st.integers(1, 4))
    world = draw(st.integers(1, min(3, n + 1)))
    costs = [[draw(cost) for _ in range(n)] for _ in range(world)]
    heads = [draw(cost) for _ in range(world)]
    return [f"b{i}" for i in range(n)], costs, heads


@PROPERTY_SETTINGS
@given(problems())
def test_placement_minimises_the_largest_stage_time(problem):
    names, costs, heads = problem
    placement = place_branches(names, costs, heads)
    assignment = [placement.rank_of(n) for n in names]
    stage = placement_stage_times(assignment, placement.head_rank, costs, heads)
    assert placement.stage_times == stage
    assert max(stage) <= _brute_force(costs, heads) * (1 + 1e-9) + 1e-12
    # Every rank runs a branch; with one rank more than branches, the head runs alone.
    world = len(costs)
    assert len(set(assignment)) == min(world, len(names))
    assert world <= len(names) or placement.branches_on(placement.head_rank) == ()


@PROPERTY_SETTINGS
@given(
    st.floats(1.0, 100.0),
    st.floats(1.001, 10.0),
    st.floats(0.01, 100.0),
    st.floats(1.001, 10.0),
    st.booleans(),
    st.booleans(),
)
def test_heavier_branch_goes_to_the_faster_rank(
    light, heavy_ratio, slow_speed, speed_ratio, heavy_first, fast_first
):
    branch_costs = [light * heavy_ratio, light] if heavy_first else [light, light * heavy_ratio]
    speeds = (
        [slow_speed * speed_ratio, slow_speed]
        if fast_first
        else [slow_speed, slow_speed * speed_ratio]
    )
    placement = place_branches(("a", "b"), costs_from_speeds(branch_costs, speeds))
    heavy = "a" if heavy_first else "b"
    fast = 0 if fast_first else 1
    assert placement.rank_of(heavy) == fast
    assert placement.rank_of("b" if heavy_first else "a") == 1 - fast


@PROPERTY_SETTINGS
@given(st.integers(1, 5), st.integers(1, 3), st.floats(0.1, 10.0))
def test_ties_are_broken_deterministically(n, world, value):
    world = min(world, n + 1)
    names = [f"b{i}" for i in range(n)]
    costs = [[value] * n for _ in range(world)]
    first = place_branches(names, costs)
    assert all(place_branches(names, costs) == first for _ in range(3))


@PROPERTY_SETTINGS
@given(problems())
def test_greedy_fallback_gives_a_valid_deterministic_placement(problem):
    names, costs, heads = problem
    saved = branch_placement._MAX_EXHAUSTIVE_CANDIDATES
    branch_placement._MAX_EXHAUSTIVE_CANDIDATES = 0
    try:
        first = place_branches(names, costs, heads)
        assert place_branches(names, costs, heads) == first
    finally:
        branch_placement._MAX_EXHAUSTIVE_CANDIDATES = saved
    assignment = [first.rank_of(n) for n in names]
    assert len(set(assignment)) == min(len(costs), len(names))
    assert len(costs) <= len(names) or first.branches_on(first.head_rank) == ()


def test_head_takes_a_rank_of_its_own_when_ranks_exceed_branches():
    placement = place_branches(("s1", "s2"), [[1.0, 2.0]] * 3, [0.5] * 3)
    assert placement.branches_on(placement.head_rank) == ()
    assert len({placement.rank_of("s1"), placement.rank_of("s2"), placement.head_rank}) == 3


def test_two_branches_on_one_rank():
    placement = place_branches(("s1", "s2"), [[1.0, 1.0]])
    assert placement.branches_on(0) == ("s1", "s2") and placement.head_rank == 0


@pytest.mark.parametrize(
    ("names", "costs", "heads", "match"),
    [
        ((), [[1.0]], None, "at least one branch"),
        (("a",), [], None, "at least one rank"),
        (("a",), [[1.0], [1.0], [1.0]], None, "would be idle"),
        (("a", "b"), [[1.0]], None, "expected one per branch"),
        (("a",), [[-1.0]], None, "finite number >= 0"),
        (("a",), [[float("nan")]], None, "finite number >= 0"),
        (("a",), [[1.0]], [1.0, 2.0], "head_costs has 2 entries"),
    ],
)
def test_bad_inputs_are_refused(names, costs, heads, match):
    with pytest.raises(ModelParallelError, match=match):
        place_branches(names, costs, heads)


def test_speeds_must_be_positive():
    with pytest.raises(ModelParallelError, match="rank speed"):
        costs_from_speeds([1.0], [0.0])


def test_explicit_placement_round_trip():
    placement = BranchPlacement.explicit({"s2": 1, "s1": 0}, ("s1", "s2"), 1, 2)
    assert placement.branch_ranks == (("s1", 0), ("s2", 1))
    assert placement.branches_on(1) == ("s2",)
