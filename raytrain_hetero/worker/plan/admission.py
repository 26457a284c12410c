"""The group decision on the workers: time the gradient collective, decide, hand it on.

:func:`assess_admission` (a collective) times a gradient-sized all-reduce on each prefix of the
fastest-first order and a small one on the whole group (the gloo link's fit,
:func:`~raytrain_hetero.core.group_price.fit_link_cost`, prices the groups that were not
timed), then applies :func:`~raytrain_hetero.core.group_decision.decide_group` to the
calibrated (loader-bound) cost models, with the noise of the calibration's step times
(:func:`~raytrain_hetero.core.group_price.prediction_noise`); every rank computes the same
decision from the same gathered numbers. With ``ProbeConfig.group`` ``train`` or ``auto``,
:func:`apply_admission` records it with the scheduler actor (once per run) and, when workers
stand by, stops the group before training for Ray Train's elastic controller to restart it on
the trainers' slots only (:mod:`raytrain_hetero.driver.elastic`). No rank gets a zero slice: a
rank in the group pays every collective whatever its slice. A map-style dataset has no
feeding path yet: its workers train or stand by.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from raytrain_hetero.core.admission import greedy_order, kept_slots
from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.group_decision import GroupDecision, decide_group
from raytrain_hetero.core.group_price import (
    ExchangePrice,
    LinkCost,
    WorkerPrice,
    fit_link_cost,
    prediction_noise,
)
from raytrain_hetero.errors import AllocationError, ConfigError, HeteroError
from raytrain_hetero.worker.measure.probe import time_gradient_allreduce
from raytrain_hetero.worker.plan.planning import gather_rank_slots
from raytrain_hetero.worker.setup.identity import RankIdentity

logger = logging.getLogger(__name__)

__all__ = ["admission_record", "apply_admission", "assess_admission", "group_report"]

#: Seconds a group that left workers out waits for Ray Train to restart it without them.
RESTART_TIMEOUT_S = float(os.environ.get("RAYTRAIN_HETERO_ADMISSION_RESTART_TIMEOUT_S", "120"))

#: Elements of the small all-reduce timed beside the gradient's (the link's latency).
_SMALL_NUMEL = 256


def _agreed_max(identity: RankIdentity, value: float) -> float:
    agreed = torch.tensor([value], dtype=torch.float64)
    if dist.get_backend() == dist.Backend.NCCL:
        agreed = agreed.to(identity.device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    return float(agreed.item())


def _link(identity: RankIdentity, module: Any, full_s: float) -> tuple[LinkCost, float]:
    """The whole group's link fitted from a small and the gradient-sized all-reduce (timed
    without the emulated link delay, which is priced per worker), and the gradient's bytes."""
    numel = sum(p.numel() for p in module.parameters() if p.requires_grad)
    gradient_bytes = 4.0 * max(1, numel)  # the timed payload is float32
    if identity.world_size < 2:
        return LinkCost(0.0, math.inf), gradient_bytes
    small = torch.nn.Linear(_SMALL_NUMEL, 1, bias=False).to(identity.device)
    small_s = _agreed_max(identity, time_gradient_allreduce(small, group=None))
    plain_s = _agreed_max(identity, time_gradient_allreduce(module, group=None))
    try:
        link = fit_link_cost(
            [4.0 * _SMALL_NUMEL, gradient_bytes], [small_s, plain_s], identity.world_size
        )
    except AllocationError:  # timings the fit refuses (noise): the full one as latency only
        hops = 2 * (identity.world_size - 1)
        link = LinkCost(max(full_s, plain_s) / hops, math.inf)
    return link, gradient_bytes


