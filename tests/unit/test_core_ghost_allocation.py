"""Slices in whole ghost groups (``quantum``): feasibility, the makespan bound, optimality,
the ragged step's rule, micro-batches and admission. Pure core, property-tested."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytrain_hetero.core.admission import decide_admission
from raytrain_hetero.core.allocation import CostModel, allocate, makespan, proportional_slices
from raytrain_hetero.core.carving import EpochCarver
from raytrain_hetero.core.memory import micro_batch_sizes
from raytrain_hetero.core.plan import Plan, PlanSchedule
from raytrain_hetero.errors import AllocationError, HeteroError

PROPERTY_SETTINGS = settings(max_examples=150, deadline=None)

alphas = st.floats(min_value=0.0, max_value=5.0, allow_nan=False, allow_infinity=False)
betas = st.floats(min_value=1e-3, max_value=1.0, allow_nan=False, allow_infinity=False)
cost_models = st.builds(CostModel, alpha=alphas, beta=betas)


@st.composite
def grouped_problems(draw, max_workers: int = 5, max_groups: int = 40):
    """A feasible (total, costs, caps, min_slice, g) request, total a multiple of g."""
    g = draw(st.integers(min_value=2, max_value=16))
    n = draw(st.integers(min_value=1, max_value=max_workers))
    costs = draw(st.lists(cost_models, min_size=n, max_size=n))
    min_slice = draw(st.integers(min_value=1, max_value=2 * g))
    min_groups = -(-min_slice // g)
    caps = draw(
        st.none()
        | st.lists(
            st.none() | st.integers(min_value=min_groups * g, max_value=max_groups * g),
            min_size=n,
            max_size=n,
        )
    )
    upper = max_groups * n
    if caps is not None and all(c is not None for c in caps):
        upper = sum(c // g for c in caps)
    groups = draw(st.integers(min_value=n * min_groups, max_value=max(n * min_groups, upper)))
    return groups * g, costs, caps, min_slice, g


def _check_whole_groups(slices, total, caps, min_slice, g):
    assert sum(slices) == total
    assert all(b % g == 0 for b in slices[:-1])
    assert slices[-1] - total % g >= 0 and (slices[-1] - total % g) % g == 0
    smallest = -(-min_slice // g) * g
    assert all(b >= smallest for b in slices)
    if caps is not None:
        assert all(c is None or b <= c for b, c in zip(slices, caps))


@PROPERTY_SETTINGS
@given(grouped_problems())
def test_grouped_allocation_is_feasible_in_whole_groups(problem):
    total, costs, caps, min_slice, g = problem
    _check_whole_groups(
        allocate(total, costs, caps=caps, min_slice=min_slice, quantum=g), total, caps, min_slice, g
    )
    shares = [1.0 / c.beta for c in costs]
    _check_whole_groups(
        proportional_slices(total, shares, caps=caps, min_slice=min_slice, quantum=g),
        total,
        caps,
        min_slice,
        g,
    )


@PROPERTY_SETTINGS
@given(grouped_problems())
def test_grouped_makespan_within_one_group_of_the_unquantised_optimum(problem):
    """The stated bound: T_grouped <= T* + g * max(beta), T* the unquantised integer optimum
    under the same whole-group caps and minimum."""
    total, costs, caps, min_slice, g = problem
    grouped = allocate(total, costs, caps=caps, min_slice=min_slice, quantum=g)
    floored = None if caps is None else [None if c is None else c // g * g for c in caps]
    smallest = -(-min_slice // g) * g
    free = allocate(total, costs, caps=floored, min_slice=smallest)
    bound = makespan(free, costs) + g * max(c.beta for c in costs)
    assert makespan(grouped, costs) <= bound * (1 + 1e-12)


@settings(max_examples=60, deadline=None)
@given(grouped_problems(max_workers=3, max_groups=6))
def test_grouped_allocation_is_optimal_among_whole_group_plans(problem):
    total, costs, caps, min_slice, g = problem
    got = makespan(allocate(total, costs, caps=caps, min_slice=min_slice, quantum=g), costs)
    min_groups = -(-min_slice // g)
    limits = [total // g if c is None else c // g for c in (caps or [None] * len(costs))]
    best = min(
        makespan([k * g for k in split], costs)
        for split in itertools.product(*(range(min_groups, top + 1) for top in limits))
        if sum(split) * g == total
    )
    assert got <= best * (1 + 1e-12)


def test_a_short_steps_remainder_goes_to_the_last_rank_within_its_cap():
    costs = [CostModel(0.0, 0.001), CostModel(0.0, 0.002), CostModel(0.0, 0.001)]
    assert allocate(101, costs, quantum=16) == (48, 16, 37)
    # The last rank's cap leaves room for the remainder: 40 - 5 -> 2 groups at most.
    assert allocate(101, costs, caps=[None, None, 40], quantum=16)[-1] <= 40


def test_too_few_whole_groups_name_the_group_size():
    with pytest.raises(AllocationError, match=r"2 whole groups of 16.*3 workers"):
        allocate(40, [CostModel(0.0, 0.001)] * 3, quantum=16)
    with pytest.raises(AllocationError, match=r"caps\[1\]=15.*whole group"):
        allocate(64, [CostModel(0.0, 0.001)] * 2, caps=[None, 15], quantum=16)


@PROPERTY_SETTINGS
@given(
    samples=st.integers(min_value=24, max_value=400),
    groups=st.integers(min_value=3, max_value=8),
    g=st.integers(min_value=2, max_value=8),
    shares=st.lists(st.floats(min_value=0.1, max_value=10.0), min_size=1, max_size=3),
)
def test_every_step_of_an_epoch_is_cut_at_its_global_group_boundaries(samples, groups, g, shares):
    """The ragged-step rule: the step is cut into groups from its first position, a remainder
    under g joining the last group; each rank's slice starts at a group boundary and the
    remainder lands on the last rank, so the slices hold exactly the step's groups."""
    world = len(shares)
    batch = max(groups, world) * g
    if samples < world * g:
        return
    carver = EpochCarver(samples, batch, seed=1, min_step_size=world * g)
    plan = Plan.from_shares(batch, shares, quantum=g)
    for step in range(carver.steps_per_epoch):
        size = carver.step_size(step)
        n_groups = max(size // g, 1)
        boundaries = {k * g for k in range(n_groups)} | {size}
        start, _ = carver.step_bounds(step)
        for rank in range(world):
            lo, hi = carver.rank_positions(step, plan, rank)
            assert lo - start in boundaries and hi - start in boundaries


def test_plan_keeps_its_group_size_through_dicts_and_schedules():
    plan = Plan.from_shares(64, [1.0, 3.0], quantum=16)
    assert plan.slices == (16, 48)
    assert Plan.from_dict(plan.to_dict()) == plan
    assert Plan.from_dict({**plan.to_dict(), "quantum": None} | {"quantum": 1}).quantum == 1
    with pytest.raises(HeteroError, match="whole groups of quantum=16"):
        Plan(version=1, effective_step=0, slices=(20, 44), shares=(1.0, 1.0), quantum=16)
    schedule = PlanSchedule()
    schedule.add(plan)
    with pytest.raises(HeteroError, match="group size is fixed"):
        schedule.add(Plan.from_shares(64, [1.0, 1.0], version=2, effective_step=3))


@given(
    groups=st.integers(min_value=1, max_value=40),
    remainder=st.integers(min_value=0, max_value=15),
    cap_groups=st.integers(min_value=1, max_value=10),
)
def test_micro_batches_hold_whole_groups(groups, remainder, cap_groups):
    g = 16
    remainder = remainder % g
    size, cap = groups * g + remainder, cap_groups * g + 5
    parts = micro_batch_sizes(size, cap, g)
    assert sum(parts) == size
    assert all(p % g == 0 and 0 < p <= cap for p in parts[:-1])
    assert (parts[-1] - remainder) % g == 0 and parts[-1] - remainder >= g
    assert parts[-1] - remainder <= cap  # only the remainder may overshoot the cap


def test_micro_batch_cap_under_one_group_is_refused():
    with pytest.raises(AllocationError, match="no whole ghost group of 16"):
        micro_batch_sizes(64, 10, 16)


def test_admission_leaves_out_a_worker_whose_best_slice_is_under_one_group():
    """Unquantised, the slow worker's best slice is a few samples and it helps; in groups of
    32 it must take a whole group, which would lengthen every step: admission leaves it out,
    as it leaves out a worker that cannot take a minimum slice."""
    costs = [CostModel(0.0, 0.001), CostModel(0.0, 0.05)]
    free = decide_admission(64, costs, collective_s=[0.0, 0.0])
    grouped = decide_admission(64, costs, collective_s=[0.0, 0.0], quantum=32)
    assert free.admitted == (0, 1)
    assert grouped.admitted == (0,) and grouped.excluded == (1,)


def test_a_measured_re_plan_keeps_whole_groups():
    """The policy's re-plan (the live scheduler's and the cheap start's) allocates whole groups
    when the plan has a group size."""
    from raytrain_hetero.core.policy import PolicyConfig, Replan, StepSample, decide_first_measured

    slices, per_sample = [16, 16, 16], [0.001, 0.004, 0.002]
    samples = [
        StepSample(rank=r, step=1 + k, samples=b, busy_s=b * s, time_s=100.0 + k)
        for k in range(3)
        for r, (b, s) in enumerate(zip(slices, per_sample))
    ]
    _, free = decide_first_measured(slices, samples, PolicyConfig())
    _, grouped = decide_first_measured(slices, samples, PolicyConfig(), quantum=8)
    assert isinstance(free, Replan) and isinstance(grouped, Replan)
    assert any(b % 8 for b in free.slices)
    assert sum(grouped.slices) == 48 and all(b % 8 == 0 and b >= 8 for b in grouped.slices)
