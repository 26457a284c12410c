"""Which cost models a restarted worker group inherits from the checkpoint it resumes."""

from __future__ import annotations

from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.plan import Plan
from raytrain_hetero.worker.state.checkpoint_state import slot_costs as _slot_costs


def _plan(version: int, costs: list[CostModel]) -> Plan:
    return Plan.from_costs(60, costs, version=version, effective_step=version * 10)


def test_newest_plan_costs_map_to_the_slots_that_measured_them():
    fast, slow = CostModel(0.001, 0.01), CostModel(0.002, 0.04)
    plans = [_plan(2, [slow, fast]), _plan(1, [fast, fast])]
    # Rank 0 filled slot 2, rank 1 filled slot 0 (ranks are ordered by node, slots are not).
    assert _slot_costs(plans, [2, 0]) == {2: slow, 0: fast}


def test_nothing_is_reused_without_slots_costs_or_a_matching_world():
    costs = [CostModel(0.0, 0.01), CostModel(0.0, 0.02)]
    assert _slot_costs([_plan(1, costs)], None) == {}  # checkpoint from an older version
    assert _slot_costs([_plan(1, costs)], [0, 1, 2]) == {}  # plan of another group size
    shares = Plan.from_shares(60, [1.0, 2.0])
    assert _slot_costs([shares], [0, 1]) == {}  # fixed shares: nothing measured
    assert _slot_costs([], [0, 1]) == {}
