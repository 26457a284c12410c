"""Run outputs: per-step metrics CSV, summary JSON, throughput plot and a text table.

No Ray, no torch; matplotlib through its Agg canvas (no pyplot, no process-wide backend
change). Every file goes through :func:`raytrain_hetero.atomic.atomic_write`. The metrics CSV
has one column per :class:`~raytrain_hetero.core.records.StepRecord` field
(:data:`METRICS_COLUMNS`, derived from the dataclass, so the two cannot drift apart).
"""

from __future__ import annotations

import contextlib
import csv
import io
import itertools
import json
import logging
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import IO, Any

from rich.box import Box
from rich.console import Console
from rich.table import Table

from raytrain_hetero.atomic import atomic_write, atomic_write_text
from raytrain_hetero.core.records import StepRecord

__all__ = [
    "METRICS_COLUMNS",
    "format_worker_table",
    "plot_worker_throughput",
    "read_metrics_csv",
    "write_metrics_csv",
    "write_summary",
]

logger = logging.getLogger(__name__)

#: Columns of the metrics CSV, in order: the fields of :class:`StepRecord`.
METRICS_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(StepRecord))

# Field types as annotated (strings: the module uses postponed annotations).
_INT_COLUMNS = frozenset(f.name for f in fields(StepRecord) if f.type in ("int", int))
_STR_COLUMNS = frozenset(f.name for f in fields(StepRecord) if f.type in ("str", str))
_BOOL_COLUMNS = frozenset(f.name for f in fields(StepRecord) if f.type in ("bool", bool))


def _as_row(record: StepRecord | Mapping[str, Any]) -> Mapping[str, Any]:
    return record.to_dict() if isinstance(record, StepRecord) else record


# ------------------------------------------------------------------------------ CSV


def write_metrics_csv(
    records: Iterable[StepRecord | Mapping[str, Any]], path: str | os.PathLike[str]
) -> Path:
    """Write step records (StepRecords or mappings) as CSV with exactly :data:`METRICS_COLUMNS`;
    returns the path.

    Other keys are ignored, a missing key (or ``None``) is an empty cell; floats are written with
    ``repr`` precision, so they read back exactly.
    """
    rows = [_as_row(r) for r in records]

    def write(fh: IO[str]) -> None:
        writer = csv.DictWriter(
            fh, fieldnames=METRICS_COLUMNS, extrasaction="ignore", restval="", lineterminator="\n"
        )
        writer.writeheader()
        for rec in rows:
            writer.writerow({k: "" if rec.get(k) is None else rec[k] for k in METRICS_COLUMNS})

    out = atomic_write(path, write)
    logger.debug("wrote %d metric rows to %s", len(rows), out)
    return out


