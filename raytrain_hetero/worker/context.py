"""Per-worker state shared by the loader, the gradient hook, BatchNorm sync and reporting.

The backend installs one :class:`WorkerContext` per training-worker process before the user's
loop starts. It lives in this importable module (not in a closure) because Ray pickles
closures by value: a module-level dict captured by a wrapper would be a copy on the worker.
Everything reaches it through :func:`get_worker_context` at run time.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from raytrain_hetero.core.plan import PlanSchedule
from raytrain_hetero.errors import HeteroError

if TYPE_CHECKING:
    from raytrain_hetero.config import ProbeConfig, SlowdownInjection, WorkerSpec
    from raytrain_hetero.core.carving import Cursor, EpochCarver

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeteroSetup:
    """Run-wide settings the trainer hands to every worker (picklable, identical on all ranks).

    Attributes:
        run_id: Unique id of this run (names the scheduler actor).
        specs: One WorkerSpec per worker slot, in worker order (counts expanded).
        global_batch_size: Samples per global step.
        weighting: "proportional" (exact) or "uniform" (the seed papers' HDP baseline).
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


@dataclass(frozen=True)
class StepInfo:
    """What this rank knows about the step it is running.

    Attributes:
        global_step: Optimizer steps since the run began.
        epoch: Epoch of the step.
        step_in_epoch: Index within the epoch.
        counts: Samples per rank this step (identical on every rank).
        rank: This rank.
        plan_version: Version of the plan that carved the step.
    """

    global_step: int
    epoch: int
    step_in_epoch: int
    counts: tuple[int, ...]
    rank: int
    plan_version: int

    @property
    def local_count(self) -> int:
        """Samples this rank processes."""
        return self.counts[self.rank]

    @property
    def global_count(self) -> int:
        """Samples all ranks process together."""
        return sum(self.counts)


@dataclass
class WorkerContext:
    """Mutable per-process state of one training worker.

    Attributes:
        setup: Run-wide settings.
        spec_index: Which worker slot of ``setup.specs`` this process fills.
        rank: World rank.
        world_size: World size.
        device: Device string this worker computes on ("cpu" or "cuda:N").
        schedule: Plans of the current worker group.
        carver: The epoch carver, once a loader has been prepared.
        cursor: Next step to run.
        current_step: The step in progress (set when the loader yields its batch).
        model: The prepared (DDP-wrapped) model, for probing.
        step_records: Finished-step measurements not yet pushed to the scheduler.
        plan_history: Every plan of the run so far (restored from checkpoints too).
        rank_spec_indices: Worker slot of every rank, once gathered.
        restored_slot_costs: Worker slot -> cost model of the group that wrote the checkpoint
            this group resumed from (slots it measured); those slots skip the probe.
        scheduler: Handle of the run's scheduler actor, once looked up.
    """

    setup: HeteroSetup
    spec_index: int
    rank: int
    world_size: int
    device: str = "cpu"
    schedule: PlanSchedule = field(default_factory=PlanSchedule)
    carver: EpochCarver | None = None
    cursor: Cursor | None = None
    current_step: StepInfo | None = None
    model: Any = None
    step_records: list[dict[str, Any]] = field(default_factory=list)
    plan_history: list[Any] = field(default_factory=list)
    rank_spec_indices: list[int] | None = None
    restored_slot_costs: dict[int, Any] = field(default_factory=dict)
    scheduler: Any = None
    pending_pushes: list[Any] = field(default_factory=list)
    step_metrics: dict[str, float] = field(default_factory=dict)
    # Compute accounting of the step in progress (seconds of this worker's own compute).
    compute_mark: float = 0.0
    compute_s: float = 0.0
    busy_mark: float = 0.0
    busy_s: float = 0.0
    step_wall_start: float = 0.0
    bn_sync_enabled: bool = True
    compute_clock: Any = None
    group_id: str = ""
    last_record: dict[str, Any] | None = None
    injections: list[SlowdownInjection] = field(default_factory=list)

    @property
    def spec(self) -> WorkerSpec:
        """The WorkerSpec this worker was started for."""
        return self.setup.specs[self.spec_index]

    @property
    def slowdown(self) -> float:
        """Emulated slowdown factor of this worker now (1.0 = none), injections included."""
        factor = float(self.spec.emulated_slowdown)
        step = self.current_step.global_step if self.current_step is not None else -1
        for injection in (*self.setup.slowdown_schedule, *self.injections):
            if injection.applies_to(self.spec.name, self.rank, step):
                factor *= injection.factor
        return factor


_lock = threading.Lock()
_context: WorkerContext | None = None


def install_worker_context(context: WorkerContext) -> None:
    """Install the context of this worker process (called by the backend)."""
    global _context
    with _lock:
        _context = context
    logger.debug(
        "worker context installed: rank %d/%d spec %s device %s",
        context.rank,
        context.world_size,
        context.spec.name,
        context.device,
    )


def get_worker_context() -> WorkerContext:
    """The context of this worker process.

    Raises:
        HeteroError: Outside a HeteroTrainer worker.
    """
    if _context is None:
        raise HeteroError(
            "No raytrain_hetero worker context: prepare_model / prepare_data_loader / report "
            "must be called inside a train loop run by HeteroTrainer."
        )
    return _context


def clear_worker_context() -> None:
    """Forget the context (worker group shutdown)."""
    global _context
    with _lock:
        _context = None
