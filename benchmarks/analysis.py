"""Figures from the per-step logs of benchmark fits (pure: no Ray, no torch).

Every contender is measured by the same code from the same kind of log (one JSON line per
rank per step, see :mod:`benchmarks.loop`), never from a contender's own
counters:

* **samples/s**: rank 0's wall time between consecutive step ends, over steady-state steps
  (the first ``skip_steps`` and every step right after an evaluation are left out: during an
  evaluation on rank 0 the others already compute the next step, which would flatter it).
  Probing, start-up and evaluation are therefore excluded for every contender alike.
* **efficiency**: the time an ideal run would need for the same steps over the time taken,
  where the ideal step of B samples takes B / sum_i s_i and s_i is worker i's throughput
  measured *alone* at the slice (and emulated factor) it had in that step. Steps are grouped
  by their per-rank (factor, slice) configuration, so re-plans and injected slowdowns are
  accounted for. 1.0 is the physical limit of data parallelism before communication.
* **time to accuracy**: from the first training step to the start of the first evaluation at
  or above the target, minus the time spent evaluating before it (``tta_s``); ``tta_total_s``
  counts from the start of the training function instead, so it includes model preparation
  and, for raytrain_hetero, probing and calibration.
* **drift** (a scenario with an injected slowdown and the ``hetero-static-post`` reference in
  the same run): the steps after the injection split into the *transition* (until a 3-step
  rolling median of samples/s stays within 10 % of the static post-drift plan's samples/s)
  and the *steady state* after it; samples/s from 30 steps after the injection over the
  reference; live re-plans per 100 steps (pooled over repeats).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks.epoch_start import epoch_start_figures
from raytrain_hetero.core.records import median_finite, modal

__all__ = [
    "RECOVERY_TOLERANCE",
    "alone_jobs",
    "drift_figures",
    "fit_figures",
    "live_replans",
    "rank_timelines",
    "steps_to_recover",
    "summarize",
]

#: "Recovered": a rolling median of samples/s within this fraction of the reference.
RECOVERY_TOLERANCE = 0.10

#: Steps after an injected slowdown from which the drift target holds the figure.
DRIFT_TARGET_STEPS = 30


def rank_timelines(records: Sequence[Mapping[str, Any]]) -> dict[int, list[list[dict[str, Any]]]]:
    """Per rank, the step records of each worker process (a restart starts a new process).

    Steps a restarted group repeats after resuming from a checkpoint appear in both
    processes; each list is one process's steps in order.
    """
    by_process: dict[tuple[int, Any], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if "step" in r and "time" in r:
            by_process[(int(r["rank"]), r.get("pid"))].append(dict(r))
    out: dict[int, list[list[dict[str, Any]]]] = defaultdict(list)
    for (rank, _), steps in by_process.items():
        out[rank].append(sorted(steps, key=lambda r: r["time"]))
    for processes in out.values():
        processes.sort(key=lambda steps: steps[0]["time"])
    return dict(out)


def _committed_rank0(records: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Rank 0's steps, each step once: a later process's record replaces a rolled-back one."""
    timelines = rank_timelines(records).get(0, [])
    by_step: dict[int, dict[str, Any]] = {}
    for process in timelines:
        for r in process:
            by_step[int(r["step"])] = r
    return [by_step[s] for s in sorted(by_step)]


def _counted_gaps(
    records: Sequence[Mapping[str, Any]], skip_steps: int
) -> list[tuple[dict, float]]:
    """(step record, seconds since the previous step end) for steady-state steps of rank 0."""
    gaps: list[tuple[dict, float]] = []
    for process in rank_timelines(records).get(0, []):
        first_step = process[0]["step"] if process else 0
        for prev, cur in itertools.pairwise(process):
            if cur["step"] != prev["step"] + 1 or cur["step"] < first_step + skip_steps:
                continue
            if "eval_start" in prev:
                continue
            gaps.append((cur, cur["time"] - prev["time"]))
    return gaps


