"""What the search's allocator (``tune.allocation: auto``) hands out and keeps as its log.

Typed records shared by the allocator actor (:mod:`raytrain_hetero.tune.allocator`), the
trials that ask it (:mod:`raytrain_hetero.tune.allocator_client`) and the search's outputs
(:mod:`raytrain_hetero.tune.results`): a trial's holding, one change of it (with the move's
predicted gain, charged cost and error margin), one decision, one fit's measured start, and
the prices the allocator measured.
"""

from __future__ import annotations

from dataclasses import dataclass

from raytrain_hetero.core.trial_model import WorkerSlot

__all__ = [
    "ALLOCATOR_NAMESPACE",
    "AllocationEvent",
    "DecisionRecord",
    "FitStart",
    "MeasuredPrices",
    "TrialHolding",
    "allocator_actor_name",
]

ALLOCATOR_NAMESPACE = "raytrain_hetero"


def allocator_actor_name(experiment: str) -> str:
    """Ray actor name of the allocator of the search ``experiment``."""
    return f"raytrain_hetero_allocator:{experiment}"


@dataclass(frozen=True)
class FitStart:
    """Where one fit's start went, measured by its rank 0 (seconds).

    Attributes:
        total_s: From the trial's call of the fit to the worker group's first step.
        library_s: Of it, from the group's start on the workers (the backend's set-up) to
            the first step: this library's part (data, model, restore, the first plan);
            ``None`` when not measured.
    """

    total_s: float
    library_s: float | None = None

    @property
    def ray_train_s(self) -> float | None:
        """The rest: Ray Train's controller, the placement group, the worker processes and
        their imports, the process group."""
        return None if self.library_s is None else self.total_s - self.library_s


@dataclass(frozen=True)
class TrialHolding:
    """The workers one trial holds now.

    Attributes:
        trial_id: The trial.
        version: Bumped each time its workers change (1: its first holding).
        workers: Its workers, sorted by slot.
        reason: Why (the allocator's one line).
    """

    trial_id: str
    version: int
    workers: tuple[WorkerSlot, ...]
    reason: str

    @property
    def nodes(self) -> tuple[str, ...]:
        """The node of each worker."""
        return tuple(w.node_id for w in self.workers)


@dataclass(frozen=True)
class AllocationEvent:
    """One change of one trial's holding (the allocation history).

    Attributes:
        time_s: Allocator clock seconds since the search's allocator started.
        trial_id: The trial.
        version: Its holding's version after the change (0: released).
        slots: The slots it holds from now on (empty: released).
        nodes: The node of each slot.
        cause: The event that made the decision (``"trial started"``, ``"epoch 2 ended"``,
            ``"trial ended"``, ``"nodes changed"``...).
        reason: The allocator's line for this trial.
        gain_s: A move (it held workers and holds others): seconds of run its new workers
            save (negative for a donor); None for a start or a release.
        cost_s: A move: its charge, the restart plus the contention it inflicts on the
            other trials (seconds, summed over them).
        margin_s: A move: its error margin (seconds).
    """

    time_s: float
    trial_id: str
    version: int
    slots: tuple[str, ...]
    nodes: tuple[str, ...]
    cause: str
    reason: str
    gain_s: float | None = None
    cost_s: float = 0.0
    margin_s: float = 0.0

    @property
    def is_move(self) -> bool:
        """A running trial's workers changed (not its start, not its release)."""
        return self.gain_s is not None


@dataclass(frozen=True)
class DecisionRecord:
    """One decision of the allocator (whether or not anything changed).

    Attributes:
        time_s: Allocator clock seconds since it started.
        cause: The event that made it.
        changed: Some trial's workers changed.
        makespan_s: The predicted makespan of what it chose (no error margin).
        gain_s: The kept makespan minus the best allocation's, restarts and contention
            charged (None while some trial held no valid workers).
        cost_s: The best allocation's charges (restarts and contention).
        margin_s: The best allocation's error margin on the makespan.
        reason: Its one line (kept, and why; or the makespan before and after).
    """

    time_s: float
    cause: str
    changed: bool
    makespan_s: float
    gain_s: float | None
    cost_s: float
    margin_s: float
    reason: str


@dataclass(frozen=True)
class MeasuredPrices:
    """What the allocator charges now, and from how many measurements.

    Attributes:
        restart_s: A move's restart charge (seconds).
        restart_error: Its relative error.
        contention: Fraction of a running trial's speed another trial's start takes.
        step_error: Relative error of the epoch predictions.
        epoch_overhead_s: Seconds an epoch spends outside its predicted steps.
        restarts: Resumed fits measured (the restart charge's sample).
        first_starts: First fits measured.
        epochs: Epochs measured with a prediction.
        starts: Fit starts (windows) measured.
    """

    restart_s: float
    restart_error: float
    contention: float
    step_error: float
    epoch_overhead_s: float
    restarts: int
    first_starts: int
    epochs: int
    starts: int
