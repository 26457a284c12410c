"""Node roles, measured: what the input pipeline delivers with and without each CPU worker.

The pure decision is the group's one decision,
:func:`raytrain_hetero.core.group_decision.decide_group` (mode ``auto``: each worker trains,
feeds or stands by), as for map-style datasets; this module measures what it needs for a Ray
Data source, on the cluster, before training, all on one scale (the pipeline's own samples/s,
task launches, reads and block sizes included):

* ``delivery``: :func:`measure_delivery` while every worker's resources are held (a placement
  group of their bundles, as the training group holds them), i.e. what the input pipeline
  delivers when every worker trains;
* ``feed_k``: the gain in delivery when worker k's resources are released too (its CPUs free
  for Ray Data's tasks), i.e. what k adds by feeding. Gains are summed over a feeder set
  (additive while the pipeline scales with free CPUs; one pass per candidate).

The trainers' compute-bound speeds are the probe's cost models (``raytrain-hetero probe`` and
the first plan measure them). A feeder (or a worker standing by) is simply left out of the
training group: Ray Data
then finds its CPUs free and schedules preprocessing there (map_batches'
``ray_remote_args`` may pin it, e.g. ``resources={"<node resource>": 0.01}``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ray.util import placement_group, remove_placement_group

from raytrain_hetero.config import WorkerSpec
from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.group_decision import GroupDecision, decide_group
from raytrain_hetero.core.group_price import ExchangePrice, LinkCost, WorkerPrice, prediction_noise
from raytrain_hetero.errors import AllocationError, ConfigError, HeteroError

if TYPE_CHECKING:
    from ray.data import Dataset

logger = logging.getLogger(__name__)

__all__ = ["measure_delivery", "node_roles"]


def measure_delivery(
    dataset: Dataset, specs: Sequence[WorkerSpec], *, rows: int, timeout_s: float = 120.0
) -> float:
    """Samples/s the pipeline delivers (``rows`` rows) while every worker's resources are held.

    Two passes under the same reservation, the second timed: the first warms up (Ray starts
    worker processes for the CPUs it finds free, seconds each), as a training run has.

    Raises:
        HeteroError: The workers' resources could not be reserved within ``timeout_s``.
    """
    group = placement_group(
        [dict(s.resources) for s in specs],
        strategy="PACK",
        bundle_label_selector=[dict(s.label_selector or {}) for s in specs],
    )
    try:
        if not group.wait(timeout_seconds=timeout_s):
            raise HeteroError(
                f"roles: could not reserve the {len(specs)} workers' resources within "
                f"{timeout_s:.0f} s to time the input pipeline. Fix: give the cluster room "
                "for every worker plus Ray Data's tasks, or set probe.roles: train"
            )
        for _ in range(2):  # the first pass warms up (worker processes for the free CPUs)
            opened = time.perf_counter()
            it = iter(dataset.limit(rows).iter_batches(batch_size=None))
            first = len(next(iter(next(it).values())))
            seen, start = 0, time.perf_counter()  # task launch, first read excluded
            for block in it:
                seen += len(next(iter(block.values())))
            if seen == 0:  # one block held every row: the whole pass, start-up included
                seen, start = first, opened
        return seen / max(time.perf_counter() - start, 1e-9)
    finally:
        remove_placement_group(group)


def node_roles(
    specs: Sequence[WorkerSpec],
    costs: Sequence[CostModel],
    total: int,
    *,
    dataset: Dataset,
    delivery_rows: int,
    collective_s: float = 0.0,
    candidates: Sequence[bool] | None = None,
    min_slice: int = 1,
    quantum: int = 1,
) -> GroupDecision:
    """Measure and decide what each worker does (see the module); logs the numbers.

    ``specs`` and ``costs`` (the probe's, compute-bound: the pipeline's delivery is measured
    apart) are per worker slot in rank order; ``dataset`` is the carved pipeline, timed over
    ``delivery_rows`` rows with every worker held and with each candidate released
    (:func:`measure_delivery`). ``candidates``: per rank, whether it may feed (default: the
    CPU workers but the fastest). ``collective_s``: the whole group's gradient all-reduce per
    step, if measured (it prices the smaller groups by the ring's hops). ``min_slice`` and
    ``quantum`` (``ghost_size`` under ghost BatchNorm) are the plan's: trainers are
    predicted in whole groups, as they will train. The noise margin is the decision's floor
    (:func:`~raytrain_hetero.core.group_price.prediction_noise` of no step times): a worker
    feeds or stands by only when the predicted gain exceeds it.

    Raises:
        ConfigError: The costs or candidates do not match the workers, or no group can hold
            the batch (one line naming the worker and the fix).
    """
    if not len(costs) == len(specs) or (candidates is not None and len(candidates) != len(specs)):
        raise ConfigError(
            f"roles: {len(specs)} workers, {len(costs)} cost models and "
            f"{'no' if candidates is None else len(candidates)} candidate flags; give one each"
        )
    if candidates is None:
        candidates = [s.resolved_device() == "cpu" for s in specs]
    fastest = min(range(len(costs)), key=lambda r: (costs[r].time(total), r))
    pool = [r for r, c in enumerate(candidates) if c and r != fastest]
    feed, delivery = [0.0] * len(specs), float("inf")
    if pool:
        # Released first, all held last: a pipeline still warming up understates a gain,
        # never invents one.
        released = {
            r: measure_delivery(dataset, [*specs[:r], *specs[r + 1 :]], rows=delivery_rows)
            for r in pool
        }
        delivery = measure_delivery(dataset, specs, rows=delivery_rows)
        for r, rate in released.items():
            feed[r] = max(0.0, rate - delivery)
    hops = 2 * max(1, len(specs) - 1)  # ring all-reduce: the measured whole group's hops
    prices = [
        WorkerPrice(
            name=spec.name,
            step=cost,
            device=spec.resolved_device(),
            cap=spec.max_batch,
            feed_samples_per_s=feed[r],
        )
        for r, (spec, cost) in enumerate(zip(specs, costs))
    ]
    try:
        decision = decide_group(
            total,
            prices,
            ExchangePrice(
                gradient_bytes=0.0, gloo=LinkCost(max(0.0, collective_s) / hops, math.inf)
            ),
            noise=prediction_noise(()),
            mode="auto",
            min_slice=min_slice,
            quantum=quantum,
            pipeline_samples_per_s=delivery,
        )
    except AllocationError as exc:
        raise ConfigError(str(exc)) from exc
    logger.info("%s", decision.summary())
    for r in pool:
        w = decision.workers[r]
        logger.info(
            "roles: %s (rank %d) %s: trains %.1f, feeds %.1f samples/s",
            *(w.worker, r, w.verdict.upper(), w.alone_samples_per_s, w.feed_samples_per_s),
        )
    return decision
