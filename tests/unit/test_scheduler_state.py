"""The scheduler actor's state, as a plain object: de-duplication, bounded memory, draining."""

from __future__ import annotations

import math

from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.plan import Plan
from raytrain_hetero.core.policy import PendingReplan, PolicyConfig
from raytrain_hetero.core.records import StepRecord
from raytrain_hetero.driver.scheduler import HeteroScheduler
from raytrain_hetero.worker.plan.scheduler_client import PollAnswer


def record(step: int, rank: int = 0, group: str = "g", busy_s: float = 0.1, **over) -> StepRecord:
    rate = 10 / busy_s if busy_s else math.nan
    fields = {
        "step": step,
        "epoch": 0,
        "rank": rank,
        "worker": f"w{rank}",
        "device": "cpu",
        "slice": 10,
        "weight": 0.5,
        "compute_s": busy_s,
        "load_s": 0.0,
        "busy_s": busy_s,
        "samples_per_s": rate,
        "loss": 1.0,
        "global_samples_per_s": 200.0,
        "plan_version": 1,
        "group": group,
        "world_size": 2,
        "wall_s": busy_s,
        "time": 1000.0 + step,
    }
    fields.update(over)
    return StepRecord(**fields)


def scheduler(**kwargs) -> HeteroScheduler:
    return HeteroScheduler("run", live=False, clock=lambda: 0.0, **kwargs)


def test_a_resent_batch_is_kept_once() -> None:
    sched = scheduler()
    batch = [record(s, r) for s in range(3) for r in range(2)]
    assert sched.record_steps(batch) == 6
    assert sched.record_steps(batch) == 0  # a worker's resend after a failed push
    assert sched.record_steps([record(3, 0), *batch[:2]]) == 1
    drained = sched.drain()
    assert [r.key for r in drained.records] == [r.key for r in batch] + [("g", 0, 3)]
    assert drained.counters.received == 15 and drained.counters.duplicates == 8
    assert drained.counters.kept == 7


def test_a_resend_arriving_after_later_steps_is_still_kept() -> None:
    sched = scheduler()
    sched.record_steps([record(5), record(6)])  # pushed after the failed push of 3 and 4
    assert sched.record_steps([record(3), record(4)]) == 2


def test_same_step_of_another_group_is_not_a_duplicate() -> None:
    sched = scheduler()
    sched.record_steps([record(0, group="a")])
    assert sched.record_steps([record(0, group="b")]) == 1


def test_absurd_timings_are_rejected_and_counted() -> None:
    sched = scheduler()
    assert sched.record_steps([record(0, busy_s=0.0), record(1, busy_s=math.nan)]) == 0
    assert sched.drain().counters.rejected == 2


def test_mappings_are_taken_as_step_records() -> None:
    sched = scheduler()
    assert sched.record_steps([record(0).to_dict()]) == 1
    assert sched.drain().records == (record(0),)


def test_drain_with_cursor_drops_what_the_driver_holds() -> None:
    sched = scheduler()
    sched.record_steps([record(s) for s in range(4)])
    first = sched.drain()
    assert len(first.records) == 4
    sched.record_steps([record(4)])
    second = sched.drain(first.cursor, first.incarnation)
    assert [r.step for r in second.records] == [4]
    assert sched.memory_footprint()["undrained"] == 1
    # A cursor from another incarnation (before a restart) acknowledges nothing here.
    third = sched.drain(second.cursor, "other-incarnation")
    assert [r.step for r in third.records] == [4]
    assert sched.drain(third.cursor, third.incarnation).records == ()
    assert sched.memory_footprint()["undrained"] == 0


def test_memory_stays_bounded_however_long_the_run() -> None:
    sched = scheduler(max_undrained=50, recent_per_rank=8, max_seen_keys=100)
    for start in range(0, 2000, 20):
        sched.record_steps([record(s, r) for s in range(start, start + 10) for r in range(2)])
    sizes = sched.memory_footprint()
    assert sizes["undrained"] == 50 and sizes["recent"] == 16 and sizes["seen_keys"] == 100
    drained = sched.drain()
    assert drained.counters.kept == 2000 and drained.counters.dropped == 1950
    # The newest records are the ones kept for the driver and for live summaries.
    assert drained.records[-1].step == 1989
    assert {r.step for r in sched.recent_records()} == set(range(1982, 1990))


def test_a_live_replan_travels_as_typed_records() -> None:
    # Rank 1 runs 4x slower than plan v1 assumed: the policy decides a re-plan.
    policy = PolicyConfig(window_steps=2, confirm_windows=1, min_steps_between_replans=0)
    sched = HeteroScheduler("run", policy, live=True, clock=lambda: 0.0)
    first = Plan(version=1, effective_step=0, slices=(10, 10), costs=(CostModel(0, 0.01),) * 2)
    sched.register_group("g", 2, first)
    sched.record_steps(
        [record(s, r, busy_s=0.1 if r == 0 else 0.4) for s in range(6) for r in (0, 1)]
    )
    answer = sched.poll("g", first.version)
    assert isinstance(answer, PollAnswer) and answer.known_group
    assert isinstance(answer.pending, PendingReplan) and answer.pending.based_on_version == 1
    slices = answer.pending.replan.slices
    assert sum(slices) == 20 and slices[0] > slices[1]
    assert sched.poll("other", 1) == PollAnswer(known_group=False)
    # Rank 0 installs the re-plan as v2: the history holds Plans, the pending answer is gone.
    second = Plan(version=2, effective_step=7, slices=slices, costs=answer.pending.replan.costs)
    sched.record_plan(second, "g")
    assert sched.poll("g", 2).pending is None
    drained = sched.drain()
    assert drained.plans == (second,) and drained.decisions == (answer.pending,)
    assert drained.policy == policy


def test_a_restarted_scheduler_takes_back_the_plan_history_rank_0_holds() -> None:
    # The actor died after plan v2 was installed but before the driver drained it: the
    # restarted (empty) actor gets the run's plans when rank 0 re-registers the group.
    first = Plan(version=1, effective_step=0, slices=(10, 10), shares=(1.0, 1.0))
    second = Plan(version=2, effective_step=7, slices=(14, 6), shares=(0.7, 0.3))
    restarted = HeteroScheduler("run", live=False)
    restarted.register_group("g", 2, second, history=(first, second))
    assert restarted.drain().plans == (first, second)
    # A later install appends once; a re-sent history adds nothing and keeps version order.
    third = Plan(version=3, effective_step=12, slices=(16, 4), shares=(0.8, 0.2))
    restarted.record_plan(third, "g")
    restarted.register_group("g", 2, third, history=(second, first, third))
    assert restarted.drain().plans == (first, second, third)
    assert restarted.poll("g", 3).known_group
    # A plan installed right after the restart (e.g. the measured plan, which follows no
    # poll) reaches the actor before any re-registration: it brings the history along.
    again = HeteroScheduler("run", live=False)
    again.record_plan(third, "g", history=(first, second, third))
    assert again.drain().plans == (first, second, third)
    assert again.poll("g", 3).known_group
