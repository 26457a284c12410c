"""Results of a Tune search over HeteroTrainer runs: one row per trial (``trials.csv``), the plot."""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from raytrain_hetero.atomic import atomic_write, atomic_write_text
from raytrain_hetero.tune.trial import plain_value

__all__ = [
    "TRIAL_COLUMNS",
    "add_allocation_history",
    "allocation_spans",
    "allocation_text",
    "finite",
    "moves_text",
    "plot_allocations",
    "plot_trials",
    "trial_rows",
    "write_allocation_log",
    "write_trials_csv",
]

#: Columns every row of ``trials.csv`` starts with (then ``config/...`` and ``workers/...``).
TRIAL_COLUMNS: tuple[str, ...] = (
    "trial_id",
    "status",
    "epochs",
    "val_accuracy",
    "best_val_accuracy",
    "samples_per_s",
    "slices",
    "error",
)


def finite(value: Any) -> bool:
    """Whether ``value`` is a finite number (``None``, NaN and text are not)."""
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def trial_rows(
    grid: Any, *, search_keys: Iterable[str], epochs: int
) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """Flatten a Tune ``ResultGrid`` into rows (sorted by trial id; a ``config/<key>`` column
    per searched key; ``_workers`` the per-worker metrics; ``epochs`` fewer than a full trial's:
    stopped early) and each trial's history of reports.
    """
    keys = list(search_keys)
    rows: list[dict[str, Any]] = []
    histories: dict[str, list[dict[str, Any]]] = {}
    for result in grid:
        metrics = dict(result.metrics or {})
        trial_id = str(metrics.get("trial_id") or Path(str(result.path)).name)
        frame = result.metrics_dataframe
        history = frame.to_dict("records") if frame is not None else []
        histories[trial_id] = history
        accuracies = [h.get("val_accuracy") for h in history if finite(h.get("val_accuracy"))]
        workers = _workers_from_metrics(metrics)
        trial_epochs = int(metrics.get("training_iteration") or 0)
        status = (
            "error" if result.error else ("stopped early" if trial_epochs < epochs else "completed")
        )
        row: dict[str, Any] = {
            "trial_id": trial_id,
            "status": status,
            "epochs": trial_epochs,
            "val_accuracy": metrics.get("val_accuracy"),
            "best_val_accuracy": max(accuracies) if accuracies else None,
            "samples_per_s": metrics.get("samples_per_s"),
            "startup_s": metrics.get("hetero/startup_s"),  # the last worker group's
            "fit_start_s": metrics.get("hetero/fit_start_s"),  # the last fit's
            "slices": " ".join(f"{n}:{w['slice']}" for n, w in workers.items()),  # rank order
            "error": _first_line(result.error) if result.error else "",
        }
        config = dict(result.config or {})
        for key in keys:
            row[f"config/{key}"] = plain_value(config.get(key))
        for name, w in workers.items():
            row[f"workers/{name}/slice"] = w["slice"]
            row[f"workers/{name}/samples_per_s"] = w["samples_per_s"]
        row["_workers"] = workers
        rows.append(row)
    rows.sort(key=lambda r: r["trial_id"])
    return rows, histories


def _workers_from_metrics(metrics: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    nested = metrics.get("workers")
    workers: dict[str, dict[str, Any]] = defaultdict(dict)
    if isinstance(nested, Mapping):
        workers.update({str(k): dict(v) for k, v in nested.items()})
    else:
        for key, value in metrics.items():
            parts = key.split("/")
            if len(parts) == 3 and parts[0] == "workers":
                workers[parts[1]][parts[2]] = value
    return dict(sorted(workers.items(), key=lambda item: (item[1].get("rank", 0), item[0])))


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def write_trials_csv(rows: Iterable[Mapping[str, Any]], path: str | Path) -> Path:
    """Write one row per trial: :data:`TRIAL_COLUMNS`, then ``config/...``, ``workers/...``."""
    rows = list(rows)
    extra: list[str] = []
    for row in rows:
        for key in row:
            if key not in TRIAL_COLUMNS and not key.startswith("_") and key not in extra:
                extra.append(key)
    columns = list(TRIAL_COLUMNS) + sorted(extra, key=lambda k: (not k.startswith("config/"), k))

    def write(fh: IO[str]) -> None:
        writer = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if row.get(k) is None else row[k] for k in columns})

    return atomic_write(path, write)