def _configuration(
    step: int, by_rank_step: Mapping[tuple[int, int], Mapping[str, Any]], world: int
) -> tuple[tuple[float, int], ...] | None:
    config = []
    for rank in range(world):
        r = by_rank_step.get((rank, step))
        if r is None:
            return None
        config.append((round(float(r.get("factor", 1.0)), 6), int(r["slice"])))
    return tuple(config)


def alone_jobs(records: Sequence[Mapping[str, Any]], skip_steps: int = 2) -> list[dict[str, Any]]:
    """The distinct (rank, factor, slice) a fit ran its counted steps at: what to time alone."""
    by_rank_step = {(int(r["rank"]), int(r["step"])): r for r in records if "step" in r}
    jobs: dict[tuple[int, float, int], dict[str, Any]] = {}
    for cur, _ in _counted_gaps(records, skip_steps):
        config = _configuration(int(cur["step"]), by_rank_step, int(cur["world"]))
        if config is None:
            continue
        for rank, (factor, slice_) in enumerate(config):
            worker = by_rank_step[(rank, int(cur["step"]))].get("worker", str(rank))
            jobs.setdefault(
                (rank, factor, slice_),
                {"rank": rank, "worker": worker, "factor": factor, "slice": slice_},
            )
    return list(jobs.values())


