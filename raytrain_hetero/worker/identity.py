"""Who a training-worker process is: the run's settings and its immutable rank identity.

Both are frozen and built once per worker-group start by the backend; nothing in a worker
writes them afterwards, so every part of the worker can hold them without copies going stale.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from raytrain_hetero.config.groups import (
    BackendConfig,
    BatchConfig,
    EmulationConfig,
    GuardConfig,
)
from raytrain_hetero.config.parallel import ParallelConfig
from raytrain_hetero.errors import ConfigError

if TYPE_CHECKING:
    from raytrain_hetero.config import ProbeConfig, SlowdownInjection, WorkerSpec
    from raytrain_hetero.config.faults import FaultInjectionConfig


@dataclass(frozen=True)
class HeteroSetup:
    """Run-wide settings the trainer hands to every worker (picklable, identical on all ranks).

    Attributes:
        run_id: Unique id of this run (names the scheduler actor).
        specs: One WorkerSpec per worker slot, in worker order (counts expanded).
        global_batch_size: Samples per global step.
        weighting: "proportional" (exact) or "uniform" (the seed papers' HDP baseline).
        batchnorm: "exact" (global-batch statistics) or "local" (per-slice statistics):
            what ``prepare_model`` does with BatchNorm layers unless told otherwise.
        max_memory_fraction: Fraction of a worker's memory one pass may use (None: no
            probed memory cap).
        memory_cap_mode: "accumulate" (micro-batches) or "slice" (capped slices) for a slice
            above a worker's per-pass cap.
        fixed_shares: One share per worker slot, or None to probe.
        min_slice: Smallest per-rank slice.
        max_world_size: Largest world the run may reach (fixes step boundaries).
        probe: Probe settings.
        seed: Seed of the carving permutations.
        scheduler_name: Ray actor name of the run's scheduler, or None.
        scheduler_namespace: Ray namespace of that actor.
        flush_every: Steps between pushes of step records to the scheduler.
        live: Re-plan from live measurements (the scheduler's policy).
        policy: PolicyConfig fields for the scheduler.
        plan_sync_every: Steps between rank 0's polls of the scheduler (a collective).
        slowdown_schedule: EMULATION: injected slowdowns known from the start.
        emulation_noise: EMULATION: per-step factor noise amplitude (0: off).
        faults: FAULT INJECTION (test/ops tooling): faults to fire, or None (off).
        collective_timeout_s: Timeout of every process group the worker creates (gradient
            and BatchNorm): a rank stuck this long in a collective fails the group.
        max_consecutive_nonfinite: Step guard: consecutive skipped (non-finite) steps after
            which the run stops.
        parallel: The parallel layout (data parallelism by default; in a model-parallel mode
            every rank of a group reads its replica's slice, see
            :mod:`raytrain_hetero.worker.sampler`).
        min_workers: Smallest group the run may shrink to (elastic ``min_workers``, else 1);
            admission never drops a group below it.
    """

    run_id: str
    specs: tuple[WorkerSpec, ...]
    global_batch_size: int
    weighting: Literal["proportional", "uniform"]
    fixed_shares: tuple[float, ...] | None
    min_slice: int
    max_world_size: int
    probe: ProbeConfig
    seed: int = 0
    scheduler_name: str | None = None
    scheduler_namespace: str | None = None
    flush_every: int = 5
    live: bool = True
    policy: dict[str, Any] | None = None
    plan_sync_every: int = 5
    slowdown_schedule: tuple[SlowdownInjection, ...] = ()
    emulation_noise: float = float(EmulationConfig.model_fields["noise"].default)
    faults: FaultInjectionConfig | None = None
    # Defaults read from the library config objects, where each setting is defined once.
    collective_timeout_s: float = float(BackendConfig.model_fields["collective_timeout_s"].default)
    max_consecutive_nonfinite: int = GuardConfig.model_fields["max_consecutive_nonfinite"].default
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    batchnorm: Literal["exact", "local"] = BatchConfig.model_fields["batchnorm"].default
    min_workers: int = 1
    max_memory_fraction: float | None = BatchConfig.model_fields["max_memory_fraction"].default
    memory_cap_mode: Literal["accumulate", "slice"] = BatchConfig.model_fields[
        "memory_cap_mode"
    ].default

    def reading_group(self, rank: int, world_size: int) -> tuple[int, ...]:
        """The ranks whose plan slices ``rank`` reads: its model-parallel group, or itself."""
        if not self.parallel.model_parallel:
            return (rank,)
        return next(g for g in self.parallel.groups(world_size) if rank in g)


@dataclass(frozen=True)
class RankIdentity:
    """This process's place in the current worker group (immutable for the group's life).

    Attributes:
        setup: Run-wide settings.
        slot: Which worker slot of ``setup.specs`` this process fills.
        rank: World rank.
        world_size: World size.
        device: Device string this worker computes on ("cpu" or "cuda:N").
        group_id: Id of the worker group (changes on every restart).
    """

    setup: HeteroSetup
    slot: int
    rank: int
    world_size: int
    device: str = "cpu"
    group_id: str = ""

    def __post_init__(self) -> None:
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"Rank {self.rank} is outside a world of {self.world_size} ranks.")
        if not 0 <= self.slot < len(self.setup.specs):
            raise ConfigError(
                f"Worker slot {self.slot} is outside the run's {len(self.setup.specs)} slots."
            )

    @property
    def spec(self) -> WorkerSpec:
        """The WorkerSpec this worker was started for."""
        return self.setup.specs[self.slot]