def read_metrics_csv(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Read a CSV written by :func:`write_metrics_csv` back into step records.

    Each column comes back as its StepRecord field's type (``int``, ``str``, ``bool``,
    else ``float``); empty cells as ``None``. A complete row converts with
    :meth:`StepRecord.from_dict`.
    """
    out: list[dict[str, Any]] = []
    with open(path, encoding="utf-8", newline="") as fh:
        for row in csv.DictReader(fh):
            rec: dict[str, Any] = {}
            for key, text in row.items():
                if text is None or text == "":
                    rec[key] = None
                elif key in _STR_COLUMNS:
                    rec[key] = text
                elif key in _BOOL_COLUMNS:
                    rec[key] = text == "True"
                elif key in _INT_COLUMNS:
                    rec[key] = int(text)
                else:
                    rec[key] = float(text)
            out.append(rec)
    return out


# ------------------------------------------------------------------------------ JSON


def _finite(value: Any, where: str, bad: list[str]) -> Any:
    """JSON-ready copy of ``value``: non-finite floats -> ``None`` (their paths go to ``bad``)."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalars
        with contextlib.suppress(TypeError, ValueError):
            value = value.item()
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        bad.append(where or "(root)")
        return None
    if isinstance(value, Mapping):
        return {
            str(k): _finite(v, f"{where}.{k}" if where else str(k), bad) for k, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_finite(v, f"{where}[{i}]", bad) for i, v in enumerate(value)]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def write_summary(summary: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write a run summary as JSON (sorted keys, indent 2), atomically; returns the path.

    NaN and infinities are not JSON: they are written as ``null`` and a warning names the keys.
    Paths become strings, numpy scalars plain numbers, tuples lists.
    """
    bad: list[str] = []
    clean = _finite(summary, "", bad)
    if bad:
        logger.warning("summary: non-finite values written as null: %s", ", ".join(bad))
    text = json.dumps(clean, sort_keys=True, indent=2, allow_nan=False) + "\n"
    return atomic_write_text(path, text)


# ------------------------------------------------------------------------------ plot


def _num(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def plot_worker_throughput(
    records: Iterable[StepRecord | Mapping[str, Any]],
    path: str | os.PathLike[str],
    title: str = "Per-worker throughput",
) -> Path:
    """Plot each worker's samples/s (top) and slice (bottom) against the step as one PNG, a
    dashed line at every step where ``plan_version`` changes; returns the path.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    by_worker: dict[str, list[Mapping[str, Any]]] = {}
    plan_at_step: dict[int, int] = {}
    for rec in map(_as_row, records):
        if rec.get("step") is None:
            continue
        step = int(rec["step"])
        by_worker.setdefault(str(rec.get("worker", rec.get("rank", "?"))), []).append(rec)
        if rec.get("plan_version") is not None:
            version = int(rec["plan_version"])
            plan_at_step[step] = max(version, plan_at_step.get(step, version))

    fig = Figure(figsize=(10, 6.5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax_tp, ax_sl = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    fig.suptitle(title)

    def first_rank(name: str) -> tuple[float, str]:
        ranks = [_num(r.get("rank")) for r in by_worker[name]]
        return (min((r for r in ranks if not math.isnan(r)), default=math.inf), name)

    for name in sorted(by_worker, key=first_rank):
        recs = sorted(by_worker[name], key=lambda r: int(r["step"]))
        steps = [int(r["step"]) for r in recs]
        throughput = [_num(r.get("samples_per_s")) for r in recs]
        (line,) = ax_tp.plot(steps, throughput, label=name, lw=1.2)
        slices = [_num(r.get("slice")) for r in recs]
        ax_sl.step(steps, slices, where="post", color=line.get_color(), lw=1.2)

    changes = [
        (s, v) for (_, u), (s, v) in itertools.pairwise(sorted(plan_at_step.items())) if v != u
    ]
    for i, (step, version) in enumerate(changes):
        for ax in (ax_tp, ax_sl):
            ax.axvline(
                step,
                color="0.35",
                ls="--",
                lw=0.9,
                label=("plan change" if (ax is ax_tp and i == 0) else None),
            )
        ax_sl.annotate(
            f"v{version}",
            (step, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(2, -2),
            textcoords="offset points",
            va="top",
            fontsize=8,
            color="0.35",
        )

    if by_worker:
        ax_tp.set_ylim(bottom=0)
        ax_sl.set_ylim(bottom=0)
    ax_tp.set_ylabel("samples / s")
    ax_tp.grid(alpha=0.3)
    ax_sl.set_ylabel("slice (samples / step)")
    ax_sl.set_xlabel("step")
    ax_sl.grid(alpha=0.3)
    if by_worker:
        ax_tp.legend(loc="best", fontsize=8, ncol=min(4, len(by_worker) + bool(changes)))
    else:
        logger.warning("plot_worker_throughput: no step records; writing an empty plot")
        ax_tp.text(0.5, 0.5, "no step records", ha="center", va="center", transform=ax_tp.transAxes)

    out = atomic_write(path, lambda fh: fig.savefig(fh, format="png"), binary=True)
    logger.debug("wrote throughput plot %s (%d workers)", out, len(by_worker))
    return out


# ------------------------------------------------------------------------------ table

_TABLE_COLUMNS: tuple[tuple[str, str, str], ...] = (
    # (header, key, alignment)
    ("rank", "rank", ">"),
    ("worker", "worker", "<"),
    ("device", "device", "<"),
    ("samples/s", "samples_per_s", ">"),
    ("slice", "slice", ">"),
    ("weight", "weight", ">"),
)


def _cell(key: str, value: Any) -> str:
    formats = {"samples_per_s": "{:.1f}", "weight": "{:.3f}", "rank": "{:g}", "slice": "{:g}"}
    if value is None:
        return "-"
    try:
        number = float(value) if key in formats else None
    except (TypeError, ValueError):
        number = None
    if number is None:
        return str(value) or "-"
    if not math.isfinite(number):
        return "-"
    return (
        str(int(number))
        if key in ("rank", "slice") and number.is_integer()
        else formats[key].format(number)
    )


# Header, a dashed rule under every column (spaces between columns), rows; nothing else.
_RULED_HEAD = Box(
    "    \n    \n -  \n    \n    \n    \n    \n    \n",
    ascii=True,
)


def format_worker_table(rows: Sequence[Mapping[str, Any]], layout_header: str | None = None) -> str:
    """Render worker rows as a plain-text table (rank, worker, device, samples/s, slice, weight;
    missing or non-finite values as ``-``), without a trailing newline.

    ``layout_header`` (a model-parallel run: ``"kernels"``, ``"branches"``) shows each rank's
    share of the model (the rows' ``layout``) instead of the slice: every rank of a group reads
    its replica's whole slice, so a per-rank slice would mislead.
    """
    table = Table(
        box=_RULED_HEAD, show_edge=False, pad_edge=False, padding=0, header_style="", safe_box=True
    )
    columns = _TABLE_COLUMNS
    if layout_header is not None:
        columns = tuple(
            (layout_header, "layout", "<") if key == "slice" else (header, key, align)
            for header, key, align in _TABLE_COLUMNS
        )
    for header, _, align in columns:
        table.add_column(header, justify="right" if align == ">" else "left", no_wrap=True)
    for row in rows:
        table.add_row(*(_cell(key, row.get(key)) for _, key, _ in columns))
    # Plain text: no colour, no terminal width limit (rows are never wrapped or cut).
    console = Console(
        file=io.StringIO(),
        width=10_000,
        color_system=None,
        force_terminal=False,
        highlight=False,
        markup=False,
        emoji=False,
    )
    console.print(table)
    return "\n".join(line.rstrip() for line in console.file.getvalue().splitlines())


def format_admission_table(admission: Mapping[str, Any]) -> str:
    """Render a group decision (``worker.plan.admission.admission_record``) as plain text.

    One line per worker, fastest first: its samples/s alone, the gradient all-reduce of the
    workers up to it, the predicted group samples/s without and with it training, its verdict
    (train, FEED, STAND BY) and why; then the decision's summary.
    """
    collective = [float(c) for c in admission["collective_s"]]
    lines = [
        "group: samples/s = B / (makespan + gradient all-reduce of the group), the best "
        "group that beats every worker training by more than the noise margin; fastest first",
        f"{'order':>5}  {'rank':>4}  {'worker':<16} {'alone/s':>9} {'all-reduce':>10} "
        f"{'group w/o':>10} {'group with':>10}  verdict",
    ]
    for w in sorted(admission["workers"], key=lambda w: w["order"]):
        verdict = str(w.get("verdict", "train" if w["admitted"] else "stand_by"))
        word = "train" if verdict == "train" else verdict.replace("_", " ").upper()
        reduce_ms = f"{collective[w['order']] * 1e3:.1f} ms"
        lines.append(
            f"{w['order']:>5}  {w['rank']:>4}  {w['worker']:<16} {w['alone_samples_per_s']:>9.1f} "
            f"{reduce_ms:>10} {w['without_samples_per_s']:>10.1f} "
            f"{w['with_samples_per_s']:>10.1f}  {word}: {w['reason']}"
        )
    lines.append(str(admission.get("summary", "")))
    return "\n".join(line.rstrip() for line in lines)