def fit_figures(
    records: Sequence[Mapping[str, Any]],
    *,
    global_batch_size: int,
    target_accuracy: float,
    alone: Mapping[tuple[float, int, str], float] | None = None,
    skip_steps: int = 2,
    phase_step: int | None = None,
) -> dict[str, Any]:
    """Figures of one fit from its step records (all ranks; see the module docstring).

    Args:
        records: Step records (``step``, ``rank``, ``world``, ``slice``, ``time``, optional
            ``factor``, ``worker``, ``pid``; rank 0's evaluations ``eval_start``/``eval_end``/
            ``val_accuracy``) and ``start`` events (``event == "start"``, ``time``).
        global_batch_size: Samples per step.
        target_accuracy: Validation accuracy the time-to-accuracy figure waits for.
        alone: Samples/s measured alone, keyed by (factor, slice, worker); None skips the
            efficiency figure.
        skip_steps: Warm-up steps of each process left out of samples/s.
        phase_step: If given, samples/s and efficiency also for steps before and from it.
    """
    gaps = _counted_gaps(records, skip_steps)
    seconds = sum(g for _, g in gaps)
    out: dict[str, Any] = {
        "counted_steps": len(gaps),
        "samples_per_s": global_batch_size * len(gaps) / seconds if seconds > 0 else float("nan"),
    }
    by_rank_step = {(int(r["rank"]), int(r["step"])): r for r in records if "step" in r}

    def efficiency(selected: list[tuple[dict, float]]) -> tuple[float, float]:
        """(ideal time / actual time, ideal samples/s) over the steps with alone figures."""
        if alone is None:
            return float("nan"), float("nan")
        ideal_s = actual_s = 0.0
        counted = 0
        for cur, gap in selected:
            config = _configuration(int(cur["step"]), by_rank_step, int(cur["world"]))
            if config is None:
                continue
            speeds = []
            for rank, (factor, slice_) in enumerate(config):
                worker = by_rank_step[(rank, int(cur["step"]))].get("worker", str(rank))
                speed = alone.get((factor, slice_, worker))
                if speed is None or not speed > 0:
                    break
                speeds.append(speed)
            else:
                ideal_s += global_batch_size / sum(speeds)
                actual_s += gap
                counted += 1
        if actual_s <= 0 or ideal_s <= 0:
            return float("nan"), float("nan")
        return ideal_s / actual_s, global_batch_size * counted / ideal_s

    out["efficiency"], out["ideal_samples_per_s"] = efficiency(gaps)
    if phase_step is not None:
        for label, part in (
            ("before", [g for g in gaps if g[0]["step"] < phase_step]),
            ("after", [g for g in gaps if g[0]["step"] >= phase_step]),
        ):
            secs = sum(g for _, g in part)
            out[f"samples_per_s_{label}"] = (
                global_batch_size * len(part) / secs if secs > 0 else float("nan")
            )
            out[f"efficiency_{label}"] = efficiency(part)[0]
        # Per-step gaps from the injection on: the drift figures compare them with the
        # side-by-side static post-drift plan (summarize), which only the summary knows.
        out["phase_step"] = phase_step
        out["phase_gaps"] = [[int(g[0]["step"]), g[1]] for g in gaps if g[0]["step"] >= phase_step]
        out["global_batch_size"] = global_batch_size

    # Accuracy over training time (rank 0, committed steps only).
    steps0 = _committed_rank0(records)
    starts = sorted(
        float(r["time"])
        for r in records
        if r.get("event") == "start" and int(r.get("rank", -1)) == 0
    )
    first_batch = next(
        (
            float(r["first_batch_time"])
            for r in sorted(
                (r for r in records if r.get("rank") == 0 and "first_batch_time" in r),
                key=lambda r: r["time"],
            )
        ),
        float("nan"),
    )
    loop_start = starts[0] if starts else float("nan")
    evals = [r for r in steps0 if "val_accuracy" in r]
    curve = []
    eval_spent = 0.0
    tta = tta_total = float("nan")
    steps_to_target: int | None = None
    for r in evals:
        train_s = float(r["eval_start"]) - first_batch - eval_spent
        curve.append(
            {"step": int(r["step"]) + 1, "train_s": train_s, "accuracy": float(r["val_accuracy"])}
        )
        if math.isnan(tta) and float(r["val_accuracy"]) >= target_accuracy:
            tta = train_s
            tta_total = float(r["eval_start"]) - loop_start - eval_spent
            steps_to_target = int(r["step"]) + 1
        eval_spent += float(r["eval_end"]) - float(r["eval_start"])
    out.update(
        tta_s=tta,
        tta_total_s=tta_total,
        steps_to_target=steps_to_target,
        final_accuracy=float(evals[-1]["val_accuracy"]) if evals else float("nan"),
        startup_s=first_batch - loop_start,
        steps=len(steps0),
        curve=curve,
        slices=_modal_slices(records, skip_steps),
        worlds=sorted({int(r["world"]) for r in steps0}),
    )
    out.update(epoch_start_figures(records))  # each epoch's first step over the median
    return out


def steps_to_recover(
    throughput: Mapping[int, float],
    injected_at: int,
    reference: float,
    tolerance: float = RECOVERY_TOLERANCE,
) -> int | None:
    """Steps from ``injected_at`` until samples/s is back within ``tolerance`` of ``reference``.

    Recovered at the first step whose 3-step rolling median (over the steps present) is at
    least ``(1 - tolerance) * reference`` and stays so for the next two steps; None if never.
    """
    steps = [s for s in sorted(throughput) if s >= injected_at]
    ok = []
    for i in range(len(steps)):
        window = [throughput[x] for x in steps[max(0, i - 2) : i + 1]]
        ok.append(len(window) == 3 and statistics.median(window) >= (1 - tolerance) * reference)
    for i in range(len(steps)):
        if len(ok[i : i + 3]) == 3 and all(ok[i : i + 3]):
            return steps[i] - injected_at
    return None


