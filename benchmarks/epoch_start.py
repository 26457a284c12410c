"""Epoch starts in the per-step timeline: is each epoch's first step as fast as the others?

From rank 0's per-step log (:mod:`benchmarks.loop`; the same gaps as the timeline of
:func:`benchmarks.plots.timeline_points`): a step's time is the wall time since the previous
step of the same process ended, the previous step's evaluation excluded. An epoch's first step
(its ``epoch`` differs from the previous step's) is compared with the median step of the
process; a process's first step has no previous one and is not counted (its start-up is the
start-up figure). Issue 47's target: every epoch's first step within 1.3x of the median.
The figures need no Ray and no torch.

``python -m benchmarks.epoch_start`` measures the loader's side directly, in one process:
each step's wait for its batch with DataLoader processes over EMULATED slow storage, with and
without reading the next epoch ahead (:func:`measure_loader_waits`).
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "EPOCH_START_TARGET",
    "epoch_start_figures",
    "epoch_start_lines",
    "main",
    "measure_loader_waits",
]

#: Each epoch's first step within this factor of the median step (issue 47).
EPOCH_START_TARGET = 1.3


def epoch_start_figures(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``epoch_start_ratio`` (the slowest epoch start over the median step; NaN without an
    epoch start after a process's first step), ``epoch_start_ratios`` (each, in order) and
    ``median_step_s`` (rank 0's median step over all its processes' steps)."""
    from benchmarks.analysis import rank_timelines

    ratios: list[float] = []
    medians: list[float] = []
    for process in rank_timelines(records).get(0, []):
        gaps: list[tuple[bool, float]] = []
        for prev, cur in itertools.pairwise(process):
            if int(cur["step"]) != int(prev["step"]) + 1:
                continue  # a step repeated after a restart, or one missing
            evaluation = (
                float(prev["eval_end"]) - float(prev["eval_start"]) if "eval_start" in prev else 0.0
            )
            gap = float(cur["time"]) - float(prev["time"]) - evaluation
            gaps.append((cur.get("epoch") != prev.get("epoch"), gap))
        if not gaps:
            continue
        median = statistics.median(g for _, g in gaps)
        medians.append(median)
        if median > 0:
            ratios += [g / median for start, g in gaps if start]
    return {
        "epoch_start_ratio": max(ratios) if ratios else math.nan,
        "epoch_start_ratios": ratios,
        "median_step_s": statistics.median(medians) if medians else math.nan,
    }


def epoch_start_lines(result: Mapping[str, Any]) -> list[str]:
    """One line per contender: its slowest epoch start over the median step, worst fit."""
    lines = []
    for name in result.get("summary", {}).get("contenders", {}):
        worst = [
            f["figures"].get("epoch_start_ratio", math.nan)
            for f in result.get("fits", [])
            if f["contender"] == name and f.get("counted", True)
        ]
        worst = [w for w in worst if math.isfinite(w)]
        if worst:
            figure = max(worst)
            verdict = "met" if figure <= EPOCH_START_TARGET else "NOT met"
            lines.append(f"  {name:<12} {figure:.2f}x [goal <= {EPOCH_START_TARGET:g}: {verdict}]")
    if not lines:
        return []
    return [
        "epoch starts: each epoch's first step over the median step (rank 0's timeline, "
        "the slowest start of the worst fit):",
        *lines,
    ]


