"""Who a training-worker process is: the run's settings and its immutable rank identity.

Both are frozen and built once per worker-group start by the backend; nothing in a worker
writes them afterwards, so every part of the worker can hold them without copies going stale.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch.distributed as dist

from raytrain_hetero.config.groups import (
    BackendConfig,
    BatchConfig,
    ElasticConfig,
    EmulationConfig,
    GuardConfig,
    SchedulerConfig,
)
from raytrain_hetero.config.parallel import ParallelConfig
from raytrain_hetero.config.specs import ProbeConfig
from raytrain_hetero.errors import ConfigError

if TYPE_CHECKING:
    from raytrain_hetero.config import WorkerSpec
    from raytrain_hetero.config.faults import FaultInjectionConfig


class RememberedCostModel(Protocol):
    """A cost model t(b) = alpha + beta * b an earlier run stored."""

    @property
    def alpha(self) -> float:
        """Fixed seconds per step."""

    @property
    def beta(self) -> float:
        """Seconds per sample."""


class CostModelStore(Protocol):
    """Where remembered cost models are read and written (by key)."""

    def read(self, key: str) -> RememberedCostModel | None:
        """The cost model stored under ``key``, or None."""

    def write(self, key: str, alpha: float, beta: float, about: dict[str, Any]) -> None:
        """Store t(b) = alpha + beta * b under ``key``."""


class CostModelStorage(Protocol):
    """The run's storage as the workers need it: its store of remembered cost models.

    The driver passes its :class:`~raytrain_hetero.storage.StorageLocation`; the workers know it
    only by this protocol, so this layer does not depend on the storage helper above it.
    """

    def cost_models(self) -> CostModelStore:
        """The store of remembered cost models kept with the runs."""


@dataclass(frozen=True)
class HeteroSetup:
    """Run-wide settings the trainer hands to every worker (picklable, identical on all ranks).

    The settings are the library's own config groups, as the user gave them to
    :class:`~raytrain_hetero.driver.trainer.HeteroTrainer`; each default lives in its group.

    Attributes:
        run_id: Unique id of this run (names the scheduler actor).
        specs: One WorkerSpec per worker slot, in worker order (counts expanded).
        faults: FAULT INJECTION (test/ops tooling): faults to fire, or None (off).
        min_workers: Smallest group the run may shrink to; admission never goes below it.
        scheduler_name: Ray actor name of the run's scheduler (and its namespace), or None.
        storage: Where the cost models of ``ProbeConfig.remember`` are kept, or None.
        preemption_watcher: Whether Ray Train's preemption watcher runs (it delivers the
            notices ``elastic.preemption_notice`` acts on; off, none can come).
    """

    run_id: str
    specs: tuple[WorkerSpec, ...]
    batch: BatchConfig
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    emulation: EmulationConfig = field(default_factory=EmulationConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    elastic: ElasticConfig = field(default_factory=ElasticConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    faults: FaultInjectionConfig | None = None
    min_workers: int = 1
    scheduler_name: str | None = None
    scheduler_namespace: str | None = None
    storage: CostModelStorage | None = None
    preemption_watcher: bool = True

    @property
    def max_world_size(self) -> int:
        """Largest world the run may reach (every slot filled, or ``batch.step_workers``
        when a run's workers change between fits; fixes step boundaries)."""
        return max(len(self.specs), self.batch.step_workers or 0)

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


def all_gather(obj: Any, group: Any = None) -> list[Any]:
    """Every rank's ``obj`` in rank order (of ``group``, default the world); a collective."""
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, obj, group=group)
    return gathered