def drift_figures(figures: Mapping[str, Any], reference: float) -> dict[str, Any]:
    """One drift fit against the static post-drift plan's samples/s ``reference``.

    The steps after the injection are split into the *transition* (until samples/s is within
    :data:`RECOVERY_TOLERANCE` of the reference, :func:`steps_to_recover`) and the *steady
    state* after it; ``vs_static_post_after_30`` is samples/s from
    :data:`DRIFT_TARGET_STEPS` steps after the injection on, over the reference.
    """
    phase = figures.get("phase_step")
    gaps = figures.get("phase_gaps") or []
    batch = figures.get("global_batch_size")
    nan = float("nan")
    if phase is None or not gaps or not batch or not (reference > 0):
        return {}

    def rate(part: Sequence[Sequence[float]]) -> float:
        seconds = sum(g for _, g in part)
        return batch * len(part) / seconds if seconds > 0 else nan

    throughput = {int(step): batch / gap for step, gap in gaps if gap > 0}
    transition = steps_to_recover(throughput, int(phase), reference)
    split = int(phase) + (transition if transition is not None else 10**9)
    steady = rate([g for g in gaps if g[0] >= split])
    late = rate([g for g in gaps if g[0] >= int(phase) + DRIFT_TARGET_STEPS])
    return {
        "transition_steps": transition,
        "samples_per_s_transition": rate([g for g in gaps if g[0] < split]),
        "samples_per_s_steady": steady,
        "vs_static_post_steady": steady / reference,
        "vs_static_post_after_30": late / reference,
    }


def live_replans(plans: Sequence[Mapping[str, Any]]) -> int:
    """How many of a fit's plans were live re-plans (the first, probed plan is not one)."""
    return sum(str(p.get("reason") or "").startswith("live") for p in plans)


def _modal_slices(records: Sequence[Mapping[str, Any]], skip_steps: int) -> list[int]:
    per_rank: dict[int, list[int]] = defaultdict(list)
    for r in records:
        if "step" in r and int(r["step"]) >= skip_steps:
            per_rank[int(r["rank"])].append(int(r["slice"]))
    return [modal(per_rank[r]) for r in sorted(per_rank)]


def _at_stock_steps(
    fits: Sequence[Mapping[str, Any]], name: str, stock: Mapping[str, Any]
) -> dict[str, float]:
    """Time to accuracy including start-up as if the fit had needed stock's (median) steps.

    Steps to the target are a draw of the data order, and stock's trajectory differs from the
    exact one: this reading keeps each fit's time per step and start-up and gives no contender
    credit for needing fewer steps (or blame for more). Median over the contender's fits.
    """
    steps = stock.get("steps_to_target")
    times = []
    for f in fits:
        if f["contender"] != name or not f.get("counted", True):
            continue
        figures = f["figures"]
        reached, tta = figures.get("steps_to_target"), figures.get("tta_s")
        total = figures.get("tta_total_s")
        if reached and tta is not None and total is not None and math.isfinite(tta):
            times.append(tta / reached * steps + (total - tta))  # total - tta: the start-up
    at_steps = median_finite(times) if steps and times else math.nan
    return {
        "tta_total_at_stock_steps_s": at_steps,
        "tta_total_at_stock_steps_speedup": _ratio(stock.get("tta_total_s"), at_steps),
    }


