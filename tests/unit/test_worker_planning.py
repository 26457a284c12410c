"""Rank identity, the one plan builder and plan installation (a real 1-rank gloo group)."""

from __future__ import annotations

import dataclasses

import pytest
from gloo_group import run_gloo_group

from raytrain_hetero.config import BatchConfig, WorkerSpec
from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.errors import ConfigError
from raytrain_hetero.worker.plan.planning import (
    PlanState,
    allocation_caps,
    build_plan,
    gather_rank_slots,
    install_plan,
    next_free_step,
)
from raytrain_hetero.worker.setup.identity import HeteroSetup, RankIdentity

SETUP = HeteroSetup(
    run_id="r",
    specs=(WorkerSpec(name="a", max_batch=20), WorkerSpec(name="b"), WorkerSpec(name="c")),
    batch=BatchConfig(global_batch_size=48, min_slice=2),
)


def _identity(**changes) -> RankIdentity:
    return RankIdentity(**{"setup": SETUP, "slot": 1, "rank": 0, "world_size": 3, **changes})


def test_identity_is_immutable_and_checked():
    identity = _identity()
    assert identity.spec.name == "b"
    with pytest.raises(dataclasses.FrozenInstanceError):
        identity.rank = 1  # type: ignore[misc]
    with pytest.raises(ConfigError, match="Rank 3 is outside a world of 3"):
        _identity(rank=3)
    with pytest.raises(ConfigError, match="slot 5 is outside the run's 3 slots"):
        _identity(slot=5)


def test_data_smaller_than_the_global_batch_is_planned_as_the_step_it_gives():
    # 12 samples under a global batch of 48: plans split the 12 a step really holds, never
    # slices the data cannot give.
    plans = PlanState(rank_slots=(0, 1, 2), largest_step=12)
    identity = _identity()
    shares = build_plan(identity, plans, shares=[2, 1, 1], effective_step=0, reason="fixed")
    assert sum(shares.slices) == 12 and shares.slices == (6, 3, 3)
    costs = [CostModel(0.0, 0.001), CostModel(0.0, 0.002), CostModel(0.0, 0.004)]
    by_costs = build_plan(identity, plans, costs=costs, effective_step=0, reason="probe")
    assert sum(by_costs.slices) == 12 and min(by_costs.slices) >= 2


def test_one_builder_for_shares_costs_and_decided_slices():
    plans = PlanState(rank_slots=(0, 1, 2))  # gathered already: no collective
    identity = _identity()
    by_shares = build_plan(identity, plans, shares=[1, 1, 1], effective_step=0, reason="fixed")
    assert by_shares.slices == (16, 16, 16) and by_shares.caps == (20, None, None)
    assert by_shares.version == 1 and by_shares.min_slice == 2
    install_plan(plans, by_shares)
    costs = [CostModel(0.0, 0.001), CostModel(0.0, 0.004), CostModel(0.0, 0.004)]
    by_costs = build_plan(identity, plans, costs=costs, effective_step=5, reason="probe")
    assert by_costs.version == 2
    assert by_costs.slices[0] == 20  # the fastest rank is held at its memory cap
    # The scheduler's live re-plan: its slices are kept as decided, costs recorded.
    live = build_plan(
        identity, plans, costs=costs, slices=[10, 19, 19], effective_step=9, reason="live"
    )
    assert live.slices == (10, 19, 19) and live.costs == tuple(costs)
    with pytest.raises(ConfigError, match="exactly one of shares= or costs="):
        build_plan(identity, plans, shares=[1, 1, 1], costs=costs, effective_step=0, reason="x")


def test_install_announces_and_restore_continues_the_versions():
    plans = PlanState(rank_slots=(0, 1, 2))
    announced = []
    plan = build_plan(_identity(), plans, shares=[1, 2, 3], effective_step=4, reason="x")
    install_plan(plans, plan, announce=announced.append)
    assert announced == [plan] and plans.current == plan and plans.history == [plan]
    resumed = PlanState(rank_slots=(2, 0, 1))
    resumed.restore([dataclasses.replace(plan, version=7)], {0: CostModel(0.0, 0.01)})
    assert resumed.next_version() == 8 and resumed.current is None
    assert resumed.restored_slot_costs == {0: CostModel(0.0, 0.01)}


def _one_rank_collectives(rank: int, world_size: int) -> tuple:
    identity = RankIdentity(setup=SETUP, slot=2, rank=rank, world_size=world_size)
    plans = PlanState()
    slots = gather_rank_slots(identity, plans)
    plan = build_plan(identity, plans, shares=[1.0], effective_step=0, reason="one")
    install_plan(plans, plan)
    free_before = next_free_step(plans)
    plans.schedule.mark_carved(0)
    plans.schedule.mark_carved(1)
    return slots, free_before, next_free_step(plans)


def test_collectives_on_a_one_rank_group():
    slots, free_before, free_after = run_gloo_group(_one_rank_collectives, 1)[0]
    assert slots == (2,)
    assert free_before == 0  # nothing carved yet
    assert free_after == 2


def test_memory_caps_cap_slices_only_in_slice_mode():
    pass_caps = (30, 8, None)  # per rank, in rank order
    slots = (0, 1, 2)
    # accumulate (default): the slice keeps its speed share; only max_batch caps it.
    assert allocation_caps(SETUP, slots, pass_caps) == (20, None, None)
    batch = BatchConfig(global_batch_size=48, min_slice=2, memory_cap_mode="slice")
    sliced = dataclasses.replace(SETUP, batch=batch)
    assert allocation_caps(sliced, slots, pass_caps) == (20, 8, None)
    assert allocation_caps(sliced, (1, 0, 2), pass_caps) == (30, 8, None)  # slots reordered
    assert allocation_caps(sliced, slots, None) == (20, None, None)
