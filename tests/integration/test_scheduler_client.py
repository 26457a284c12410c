"""The worker's scheduler client against a real scheduler actor (restarted by Ray)."""

from __future__ import annotations

import time
import uuid

from raytrain_hetero.core.plan import Plan
from raytrain_hetero.core.records import StepRecord
from raytrain_hetero.driver.scheduler import (
    SCHEDULER_NAMESPACE,
    create_scheduler,
    scheduler_actor_name,
)
from raytrain_hetero.driver.telemetry import RecordCollector
from raytrain_hetero.worker.plan.scheduler_client import SchedulerClient


def _record(step: int, rank: int = 0, group: str = "g") -> StepRecord:
    return StepRecord(
        step=step,
        epoch=0,
        rank=rank,
        worker="a",
        device="cpu",
        slice=8,
        weight=0.5,
        compute_s=0.01,
        load_s=0.0,
        busy_s=0.01,
        samples_per_s=800.0,
        loss=1.0,
        global_samples_per_s=1000.0,
        plan_version=1,
        group=group,
        world_size=2,
        wall_s=0.02,
        time=time.time(),
    )


def _drain(actor):
    import ray

    return ray.get(actor.drain.remote(0), timeout=60)


def _kill(actor, *, catch_restarting: bool = False) -> None:
    """Kill ``actor`` and return once Ray has restarted it (a new incarnation answers), or,
    with ``catch_restarting``, once a call is refused as restarting (killed again if it came
    back first: a call right after ``ray.kill`` may still reach the old incarnation)."""
    import ray

    for _ in range(5):
        before = _drain(actor).incarnation
        ray.kill(actor, no_restart=False)
        deadline = time.time() + 60
        while time.time() < deadline:
            try:
                if _drain(actor).incarnation != before:
                    if not catch_restarting:
                        return
                    break
            except ray.exceptions.ActorUnavailableError:
                if catch_restarting:
                    return
            except ray.exceptions.RayActorError:
                pass  # dead, not yet restarting
            time.sleep(0.01)
    raise AssertionError(
        f"the scheduler actor was not {'caught restarting' if catch_restarting else 'restarted'} in 5 kills"
    )


def test_pushes_typed_records_and_reregisters_with_a_restarted_actor(ray_local):
    import ray

    run_id = uuid.uuid4().hex[:8]
    actor = create_scheduler(run_id)
    ray.get(actor.register_group.remote("g", 2))
    client = SchedulerClient(
        scheduler_actor_name(run_id), SCHEDULER_NAMESPACE, group_id="g", world_size=2
    )
    for step in range(3):
        client.add(_record(step))
    client.flush(wait=True)
    assert client.buffered == 0
    assert [r.step for r in _drain(actor).records] == [0, 1, 2]
    plan = Plan.from_shares(16, [1.0, 1.0])
    assert client.poll(plan).known_group is True

    # Ray restarts the actor (the driver owns its lifecycle); its state starts empty.
    _kill(actor)
    payload = client.poll(plan, history=(plan,))
    assert payload is not None and payload.known_group is False
    # The client registered the group again, with its current plan and the run's history.
    assert client.poll(plan).known_group is True
    assert _drain(actor).plans == (plan,)
    client.add(_record(3))
    client.flush(wait=True)
    drained = _drain(ray.get_actor(scheduler_actor_name(run_id), namespace=SCHEDULER_NAMESPACE))
    assert [r.step for r in drained.records] == [3]

    # A run's last flush while Ray restarts the actor (a push then fails with
    # ActorUnavailableError): it pushes again until the restarted actor takes the records,
    # and the driver's last drain waits for the restart too.
    _kill(actor, catch_restarting=True)
    client.add(_record(4))
    client.flush(wait=True)
    assert client.buffered == 0
    collector = RecordCollector(actor, timeout_s=60)
    assert [r.step for r in collector.drain(wait_restart=True)] == [4]
    ray.kill(actor)


def test_without_an_actor_records_stay_buffered_within_the_bound(ray_local):
    client = SchedulerClient(
        "raytrain_hetero_scheduler:absent",
        SCHEDULER_NAMESPACE,
        group_id="g",
        world_size=2,
        max_buffer=3,
    )
    for step in range(5):
        client.add(_record(step))
    client.flush(wait=True)
    assert client.buffered == 3
    assert client.poll(None) is None


def test_pushes_and_polls_leave_the_step_path(ray_local):
    """flush() and ask() return at once; the sender thread delivers and the answer waits to
    be taken (once) at the plan-sync step."""
    import ray

    run_id = uuid.uuid4().hex[:8]
    actor = create_scheduler(run_id)
    plan = Plan.from_shares(16, [1.0, 1.0])
    ray.get(actor.register_group.remote("g", 2, plan))
    client = SchedulerClient(
        scheduler_actor_name(run_id), SCHEDULER_NAMESPACE, group_id="g", world_size=2
    )
    for step in range(4):
        client.add(_record(step))
    client.flush()
    client.ask(plan, (plan,))
    deadline = time.time() + 60
    answer = None
    while answer is None and time.time() < deadline:
        answer = client.answer()
        time.sleep(0.05)
    assert answer is not None and answer.known_group is True and answer.pending is None
    assert client.answer() is None  # taken once
    client.flush(wait=True)
    assert client.buffered == 0
    assert [r.step for r in _drain(actor).records] == [0, 1, 2, 3]
    ray.kill(actor)
