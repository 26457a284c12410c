"""The plan's life on a worker: the first plan, the passive switch, the scheduler's re-plans.

:mod:`~raytrain_hetero.worker.api`'s loaders call these: the first iteration installs the
first plan (fixed shares, a prior under the cheap start, or an explicit probe), every step's
end may install the passively measured plan and, every ``plan_sync_every`` steps, adopts the
scheduler's pending re-plan and reads Ray's preemption notice (collectives at the same step on
every rank; :mod:`~raytrain_hetero.worker.runtime.handoff`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import torch
import torch.distributed as dist

from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.group_decision import GroupDecision
from raytrain_hetero.core.group_price import loading_per_sample
from raytrain_hetero.core.plan import Plan
from raytrain_hetero.core.plan_words import explain_slices
from raytrain_hetero.core.records import StepRecord
from raytrain_hetero.worker.data.micro_batches import pass_caps_note
from raytrain_hetero.worker.plan.admission import (
    RETAKE_AFTER_STEPS,
    GroupWatch,
    apply_admission,
    retake_group,
)
from raytrain_hetero.worker.plan.calibration import (
    ProbeInputs,
    known_costs,
    measure_costs,
    measure_pass_caps,
    passive_step,
    prior_plan,
    remember_cost,
    starts_passive,
)
from raytrain_hetero.worker.plan.planning import (
    PassiveWindow,
    build_plan,
    gather_rank_slots,
    install_plan,
    next_free_step,
)
from raytrain_hetero.worker.plan.scheduler_client import PollAnswer
from raytrain_hetero.worker.runtime.handoff import end_of_step, notice_due, read_notice
from raytrain_hetero.worker.runtime.registry import WorkerRuntime
from raytrain_hetero.worker.setup.faults import fault_point
from raytrain_hetero.worker.setup.identity import all_gather

__all__ = [
    "decide_group_after_window",
    "install_first_plan",
    "install_run_plan",
    "on_step_end",
    "sync_with_scheduler",
    "watch_group_decision",
]


def install_run_plan(runtime: WorkerRuntime, plan: Plan) -> Plan:
    scheduler = runtime.scheduler
    announce = None
    if scheduler is not None and runtime.identity.rank == 0:

        def announce(installed: Plan) -> None:
            scheduler.record_plan(installed, runtime.plans.history)

    return install_plan(runtime.plans, plan, announce=announce)


def install_first_plan(runtime: WorkerRuntime, inputs: ProbeInputs) -> None:
    identity, plans = runtime.identity, runtime.plans
    setup = identity.setup
    rank_slots = gather_rank_slots(identity, plans)
    plans.pass_caps = measure_pass_caps(identity, runtime.model, inputs)
    loader = runtime.loader
    start = loader.carver.global_step(loader.cursor)
    if setup.batch.fixed_shares is not None:
        shares = [setup.batch.fixed_shares[slot] for slot in rank_slots]
        plan = build_plan(
            identity,
            plans,
            shares=shares,
            effective_step=start,
            reason="fixed shares" + pass_caps_note(plans.pass_caps),
        )
    elif starts_passive(identity):
        # No phase before step 0: a prior now, the measured plan after a few timed steps.
        known = known_costs(identity, plans, runtime.model, inputs, stored=True)
        plan = prior_plan(identity, plans, known, start)
    else:
        # After a restart, slots the previous group measured keep their cost models (the
        # calibration refits them under the new group's contention); only new slots are
        # probed. An explicit probe is not skipped for remembered ones; it is remembered.
        known_list = known_costs(identity, plans, runtime.model, inputs, stored=False)
        known = {slot: c for slot, c in zip(rank_slots, known_list) if c is not None}
        costs, how, step_seconds = measure_costs(
            identity,
            runtime.model,
            runtime.timing,
            inputs,
            rank_slots=rank_slots,
            known=known,
            pass_caps=plans.pass_caps,
        )
        remember_cost(identity, plans, costs[identity.rank])
        if setup.probe.group != "all" and not setup.parallel.model_parallel:
            decision = apply_admission(
                identity, runtime.model, costs, rank_slots, runtime.scheduler, step_seconds
            )
            _watch_decision(runtime, decision, costs, rank_slots)
        plan = build_plan(identity, plans, costs=costs, effective_step=start, reason=how)
        # The slices in words (each rank's fixed and per-sample cost, and why a rank held at
        # the minimum gets so little), once they are allocated.
        words = explain_slices(plan.slices, costs, plan.min_slice)
        plan = replace(plan, reason=f"{how} ({words})" + pass_caps_note(plans.pass_caps))
    install_run_plan(runtime, plan)


def decide_group_after_window(runtime: WorkerRuntime, window: PassiveWindow) -> None:
    """``group`` ``train`` / ``auto`` under the cheap start: decide on what the window measured.

    The passive window's cost models (each rank's loader-bound step, timed while training)
    and its step times (the prediction's noise) feed the same decision an explicit probe
    feeds (:func:`~raytrain_hetero.worker.plan.admission.apply_admission`: once per run, on
    a full group). A worker that does not train makes the group wait here for Ray Train's
    elastic restart on the kept slots, which resumes from the run's latest checkpoint: the
    window's steps are trained again by the kept group, so the run stays the one-device run
    of the kept group. A collective: every rank calls it at the same step.
    """
    identity, plans = runtime.identity, runtime.plans
    setup = identity.setup
    if setup.probe.group == "all" or setup.batch.fixed_shares is not None:
        return
    costs = plans.measured_costs  # agreed by broadcast: every rank takes the same branch
    if costs is None:
        return
    valid = [s for s in window.samples if s.valid]
    gathered = all_gather(
        [[s.busy_s for s in valid], [s.samples for s in valid], [s.compute_s for s in valid]]
    )
    step_seconds = [g[0] for g in gathered]
    loading = [loading_per_sample(g[1], g[0], g[2]) for g in gathered]
    rank_slots = gather_rank_slots(identity, plans)
    decision = apply_admission(
        identity,
        runtime.model,
        costs,
        rank_slots,
        runtime.scheduler,
        step_seconds,
        loading_s_per_sample=loading,
    )
    _watch_decision(runtime, decision, costs, rank_slots)


def _watch_decision(
    runtime: WorkerRuntime,
    decision: GroupDecision | None,
    costs: Sequence[CostModel],
    rank_slots: Sequence[int],
) -> None:
    """The group that decided, and trains on, checks its decision on its next steps
    (:func:`watch_group_decision`)."""
    if decision is not None and decision.mode != "all":
        runtime.group_watch = GroupWatch(decision, tuple(costs), tuple(rank_slots))


def watch_group_decision(runtime: WorkerRuntime, record: StepRecord) -> None:
    """Count a step towards this group's decision check; at the
    :data:`~raytrain_hetero.worker.plan.admission.RETAKE_AFTER_STEPS`-th, check it (a
    collective at the same step on every rank: all started watching at the same step) and
    decide again if the group missed its prediction
    (:func:`~raytrain_hetero.worker.plan.admission.retake_group`). One check per decision."""
    watch = runtime.group_watch
    if watch is None:
        return
    current = runtime.plans.current
    if current is not None and record.plan_version != current.version:
        return  # a step of an older plan (the prior's, before the decided plan took effect)
    if watch.add(record.slice, record.busy_s, record.wall_s, record.compute_s) < RETAKE_AFTER_STEPS:
        return
    runtime.group_watch = None
    retake_group(runtime.identity, runtime.model, runtime.scheduler, watch)


def on_step_end(runtime: WorkerRuntime, record: StepRecord) -> None:
    """The library's work after each step; its wall time is the next record's ``overhead_s``."""
    fault_point(runtime.identity, "mid_epoch", step=record.step, model=runtime.model)
    started = time.perf_counter()
    try:
        _after_step(runtime, record)
    finally:
        runtime.telemetry.add_overhead(time.perf_counter() - started)


def _after_step(runtime: WorkerRuntime, record: StepRecord) -> None:
    runtime.telemetry.last_record = record
    if runtime.plans.first_step_at is None:
        runtime.plans.first_step_at = record.time - record.wall_s
    window = runtime.plans.passive
    measured = passive_step(runtime.identity, runtime.plans, record)
    if window is not None and runtime.plans.passive is None:  # the window closed at this step
        decide_group_after_window(runtime, window)
    else:
        watch_group_decision(runtime, record)
    if measured is not None:
        fault_point(runtime.identity, "plan_switch", step=measured.effective_step - 1)
        install_run_plan(runtime, measured)
    setup = runtime.identity.setup
    scheduler = runtime.scheduler
    if scheduler is None:
        return
    scheduler.add(record)
    every = setup.scheduler.plan_sync_every
    ahead = every > 0 and (record.step + 2) % every == 0  # the step before a plan sync
    if ahead or scheduler.buffered >= setup.scheduler.resolved_flush_every():
        scheduler.flush()  # handed to the client's sender thread: no wait here
    if ahead and runtime.identity.rank == 0:
        scheduler.ask(runtime.plans.current, runtime.plans.history)
    end_of_step(runtime, record)  # the agreed last step before a preemption: hand off
    if every > 0 and (record.step + 1) % every == 0:
        sync_with_scheduler(runtime, record)


#: Bits of the plan sync's flag: an answer follows; read the preemption notice now.
_ANSWER, _NOTICE = 1, 2


def sync_with_scheduler(runtime: WorkerRuntime, record: StepRecord) -> None:
    """A collective at the same step on every rank: adopt the scheduler's pending plan.

    Rank 0 takes the answer to the poll it asked a step ahead (none if it has not arrived or
    the actor is unreachable: training goes on with the current plan) and broadcasts one small
    flag: whether an answer with news follows (a pending re-plan decided from the current
    plan, or new injections) and whether every rank reads the preemption notice now. A new
    plan takes effect at the first step no rank has carved, on every rank alike.
    """
    answer: PollAnswer | None = None
    flags = 0
    if runtime.identity.rank == 0:
        answer = _news(runtime, runtime.scheduler.answer())
        flags = (_ANSWER if answer is not None else 0) | (_NOTICE if notice_due(runtime) else 0)
    flags = _broadcast_flags(runtime, flags)
    if flags & _ANSWER:
        box = [answer]
        dist.broadcast_object_list(box, src=0)
        answer = box[0]
    if flags & _NOTICE:
        read_notice(runtime, record)
    if answer is None:
        return
    runtime.slowdowns.set_live(answer.injections)
    if answer.pending is None:
        return
    replan = answer.pending.replan
    plan = build_plan(
        runtime.identity,
        runtime.plans,
        costs=replan.costs,
        slices=replan.slices,
        effective_step=next_free_step(runtime.plans),
        reason=f"live: {replan.reason}",
    )
    fault_point(runtime.identity, "plan_switch", step=plan.effective_step - 1)
    install_run_plan(runtime, plan)
    # The newest passive (loader-bound) price of this worker is what later runs start from.
    remember_cost(runtime.identity, runtime.plans, replan.costs[runtime.identity.rank])


def _news(runtime: WorkerRuntime, answer: PollAnswer | None) -> PollAnswer | None:
    """``answer`` without what the group has already (rank 0): a pending re-plan decided from
    an older plan than the current one (asked before it was installed) is dropped; None when
    nothing is left that changes anything."""
    if answer is None:
        return None
    current = runtime.plans.current
    version = current.version if current is not None else 0
    if answer.pending is not None and answer.pending.based_on_version < version:
        answer = replace(answer, pending=None)
    if answer.pending is None and tuple(answer.injections) == runtime.slowdowns.live:
        return None
    return answer


def _broadcast_flags(runtime: WorkerRuntime, flags: int) -> int:
    """Rank 0's ``flags`` on every rank: one int64 broadcast (on the device under NCCL)."""
    device = "cpu"
    if dist.get_backend() == dist.Backend.NCCL:
        device = runtime.identity.device
    box = torch.tensor([flags], dtype=torch.int64, device=device)
    dist.broadcast(box, src=0)
    return int(box.item())
