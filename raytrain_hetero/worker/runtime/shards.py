"""Opening this worker group's loader of a carved Ray Data shard, and its first plan.

:func:`open_carved_shard` turns the :class:`~raytrain_hetero.worker.data.ray_data.CarvedShard`
that ``get_dataset_shard`` returns into this group's
:class:`~raytrain_hetero.worker.data.ray_data.RayDataShard` once (cursor and plans restored from
the checkpoint); :func:`start_plan` is a stream's first plan (no probe).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from raytrain_hetero.core.carving import EpochCarver
from raytrain_hetero.core.plan import Plan
from raytrain_hetero.errors import HeteroError
from raytrain_hetero.worker.data.ray_data import CarvedShard, RayDataShard
from raytrain_hetero.worker.data.sampler import LoaderState
from raytrain_hetero.worker.plan.planning import build_plan, gather_rank_slots
from raytrain_hetero.worker.runtime.registry import WorkerRuntime
from raytrain_hetero.worker.runtime.resume import restore_from_checkpoint

__all__ = ["open_carved_shard", "start_plan"]


def start_plan(runtime: WorkerRuntime) -> Plan:
    """The first plan of a Ray Data run: the fixed shares, else equal slices.

    A stream cannot be indexed for probe batches without consuming rows, so there is no
    probe: the run starts on equal slices and the live scheduler re-plans from the first
    steps' timings (``SchedulerConfig.live``).
    """
    identity, loader = runtime.identity, runtime.loader
    if loader is None:
        raise HeteroError("start_plan before the carved shard was opened")
    slots = gather_rank_slots(identity, runtime.plans)
    fixed = identity.setup.batch.fixed_shares
    shares = [fixed[s] for s in slots] if fixed is not None else [1.0] * len(slots)
    return build_plan(
        identity,
        runtime.plans,
        shares=shares,
        effective_step=loader.carver.global_step(loader.cursor),
        reason="fixed shares" if fixed is not None else "equal start (Ray Data: no probe)",
    )


_opened: dict[int, tuple[WorkerRuntime, dict[str, RayDataShard]]] = {}


def open_carved_shard(
    runtime: WorkerRuntime,
    shard: CarvedShard,
    carver: EpochCarver,
    *,
    parts: Callable[[Callable[[], None]], dict[str, Any]],
    install: Callable[[Plan], Plan],
) -> RayDataShard:
    """This worker group's loader of ``shard``: made once (cursor and plans restored from the
    checkpoint), then the same object at every call.

    Args:
        runtime: This worker's runtime.
        shard: The carved dataset's handle.
        carver: The run's carving of ``shard.rows`` stream positions.
        parts: ``fn(ensure_plan)`` -> the loader's step-accounting arguments.
        install: Installs (and announces) a plan.

    Raises:
        HeteroError: The loop already carves another source (one cursor per run).
    """
    held = _opened.get(id(runtime))
    if held is None or held[0] is not runtime:
        _opened.clear()  # a new worker group: the old group's loaders are gone
        held = _opened[id(runtime)] = (runtime, {})
    loaders = held[1]
    if shard.name in loaders:
        return loaders[shard.name]
    if runtime.loader is not None:
        raise HeteroError(
            f"get_dataset_shard({shard.name!r}): this loop already carves another source "
            "(prepare_data_loader or another carved dataset); a run carves one."
        )
    runtime.loader = LoaderState(carver, restore_from_checkpoint(runtime, carver))

    def ensure_plan() -> None:
        if runtime.plans.current is None:
            install(start_plan(runtime))

    loaders[shard.name] = RayDataShard(shard, **parts(ensure_plan))
    return loaders[shard.name]
