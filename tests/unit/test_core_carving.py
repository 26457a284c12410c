"""Pure carving and plan-schedule invariants (no Ray, no torch)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.carving import Cursor, EpochCarver
from raytrain_hetero.core.plan import Plan, PlanSchedule
from raytrain_hetero.errors import ConfigError, HeteroError


@st.composite
def carving_cases(draw):
    world = draw(st.integers(1, 6))
    batch = draw(st.integers(world, 64))
    size = draw(st.integers(world, 300))
    epochs = draw(st.integers(1, 3))
    carver = EpochCarver(size, batch, seed=draw(st.integers(0, 10)), min_step_size=world)
    total_steps = carver.steps_per_epoch * epochs
    # A few re-plans at random steps, each with random positive shares.
    change_steps = sorted(set(draw(st.lists(st.integers(1, max(1, total_steps - 1)), max_size=4))))
    share_lists = [
        draw(st.lists(st.floats(0.1, 10.0), min_size=world, max_size=world))
        for _ in range(len(change_steps) + 1)
    ]
    return carver, epochs, world, change_steps, share_lists


@settings(max_examples=150, deadline=None)
@given(carving_cases())
def test_every_sample_once_per_epoch_under_replans(case):
    carver, epochs, world, change_steps, share_lists = case
    schedule = PlanSchedule()
    batch = carver.global_batch_size
    schedule.add(Plan.from_shares(batch, share_lists[0], version=1, effective_step=0))
    pending = list(zip(change_steps, share_lists[1:]))
    step = 0
    for epoch in range(epochs):
        seen = Counter()
        perm = carver.permutation(epoch)
        for k in range(carver.steps_per_epoch):
            while pending and pending[0][0] == step:
                at, shares = pending.pop(0)
                schedule.add(
                    Plan.from_shares(
                        batch, shares, version=len(schedule.plans) + 1, effective_step=at
                    )
                )
            plan = schedule.plan_for(step)
            schedule.mark_carved(step)
            counts = carver.step_counts(k, plan)
            assert min(counts) >= 1, "no rank may receive an empty slice"
            assert sum(counts) == carver.step_size(k)
            for rank in range(world):
                ids = carver.rank_indices(epoch, k, plan, rank, perm)
                assert len(ids) == counts[rank]
                seen.update(ids.tolist())
            step += 1
        assert sorted(seen) == list(range(carver.dataset_size))
        assert max(seen.values()) == 1


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8), st.integers(1, 100), st.integers(1, 1000))
def test_step_sizes_partition_the_epoch(world, batch, size):
    if batch < world or size < world:
        with pytest.raises(ConfigError):
            EpochCarver(size, batch, min_step_size=world)
        return
    carver = EpochCarver(size, batch, min_step_size=world)
    sizes = [carver.step_size(k) for k in range(carver.steps_per_epoch)]
    assert sum(sizes) == size
    assert all(s >= world for s in sizes)
    assert all(s == batch for s in sizes[:-1])
    assert sizes[-1] < batch + world  # a merged tail adds fewer than `world` samples


def test_small_tail_is_merged_and_large_tail_is_its_own_step():
    merged = EpochCarver(98, 24, min_step_size=3)  # tail 2 < 3
    assert merged.steps_per_epoch == 4 and merged.step_size(3) == 26
    alone = EpochCarver(101, 24, min_step_size=3)  # tail 5 >= 3
    assert alone.steps_per_epoch == 5 and alone.step_size(4) == 5


def test_permutation_is_seeded_and_differs_by_epoch():
    carver = EpochCarver(50, 10, seed=3)
    assert (carver.permutation(0) == EpochCarver(50, 10, seed=3).permutation(0)).all()
    assert (carver.permutation(0) != carver.permutation(1)).any()
    assert sorted(carver.permutation(1).tolist()) == list(range(50))


def test_cursor_round_trip():
    carver = EpochCarver(101, 24, min_step_size=3)
    for g in range(20):
        assert carver.global_step(carver.cursor_of(g)) == g
    assert carver.cursor_of(7) == Cursor(epoch=1, step_in_epoch=2)


def test_schedule_refuses_plans_for_carved_steps_and_stale_versions():
    schedule = PlanSchedule()
    schedule.add(Plan.from_shares(12, [1, 1, 1], version=1, effective_step=0))
    schedule.mark_carved(5)
    with pytest.raises(HeteroError, match="already carved"):
        schedule.add(Plan.from_shares(12, [1, 2, 3], version=2, effective_step=5))
    with pytest.raises(HeteroError, match="not newer"):
        schedule.add(Plan.from_shares(12, [1, 2, 3], version=1, effective_step=9))
    with pytest.raises(HeteroError, match="ranks"):
        schedule.add(Plan.from_shares(12, [1, 2], version=2, effective_step=9))
    schedule.add(Plan.from_shares(12, [1, 2, 3], version=2, effective_step=6))
    assert schedule.plan_for(5).version == 1 and schedule.plan_for(6).version == 2


def test_cost_plan_splits_short_steps_and_round_trips():
    costs = (CostModel(0.01, 0.001), CostModel(0.0, 0.004))
    plan = Plan.from_costs(40, costs, caps=(None, 30), min_slice=2)
    assert sum(plan.slices) == 40 and plan.slices[0] > plan.slices[1]
    short = plan.split(7)
    assert sum(short) == 7 and min(short) >= 2
    assert Plan.from_dict(plan.to_dict()) == plan


def test_plan_needs_one_kind_and_matching_lengths():
    with pytest.raises(HeteroError):
        Plan(version=1, effective_step=0, slices=(2, 2))
    with pytest.raises(HeteroError):
        Plan(version=1, effective_step=0, slices=(2, 2), shares=(1.0,))
