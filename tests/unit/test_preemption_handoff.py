"""The worker's hand-off after a preemption notice, on a real gloo group, and the driver's
failure policy that turns a hand-off into a preemption retry (Ray's stock policy inside).

The notice itself (Ray Train's watcher, a drained node) is exercised end to end by
tests/integration/test_preemption.py; here every rank holds the decision rank 0 broadcast.
"""

from __future__ import annotations

import pytest
from gloo_group import run_gloo_group
from ray.train import FailureConfig, PreemptionError, WorkerGroupError

from raytrain_hetero import BatchConfig, ElasticConfig, WorkerSpec
from raytrain_hetero.core.preemption import HandoffDecision
from raytrain_hetero.core.records import StepRecord
from raytrain_hetero.driver._ray_compat import HandoffFailurePolicy, create_failure_policy
from raytrain_hetero.errors import HeteroError, PreemptionHandoff
from raytrain_hetero.worker.measure.timing import StepInfo
from raytrain_hetero.worker.runtime.handoff import checkpoint_due, end_of_step, note_report
from raytrain_hetero.worker.runtime.registry import RankIdentity, WorkerRuntime
from raytrain_hetero.worker.setup.identity import HeteroSetup
from raytrain_hetero.worker.state.preemption import PreemptionWatch


def _record(step: int, wall_s: float = 0.1) -> StepRecord:
    return StepRecord(
        step=step,
        epoch=0,
        rank=0,
        worker="w",
        device="cpu",
        slice=4,
        weight=0.5,
        compute_s=wall_s,
        load_s=0.0,
        busy_s=wall_s,
        samples_per_s=4 / wall_s,
        loss=0.0,
        global_samples_per_s=8 / wall_s,
        plan_version=1,
        group="g",
        world_size=2,
        wall_s=wall_s,
        time=0.0,
    )


def _runtime(rank: int, world_size: int, min_workers: int) -> WorkerRuntime:
    setup = HeteroSetup(
        run_id="t",
        specs=tuple(WorkerSpec(name=f"w{i}") for i in range(world_size)),
        batch=BatchConfig(global_batch_size=8),
        elastic=ElasticConfig(min_workers=min_workers),
        min_workers=min_workers,
    )
    return WorkerRuntime.start(RankIdentity(setup=setup, slot=rank, rank=rank, world_size=2))


def _hand_off(rank: int, world_size: int, rank0_checkpoints: bool) -> str:
    """Ranks agreed on step 7; every rank reports at step 7 (rank 0 with a checkpoint or not)."""
    runtime = _runtime(rank, world_size, min_workers=1)
    runtime.preemption.decision = HandoffDecision(7, True, 1.0, 5.0)
    for step in (6, 7):
        runtime.timing.begin(
            StepInfo(
                global_step=step,
                epoch=0,
                step_in_epoch=step,
                counts=(4, 4),
                rank=rank,
                plan_version=1,
            )
        )
        due = checkpoint_due(runtime)
        assert due == (step == 7)
        if due:
            note_report(runtime, object() if rank0_checkpoints or rank else None, 0.2)
        runtime.timing.end()
        try:
            end_of_step(runtime, _record(step))
        except PreemptionHandoff:
            return f"handed off after {step}"
    return "trained on" if runtime.preemption.given_up else "no decision"


def test_every_rank_hands_off_after_the_agreed_step_once_rank_0_checkpointed():
    results = run_gloo_group(_hand_off, 2, True)
    assert results == {0: "handed off after 7", 1: "handed off after 7"}


def test_without_a_checkpoint_at_the_agreed_step_every_rank_trains_on():
    """Ray Train's default then: the loop did not write the checkpoint the hand-off needs."""
    results = run_gloo_group(_hand_off, 2, False)
    assert results == {0: "trained on", 1: "trained on"}


def test_a_checkpoint_step_is_measured_as_the_checkpoint_cost():
    watch = PreemptionWatch()
    for step in range(5):
        watch.note_step(_record(step, wall_s=0.1))
    watch.reported_at = (5, True, 0.3)  # the report itself took 0.3 s of a 0.9 s step
    watch.note_step(_record(5, wall_s=0.9))
    assert watch.checkpoint_s == pytest.approx(0.8)
    assert watch.step_estimate(1.0) == pytest.approx(0.1)  # the checkpoint step left out


def _group_error(*errors: Exception) -> WorkerGroupError:
    return WorkerGroupError("workers", dict(enumerate(errors)))


def test_a_hand_off_is_retried_as_a_preemption_not_a_failure():
    config = FailureConfig(max_failures=0, max_preemption_failures=1)
    policy = HandoffFailurePolicy(create_failure_policy(config))
    handoff = _group_error(PreemptionHandoff("a"), PreemptionHandoff("b"))
    assert policy.make_decision(handoff).value == "RETRY"  # max_failures=0 left untouched
    assert policy.make_decision(handoff).value == "RAISE"  # the preemption budget is spent
    # A real failure beside a hand-off stays a failure.
    mixed = _group_error(PreemptionHandoff("a"), HeteroError("crash"))
    fresh = HandoffFailurePolicy(create_failure_policy(config))
    assert fresh.make_decision(mixed).value == "RAISE"
    assert fresh.make_decision(PreemptionError(_info())).value == "RETRY"


def _info():
    from ray.train import PreemptionInfo

    return PreemptionInfo(deadline_ms=None, preempted_node_to_ranks={"n": [1]})
