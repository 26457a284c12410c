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

The group that decided then checks the decision against its own first
:data:`RETAKE_AFTER_STEPS` training steps (:class:`GroupWatch`, :func:`retake_group`): when it
runs below its prediction by more than the margin
(:func:`~raytrain_hetero.core.group_retake.check_retake`), it re-prices from those steps
(:func:`~raytrain_hetero.core.group_retake.reprice_from_steps`: each worker's cost as measured,
the full group's exchange as it showed) and decides again. Within the margin it re-prices and
decides again too, acting only when a verdict changes (the first decision's margin came from a
short window's noise). A decision that acts replaces the recorded one; one that leaves workers
out restarts the group without them.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
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
    compute_cost,
    fit_link_cost,
    loading_per_sample,
    prediction_noise,
)
from raytrain_hetero.core.group_retake import (
    check_retake,
    group_step_s,
    reprice_from_steps,
    settle_retake,
)
from raytrain_hetero.errors import AllocationError, ConfigError, HeteroError
from raytrain_hetero.worker.measure.probe import time_gradient_allreduce
from raytrain_hetero.worker.plan.planning import gather_rank_slots
from raytrain_hetero.worker.setup.identity import RankIdentity, all_gather
from raytrain_hetero.worker.sync.batchnorm.exact import HeteroBatchNorm

logger = logging.getLogger(__name__)

__all__ = [
    "RETAKE_AFTER_STEPS",
    "GroupWatch",
    "admission_record",
    "apply_admission",
    "assess_admission",
    "group_report",
    "retake_group",
]

#: Training steps of a deciding group measured before its decision is checked against them.
RETAKE_AFTER_STEPS = 10

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


def exact_batchnorm_exchange(module: Any) -> tuple[int, float]:
    """Exact BatchNorm layers of ``module`` and the bytes one layer's two exchanges move per
    step on average (float64: the forward's ``2C + 1`` statistics, the backward's two sums of
    ``C``); ``(0, 0.0)`` without such layers (ghost, local or no BatchNorm)."""
    channels = [m.num_features for m in module.modules() if isinstance(m, HeteroBatchNorm)]
    if not channels:
        return 0, 0.0
    return len(channels), 8.0 * sum(4 * c + 1 for c in channels) / len(channels)


def assess_admission(
    identity: RankIdentity,
    model: Any,
    costs: Sequence[CostModel],
    rank_slots: Sequence[int],
    step_seconds: Sequence[Sequence[float]] = (),
    *,
    mode: str | None = None,
    full_group_exchange_s: float | None = None,
    loading_s_per_sample: Sequence[float] | None = None,
) -> tuple[GroupDecision, tuple[float, ...]]:
    """The group decision for this group (a collective; identical on every rank).

    The gradient all-reduce is timed on each prefix of two or more ranks of the
    fastest-first order (a process group per prefix, created, timed and destroyed in turn;
    a slow link shows in exactly the prefixes holding it); other groups are priced from the
    whole group's fitted link plus each member's emulated link delay. ``step_seconds``: per
    rank, its calibration step times (the prediction's noise; empty: the noise floor).
    ``mode``: the decision's mode (default ``ProbeConfig.group``).
    ``full_group_exchange_s``: the exchange this whole group showed while training (a
    re-take): it prices the whole group's gradient exchange instead of the timed all-reduce.
    ``loading_s_per_sample``: per rank, its measured seconds of loading per sample
    (:func:`~raytrain_hetero.core.group_price.loading_per_sample`; ``nan``: unknown): under
    exact BatchNorm the ranks meet in forward, so a group pays its slowest loading and its
    slowest compute one after the other
    (:func:`~raytrain_hetero.core.group_price.synchronised_makespan`).

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
    measured: dict[Collection[int], float] = {}
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
    if full_group_exchange_s is not None:
        measured[frozenset(range(identity.world_size))] = float(full_group_exchange_s)
    logger.info(
        "gradient all-reduce of the k fastest workers, k = 1..%d: %s ms",
        len(order),
        [round(c * 1e3, 2) for c in collective],
    )
    link, gradient_bytes = _link(identity, module, collective[-1])
    specs = [setup.specs[slot] for slot in rank_slots]
    loading = list(loading_s_per_sample or [math.nan] * len(costs))
    prices = [
        WorkerPrice(
            name=spec.name,
            step=cost,
            compute=compute_cost(cost, per_sample),
            device=spec.resolved_device(),
            cap=spec.max_batch,
            exchange_delay_s=spec.emulated_collective_delay_s,  # EMULATED link delay
        )
        for spec, cost, per_sample in zip(specs, costs, loading)
    ]
    batchnorm_layers, batchnorm_bytes = exact_batchnorm_exchange(module)
    try:
        decision = decide_group(
            total,
            prices,
            ExchangePrice(
                gradient_bytes=gradient_bytes,
                gloo=link,
                batchnorm_layers=batchnorm_layers,
                batchnorm_bytes=batchnorm_bytes,
            ),
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
    *,
    retake: str | None = None,
    full_group_exchange_s: float | None = None,
    loading_s_per_sample: Sequence[float] | None = None,
) -> GroupDecision | None:
    """``group`` ``train`` / ``auto`` at a group's first plan: decide once, then act on it.

    Only a full group decides (no slot left out unmeasured), once per run (rank 0 asks the
    scheduler), unless ``retake`` (why this group decides again, :func:`retake_group`; with
    ``full_group_exchange_s``, the exchange it showed): its decision then replaces the
    recorded one. Rank 0 records the decision
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
    if box[0] is not None and retake is None:
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
    decision, collective = assess_admission(
        identity,
        model,
        costs,
        rank_slots,
        step_seconds,
        full_group_exchange_s=full_group_exchange_s,
        loading_s_per_sample=loading_s_per_sample,
    )
    return _act_on_decision(identity, decision, collective, rank_slots, scheduler, retake)


def _act_on_decision(
    identity: RankIdentity,
    decision: GroupDecision,
    collective: Sequence[float],
    rank_slots: Sequence[int],
    scheduler: Any,
    retake: str | None,
) -> GroupDecision:
    """Log and record ``decision`` (rank 0); if it leaves workers out, wait for the restart.

    Raises:
        HeteroError: The group was not restarted within ``RESTART_TIMEOUT_S``.
    """
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
        record = admission_record(decision, collective, kept)
        if retake is not None:
            record["retake"] = retake
        scheduler.record_admission(record)
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


@dataclass
class GroupWatch:
    """The steps a deciding group trains after its decision, to check it (:func:`retake_group`).

    Attributes:
        decision: The group's decision (every rank holds the same).
        costs: The cost models it was decided on, per rank.
        rank_slots: Each rank's worker slot.
        slices: This rank's slice at each watched step.
        busy: This rank's busy (loader-bound) seconds at each watched step.
        wall: This rank's wall seconds of each watched step.
        compute: This rank's compute seconds at each watched step (its loading apart).
    """

    decision: GroupDecision
    costs: tuple[CostModel, ...]
    rank_slots: tuple[int, ...]
    slices: list[int] = field(default_factory=list)
    busy: list[float] = field(default_factory=list)
    wall: list[float] = field(default_factory=list)
    compute: list[float] = field(default_factory=list)

    def add(self, slice_: int, busy_s: float, wall_s: float, compute_s: float = math.nan) -> int:
        """Take one step of this rank; returns how many are watched."""
        self.slices.append(int(slice_))
        self.busy.append(float(busy_s))
        self.wall.append(float(wall_s))
        self.compute.append(float(compute_s))
        return len(self.wall)


def retake_group(
    identity: RankIdentity, model: Any, scheduler: Any, watch: GroupWatch
) -> GroupDecision | None:
    """Check the group's decision against its watched steps, re-price, and decide again.

    A collective: every rank calls it at the same step, gathers every rank's watched steps
    and takes the same branch. The group's rate is the global batch over its step period
    (:func:`~raytrain_hetero.core.group_retake.group_step_s`: the slowest rank's median
    wall, so a stall of one rank between steps is not charged to the exchange);
    :func:`~raytrain_hetero.core.group_retake.check_retake` compares it with the
    prediction. Unless the mode is ``all``, the workers are then re-priced from these steps (their costs as measured, the whole group's exchange as it
    showed) and the decision is taken again on them (the noise: these steps' standard
    errors). :func:`~raytrain_hetero.core.group_retake.settle_retake` says whether it acts:
    always when the group missed its prediction beyond the margin, otherwise only when a
    verdict changes (the first decision's margin came from a short window's noise). An
    acting decision replaces the recorded one, with the reason; one that leaves workers out
    restarts the group without them.

    Returns:
        The new decision, or None when the decision holds.
    """
    gathered = all_gather([watch.slices, watch.busy, watch.wall, watch.compute])
    slices = [g[0] for g in gathered]
    busy = [g[1] for g in gathered]
    compute = [g[3] for g in gathered]
    steps = min(len(g[2]) for g in gathered)
    module = getattr(model, "module", model)
    synchronised = identity.world_size > 1 and exact_batchnorm_exchange(module)[0] > 0
    repriced = reprice_from_steps(
        watch.costs,
        slices,
        busy,
        [group_step_s([g[2] for g in gathered])],
        compute_s=compute if synchronised else None,
    )
    measured = identity.setup.batch.global_batch_size / repriced.step_s
    check = check_retake(
        watch.decision, measured, measured_steps=steps, min_steps=RETAKE_AFTER_STEPS
    )
    if identity.rank == 0:
        logger.info("group decision check: %s", check.reason)
    if not check.reprice:
        return None
    if identity.rank == 0:
        logger.info(
            "group re-priced from %d steps: per rank %s; the whole group's exchange %.1f ms "
            "(step period %.1f ms)",
            steps,
            ", ".join(
                f"{r}: slices {sorted(set(slices[r]))} {old.time(slices[r][-1]) * 1e3:.1f} -> "
                f"{new.time(slices[r][-1]) * 1e3:.1f} ms"
                for r, (old, new) in enumerate(zip(watch.costs, repriced.costs))
            ),
            repriced.exchange_s * 1e3,
            repriced.step_s * 1e3,
        )
    decision, collective = assess_admission(
        identity,
        model,
        repriced.costs,
        watch.rank_slots,
        busy,
        mode=watch.decision.mode,
        full_group_exchange_s=repriced.exchange_s,
        loading_s_per_sample=[
            loading_per_sample(n, b, c) for n, b, c in zip(slices, busy, compute)
        ],
    )
    outcome = settle_retake(check, watch.decision, decision)
    if not outcome.act:
        if identity.rank == 0:
            logger.info("group decision check: %s", outcome.reason)
        return None
    return _act_on_decision(
        identity, decision, collective, watch.rank_slots, scheduler, outcome.reason
    )
