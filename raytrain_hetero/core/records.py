"""Typed per-step measurements of one rank, and the one aggregation over them.

A :class:`StepRecord` is built by the loader at every step end, pushed to the scheduler actor,
drained by the driver and written to ``metrics.csv``; :func:`summarize_workers` and
:func:`run_samples_per_s` are the only aggregation of them. Pure (stdlib only).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, TypeVar

__all__ = [
    "StepRecord",
    "WorkerSummary",
    "as_step_record",
    "median_finite",
    "modal",
    "nonfinite_steps_skipped",
    "run_samples_per_s",
    "summarize_workers",
]

_H = TypeVar("_H", bound=Hashable)


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
        load_s: Seconds of this rank's own work loading the slice (reading and collating in
            its process, the copy to its device), on the compute clock: a wait for
            DataLoader processes is not work and is not counted here.
        busy_s: The step's **loader-bound** price: wall seconds from asking the loader for
            the slice to the last gradient exchange, the wait for data included, waits in
            collectives excluded. What every plan, the remembered cost models and the
            reported speed are priced from.
        samples_per_s: ``slice / busy_s``: this rank's loader-bound speed (NaN if
            unmeasurable).
        loss: The loss the loop logged for the step (NaN if none).
        global_samples_per_s: Global batch / step wall time.
        plan_version: Version of the plan that carved the step.
        group: Worker-group id (changes on every restart).
        world_size: World size of the group.
        wall_s: Wall seconds of the whole step.
        time: Unix time at the end of the step.
        skipped_nonfinite: The step guard skipped this step's update on every rank (some
            rank's gradients were non-finite).
        overhead_s: Wall seconds the library's own between-step work took on this rank
            since the previous step ended (pushing records to the scheduler, plan sync,
            preemption reads): the live scheduler's cost on the step's path (0 for a group's
            first step).
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
    skipped_nonfinite: bool = False
    overhead_s: float = 0.0

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


def as_step_record(record: StepRecord | Mapping[str, Any]) -> StepRecord:
    """``record`` as a :class:`StepRecord` (a mapping is converted with :meth:`StepRecord.from_dict`)."""
    return record if isinstance(record, StepRecord) else StepRecord.from_dict(dict(record))


def median_finite(values: Iterable[float | int | None]) -> float:
    """Median of the finite values; NaN if there are none."""
    finite = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return statistics.median(finite) if finite else float("nan")


def _mean_finite(values: Iterable[float]) -> float:
    """Mean of the finite values; NaN if there are none."""
    finite = [float(v) for v in values if math.isfinite(float(v))]
    return math.fsum(finite) / len(finite) if finite else float("nan")


def modal(values: Iterable[_H]) -> _H:
    """Most frequent value; ties go to the largest (a short epoch tail never wins a tie).

    Raises:
        ValueError: ``values`` is empty.
    """
    counts = Counter(values)
    if not counts:
        raise ValueError("modal() of no values")
    return max(counts, key=lambda v: (counts[v], v))


@dataclass(frozen=True)
class WorkerSummary:
    """What one worker (at one rank) did over a run.

    Attributes:
        worker: WorkerSpec name.
        device: Device of its latest step.
        samples_per_s: Median of its finite per-step rates (NaN if none).
        slice: Its full-step slice under the latest plan it ran (the modal slice: the last,
            short step of an epoch is not representative).
        weight: Its gradient weight at that slice.
        mean_slice: Mean samples per step over all its steps.
        compute_s: Median seconds of own compute per step.
        busy_s: Median seconds busy (compute + loading) per step.
        wall_s: Median wall seconds per step.
        overhead_s: Mean seconds of the library's between-step work per step (the median
            would hide work done every few steps).
        steps: Steps it reported.
        measured_steps: Steps with a finite, positive rate.
        last_step: The latest step it reported.
    """

    rank: int
    worker: str
    device: str
    samples_per_s: float
    slice: int
    weight: float
    mean_slice: float
    compute_s: float
    busy_s: float
    wall_s: float
    steps: int
    measured_steps: int
    last_step: int
    overhead_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (tables, JSON)."""
        return asdict(self)


def summarize_workers(records: Iterable[StepRecord]) -> list[WorkerSummary]:
    """One :class:`WorkerSummary` per (rank, worker), ordered by rank then name."""
    by_worker: dict[tuple[int, str], list[StepRecord]] = defaultdict(list)
    for record in records:
        by_worker[(record.rank, record.worker)].append(record)
    out: list[WorkerSummary] = []
    for (rank, worker), steps in sorted(by_worker.items()):
        steps.sort(key=lambda r: (r.step, r.time))
        latest = steps[-1]
        current = [r for r in steps if r.plan_version == latest.plan_version]
        slice_ = modal(r.slice for r in current)
        weight = modal(round(r.weight, 6) for r in current if r.slice == slice_)
        out.append(
            WorkerSummary(
                rank=rank,
                worker=worker,
                device=latest.device,
                samples_per_s=median_finite(r.samples_per_s for r in steps),
                slice=slice_,
                weight=weight,
                mean_slice=sum(r.slice for r in steps) / len(steps),
                compute_s=median_finite(r.compute_s for r in steps),
                busy_s=median_finite(r.busy_s for r in steps),
                wall_s=median_finite(r.wall_s for r in steps),
                steps=len(steps),
                measured_steps=sum(r.has_speed for r in steps),
                last_step=latest.step,
                overhead_s=_mean_finite(r.overhead_s for r in steps),
            )
        )
    return out


def run_samples_per_s(records: Iterable[StepRecord]) -> float:
    """Global samples/s: every step's samples over the sum of each step's slowest wall time.

    A step is identified by (group, step): a step a restarted group repeats counts again,
    as it was computed again. NaN if no step has a positive wall time.
    """
    samples: dict[tuple[str, int], int] = defaultdict(int)
    wall: dict[tuple[str, int], float] = defaultdict(float)
    for record in records:
        key = (record.group, record.step)
        samples[key] += record.slice
        if math.isfinite(record.wall_s):
            wall[key] = max(wall[key], record.wall_s)
    total_wall = sum(wall.values())
    return sum(samples.values()) / total_wall if total_wall > 0 else float("nan")


def nonfinite_steps_skipped(records: Iterable[StepRecord]) -> int:
    """Steps the step guard skipped, each (group, step) once however many ranks recorded it."""
    return len({(r.group, r.step) for r in records if r.skipped_nonfinite})