def assess_admission(
    identity: RankIdentity,
    model: Any,
    costs: Sequence[CostModel],
    rank_slots: Sequence[int],
    step_seconds: Sequence[Sequence[float]] = (),
    *,
    mode: str | None = None,
) -> tuple[GroupDecision, tuple[float, ...]]:
    """The group decision for this group (a collective; identical on every rank).

    The gradient all-reduce is timed on each prefix of two or more ranks of the
    fastest-first order (a process group per prefix, created, timed and destroyed in turn;
    a slow link shows in exactly the prefixes holding it); other groups are priced from the
    whole group's fitted link plus each member's emulated link delay. ``step_seconds``: per
    rank, its calibration step times (the prediction's noise; empty: the noise floor).
    ``mode``: the decision's mode (default ``ProbeConfig.group``).

    Returns:
        The decision and the gradient all-reduce seconds of the k fastest, at index k - 1.

    Raises:
        ConfigError: ``group: all`` with a worker that cannot hold one slice, or caps that
            cannot hold the batch (one line naming the worker and the fix).
    """
    setup = identity.setup
    module = getattr(model, "module", model)
    total = setup.batch.global_batch_size
    order = greedy_order(total, costs)
    timeout = timedelta(seconds=setup.backend.collective_timeout_s)
    collective = [0.0]
    measured: dict[frozenset[int], float] = {}
    for k in range(2, len(order) + 1):
        members = sorted(order[:k])
        group = dist.new_group(ranks=members, timeout=timeout)  # every rank must call it
        mine = 0.0
        if identity.rank in members:
            mine = time_gradient_allreduce(
                module, group=group, collective_delay_s=identity.spec.emulated_collective_delay_s
            )
        seconds = _agreed_max(identity, mine)
        dist.destroy_process_group(group)
        collective.append(seconds)
        measured[frozenset(members)] = seconds
    logger.info(
        "gradient all-reduce of the k fastest workers, k = 1..%d: %s ms",
        len(order),
        [round(c * 1e3, 2) for c in collective],
    )
    link, gradient_bytes = _link(identity, module, collective[-1])
    specs = [setup.specs[slot] for slot in rank_slots]
    prices = [
        WorkerPrice(
            name=spec.name,
            step=cost,
            device=spec.resolved_device(),
            cap=spec.max_batch,
            exchange_delay_s=spec.emulated_collective_delay_s,  # EMULATED link delay
        )
        for spec, cost in zip(specs, costs)
    ]
    try:
        decision = decide_group(
            total,
            prices,
            ExchangePrice(gradient_bytes=gradient_bytes, gloo=link),
            noise=prediction_noise(step_seconds),
            mode=setup.probe.group if mode is None else mode,  # type: ignore[arg-type]
            min_slice=setup.batch.min_slice,
            quantum=setup.batch.slice_quantum,
            measured_gradient_s=measured,
        )
    except AllocationError as exc:
        raise ConfigError(str(exc)) from exc
    return decision, tuple(collective)


def admission_record(
    decision: GroupDecision, collective_s: Sequence[float], keep_slots: Sequence[int]
) -> dict[str, Any]:
    """The decision as the run records it (scheduler, ``summary.json``, the probe's table):
    ``GroupDecision.to_dict()`` (verdicts, ``summary``) plus the keys admission recorded
    before (``admitted``, ``excluded``, ``collective_s``, per worker ``rank``, ``order``,
    ``admitted``, ``with_``/``without_samples_per_s``), and ``keep_slots``."""
    out = decision.to_dict()
    rate = decision.chosen.samples_per_s
    order = {rank: place for place, rank in enumerate(decision.preference)}
    workers = []
    for w, plain in zip(decision.workers, out["workers"]):
        trains = w.verdict == "train"
        other = w.alternative_samples_per_s
        workers.append(
            dict(
                plain,
                rank=w.index,
                order=order[w.index],
                admitted=trains,
                with_samples_per_s=rate if trains else other,
                without_samples_per_s=other if trains else rate,
            )
        )
    return dict(
        out,
        workers=workers,
        admitted=list(decision.trainers),
        excluded=[w.index for w in decision.workers if w.verdict != "train"],
        collective_s=list(collective_s),
        all_samples_per_s=decision.everyone.samples_per_s,
        admitted_samples_per_s=rate,
        keep_slots=list(keep_slots),
    )


