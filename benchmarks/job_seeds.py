"""``python -m benchmarks.job_seeds DIR [DIR ...]``: a YAML job per BatchNorm mode and seed.

Reads one directory per job as ``benchmarks/results/ghost_seeds/RUN.sh`` writes it:
``s<S>-bench/bench.json`` (``raytrain-hetero bench``: the stock fit of seed S; optional, a
Lightning job has none) and ``s<S>-<mode>/summary.json`` (``raytrain-hetero train --set
train.seed=S --set train.batchnorm=...``). Prints, in markdown, each mode's final accuracy per
seed, its difference to stock's and to ``exact``'s in points per seed (issue 35's rule: ghost
becomes the default if within 0.5 pt of exact everywhere), and its median samples/s and wall
time; then, per mode, the largest difference to exact in any seed.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from dataclasses import dataclass
from pathlib import Path

__all__ = ["JobFit", "job_fits", "job_table"]

_FIT_DIR = re.compile(r"^s(?P<seed>\d+)-(?P<mode>[A-Za-z0-9_]+)$")


@dataclass(frozen=True)
class JobFit:
    """One fit of a job: its mode (``stock`` for the bench's stock fit) and figures."""

    mode: str
    seed: int
    final_accuracy: float
    samples_per_s: float
    wall_s: float


def job_fits(path: Path) -> list[JobFit]:
    """Every fit under ``path`` (see the module docstring for the layout).

    Raises:
        FileNotFoundError: ``path`` holds no ``s<S>-<mode>`` directory with its file.
    """
    fits = []
    for child in sorted(path.iterdir()):
        match = _FIT_DIR.match(child.name)
        if match is None or not child.is_dir():
            continue
        seed, mode = int(match["seed"]), match["mode"]
        if mode == "bench":
            bench = child / "bench.json"
            if bench.is_file():
                stock = json.loads(bench.read_text())["summary"]["stock"]
                fits.append(
                    JobFit(
                        "stock",
                        seed,
                        stock["final_accuracy"],
                        stock["samples_per_s"],
                        stock["wall_s"],
                    )
                )
            continue
        summary = child / "summary.json"
        if summary.is_file():
            data = json.loads(summary.read_text())
            fits.append(
                JobFit(
                    mode,
                    seed,
                    data["final_val_accuracy"],
                    data["samples_per_s"],
                    data["wall_time_s"],
                )
            )
    if not fits:
        raise FileNotFoundError(
            f"no s<seed>-bench/bench.json or s<seed>-<mode>/summary.json under {path}: pass a "
            "job directory of a seeds run (e.g. benchmarks/results/ghost_seeds/eurosat_local)"
        )
    return fits


def _points(a: float | None, b: float | None) -> str:
    return "" if a is None or b is None else f"{100.0 * (a - b):+.1f}"


def job_table(path: Path) -> str:
    """The markdown of one job directory."""
    fits = job_fits(path)
    seeds = sorted({f.seed for f in fits})
    modes = list(dict.fromkeys(["stock", "exact"] + [f.mode for f in fits]))
    by = {(f.mode, f.seed): f for f in fits}
    modes = [m for m in modes if any((m, s) in by for s in seeds)]

    def acc(mode: str, seed: int) -> float | None:
        fit = by.get((mode, seed))
        return fit.final_accuracy if fit is not None else None

    slash = " / ".join
    lines = [
        f"**{path.name}** (`{path}`; seeds {slash(str(s) for s in seeds)})",
        "",
        "| mode | final acc. per seed | vs stock (pt) per seed | vs exact (pt) per seed"
        " | samples/s (median) | wall s (median) |",
        "|---|---|---|---|---:|---:|",
    ]
    for mode in modes:
        mine = [by[(mode, s)] for s in seeds if (mode, s) in by]
        accuracies = slash(f"{a:.3f}" if (a := acc(mode, s)) is not None else "-" for s in seeds)
        vs_stock = (
            ""
            if mode == "stock" or "stock" not in modes  # a Lightning job has no stock bench
            else slash(_points(acc(mode, s), acc("stock", s)) for s in seeds)
        )
        vs_exact = (
            ""
            if mode in ("stock", "exact") or "exact" not in modes
            else slash(_points(acc(mode, s), acc("exact", s)) for s in seeds)
        )
        lines.append(
            f"| {mode} | {accuracies} | {vs_stock} | {vs_exact} | "
            f"{statistics.median(f.samples_per_s for f in mine):.0f} | "
            f"{statistics.median(f.wall_s for f in mine):.1f} |"
        )
    worst = []
    for mode in modes:
        gaps = [
            100.0 * (a - e)
            for s in seeds
            if mode not in ("stock", "exact")
            and (a := acc(mode, s)) is not None
            and (e := acc("exact", s)) is not None
        ]
        if gaps:
            worst.append(f"| {mode} | {max(gaps, key=abs):+.1f} |")
    if worst:
        lines += ["", "| mode | largest difference to exact in any seed (pt) |", "|---|---:|"]
        lines += worst
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("directories", nargs="+", type=Path)
    args = parser.parse_args()
    missing = [str(p) for p in args.directories if not p.is_dir()]
    if missing:
        parser.error(f"not a directory: {', '.join(missing)}")
    try:
        print("\n".join(job_table(path) for path in args.directories))
    except FileNotFoundError as exc:
        parser.error(str(exc))


if __name__ == "__main__":
    main()
