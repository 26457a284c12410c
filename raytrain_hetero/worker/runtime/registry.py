"""The one per-process registry of a training worker's runtime.

The backend installs one :class:`WorkerRuntime` per training-worker process before the user's
loop starts. It lives in this importable module (not in a closure) because Ray pickles
closures by value: a module-level object captured by a wrapper would be a copy on the worker.
Only the public worker API reads it (:func:`get_runtime`); everything below gets its parts
passed in.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raytrain_hetero.errors import HeteroError
from raytrain_hetero.worker.measure.clock import ComputeClock
from raytrain_hetero.worker.measure.emulation import (
    SlowdownSchedule,
    current_node_labels,
    node_slowdown,
)
from raytrain_hetero.worker.measure.telemetry import Telemetry
from raytrain_hetero.worker.measure.timing import StepTiming
from raytrain_hetero.worker.plan.planning import PlanState
from raytrain_hetero.worker.plan.scheduler_client import SchedulerClient
from raytrain_hetero.worker.setup.identity import RankIdentity
from raytrain_hetero.worker.state.preemption import PreemptionWatch
from raytrain_hetero.worker.sync.guard import StepGuard

if TYPE_CHECKING:
    from raytrain_hetero.worker.data.sampler import LoaderState
    from raytrain_hetero.worker.plan.admission import GroupWatch
    from raytrain_hetero.worker.state.rng_state import RngState

logger = logging.getLogger(__name__)

__all__ = ["WorkerRuntime", "get_runtime", "install_runtime"]


@dataclass
class WorkerRuntime:
    """Everything a training worker process holds for the current worker group.

        Each part has one writer: ``loader`` once ``prepare_data_loader`` ran, ``model`` (the
        prepared model, for probing and calibration) by ``prepare_model``, ``pending_rng``
        (generator states from the checkpoint) until the loader applies them, ``preemption`` (step
    and checkpoint times, the agreed hand-off) by :mod:`~raytrain_hetero.worker.runtime.handoff`,
    ``group_watch`` (the steps checking this group's own group decision) by
    :mod:`~raytrain_hetero.worker.runtime.plan_flow`.
    """

    identity: RankIdentity
    slowdowns: SlowdownSchedule
    timing: StepTiming
    plans: PlanState = field(default_factory=PlanState)
    scheduler: SchedulerClient | None = None
    loader: LoaderState | None = None
    telemetry: Telemetry = field(default_factory=Telemetry)
    model: Any = None
    guard: StepGuard | None = None
    pending_rng: RngState | None = None
    preemption: PreemptionWatch = field(default_factory=PreemptionWatch)
    group_watch: GroupWatch | None = None

    @classmethod
    def start(cls, identity: RankIdentity) -> WorkerRuntime:
        """A fresh runtime for ``identity`` (a worker-group start)."""
        setup = identity.setup
        base = identity.spec.emulated_slowdown
        if setup.emulation.node_slowdowns:  # EMULATION: the node this worker landed on
            base *= node_slowdown(setup.emulation.node_slowdowns, current_node_labels())
        slowdowns = SlowdownSchedule(
            base,
            worker=identity.spec.name,
            rank=identity.rank,
            planned=setup.emulation.slowdowns,
            noise=setup.emulation.noise,
        )
        scheduler = None
        if setup.scheduler_name is not None:
            scheduler = SchedulerClient(
                setup.scheduler_name,
                setup.scheduler_namespace,
                group_id=identity.group_id,
                world_size=identity.world_size,
            )
        timing = StepTiming(ComputeClock(identity.device), slowdowns.factor_at)
        guard = StepGuard(identity.rank, identity.world_size, setup.guard.max_consecutive_nonfinite)
        return cls(
            identity=identity,
            slowdowns=slowdowns,
            timing=timing,
            scheduler=scheduler,
            guard=guard,
        )


_lock = threading.Lock()
_runtime: WorkerRuntime | None = None


def install_runtime(runtime: WorkerRuntime) -> None:
    """Install the runtime of this worker process (called by the backend)."""
    global _runtime
    with _lock:
        _runtime = runtime
    identity = runtime.identity
    logger.debug(
        "worker runtime installed: rank %d/%d slot %s device %s",
        identity.rank,
        identity.world_size,
        identity.spec.name,
        identity.device,
    )


def get_runtime() -> WorkerRuntime:
    """The runtime of this worker process.

    Raises:
        HeteroError: Outside a HeteroTrainer worker.
    """
    if _runtime is None:
        raise HeteroError(
            "No raytrain_hetero worker runtime: prepare_model / prepare_data_loader / report "
            "must be called inside a train loop run by HeteroTrainer."
        )
    return _runtime
