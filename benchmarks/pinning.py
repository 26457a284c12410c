"""Pinning each benchmark worker to its own cores: real heterogeneity, no emulation.

On one many-core machine, workers of 8, 4 and 2 cores are made real by giving each process
exactly that many cores of its own (Ray's ``CPU`` resource is a count, not a set of cores,
and torch threads would otherwise roam over every core). :func:`disjoint_cpu_sets` hands out
consecutive cores in worker order, keeping :data:`RESERVED` for the driver and Ray's own
processes; :func:`pinned_bench_loop` wraps the benchmark loop so that every contender's worker
pins every thread of its process (``/proc/self/task``) before anything else, stock's too.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["RESERVED", "disjoint_cpu_sets", "pin_process", "pinned_bench_loop"]

#: Cores left to the driver and Ray's processes.
RESERVED = 2


def usable_cpus() -> list[int]:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def disjoint_cpu_sets(
    specs: Sequence[Any], cpus: Sequence[int], reserved: int = RESERVED
) -> dict[str, list[int]]:
    """Worker name -> its own cores (as many as its ``CPU`` resource, whole), in order.

    Raises:
        ValueError: Fewer than the workers' cores plus ``reserved`` are usable (names the
            counts and the fix).
    """
    wanted = [max(1, round(float(s.resources.get("CPU", 1)))) for s in specs]
    if sum(wanted) + reserved > len(cpus):
        raise ValueError(
            f"pinning needs {sum(wanted)} cores for the workers ({wanted}) plus {reserved} for "
            f"Ray, and {len(cpus)} are usable. Fix: run on a machine with "
            f"{sum(wanted) + reserved} cores, or give the workers fewer CPUs"
        )
    sets, start = {}, 0
    for spec, count in zip(specs, wanted):
        sets[spec.name] = list(cpus[start : start + count])
        start += count
    return sets


def pin_process(cores: Sequence[int]) -> int:
    """Pin every thread of this process to ``cores``; returns how many threads were pinned."""
    tasks = Path("/proc/self/task")
    ids = [int(p.name) for p in tasks.iterdir()] if tasks.is_dir() else [0]
    pinned = 0
    for tid in ids:
        try:
            os.sched_setaffinity(tid, set(cores))
            pinned += 1
        except OSError:  # a thread that ended meanwhile
            continue
    return pinned


def _worker_name(config: dict[str, Any]) -> str:
    if config["mode"] == "stock":
        import ray.train

        rank = ray.train.get_context().get_world_rank()
        names = config.get("worker_names") or []
        return str(names[rank]) if rank < len(names) else str(rank)
    import raytrain_hetero as rh

    return str(rh.get_rank_info()["worker"])


def pinned_bench_loop(config: dict[str, Any]) -> None:
    """:func:`benchmarks.loop.bench_loop`, with this worker's process pinned to its cores
    (``config["cpu_sets"]``: worker name -> cores; a worker not listed is not pinned)."""
    from benchmarks.loop import bench_loop

    cores = (config.get("cpu_sets") or {}).get(_worker_name(config))
    if cores:
        pin_process(cores)
    bench_loop(config)