def summarize(
    fits: Sequence[Mapping[str, Any]],
    contenders: Sequence[str],
    targets: Sequence[Any] = (),
) -> dict[str, Any]:
    """Medians per contender over counted fits, ratios to stock, and the targets' verdicts.

    Each fit is ``{"contender", "counted", "figures": fit_figures(...), "wall_s"}``.
    """
    keys = (
        "samples_per_s",
        "efficiency",
        "tta_s",
        "tta_total_s",
        "final_accuracy",
        "wall_s",
        "startup_s",
        "samples_per_s_before",
        "samples_per_s_after",
        "efficiency_after",
        "join_latency_s",
        "ideal_samples_per_s",
    )
    reference_fits = [
        f for f in fits if f["contender"] == "hetero-static-post" and f.get("counted", True)
    ]
    reference = median_finite(f["figures"].get("samples_per_s") for f in reference_fits)
    per: dict[str, dict[str, Any]] = {}
    for name in contenders:
        mine = [f for f in fits if f["contender"] == name and f.get("counted", True)]
        row: dict[str, Any] = {"repeats": len(mine)}
        for key in keys:
            values = [f["figures"].get(key, f.get(key)) for f in mine]
            if any(v is not None for v in values):
                row[key] = median_finite(values)
        if mine and all("plans" in f for f in mine):
            replans = [live_replans(f["plans"]) for f in mine]
            row["replans"] = median_finite(replans)
            # A rate: pooled over the repeats (all re-plans over all steps), not a median.
            steps = sum(int(f["figures"].get("steps") or 0) for f in mine)
            row["replans_per_100_steps"] = 100.0 * sum(replans) / steps if steps else math.nan
        if name not in ("hetero-static-post", "hetero-live-noise") and math.isfinite(reference):
            drifts = [drift_figures(f["figures"], reference) for f in mine]
            for key in (
                "samples_per_s_transition",
                "samples_per_s_steady",
                "vs_static_post_steady",
                "vs_static_post_after_30",
            ):
                if any(key in d for d in drifts):
                    row[key] = median_finite(d.get(key) for d in drifts)
            if any(drifts):
                transitions = [d.get("transition_steps") for d in drifts if d]
                row["transition_steps"] = median_finite(transitions)
                row["recovered"] = sum(t is not None for t in transitions)
        rates = [f["figures"].get("samples_per_s") for f in mine]
        rates = [float(v) for v in rates if v is not None and math.isfinite(float(v))]
        if rates:
            row["samples_per_s_min"], row["samples_per_s_max"] = min(rates), max(rates)
        reached = [f["figures"].get("steps_to_target") for f in mine]
        row["steps_to_target"] = median_finite(reached)
        row["reached_target"] = sum(v is not None for v in reached)
        per[name] = row
    stock = per.get("stock")
    if stock is not None:
        for name, row in per.items():
            row.update(_at_stock_steps(fits, name, stock))
    for row in per.values():
        if stock is None:
            break
        row["speedup"] = _ratio(row.get("samples_per_s"), stock.get("samples_per_s"))
        row["overhead"] = _ratio(stock.get("samples_per_s"), row.get("samples_per_s")) - 1.0
        row["tta_speedup"] = _ratio(stock.get("tta_s"), row.get("tta_s"))
        row["tta_total_speedup"] = _ratio(stock.get("tta_total_s"), row.get("tta_total_s"))

        row["accuracy_gap_pt"] = 100.0 * (
            row.get("final_accuracy", float("nan")) - stock.get("final_accuracy", float("nan"))
        )
    if "gpu-alone" in per:
        for row in per.values():
            row["vs_gpu_alone"] = _ratio(
                row.get("samples_per_s"), per["gpu-alone"].get("samples_per_s")
            )
    if "best-subset" in per:  # the simple choice, measured in the same run
        for row in per.values():
            row["vs_best_subset"] = _ratio(
                row.get("samples_per_s"), per["best-subset"].get("samples_per_s")
            )
    verdicts = []
    for target in targets:
        for name in target.contenders:
            if name not in per:
                continue
            figure = per[name].get(target.metric)
            met = target.met(figure)
            note = ""
            if target.metric == "tta_speedup":
                gap = per[name].get("accuracy_gap_pt", float("nan"))
                if not (math.isfinite(gap) and abs(gap) <= 0.5):
                    met = False
                note = f"final accuracy {gap:+.1f} pt vs stock"
            verdicts.append(
                {
                    "target": target.label,
                    "metric": target.metric,
                    "contender": name,
                    "op": target.op,
                    "goal": target.value,
                    "figure": figure,
                    "met": bool(met),
                    "note": note,
                }
            )
    return {"contenders": per, "targets": verdicts}


def _ratio(a: float | None, b: float | None) -> float:
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)) or b == 0:
        return float("nan")
    return a / b
