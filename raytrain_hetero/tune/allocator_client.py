"""The trial's side of the search's allocator (``tune.allocation: auto``).

A trial's driver asks the allocator actor for its workers (:func:`wait_for_holding`) and pins
each of its workers to the node of its slot (:func:`allocated_worker_specs`); at every epoch
end, before the epoch's report, the training loop tells the allocator what the epoch measured
and learns whether its workers changed (:func:`epoch_end_moves`): the newest cost models per
worker type, the epoch's wall-clock span, and once per fit the fit's start (its length, the
library's part of it, and its span). The allocator prices moves from these: the restart as
measured, the contention a start inflicts on the trials running beside it, and the error of
its predictions (:mod:`raytrain_hetero.core.move_pricing`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from raytrain_hetero.config import WorkerSpec
from raytrain_hetero.config.specs import NODE_ID_LABEL
from raytrain_hetero.tune.allocation_records import (
    ALLOCATOR_NAMESPACE,
    TrialHolding,
    allocator_actor_name,
)

__all__ = [
    "allocated_worker_specs",
    "epoch_end_moves",
    "lookup_allocator",
    "type_costs",
    "wait_for_holding",
]

#: Rank 0's end of the last epoch it reported, per (trial, holding version): the next
#: epoch's start. A fit runs in fresh worker processes, so each fit starts empty.
_EPOCH_ENDS: dict[tuple[str, int], float] = {}


def lookup_allocator(experiment: str) -> Any:
    """The allocator actor of ``experiment``."""
    import ray

    return ray.get_actor(allocator_actor_name(experiment), namespace=ALLOCATOR_NAMESPACE)


def wait_for_holding(
    allocator: Any,
    trial_id: str,
    *,
    global_batch: int,
    driver_node: str | None,
    poll_s: float,
) -> TrialHolding:
    """Ask the allocator for the trial's workers until it has some (a waiting trial polls)."""
    import ray

    while True:
        holding = ray.get(
            allocator.request.remote(trial_id, global_batch=global_batch, driver_node=driver_node)
        )
        if holding is not None:
            return holding
        time.sleep(poll_s)


def allocated_worker_specs(
    holding: TrialHolding, types: Mapping[str, WorkerSpec]
) -> list[WorkerSpec]:
    """One worker spec per held worker: its type's spec (``count`` 1), named ``<type>-<k>``,
    pinned to its slot's node (the type's label selector plus ``ray.io/node-id``)."""
    specs: list[WorkerSpec] = []
    seen: dict[str, int] = {}
    for worker in holding.workers:
        base = types[worker.worker_type]
        k = seen.get(worker.worker_type, 0)
        seen[worker.worker_type] = k + 1
        selector = {**(base.label_selector or {}), NODE_ID_LABEL: worker.node_id}
        specs.append(
            base.model_copy(
                update={"name": f"{base.name}-{k}", "count": 1, "label_selector": selector}
            )
        )
    return specs


def type_costs(costs: Sequence[Any], worker_types: Sequence[str]) -> dict[str, tuple[float, float]]:
    """Per worker type the mean ``(alpha, beta)`` of a plan's per-rank cost models (rank
    ``i`` is of type ``worker_types[i]``)."""
    sums: dict[str, list[float]] = {}
    for cost, worker_type in zip(costs, worker_types):
        acc = sums.setdefault(worker_type, [0.0, 0.0, 0.0])
        acc[0] += cost.alpha
        acc[1] += cost.beta
        acc[2] += 1
    return {t: (a / n, b / n) for t, (a, b, n) in sums.items()}


def epoch_end_moves(
    allocation: Mapping[str, Any] | None,
    epochs_done: int,
    *,
    final: bool = False,
    fit_start_s: float | None = None,
) -> bool:
    """On every rank at an epoch end, before its report: whether the trial's holding changed
    (it should end this fit after the report and resume on its new workers).

    Rank 0 tells the allocator the epoch ended, with what the fit measured: the newest cost
    models per worker type (``newest_costs``: so the allocator knows the types' speeds while
    trials run, and ASHA's stopped trials have told it too), the epoch's wall-clock span
    (from the previous epoch's end, or the fit's first step, to now: the allocator's
    prediction error and the contention of other trials' starts are measured on it) and,
    at the fit's first epoch end, the fit's start (its call to the first step, the library's
    part of it, and its span). It compares the holding's version; one all-reduce makes every
    rank agree. ``allocation`` is the loop config's ``"allocation"`` entry (None: fixed,
    never moves); ``final``: the trial's last epoch (measurements only, no move);
    ``fit_start_s``: the fit's call to its first step, as the loop reports it
    (``hetero/fit_start_s``; None: no start is sent).
    """
    if not allocation:
        return False
    import ray

    from raytrain_hetero.worker.api import (
        first_step_time,
        get_rank_info,
        group_start_time,
        newest_costs,
        sum_across_ranks,
    )

    moved = 0
    if get_rank_info()["rank"] == 0:
        now = time.time()
        trial_id, version = allocation["trial_id"], allocation["version"]
        # The newest, not the plan's: a one-worker trial's plan never takes measured costs.
        measured = newest_costs()
        costs = type_costs(measured, allocation["worker_types"]) if measured else {}
        first_step = first_step_time()
        resumed_epochs = allocation["resumed_epochs"]
        start_s = library_s = None
        start_window = epoch_window = None
        first_epoch = epochs_done == resumed_epochs + 1  # the start is sent once per fit
        if first_step is not None and fit_start_s is not None and first_epoch:
            start_s = fit_start_s
            library_s = first_step - group_start_time()
            start_window = (first_step - fit_start_s, first_step)
        began = _EPOCH_ENDS.get((trial_id, version), first_step if first_epoch else None)
        if began is not None and now > began:
            epoch_window = (began, now)
        _EPOCH_ENDS[(trial_id, version)] = now
        actor = ray.get_actor(allocation["actor"], namespace=ALLOCATOR_NAMESPACE)
        holding = ray.get(
            actor.epoch_ended.remote(
                trial_id,
                epochs_done,
                costs=costs or None,
                start_s=start_s,
                library_s=library_s,
                resumed=resumed_epochs > 0,
                version=version,
                epoch_window=epoch_window,
                start_window=start_window,
            )
        )
        moved = int(holding is None or holding.version != version)
    if final:  # every rank knows it is the last epoch: no collective needed
        return False
    (total,) = sum_across_ranks(moved)
    return total > 0
