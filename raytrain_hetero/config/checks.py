"""Checks across config objects (workers vs batch, elasticity, slowdown targets), written once.

:class:`~raytrain_hetero.driver.trainer.HeteroTrainer` and the YAML job schema both call
:func:`run_setting_problems`; only the key paths differ (``batch.min_slice`` from Python,
``train.min_slice`` in YAML), so they are passed in as :class:`SettingPaths`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from raytrain_hetero.config.fields import Problem, Problems
from raytrain_hetero.config.groups import BatchConfig, ElasticConfig, EmulationConfig
from raytrain_hetero.config.parallel import ParallelConfig
from raytrain_hetero.config.problems import loc_path, raise_if_any
from raytrain_hetero.config.specs import (
    SlowdownInjection,
    WorkerSpec,
    expand_worker_specs,
)
from raytrain_hetero.errors import ConfigError

__all__ = ["SettingPaths", "check_run_settings", "check_slowdown", "run_setting_problems"]

Loc = tuple[str | int, ...]


@dataclass(frozen=True)
class SettingPaths:
    """Where each config group (worker list, :class:`BatchConfig`, :class:`ElasticConfig`,
    slowdown list, :class:`ParallelConfig`) sits in the caller's terms, for the messages.
    """

    workers: Loc = ("workers",)
    batch: Loc = ("batch",)
    elastic: Loc = ("elastic",)
    slowdowns: Loc = ("emulation", "slowdowns")
    parallel: Loc = ("parallel",)

    def key(self, group: Loc, field: str) -> str:
        """Dotted key of ``field`` under ``group``, e.g. ``train.min_slice``."""
        return loc_path((*group, field))


def _slowdown_problems(
    injection: SlowdownInjection, names: Sequence[str], at: Loc
) -> list[Problem]:
    problems = Problems()
    if injection.worker is not None and injection.worker not in names:
        problems.add(
            (*at, "worker"),
            f"names worker {injection.worker!r}, but the workers are {list(names)}",
            f"name one of {_shown(names)} (a group with count > 1 is <name>-0, <name>-1, ...), "
            "or give rank instead",
        )
    elif injection.rank is not None and not injection.rank < len(names):
        last = len(names) - 1
        problems.add(
            (*at, "rank"),
            f"rank {injection.rank} is outside 0..{last}",
            f"use a rank from 0 to {last}",
        )
    return problems


def _shown(names: Sequence[str]) -> str:
    return ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")


def _worker_problems(workers: Sequence[WorkerSpec], paths: SettingPaths) -> Problems:
    problems = Problems()
    first_index: dict[str, int] = {}
    for i, spec in enumerate(workers):
        if spec.name in first_index:
            problems.add(
                (*paths.workers, i, "name"),
                f"duplicate worker name {spec.name!r} "
                f"(also {loc_path((*paths.workers, first_index[spec.name]))})",
                "give every worker group a unique name",
            )
        else:
            first_index[spec.name] = i
    if not problems:
        expanded = [w.name for w in expand_worker_specs(workers)]
        clashes = sorted({n for n in expanded if expanded.count(n) > 1})
        if clashes:
            problems.add(
                paths.workers,
                f"expanded worker names clash: {', '.join(clashes)} (a group with count > 1 "
                "is expanded to <name>-0, <name>-1, ...)",
                "rename the group whose name looks like another group's expanded name",
            )
    return problems


def run_setting_problems(
    workers: Sequence[WorkerSpec],
    batch: BatchConfig,
    elastic: ElasticConfig,
    emulation: EmulationConfig,
    paths: SettingPaths = SettingPaths(),
    parallel: ParallelConfig | None = None,
) -> list[Problem]:
    """Every inconsistency between the worker groups (``count`` not expanded) and the run's
    settings, as ``(location, what is wrong, how to fix it)`` at ``paths``; empty if all is well.
    """
    problems = _worker_problems(workers, paths)
    names = [w.name for w in expand_worker_specs(workers)]
    n = len(names)
    min_slice_key = paths.key(paths.batch, "min_slice")
    if batch.fixed_shares is not None and len(batch.fixed_shares) != n:
        problems.add(
            (*paths.batch, "fixed_shares"),
            f"has {len(batch.fixed_shares)} entries but there are {n} workers (counts "
            f"expanded); {n} shares are needed",
            f"give exactly {n} shares, one per worker in this order: {_shown(names)}",
        )
    smallest = batch.min_slice_samples  # min_slice in whole ghost groups
    if batch.global_batch_size < n * smallest:
        unit = (
            f"min_slice {batch.min_slice}"
            if smallest == batch.min_slice
            else f"a smallest slice of {smallest} (min_slice {batch.min_slice} in whole "
            f"ghost groups of {batch.ghost_size})"
        )
        problems.add(
            (*paths.batch, "global_batch_size"),
            f"{batch.global_batch_size} is too small: {n} workers x {unit} need at least "
            f"{n * smallest} samples per step",
            f"set global_batch_size >= {n * smallest} or lower {min_slice_key}"
            + ("" if smallest == batch.min_slice else " or ghost_size"),
        )
    for i, spec in enumerate(workers):
        if spec.max_batch is not None and spec.max_batch < smallest:
            problems.add(
                (*paths.workers, i, "max_batch"),
                f"{spec.max_batch} is below the smallest slice {smallest} ({min_slice_key} "
                f"{batch.min_slice}, in whole groups of {batch.slice_quantum}), so no slice "
                "fits this worker",
                f"raise max_batch to >= {smallest} or lower {min_slice_key}",
            )
        if (
            batch.batchnorm == "ghost"
            and batch.memory_cap_mode == "accumulate"
            and spec.max_micro_batch is not None
            and spec.max_micro_batch < batch.ghost_size
        ):
            problems.add(
                (*paths.workers, i, "max_micro_batch"),
                f"{spec.max_micro_batch} is below ghost_size {batch.ghost_size}: a "
                "micro-batch holds whole ghost groups, at least one",
                f"raise max_micro_batch to >= {batch.ghost_size} or lower ghost_size",
            )
        if (
            batch.memory_cap_mode == "slice"
            and spec.max_micro_batch is not None
            and spec.max_micro_batch < smallest
        ):
            mode_key = paths.key(paths.batch, "memory_cap_mode")
            problems.add(
                (*paths.workers, i, "max_micro_batch"),
                f"{spec.max_micro_batch} is below the smallest slice {smallest} "
                f"({min_slice_key} {batch.min_slice}); with {mode_key} slice it caps the "
                "slice, so no slice fits this worker",
                f"raise max_micro_batch to >= {smallest}, lower {min_slice_key}, "
                f"or set {mode_key}: accumulate",
            )
    slice_caps = [_slice_cap(w, batch) for w in workers]
    if all(c is not None for c in slice_caps):
        capacity = sum(w.count * c for w, c in zip(workers, slice_caps))  # type: ignore[misc]
        cap_name = "max_batch"
        if batch.memory_cap_mode == "slice" and any(w.max_micro_batch for w in workers):
            cap_name = "the smaller of max_batch and max_micro_batch"
        if capacity < batch.global_batch_size:
            problems.add(
                (*paths.batch, "global_batch_size"),
                f"{batch.global_batch_size} exceeds what all workers can hold per step "
                f"(sum of count x {cap_name} = {capacity})",
                f"lower global_batch_size to <= {capacity}, raise some max_batch or "
                "max_micro_batch, or remove a cap",
            )
    if elastic.min_workers is not None and elastic.min_workers > n:
        problems.add(
            (*paths.elastic, "min_workers"),
            f"{elastic.min_workers} is more than the {n} worker slots (counts expanded)",
            f"set min_workers between 1 and {n}, or add worker slots",
        )
    for i, injection in enumerate(emulation.slowdowns):
        problems.extend(_slowdown_problems(injection, names, (*paths.slowdowns, i)))
    if parallel is not None:
        problems.extend(_parallel_problems(parallel, n, elastic.min_workers, batch, paths))
    return problems


def _parallel_problems(
    parallel: ParallelConfig,
    workers: int,
    min_workers: int | None,
    batch: BatchConfig,
    paths: SettingPaths,
) -> list[Problem]:
    """The model-parallel layout against every world size the run can reach, and weighting."""
    if not parallel.model_parallel:
        return []
    problems = Problems()
    if batch.weighting != "proportional":
        problems.add(
            (*paths.batch, "weighting"),
            f"{batch.weighting!r} with parallel.mode {parallel.mode!r}: model-parallel "
            "replicas are weighted by the samples they process (exact)",
            "set weighting: proportional, or parallel.mode: data",
        )
    if batch.batchnorm == "ghost":
        problems.add(
            (*paths.batch, "batchnorm"),
            f"'ghost' with parallel.mode {parallel.mode!r}: a model-parallel group splits "
            "layers or branches, not the batch in carving order, and its replicas are not "
            "carved in whole ghost groups",
            "set batchnorm: exact or local, or parallel.mode: data",
        )
    worlds = [workers] if min_workers is None else list(range(min_workers, workers + 1))
    bad = []
    for world in worlds:
        try:
            parallel.groups(world)
        except ConfigError:
            bad.append(world)
    elastic_key = paths.key(paths.elastic, "min_workers")
    size = parallel.group_size
    if bad and size is None:
        problems.add(
            (*paths.parallel, "mode"),
            f"{parallel.mode} splits the model over all workers, but the run may have {min(bad)}",
            "give it >= 2 workers"
            + (f" and set {elastic_key} >= 2" if min_workers is not None else ""),
        )
    elif bad:
        problems.add(
            (*paths.parallel, "group_size"),
            f"group_size {size} does not divide "
            + (
                f"the elastic world sizes {bad} ({elastic_key} {min_workers} to "
                f"{workers} worker slots)"
                if min_workers is not None
                else f"the {workers} worker(s)"
            )
            + f": every {parallel.mode} group needs {size} ranks",
            f"use a multiple of {size} workers"
            + (
                f", set {elastic_key} so every possible count is a multiple"
                if min_workers is not None
                else ""
            )
            + ", or change group_size",
        )
    return problems


def check_run_settings(
    workers: Sequence[WorkerSpec],
    batch: BatchConfig,
    elastic: ElasticConfig,
    emulation: EmulationConfig,
    source: str = "HeteroTrainer",
    parallel: ParallelConfig | None = None,
) -> None:
    """:func:`run_setting_problems` with the Python paths; raise one ConfigError if any.

    Raises:
        ConfigError: Listing every problem with its fix.
    """
    raise_if_any(
        run_setting_problems(workers, batch, elastic, emulation, parallel=parallel), source
    )


def check_slowdown(injection: SlowdownInjection, slots: Sequence[WorkerSpec]) -> SlowdownInjection:
    """``injection`` if it targets one of the worker ``slots`` (counts expanded).

    Raises:
        ConfigError: It names an unknown worker or a rank outside the world.
    """
    names = [s.name for s in slots]
    raise_if_any(_slowdown_problems(injection, names, ("slowdown",)), "inject_slowdown")
    return injection


def _slice_cap(spec: WorkerSpec, batch: BatchConfig) -> int | None:
    """A worker's slice cap known from the config: ``max_batch``, and under
    ``memory_cap_mode="slice"`` also ``max_micro_batch`` (the smaller binds), floored to
    whole ghost groups."""
    caps = [spec.max_batch]
    if batch.memory_cap_mode == "slice":
        caps.append(spec.max_micro_batch)
    known = [c for c in caps if c is not None]
    quantum = batch.slice_quantum
    return min(known) // quantum * quantum if known else None