def measure_loader_waits(
    *,
    read_ahead: bool,
    persistent: bool,
    epochs: int = 4,
    steps_per_epoch: int = 8,
    batch: int = 32,
    read_delay_s: float = 0.002,
    compute_s: float = 0.03,
    loader_processes: int = 2,
) -> dict[str, Any]:
    """Each step's wait for its batch with DataLoader processes, in this process (no Ray).

    One rank reads ``batch`` samples a step from a dataset whose every read waits
    ``read_delay_s`` (EMULATED slow storage: a sleep, no CPU); each step "computes" for
    ``compute_s`` (a sleep). ``read_ahead`` False is the loader before issue 47 (each epoch's
    iterator made when the epoch starts). Returns the waits and each epoch start's over the
    median step (wait + compute).
    """
    from raytrain_hetero.config import BatchConfig, WorkerSpec
    from raytrain_hetero.core.carving import Cursor, EpochCarver
    from raytrain_hetero.core.plan import Plan, PlanSchedule
    from raytrain_hetero.worker.data.sampler import HeteroDataLoader, LoaderState
    from raytrain_hetero.worker.measure.clock import ComputeClock
    from raytrain_hetero.worker.measure.telemetry import Telemetry
    from raytrain_hetero.worker.measure.timing import StepTiming
    from raytrain_hetero.worker.setup.identity import HeteroSetup, RankIdentity

    size = steps_per_epoch * batch
    setup = HeteroSetup(
        run_id="epoch-start",
        specs=(WorkerSpec(name="w"),),
        batch=BatchConfig(global_batch_size=batch, fixed_shares=(1.0,)),
    )
    schedule = PlanSchedule()
    schedule.add(Plan.from_shares(batch, [1.0]))
    records: list[Any] = []
    loader = HeteroDataLoader(
        _SlowReads(size, read_delay_s),
        state=LoaderState(EpochCarver(size, batch, seed=0, min_step_size=1), Cursor()),
        schedule=schedule,
        identity=RankIdentity(setup=setup, slot=0, rank=0, world_size=1, group_id="g"),
        timing=StepTiming(ComputeClock("cpu"), lambda step: 1.0),
        telemetry=Telemetry(),
        ensure_plan=lambda: None,
        on_step_end=records.append,
        num_workers=loader_processes,
        persistent_workers=persistent,
    )
    if not read_ahead:
        loader._stream = None  # the loader as it was: each epoch's iterator made at its start
    for _ in range(epochs):
        for _batch in loader:
            time.sleep(compute_s)
    waits = [r.busy_s for r in records]  # one rank, no exchange: busy_s is the wait
    steps = [w + compute_s for w in waits]
    median = statistics.median(steps)
    starts = [steps[k] / median for k in range(steps_per_epoch, len(steps), steps_per_epoch)]
    return {
        "read_ahead": read_ahead,
        "persistent_workers": persistent,
        "waits_ms": [round(1e3 * w, 2) for w in waits],
        "median_step_ms": 1e3 * median,
        "epoch_start_ratios": starts,
        "epoch_start_ratio": max(starts) if starts else math.nan,
    }


class _SlowReads:
    """Item i is a small tensor; every read waits ``delay_s`` (EMULATED slow storage)."""

    def __init__(self, size: int, delay_s: float) -> None:
        self.size = size
        self.delay_s = delay_s

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> Any:
        import torch

        time.sleep(self.delay_s)
        return torch.full((8,), float(index))


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.epoch_start``: loader waits at epoch starts, with and without
    reading the next epoch ahead, for per-epoch and persistent DataLoader processes."""
    import argparse
    import json

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.epoch_start", description=main.__doc__
    )
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--steps-per-epoch", type=int, default=8)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--read-delay-s", type=float, default=0.002)
    parser.add_argument("--compute-s", type=float, default=0.03)
    parser.add_argument("--loader-processes", type=int, default=2)
    parser.add_argument("--output", type=Path, default=None, help="write result.json here")
    args = parser.parse_args(argv)
    rows = []
    for persistent in (False, True):
        for read_ahead in (False, True):
            rows.append(
                measure_loader_waits(
                    read_ahead=read_ahead,
                    persistent=persistent,
                    epochs=args.epochs,
                    steps_per_epoch=args.steps_per_epoch,
                    batch=args.batch,
                    read_delay_s=args.read_delay_s,
                    compute_s=args.compute_s,
                    loader_processes=args.loader_processes,
                )
            )
    print(
        f"{'workers':<11} {'read ahead':<10} {'median step ms':>14} "
        f"{'epoch starts / median step':<40}"
    )
    for row in rows:
        starts = ", ".join(f"{r:.2f}" for r in row["epoch_start_ratios"])
        print(
            f"{'persistent' if row['persistent_workers'] else 'per epoch':<11} "
            f"{'yes' if row['read_ahead'] else 'no':<10} {row['median_step_ms']:>14.1f} {starts}"
        )
    if args.output is not None:
        args.output.mkdir(parents=True, exist_ok=True)
        (args.output / "result.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