def group_report(runtime: Any) -> dict[str, Any]:
    """The decision for the current plan's cost models, without acting on it (a collective).

    The mode is ``ProbeConfig.group``'s (``train`` where it is ``all``: what would stand
    by); noise: the floor (no calibration step times at hand). ``runtime`` is the worker's
    :class:`~raytrain_hetero.worker.runtime.registry.WorkerRuntime`.

    Returns:
        :func:`admission_record`'s dict (``summary``: one line).

    Raises:
        HeteroError: No probed plan yet.
    """
    plan = runtime.plans.current
    if plan is None or plan.costs is None:
        raise HeteroError(
            "admission_report needs a probed plan: iterate the prepared loader (or call its "
            "ensure_plan()) first, without fixed shares."
        )
    rank_slots = gather_rank_slots(runtime.identity, runtime.plans)
    group = runtime.identity.setup.probe.group
    decision, collective = assess_admission(
        runtime.identity,
        runtime.model,
        plan.costs,
        rank_slots,
        mode="train" if group == "all" else group,
    )
    return admission_record(decision, collective, [rank_slots[r] for r in decision.trainers])


def apply_admission(
    identity: RankIdentity,
    model: Any,
    costs: Sequence[CostModel],
    rank_slots: Sequence[int],
    scheduler: Any,
    step_seconds: Sequence[Sequence[float]] = (),
) -> GroupDecision | None:
    """``group`` ``train`` / ``auto`` at a group's first plan: decide once, then act on it.

    Only a full group decides (no slot left out unmeasured), once per run (rank 0 asks the
    scheduler) until the decision is cleared (a re-take). Rank 0 records the decision
    (:func:`admission_record`) and logs each worker's verdict and reason; if this group holds
    a worker that does not train, every rank waits for the elastic controller to restart the
    group on the kept slots. ``scheduler`` is rank 0's client (None elsewhere).

    Returns:
        The decision made by this group, or None if the run had decided already, the group
        is not full, or the scheduler is unreachable (the decision is then not applied).

    Raises:
        HeteroError: The group was not restarted within ``RESTART_TIMEOUT_S``.
    """
    box: list[Any] = [None]
    if identity.rank == 0:
        box[0] = "unreachable" if scheduler is None else scheduler.admission()
    dist.broadcast_object_list(box, src=0)
    if box[0] == "unreachable":
        logger.warning("group decision: needs the run's scheduler actor, which is unreachable")
        return None
    if box[0] is not None:
        logger.info("group decided earlier in this run: %s", box[0].get("summary", ""))
        return None
    if identity.world_size < identity.setup.max_world_size:
        # Judge every slot at once: slots never measured must not be capped away.
        logger.info(
            "group decision waits for the full group (%d of %d workers)",
            identity.world_size,
            identity.setup.max_world_size,
        )
        return None
    decision, collective = assess_admission(identity, model, costs, rank_slots, step_seconds)
    kept = kept_slots(
        [rank_slots[r] for r in decision.trainers],
        [rank_slots[r] for r in decision.preference],
        min_workers=identity.setup.min_workers,
    )
    dropped = sorted(set(rank_slots) - set(kept))
    if identity.rank == 0:
        logger.info("%s", decision.summary())
        for worker in decision.workers:
            logger.info(
                "group: %s (rank %d) %s: %s",
                worker.worker,
                worker.index,
                worker.verdict.upper(),
                worker.reason,
            )
        scheduler.record_admission(admission_record(decision, collective, kept))
    if not dropped:
        return decision
    logger.info(
        "group: waiting for Ray Train to restart the group on worker slots %s (slots %s stand by)",
        list(kept),
        dropped,
    )
    deadline = time.monotonic() + RESTART_TIMEOUT_S
    while time.monotonic() < deadline:
        time.sleep(0.5)
    raise HeteroError(
        f"the group decision left out worker slots {dropped}, but Ray Train did not restart "
        f"the group without them within {RESTART_TIMEOUT_S:.0f} s. Fix: check that the run is "
        "elastic (HeteroTrainer makes it so with probe.group train or auto), or set "
        "probe.group: all."
    )
