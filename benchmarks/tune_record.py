"""What a real search of ``benchmarks.tune_asha`` measured, kept so the simulator can be checked.

:func:`write_timeline` (run after each search of ``auto`` and ``fixed``) writes the
contender's ``timeline.json``: the search's start and makespan, its setup (batch, epoch size,
ASHA, the cluster's slots), every trial's reports as Tune stored them (iteration, seconds since
the trial's launch, the fit's measured start, samples/s of the run and of each worker) and,
under ``auto``, the allocator's log (``allocation_log.json``: its measured prices, moves,
decisions). :func:`recorded_run` turns a timeline into the simulator's input
(:class:`~raytrain_hetero.sim.tune_replay.RecordedRun`): when Tune launched each trial, its
first start, its epochs, its step cost per worker type (the median samples/s of its
one-worker reports per type, else of its workers of that type; a type it never ran on: the
run's median), the per-epoch overhead (a report's seconds since the previous one, in the same
fit, minus its steps at the report's samples/s: the median), the restart (the resumed fits'
median start), and Tune's wind-down after the last report. :func:`promotion_schedule` reads a
search's epochs per trial back for a replay.

The records written before issue 44 (``benchmarks/results/tune_asha*``) keep only each
trial's last report (``trials.csv``): no per-epoch times, no launch times, no fit starts under
``fixed``; they cannot be checked this way.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from raytrain_hetero.atomic import atomic_write_text
from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.sim.tune_replay import RecordedRun, RecordedTrial
from raytrain_hetero.tune.replay import PromotionSchedule, trial_index

__all__ = ["promotion_schedule", "recorded_run", "tune_rows", "write_timeline"]

#: The report keys a timeline keeps (Tune's and the library's).
_KEPT = ("training_iteration", "time_total_s", "timestamp", "hetero/fit_start_s", "samples_per_s")


def tune_rows(storage: Path) -> dict[str, list[dict[str, Any]]]:
    """Every trial's reports (Tune's ``result.json`` lines), by trial id, in order."""
    trials: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(Path(storage).glob("*/result.json")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        rows = [r for r in rows if r.get("training_iteration") is not None]
        if rows:
            trials[str(rows[0]["trial_id"])] = rows
    return trials


def _workers(row: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """``{worker: {"samples_per_s", "slice"}}`` of one report (nested or flattened keys)."""
    out: dict[str, dict[str, float]] = {}
    nested = row.get("workers")
    if isinstance(nested, Mapping):
        for name, values in nested.items():
            if isinstance(values, Mapping):
                out[str(name)] = {k: values[k] for k in ("samples_per_s", "slice") if k in values}
    for key, value in row.items():
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == "workers" and parts[2] in ("samples_per_s", "slice"):
            out.setdefault(parts[1], {})[parts[2]] = value
    return out


def write_timeline(
    out: Path,
    *,
    contender: str,
    summary: Mapping[str, Any],
    setup: Mapping[str, Any],
    samples_per_epoch: int,
    slots: Mapping[str, int],
) -> Path:
    """Write ``out/timeline.json`` for one search (see the module docstring).

    Args:
        out: The contender's output directory (``run_tune``'s: its ``allocation_log.json``
            is read from there).
        contender: ``auto`` or ``fixed``.
        summary: ``run_tune``'s summary (``storage``, ``wall_time_s``, ``started_at``).
        setup: The benchmark's setup (``global_batch_size``, ``epochs``, ASHA's).
        samples_per_epoch: Training samples of one epoch.
        slots: Worker slots per type (``fixed``: one type for all).
    """
    trials = []
    for trial_id, rows in sorted(tune_rows(Path(summary["storage"])).items()):
        reports = []
        for row in rows:
            kept = {k: row.get(k) for k in _KEPT}
            kept["workers"] = _workers(row)
            reports.append(kept)
        config = dict(rows[-1].get("config") or {})
        trials.append(
            {
                "trial_id": trial_id,
                "index": trial_index(trial_id),
                "config": config,
                "reports": reports,
            }
        )
    log_path = Path(out) / "allocation_log.json"
    timeline = {
        "contender": contender,
        "makespan_s": float(summary["wall_time_s"]),
        "started_at": float(summary["started_at"]),
        "global_batch": int(setup["global_batch_size"]),
        "samples_per_epoch": int(samples_per_epoch),
        "max_epochs": int(setup["epochs"]),
        "grace_period": int(setup["grace_period"]),
        "reduction_factor": float(setup["reduction_factor"]),
        "max_workers_per_trial": setup.get("max_workers_per_trial"),
        "slots": dict(slots),
        "trials": sorted(trials, key=lambda t: t["index"]),
        "allocation": json.loads(log_path.read_text()) if log_path.exists() else None,
    }
    return atomic_write_text(
        Path(out) / "timeline.json", json.dumps(timeline, indent=1, default=str) + "\n"
    )


def _finite(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None


def _fits(reports: Sequence[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """The reports grouped by fit (a fit's reports carry its one measured start)."""
    fits: list[list[Mapping[str, Any]]] = []
    for r in reports:
        start = r.get("hetero/fit_start_s")
        if not fits or start != fits[-1][-1].get("hetero/fit_start_s"):
            fits.append([])
        fits[-1].append(r)
    return fits


def _type_rates(reports: Sequence[Mapping[str, Any]], fixed: bool) -> dict[str, list[float]]:
    """Per worker type its measured samples/s: the run's rate of one-worker reports, else
    each worker's (``fixed``: one type, ``any``)."""
    lone: dict[str, list[float]] = {}
    each: dict[str, list[float]] = {}
    for r in reports:
        workers = r.get("workers") or {}
        for name, w in workers.items():
            kind = "any" if fixed else name.rsplit("-", 1)[0]
            rate = _finite(w.get("samples_per_s"))
            if rate is not None:
                each.setdefault(kind, []).append(rate)
        if len(workers) == 1 and (rate := _finite(r.get("samples_per_s"))) is not None:
            kind = "any" if fixed else next(iter(workers)).rsplit("-", 1)[0]
            lone.setdefault(kind, []).append(rate)
    return {k: lone.get(k) or v for k, v in each.items()}


def recorded_run(timeline: Mapping[str, Any]) -> RecordedRun:
    """The simulator's input for one recorded search (see the module docstring)."""
    contender = str(timeline["contender"])
    fixed = contender != "auto"
    batch = int(timeline["global_batch"])
    per_epoch = int(timeline["samples_per_epoch"])
    started = float(timeline["started_at"])
    steps = per_epoch / batch
    run_rates: dict[str, list[float]] = {}
    per_trial: list[dict[str, list[float]]] = []
    overheads: list[float] = []
    resumed: list[float] = []
    last_report = 0.0
    for trial in timeline["trials"]:
        reports = trial["reports"]
        rates = _type_rates(reports, fixed)
        per_trial.append(rates)
        for kind, values in rates.items():
            run_rates.setdefault(kind, []).extend(values)
        for k, fit in enumerate(_fits(reports)):
            if k > 0 and (start := _finite(fit[0].get("hetero/fit_start_s"))) is not None:
                resumed.append(start)
            for before, after in itertools.pairwise(fit):
                rate = _finite(after.get("samples_per_s"))
                if rate is not None:
                    wall = float(after["time_total_s"]) - float(before["time_total_s"])
                    overheads.append(wall - steps * batch / rate)
        first = reports[0]
        launch = float(first["timestamp"]) - float(first["time_total_s"]) - started
        last_report = max(last_report, launch + float(reports[-1]["time_total_s"]))
        trial["_launch"] = max(0.0, launch)
    medians = {k: statistics.median(v) for k, v in run_rates.items()}
    trials = []
    for trial, rates in zip(timeline["trials"], per_trial):
        own = {k: statistics.median(v) for k, v in rates.items()}
        costs = {k: CostModel(0.0, 1.0 / own.get(k, medians[k])) for k in medians}
        start = _finite(trial["reports"][0].get("hetero/fit_start_s")) or 0.0
        trials.append(
            RecordedTrial(
                trial_id=str(trial["trial_id"]),
                launch_s=float(trial["_launch"]),
                start_s=start,
                epochs=int(trial["reports"][-1]["training_iteration"]),
                costs=costs if not fixed else {"any": costs["any"]},
                own_type="any" if fixed else None,
            )
        )
    prices = (timeline.get("allocation") or {}).get("prices") or {}
    slots = dict(timeline["slots"])
    return RecordedRun(
        policy="auto" if not fixed else "fixed",
        makespan_s=float(timeline["makespan_s"]),
        trials=tuple(trials),
        slots=slots if not fixed else {"any": sum(slots.values())},
        global_batch=batch,
        samples_per_epoch=per_epoch,
        max_epochs=int(timeline["max_epochs"]),
        grace_period=int(timeline["grace_period"]),
        reduction_factor=float(timeline["reduction_factor"]),
        epoch_overhead_s=max(0.0, statistics.median(overheads)) if overheads else 0.0,
        restart_s=statistics.median(resumed) if resumed else float(prices.get("restart_s", 30.0)),
        contention=float(prices.get("contention", 0.0)),
        step_error=float(prices.get("step_error", 0.0)),
        restart_error=float(prices.get("restart_error", 0.0)),
        tail_s=max(0.0, float(timeline["makespan_s"]) - last_report),
        max_workers_per_trial=timeline.get("max_workers_per_trial"),
    )


def promotion_schedule(source: Path, contender: str = "fixed") -> PromotionSchedule:
    """The epochs each trial ran (and its learning rate) in a recorded search, to replay:
    from a ``benchmarks.tune_asha`` ``results.json`` (its ``contender``'s), or a schedule
    JSON (:meth:`PromotionSchedule.save`)."""
    data = json.loads(Path(source).read_text())
    if "epochs" in data:
        return PromotionSchedule.from_dict(data)
    figures = data["contenders"][contender]
    lrs = figures.get("lr_per_trial") or []
    configs = tuple({"train.lr": lr} for lr in lrs) if all(v is not None for v in lrs) else ()
    return PromotionSchedule(
        tuple(int(e) for e in figures["epochs_per_trial"]), configs, f"{source}:{contender}"
    )
