"""A preemption notice on a worker: agree the last step, checkpoint there, hand off.

Ray Train's preemption watcher marks every worker when a node of the group is drained (a spot
node taken back with notice); ``ray.train.get_preemption_info()`` reads that, as a collective.
This module reads it at plan-sync steps only (never per step), at most every
``NOTICE_EVERY_S`` until a hand-off is agreed (rank 0 says when, in the plan sync's broadcast,
:func:`notice_due`). On a notice, rank 0 decides
with :func:`~raytrain_hetero.core.preemption.last_step_before_deadline` from the group's
measured step and checkpoint times and broadcasts the decision: every rank trains to that step,
the loop writes a checkpoint there (``checkpoint_due()`` is true for that step), and once the
step ends the group hands off. An elastic group ends itself (:class:`PreemptionHandoff`), so
Ray Train restarts it at once on the workers that stay (the driver's failure policy counts it
as a preemption); a fixed-size group cannot start without the node, so its workers wait for
Ray Train to restart the run at the deadline, with no step to redo.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import ray.train
import torch.distributed as dist

from raytrain_hetero.core.preemption import HandoffDecision, last_step_before_deadline
from raytrain_hetero.core.records import StepRecord
from raytrain_hetero.errors import PreemptionHandoff
from raytrain_hetero.worker.runtime.registry import WorkerRuntime

logger = logging.getLogger(__name__)

__all__ = [
    "NOTICE_EVERY_S",
    "checkpoint_due",
    "enabled",
    "end_of_step",
    "note_report",
    "notice_due",
    "read_notice",
]

#: Seconds between a fixed-size group's checks while it waits to be restarted.
WAIT_POLL_S = 1.0

#: Seconds between two reads of the notice at plan-sync steps: each read is a round trip of
#: every rank to Ray Train's synchronisation actor, and notices give tens of seconds.
NOTICE_EVERY_S = 1.0


def enabled(runtime: WorkerRuntime) -> bool:
    """Whether this run reads preemption notices (the setting, and Ray Train's watcher)."""
    setup = runtime.identity.setup
    return setup.elastic.preemption_notice and setup.preemption_watcher


def note_report(runtime: WorkerRuntime, checkpoint: Any, seconds: float) -> None:
    """``report`` was called during the step in progress (with ``checkpoint`` or not)."""
    step = runtime.timing.current
    if step is not None:
        runtime.preemption.reported_at = (step.global_step, checkpoint is not None, seconds)


def checkpoint_due(runtime: WorkerRuntime) -> bool:
    """Whether the step in progress is the agreed last step before a preemption."""
    watch, step = runtime.preemption, runtime.timing.current
    return (
        watch.decision is not None
        and not watch.given_up
        and step is not None
        and step.global_step == watch.decision.last_step
    )


def notice_due(runtime: WorkerRuntime) -> bool:
    """Rank 0 at a plan-sync step: read the notice now? (Every rank follows its answer.)

    Yes when this run reads notices and ``NOTICE_EVERY_S`` passed since the last read, or
    once a hand-off is agreed (it is renewed at every plan sync before its step).
    """
    watch = runtime.preemption
    if not enabled(runtime) or watch.given_up:
        return False
    now = time.monotonic()
    if (
        watch.decision is None
        and watch.read_at is not None
        and now - watch.read_at < NOTICE_EVERY_S
    ):
        return False
    watch.read_at = now
    return True


def read_notice(runtime: WorkerRuntime, record: StepRecord) -> None:
    """A collective at a plan-sync step: on a notice, agree the hand-off on every rank (and
    renew it at each later plan-sync step before it, from the newest step times)."""
    watch = runtime.preemption
    if not enabled(runtime) or watch.given_up:
        return
    try:
        info = ray.train.get_preemption_info()  # the same answer on every rank (rank 0's)
    except Exception:  # the same context fails it on every rank
        logger.warning("preemption notices unreadable here; Ray Train's default", exc_info=True)
        watch.given_up = True
        return
    if info is None:
        return
    decision = None
    if runtime.identity.rank == 0:
        decision = _decide(runtime, record, info, renewal=watch.decision is not None)
    if dist.is_initialized():
        box = [decision]
        dist.broadcast_object_list(box, src=0)
        decision = box[0]
    watch.decision = decision


def _decide(
    runtime: WorkerRuntime, record: StepRecord, info: Any, *, renewal: bool
) -> HandoffDecision:
    watch, loader = runtime.preemption, runtime.loader
    elastic = runtime.identity.setup.elastic
    next_step = record.step + 1
    max_step = next_step
    if loader is not None:
        carver = loader.carver
        next_step = carver.global_step(loader.cursor)
        # Not past the epoch's end: its evaluation and reports would have to fit too.
        max_step = (loader.cursor.epoch + 1) * carver.steps_per_epoch - 1
    step_s = watch.step_estimate(record.wall_s or 1e-3)
    checkpoint_s = watch.checkpoint_s if watch.checkpoint_s is not None else step_s
    deadline_s = None if info.deadline_ms is None else info.deadline_ms / 1000.0
    now = time.time()
    decision = last_step_before_deadline(
        now_s=now,
        deadline_s=deadline_s,
        next_step=next_step,
        max_step=max(max_step, next_step),
        step_s=step_s,
        checkpoint_s=checkpoint_s,
        margin_s=elastic.preemption_margin_s,
    )
    if renewal:
        logger.info("preemption: hand-off renewed at step %d", decision.last_step)
        return decision
    left = "none" if deadline_s is None else f"{deadline_s - now:.1f} s"
    message = (
        "preemption notice for rank(s) %s (deadline in %s): training every rank to step %d "
        "(%.2f s/step, checkpoint %.2f s, margin %.1f s), checkpointing there"
    )
    args = (
        info.preempted_ranks,
        left,
        decision.last_step,
        step_s,
        checkpoint_s,
        elastic.preemption_margin_s,
    )
    if decision.fits:
        logger.warning(message, *args)
    else:
        logger.warning(
            message + "; the notice is shorter than one step and a checkpoint: "
            "the checkpoint may not complete before the node goes",
            *args,
        )
    return decision


def end_of_step(runtime: WorkerRuntime, record: StepRecord) -> None:
    """After step ``record.step`` (its record already handed on): hand off if it was the
    agreed last step and the loop checkpointed there; a collective at that step only."""
    watch = runtime.preemption
    watch.note_step(record)
    decision = watch.decision
    if decision is None or watch.given_up or record.step != decision.last_step:
        return
    reported = watch.reported_at
    ok = reported is not None and reported[0] == record.step
    if runtime.identity.rank == 0:
        ok = ok and reported is not None and reported[1]
    if dist.is_initialized():
        flags: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(flags, ok)
        ok = all(bool(flag) for flag in flags)
    if not ok:
        watch.given_up = True
        if runtime.identity.rank == 0:
            logger.warning(
                "preemption: the loop wrote no checkpoint at the agreed step %d (write one when "
                "raytrain_hetero.checkpoint_due() is true, see docs/reliability/"
                "preemption.md); Ray Train restarts from the last checkpoint at the deadline",
                record.step,
            )
        return
    if runtime.scheduler is not None:
        runtime.scheduler.flush(wait=True)
    setup = runtime.identity.setup
    if setup.min_workers < setup.max_world_size:
        raise PreemptionHandoff(
            f"preemption hand-off: this worker group checkpointed at step {record.step} "
            "ahead of a node's preemption deadline and ends, so that Ray Train restarts "
            "it at once on the nodes that stay"
        )
    # A fixed-size group cannot start without the node: wait, with nothing left to redo,
    # until Ray Train restarts the run at the deadline.
    logger.warning(
        "preemption: checkpointed at step %d; a fixed-size group waits for Ray Train to "
        "restart it after the deadline",
        record.step,
    )
    while True:
        time.sleep(WAIT_POLL_S)
