"""Admission on the workers: time the gradient collective, decide, and hand the decision on.

:func:`assess_admission` (a collective) times a gradient-sized all-reduce on each prefix of the
fastest-first order and applies :func:`~raytrain_hetero.core.admission.decide_admission`;
every rank computes the same decision from the same gathered numbers. With
``ProbeConfig.admission == "auto"``, :func:`apply_admission` records it with the scheduler
actor (once per run) and, when slots are left out, stops the group before training for Ray
Train's elastic controller to restart it on the kept slots only
(:mod:`raytrain_hetero.driver.elastic`). No rank gets a zero slice: a rank in the group pays
every collective whatever its slice.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from raytrain_hetero.core.admission import (
    AdmissionDecision,
    decide_admission,
    greedy_order,
    kept_slots,
)
from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.errors import HeteroError
from raytrain_hetero.worker.measure.probe import time_gradient_allreduce
from raytrain_hetero.worker.setup.identity import RankIdentity

logger = logging.getLogger(__name__)

__all__ = ["apply_admission", "assess_admission"]

#: Seconds a group that left workers out waits for Ray Train to restart it without them.
RESTART_TIMEOUT_S = float(os.environ.get("RAYTRAIN_HETERO_ADMISSION_RESTART_TIMEOUT_S", "120"))


def assess_admission(
    identity: RankIdentity,
    model: Any,
    costs: Sequence[CostModel],
    rank_slots: Sequence[int],
) -> AdmissionDecision:
    """The admission decision for this group (a collective; identical on every rank).

    The greedy only evaluates prefixes of :func:`~raytrain_hetero.core.admission.greedy_order`,
    so the all-reduce of ``model``'s gradient size is timed on each prefix of two or more
    ranks: a process group per prefix, created, timed and destroyed in turn.
    """
    setup = identity.setup
    module = getattr(model, "module", model)
    order = greedy_order(setup.batch.global_batch_size, costs)
    timeout = timedelta(seconds=setup.backend.collective_timeout_s)
    collective = [0.0]
    for k in range(2, len(order) + 1):
        members = sorted(order[:k])
        group = dist.new_group(ranks=members, timeout=timeout)  # every rank must call it
        mine = 0.0
        if identity.rank in members:
            mine = time_gradient_allreduce(
                module, group=group, collective_delay_s=identity.spec.emulated_collective_delay_s
            )
        agreed = torch.tensor([mine], dtype=torch.float64)
        if dist.get_backend() == dist.Backend.NCCL:
            agreed = agreed.to(identity.device)
        dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
        dist.destroy_process_group(group)
        collective.append(float(agreed.item()))
    logger.info(
        "gradient all-reduce of the k fastest workers, k = 1..%d: %s ms",
        len(order),
        [round(c * 1e3, 2) for c in collective],
    )
    return decide_admission(
        setup.batch.global_batch_size,
        costs,
        collective_s=collective,
        names=[setup.specs[slot].name for slot in rank_slots],
        caps=[setup.specs[slot].max_batch for slot in rank_slots],
        min_slice=setup.batch.min_slice,
        quantum=setup.batch.slice_quantum,
    )


def apply_admission(
    identity: RankIdentity,
    model: Any,
    costs: Sequence[CostModel],
    rank_slots: Sequence[int],
    scheduler: Any,
) -> AdmissionDecision | None:
    """``admission: auto`` at a group's first plan: decide once per run, then act on it.

    Only a full group decides (no slot left out unmeasured), once per run (rank 0 asks the
    scheduler). Rank 0 records the decision and the slots to keep; if this group holds
    another slot, every rank waits for the elastic controller to restart the group on the
    kept slots. ``scheduler`` is rank 0's client (None elsewhere).

    Returns:
        The decision made by this group, or None if the run had decided already, the group
        is not full, or the scheduler is unreachable (admission is then not applied).

    Raises:
        HeteroError: The group was not restarted within ``RESTART_TIMEOUT_S``.
    """
    box: list[Any] = [None]
    if identity.rank == 0:
        box[0] = "unreachable" if scheduler is None else scheduler.admission()
    dist.broadcast_object_list(box, src=0)
    if box[0] == "unreachable":
        logger.warning("admission: auto needs the run's scheduler actor, which is unreachable")
        return None
    if box[0] is not None:
        logger.info("admission decided earlier in this run: %s", box[0].get("summary", ""))
        return None
    if identity.world_size < identity.setup.max_world_size:
        # Judge every slot at once: slots never measured must not be capped away.
        logger.info(
            "admission waits for the full group (%d of %d workers)",
            identity.world_size,
            identity.setup.max_world_size,
        )
        return None
    decision = assess_admission(identity, model, costs, rank_slots)
    ranked = sorted(decision.workers, key=lambda w: w.order)
    kept = kept_slots(
        [rank_slots[r] for r in decision.admitted],
        [rank_slots[w.rank] for w in ranked],
        min_workers=identity.setup.min_workers,
    )
    dropped = sorted(set(rank_slots) - set(kept))
    if identity.rank == 0:
        logger.info("%s", decision.summary())
        for worker in decision.workers:
            logger.info("admission: %s (rank %d): %s", worker.worker, worker.rank, worker.reason)
        scheduler.record_admission(
            dict(decision.to_dict(), summary=decision.summary(), keep_slots=list(kept))
        )
    if not dropped:
        return decision
    logger.info(
        "admission: waiting for Ray Train to restart the group on worker slots %s "
        "(slots %s left out)",
        list(kept),
        dropped,
    )
    deadline = time.monotonic() + RESTART_TIMEOUT_S
    while time.monotonic() < deadline:
        time.sleep(0.5)
    raise HeteroError(
        f"admission left out worker slots {dropped}, but Ray Train did not restart the group "
        f"without them within {RESTART_TIMEOUT_S:.0f} s. Fix: check that the run is elastic "
        "(HeteroTrainer makes it so with probe admission: auto), or set admission: all."
    )
