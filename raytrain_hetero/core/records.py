"""Typed per-step measurements of one rank: the one record that travels worker -> driver.

A :class:`StepRecord` is built by the worker's loader at the end of every step, pushed to the
run's scheduler actor, drained by the driver, and written to ``metrics.csv``. Pure (stdlib only).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

__all__ = ["StepRecord"]


@dataclass(frozen=True)
class StepRecord:
    """What one rank measured during one optimizer step.

    Attributes:
        step: Global step (optimizer steps since the run began).
        epoch: Epoch of the step.
        rank: World rank that ran it.
        worker: WorkerSpec name of that rank's slot.
        device: Device string ("cpu", "cuda:0").
        slice: Samples this rank processed.
        weight: Gradient weight this rank applied (n_i / N for proportional weighting).
        compute_s: Seconds of this rank's own compute (emulated slowdown included).
        load_s: Seconds spent loading the slice on the step's critical path.
        busy_s: Wall seconds busy (compute + loading), collective waits excluded.
        samples_per_s: ``slice / busy_s``: this rank's speed (NaN if unmeasurable).
        loss: The loss the loop logged for the step (NaN if none).
        global_samples_per_s: Global batch / step wall time.
        plan_version: Version of the plan that carved the step.
        group: Worker-group id (changes on every restart).
        world_size: World size of the group.
        wall_s: Wall seconds of the whole step.
        time: Unix time at the end of the step.
    """

    step: int
    epoch: int
    rank: int
    worker: str
    device: str
    slice: int
    weight: float
    compute_s: float
    load_s: float
    busy_s: float
    samples_per_s: float
    loss: float
    global_samples_per_s: float
    plan_version: int
    group: str
    world_size: int
    wall_s: float
    time: float

    @property
    def key(self) -> tuple[str, int, int]:
        """Identity of the record: (group, rank, step). Delivering it twice is harmless."""
        return (self.group, self.rank, self.step)

    @property
    def has_speed(self) -> bool:
        """True when ``samples_per_s`` is a finite, positive measurement."""
        return math.isfinite(self.samples_per_s) and self.samples_per_s > 0

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (CSV rows, JSON)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepRecord:
        """Inverse of :meth:`to_dict`; unknown keys are ignored."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})
