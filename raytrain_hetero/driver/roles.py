"""Node roles, measured: a CPU worker's own preprocessing speed and the pipeline's delivery.

The pure decision is :func:`raytrain_hetero.core.roles.decide_roles`; this module measures
what it needs, on the cluster, before training:

* :func:`measure_feed_rate`: the dataset's own preprocessing function (the ``map_batches``
  decode/augment) timed on one batch in a Ray task placed like the worker (its resources and
  label selector), i.e. on the node that would feed.
* :func:`measure_delivery`: the Ray Data pipeline's samples/s while every worker's resources
  are held (a placement group of their bundles, as the training group holds them), i.e. what
  the input pipeline delivers when every worker trains.

The trainers' compute-bound speeds are the probe's cost models (``raytrain-hetero probe`` and
the first plan measure them). A feeder is simply left out of the training group: Ray Data
then finds its CPUs free and schedules preprocessing there (map_batches'
``ray_remote_args`` may pin it, e.g. ``resources={"<node resource>": 0.01}``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import ray
from ray.util import placement_group, remove_placement_group

from raytrain_hetero.config import WorkerSpec
from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.roles import RolesDecision, decide_roles
from raytrain_hetero.errors import HeteroError

if TYPE_CHECKING:
    from ray.data import Dataset

logger = logging.getLogger(__name__)

__all__ = ["measure_delivery", "measure_feed_rate", "node_roles"]


def _timed_calls(fn: Callable[[Any], Any], batch: Any, rows: int, seconds: float) -> float:
    """Rows/s of ``fn(batch)`` over ``seconds`` (after one untimed call)."""
    fn(batch)
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or calls == 0:
        fn(batch)
        calls += 1
    return rows * calls / elapsed


def measure_feed_rate(
    fn: Callable[[Any], Any], batch: Any, rows: int, spec: WorkerSpec, *, seconds: float = 1.0
) -> float:
    """Samples/s of ``fn(batch)`` (``rows`` rows) in a Ray task placed as worker ``spec``.

    The task asks for the worker's resources (and label selector), so it runs on a node that
    could host the worker, with the CPUs the worker would use.
    """
    task = ray.remote(_timed_calls).options(**spec.remote_options())
    return float(ray.get(task.remote(fn, batch, rows, seconds)))


def measure_delivery(
    dataset: Dataset, specs: Sequence[WorkerSpec], *, rows: int, timeout_s: float = 120.0
) -> float:
    """Samples/s the pipeline delivers (``rows`` rows) while every worker's resources are held.

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
        opened = time.perf_counter()
        it = iter(dataset.limit(rows).iter_batches(batch_size=None))
        first = len(next(iter(next(it).values())))
        seen, start = 0, time.perf_counter()  # start-up (task launch, first read) excluded
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
    feed_fn: Callable[[Any], Any],
    feed_batch: Any,
    feed_rows: int,
    delivery_rows: int,
    collective_s: float = 0.0,
) -> RolesDecision:
    """Measure and decide which CPU workers feed (see the module); logs the numbers.

    ``specs`` and ``costs`` (the probe's, compute-bound) are per worker slot in rank order;
    ``feed_fn(feed_batch)`` is the pipeline's preprocessing of ``feed_rows`` rows, and
    ``dataset`` the carved pipeline, timed over ``delivery_rows`` rows.
    """
    candidates = [s.resolved_device() == "cpu" for s in specs]
    fastest = min(range(len(costs)), key=lambda r: (costs[r].time(total), r))
    feed = [
        measure_feed_rate(feed_fn, feed_batch, feed_rows, s) if c and r != fastest else 0.0
        for r, (s, c) in enumerate(zip(specs, candidates, strict=True))
    ]
    delivery = measure_delivery(dataset, specs, rows=delivery_rows) if any(feed) else float("inf")
    decision = decide_roles(
        total,
        costs,
        candidates=candidates,
        feed_samples_per_s=feed,
        delivery_samples_per_s=delivery,
        names=[s.name for s in specs],
        collective_s=collective_s,
    )
    logger.info("%s", decision.summary())
    for w in (w for w in decision.workers if w.candidate):
        logger.info(
            "roles: %s (rank %d) %s: trains %.1f, feeds %.1f samples/s",
            *(w.worker, w.rank, w.role.upper(), w.train_samples_per_s, w.feed_samples_per_s),
        )
    return decision
