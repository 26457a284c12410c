"""PNG plots of a benchmark run (matplotlib's Agg canvas directly: no pyplot, no display)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["plot_accuracy", "plot_conv_split", "plot_throughput", "plot_timeline"]

COLORS = {
    "stock": "#7f7f7f",
    "hdp": "#ff7f0e",
    "hetero": "#1f77b4",
    "hetero-live": "#2ca02c",
    "hetero-nobnsync": "#9467bd",
    "hetero-local": "#8c564b",
    "hetero-ghost16": "#e377c2",
    "hetero-ghost32": "#aec7e8",
    "hetero-static-post": "#d62728",
    "hetero-live-noise": "#bcbd22",
    "gpu-alone": "#17becf",
}


def _figure(size: tuple[float, float]) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


def plot_throughput(result: dict[str, Any], path: Path) -> Path:
    """Median samples/s per contender (bars), each repeat (dots), the sum of alone speeds (—)."""
    fig = _figure((7.5, 4.5))
    ax = fig.subplots()
    names = list(result["contenders"])
    summary = result["summary"]["contenders"]
    for i, name in enumerate(names):
        row = summary.get(name, {})
        ax.bar(i, row.get("samples_per_s", 0) or 0, color=COLORS.get(name, "C0"), alpha=0.8)
        dots = [
            f["figures"]["samples_per_s"]
            for f in result["fits"]
            if f["contender"] == name and f["counted"]
        ]
        ax.plot([i] * len(dots), dots, "k.", ms=6)
        ideal = row.get("ideal_samples_per_s")
        if _finite(ideal):
            ax.hlines(
                ideal,
                i - 0.4,
                i + 0.4,
                colors="k",
                linestyles="--",
                lw=1.2,
                label="sum of alone speeds (physical limit)" if i == 0 else None,
            )
        speedup = row.get("speedup")
        if _finite(speedup) and name != "stock":
            ax.annotate(
                f"{speedup:.2f}x",
                (i, row.get("samples_per_s", 0)),
                ha="center",
                va="bottom",
                xytext=(0, 3),
                textcoords="offset points",
            )
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("training samples / s (median; dots: repeats)")
    factors = ", ".join(format(w["emulated_slowdown"], "g") for w in result.get("workers") or [])
    kind = f"EMULATED heterogeneity (factors {factors})" if result["emulated"] else "no emulation"
    ax.set_title(f"{result['scenario']}: {kind}")
    ax.grid(axis="y", alpha=0.3)
    if any(_finite(summary.get(n, {}).get("ideal_samples_per_s")) for n in names):
        ax.legend(loc="best", fontsize=8)
    return _save(fig, path)


def plot_accuracy(result: dict[str, Any], path: Path) -> Path:
    """Validation accuracy against training seconds, every counted repeat."""
    fig = _figure((7.5, 4.5))
    ax = fig.subplots()
    seen: set[str] = set()
    for fit in result["fits"]:
        if not fit["counted"]:
            continue
        curve = fit["figures"].get("curve") or []
        name = fit["contender"]
        ax.plot(
            [p["train_s"] for p in curve],
            [p["accuracy"] for p in curve],
            marker=".",
            color=COLORS.get(name),
            alpha=0.8,
            lw=1.2,
            label=name if name not in seen else None,
        )
        seen.add(name)
    target = result["options"].get("target_accuracy")
    if _finite(target):
        ax.axhline(target, color="0.3", ls=":", lw=1, label=f"target {target:.2f}")
    ax.set_xlabel("training seconds (evaluation and start-up excluded)")
    ax.set_ylabel("validation accuracy")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(f"{result['scenario']}: accuracy over time")
    return _save(fig, path)


def plot_timeline(
    result: dict[str, Any],
    path: Path,
    *,
    marker: float | None = None,
    marker_label: str = "",
    x: str = "step",
) -> Path:
    """Per-step samples/s of the first counted repeat of each contender against the step
    (``x="step"``, a vertical line at the ``marker`` step), or (``x="join"``) the global step
    against seconds since the join (the line at 0), with the world size on a second axis.
    """
    fig = _figure((9, 4.5))
    ax = fig.subplots()
    ax_world = ax.twinx() if x == "join" else None
    done: set[str] = set()
    for fit in result["fits"]:
        name = fit["contender"]
        if not fit["counted"] or name in done or not fit.get("timeline"):
            continue
        done.add(name)
        points = fit["timeline"]
        xs = [p["step"] if x == "step" else p["since_join_s"] for p in points]
        # Join: progress (global step) over time shows the pause of the restart best.
        ys = [p["samples_per_s"] if x == "step" else p["step"] for p in points]
        ax.plot(
            xs,
            ys,
            color=COLORS.get(name),
            lw=1.2,
            marker="." if x == "join" else None,
            ms=3,
            label=name,
        )
        if ax_world is not None:
            ax_world.step(
                xs,
                [p["world"] for p in points],
                where="post",
                color=COLORS.get(name),
                lw=0.8,
                ls="--",
            )
    if marker is not None:
        ax.axvline(marker, color="0.3", ls=":", lw=1, label=marker_label or None)
    ax.set_xlabel("step" if x == "step" else "seconds since the node joined")
    ax.set_ylabel("samples / s (per step)" if x == "step" else "global step")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    if ax_world is not None:
        ax_world.set_ylabel("workers (dashed)")
        ax_world.set_ylim(0, 4)
    ax.set_title(
        f"{result['scenario']}: "
        + ("per-step throughput" if x == "step" else "training progress around the join")
    )
    return _save(fig, path)


def timeline_points(
    records: Sequence[dict[str, Any]], global_batch_size: int, join_time: float | None = None
) -> list[dict[str, Any]]:
    """Per-step samples/s of rank 0 (B over the gap to the previous step of its process)."""
    from benchmarks.analysis import rank_timelines

    points: list[dict[str, Any]] = []
    for process in rank_timelines(records).get(0, []):
        for prev, cur in itertools.pairwise(process):
            gap = (
                cur["time"]
                - prev["time"]
                - (prev["eval_end"] - prev["eval_start"] if "eval_start" in prev else 0.0)
            )
            if gap <= 0:
                continue
            point = {
                "step": cur["step"],
                "samples_per_s": global_batch_size / gap,
                "world": cur["world"],
                "time": cur["time"],
            }
            if join_time is not None:
                point["since_join_s"] = cur["time"] - join_time
            points.append(point)
    return points


MP_COLORS = {"alone": "#7f7f7f", "equal": "#ff7f0e", "proportional": "#1f77b4", "data": "#2ca02c"}


def plot_conv_split(result: dict[str, Any], path: Path) -> Path:
    """Left: speed-up over the fastest worker alone vs batch size, per configuration and
    contender. Right: step time vs emulated per-byte link delay (the bandwidth crossover)."""
    fig = _figure((11.0, 4.5))
    left, right = fig.subplots(1, 2)
    styles = itertools.cycle(["-", "--", ":", "-."])
    for config, style in zip(result["configs"], styles):
        rows = config["figures"]["rows"]
        for name in ("equal", "proportional", "data"):
            points = sorted((r["batch"], r["speedup"]) for r in rows if r["contender"] == name)
            if points:
                left.plot(
                    [b for b, _ in points],
                    [v for _, v in points],
                    style,
                    marker="o",
                    color=MP_COLORS[name],
                    label=f"{config['label']} {name}",
                )
        left.axhline(config["figures"]["ideal_speedup"], color="k", ls=style, lw=0.6)
    left.set_xscale("log", base=2)
    left.set_xlabel("global batch size")
    left.set_ylabel("speed-up over the fastest worker alone (whole step)")
    left.set_title("conv split vs data parallelism (thin black: sum of speeds)")
    left.legend(fontsize=6, ncol=2)
    for config, style in zip(result["configs"], itertools.cycle(["-", "--", ":"])):
        sweep = config["figures"]["sweep"]
        if not sweep:
            continue
        delays = [e["delay_ms_per_mb"] for e in sweep]
        right.plot(
            delays,
            [e["proportional_s"] for e in sweep],
            style,
            marker="o",
            color=MP_COLORS["proportional"],
            label=f"{config['label']} proportional split",
        )
        right.plot(
            delays,
            [e["data_s"] for e in sweep],
            style,
            marker="s",
            color=MP_COLORS["data"],
            label=f"{config['label']} data parallel",
        )
    right.set_xlabel("EMULATED link delay (ms per MB a worker sends)")
    right.set_ylabel("step seconds")
    right.set_title("bandwidth sweep" if right.lines else "bandwidth sweep (not run)")
    if right.lines:
        right.legend(fontsize=7)
    import textwrap

    fig.suptitle("\n".join(textwrap.wrap(result.get("note", ""), 160)), fontsize=7)
    return _save(fig, path)