def plot_trials(
    histories: Mapping[str, Sequence[Mapping[str, Any]]],
    rows: Sequence[Mapping[str, Any]],
    path: str | Path,
    *,
    metric: str = "val_accuracy",
    title: str = "Trials",
) -> Path:
    """Left: ``metric`` per epoch of every trial (early-stopped trials end early).
    Right: each trial's per-worker samples/s, stacked, with the run's samples/s marked."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(12, 5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax_metric, ax_tp = fig.subplots(1, 2)
    fig.suptitle(title)
    for trial_id, history in sorted(histories.items()):
        points = [
            (int(h["training_iteration"]), float(h[metric]))
            for h in history
            if finite(h.get(metric)) and h.get("training_iteration") is not None
        ]
        if points:
            xs, ys = zip(*points)
            ax_metric.plot(xs, ys, marker="o", lw=1.2, label=trial_id)
    ax_metric.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_metric.set_xlabel("epoch")
    ax_metric.set_ylabel(metric)
    ax_metric.grid(alpha=0.3)
    if histories:
        ax_metric.legend(fontsize=8)
    names = sorted({n for r in rows for n in r.get("_workers", {})})
    bottoms = [0.0] * len(rows)
    xs = list(range(len(rows)))
    for name in names:
        heights = [
            float(r["_workers"][name]["samples_per_s"])
            if name in r.get("_workers", {}) and finite(r["_workers"][name]["samples_per_s"])
            else 0.0
            for r in rows
        ]
        ax_tp.bar(xs, heights, bottom=bottoms, label=name)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    totals = [
        float(r["samples_per_s"]) if finite(r.get("samples_per_s")) else math.nan for r in rows
    ]
    ax_tp.plot(xs, totals, "k_", markersize=30, mew=2, label="run samples/s")
    ax_tp.set_xticks(xs, [str(r["trial_id"]) for r in rows], rotation=30, ha="right", fontsize=8)
    # Per worker: samples over its own busy time; the run: samples over each step's wall time.
    ax_tp.set_ylabel("samples / s (per worker, stacked)")
    ax_tp.grid(alpha=0.3, axis="y")
    if names:
        ax_tp.legend(fontsize=8)

    return atomic_write(path, lambda fh: fig.savefig(fh, format="png"), binary=True)


def _short(node_id: str) -> str:
    return node_id[:8]


def allocation_text(events: Sequence[Any], trial_id: str) -> str:
    """One trial's allocation history (``tune.allocation: auto``) as one cell: per change,
    ``<seconds>s v<version> <workers> on <node>[*<workers there>],...`` (``released`` at the end), ``; ``
    between changes; node ids shortened to 8 characters."""
    parts = []
    for e in events:
        if e.trial_id != trial_id:
            continue
        if not e.slots:
            parts.append(f"{e.time_s:.1f}s released")
            continue
        counts: dict[str, int] = {}
        for node in e.nodes:
            counts[node] = counts.get(node, 0) + 1
        nodes = ",".join(_short(n) + (f"*{k}" if k > 1 else "") for n, k in counts.items())
        parts.append(f"{e.time_s:.1f}s v{e.version} {len(e.slots)} on {nodes}")
    return "; ".join(parts)


def moves_text(events: Sequence[Any], trial_id: str) -> str:
    """One trial's moves (its workers changed while it ran) as one cell: per move
    ``<seconds>s gain <s>, cost <s>, margin <s>`` (the run its new workers save, what the
    move was charged: restart and contention, and its error margin), ``; `` between them."""
    return "; ".join(
        f"{e.time_s:.1f}s gain {e.gain_s:.1f}, cost {e.cost_s:.1f}, margin {e.margin_s:.1f}"
        for e in events
        if e.trial_id == trial_id and getattr(e, "gain_s", None) is not None
    )


def add_allocation_history(
    rows: Sequence[dict[str, Any]],
    events: Sequence[Any],
    fit_starts: Mapping[str, Sequence[Any]] | None = None,
) -> None:
    """Add ``allocation`` (:func:`allocation_text`), ``allocations`` (how many worker
    sets the trial held) and ``moves`` (:func:`moves_text`) to each row of :func:`trial_rows`, from the allocator's history
    (:class:`~raytrain_hetero.tune.allocator.AllocationEvent`), and from its fits' measured
    starts (:class:`~raytrain_hetero.tune.allocator.FitStart`), space-separated per fit:
    ``fit_starts_s`` (the fit's call to its first step), ``fit_starts_ray_train_s`` (Ray
    Train's part: controller, placement group, worker processes) and
    ``fit_starts_library_s`` (the library's: data, model, restore, first plan)."""

    def seconds(values: Sequence[float | None]) -> str:
        return " ".join("-" if v is None else f"{v:.1f}" for v in values)

    for row in rows:
        trial_id = str(row["trial_id"])
        row["allocation"] = allocation_text(events, trial_id)
        row["allocations"] = sum(1 for e in events if e.trial_id == trial_id and e.slots)
        row["moves"] = moves_text(events, trial_id)
        starts = (fit_starts or {}).get(trial_id, ())
        row["fit_starts_s"] = seconds([s.total_s for s in starts])
        row["fit_starts_ray_train_s"] = seconds([s.ray_train_s for s in starts])
        row["fit_starts_library_s"] = seconds([s.library_s for s in starts])


def write_allocation_log(
    path: str | Path,
    *,
    events: Sequence[Any],
    decisions: Sequence[Any],
    fit_starts: Mapping[str, Sequence[Any]],
    prices: Any,
    wall_start: float,
) -> Path:
    """``allocation_log.json``: the allocator's whole log for a search under ``auto``: when
    it started (unix seconds, the origin of every ``time_s``), what it charges now
    (:class:`~raytrain_hetero.tune.allocation_records.MeasuredPrices`), every change of a
    holding (with each move's gain, cost and margin), every decision (also the kept ones,
    with the best change's figures) and every fit's measured start."""
    from dataclasses import asdict

    log = {
        "wall_start": wall_start,
        "prices": asdict(prices),
        "events": [asdict(e) for e in events],
        "decisions": [asdict(d) for d in decisions],
        "fit_starts": {t: [asdict(s) for s in starts] for t, starts in fit_starts.items()},
    }
    return atomic_write_text(path, json.dumps(log, indent=1, default=str) + "\n")


def allocation_spans(events: Sequence[Any], end_s: float) -> list[tuple[str, str, float, float]]:
    """``(trial_id, node_id, start_s, end_s)`` per worker of each holding: from the change
    that gave it until the trial's next change (or ``end_s``)."""
    spans: list[tuple[str, str, float, float]] = []
    by_trial: dict[str, list[Any]] = defaultdict(list)
    for e in events:
        by_trial[e.trial_id].append(e)
    for trial_id, changes in by_trial.items():
        for i, e in enumerate(changes):
            until = changes[i + 1].time_s if i + 1 < len(changes) else end_s
            spans.extend((trial_id, node, e.time_s, until) for node in e.nodes)
    return spans


def plot_allocations(events: Sequence[Any], path: str | Path, *, title: str = "Allocation") -> Path:
    """A Gantt chart of which nodes each trial held over time (one row per node and worker
    slot, one colour per trial), next to ``trials.png``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    end_s = max((e.time_s for e in events), default=0.0)
    spans = allocation_spans(events, end_s)
    trials = sorted({t for t, *_ in spans})
    colours = {t: f"C{i % 10}" for i, t in enumerate(trials)}
    # One lane per (node, k-th worker of a trial on that node at once).
    lanes: dict[tuple[str, int], list[tuple[float, float]]] = defaultdict(list)
    placed: list[tuple[tuple[str, int], str, float, float]] = []
    for trial_id, node, start, stop in sorted(spans, key=lambda s: (s[1], s[2], s[0])):
        k = 0
        while any(a < stop and start < b for a, b in lanes[(node, k)]):
            k += 1
        lanes[(node, k)].append((start, stop))
        placed.append(((node, k), trial_id, start, stop))
    order = sorted(lanes)
    fig = Figure(figsize=(10, 1.5 + 0.4 * max(len(order), 1)), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.set_title(title)
    for lane, trial_id, start, stop in placed:
        y = order.index(lane)
        width = max(stop - start, end_s * 0.005 + 1e-3)
        # White edges mark where a trial's holding changed (it moved).
        ax.barh(y, width, left=start, color=colours[trial_id], edgecolor="white", linewidth=1.5)
    ax.set_yticks(range(len(order)), [f"{_short(n)} #{k}" for n, k in order], fontsize=8)
    ax.set_xlabel("seconds since the search's allocator started")
    ax.set_ylabel("node, worker")
    for t in trials:
        ax.barh(0, 0, color=colours[t], label=t)
    if trials:
        ax.legend(fontsize=8, loc="upper right")
    ax.grid(alpha=0.3, axis="x")
    return atomic_write(path, lambda fh: fig.savefig(fh, format="png"), binary=True)
