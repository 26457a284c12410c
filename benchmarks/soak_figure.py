#!/usr/bin/env python3
"""The soak's figure and totals, from one or several ``benchmarks/soak.py`` runs.

Reads each run's printed report (the per-fault table and the JSON summary on its last line)
and its ``--out`` folder's fault markers (``soak/faults/*.fired.json``: what fired, where and
when), and writes:

* ``summary.txt``: one line per run and the totals (faults injected of drawn, node losses,
  preemptions with notice, survived, samples lost, restores matched, largest parameter
  difference, worker groups started, wall time), and the drawn faults by action and phase;
* ``soak.png``: the drawn faults firing (a scheduler kill only if its marker says it found and
  killed the actor, as the soak counts it) over each run's wall time (cumulative, one line per
  run) and their counts by phase and action.

    python benchmarks/soak_figure.py --run /tmp/soak/soak_seed10.txt:/tmp/soak/ledgers_10 \\
        --run ... --output benchmarks/results/soak_1000
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raytrain_hetero.worker.setup.faults import KILLED_SCHEDULER

__all__ = ["SoakRun", "main", "read_run", "totals"]

ACTIONS = ("kill", "hang", "kill_scheduler")
PHASES = ("probe", "calibration", "plan_switch", "mid_epoch", "checkpoint_commit")


@dataclass(frozen=True)
class SoakRun:
    """One soak run: its summary and the drawn faults that fired.

    Attributes:
        name: The run's label (its report's file name).
        summary: The JSON summary the soak printed last.
        fired: ``(time, action, phase)`` of every drawn fault whose marker says it fired.
    """

    name: str
    summary: dict[str, Any]
    fired: tuple[tuple[float, str, str], ...]


def read_run(report: Path, out: Path) -> SoakRun:
    """Read one run from its printed report and its ``--out`` folder.

    Raises:
        ValueError: The report has no JSON summary (the run did not finish).
    """
    lines = [line for line in report.read_text().splitlines() if line.startswith("{")]
    if not lines:
        raise ValueError(f"{report}: no JSON summary line; did the soak run finish?")
    summary = json.loads(lines[-1])
    fired = []
    for marker in sorted((out / "soak" / "faults").glob("*.fired.json")):
        data = json.loads(marker.read_text())
        action = data["what"].split(" ", 1)[0]
        if action == "kill_scheduler" and data.get("effect") != KILLED_SCHEDULER:
            continue  # fired, but found no actor to kill: not injected (as the soak counts)
        fired.append((float(data["time"]), action, data["phase"]))
    return SoakRun(report.stem, summary, tuple(sorted(fired)))


def totals(runs: list[SoakRun]) -> dict[str, Any]:
    """The runs' figures added up (the worst of the per-run checks)."""
    keys = ("faults_injected", "faults_drawn", "node_losses", "notice_preemptions", "survived")
    sums: dict[str, Any] = {key: sum(int(r.summary[key]) for r in runs) for key in keys}
    lost = [r.summary["samples_lost"] for r in runs]
    sums["samples_lost"] = sum(lost) if all(isinstance(x, int) for x in lost) else lost
    sums["restores_matched"] = (
        "yes" if all(r.summary["restores_matched"] == "yes" for r in runs) else "NO"
    )
    diffs = [r.summary["max_param_diff"] for r in runs]
    sums["max_param_diff"] = max(diffs) if all(isinstance(d, float) for d in diffs) else diffs
    sums["worker_groups_started"] = sum(int(r.summary["worker_groups_started"] or 0) for r in runs)
    sums["soak_s"] = round(sum(float(r.summary["soak_s"]) for r in runs), 1)
    sums["runs"] = len(runs)
    return sums


def _summary_text(runs: list[SoakRun]) -> str:
    lines = []
    for run in runs:
        lines.append(f"{run.name}: {json.dumps(run.summary)}")
    total = totals(runs)
    lines.append("")
    lines.append(
        f"total over {total['runs']} runs: faults injected {total['faults_injected']}/"
        f"{total['faults_drawn']} (node losses {total['node_losses']}, preemptions with notice "
        f"{total['notice_preemptions']})   survived {total['survived']}   samples lost "
        f"{total['samples_lost']}   restores matched {total['restores_matched']}   "
        f"max |param diff| {total['max_param_diff']}   worker groups started "
        f"{total['worker_groups_started']}   soak wall {total['soak_s']:.0f} s"
    )
    counts = Counter((action, phase) for run in runs for _, action, phase in run.fired)
    lines.append("")
    lines.append("drawn faults fired, by phase and action:")
    lines.append(f"{'phase':<18}" + "".join(f"{a:>16}" for a in ACTIONS))
    for phase in PHASES:
        lines.append(f"{phase:<18}" + "".join(f"{counts[(a, phase)]:>16}" for a in ACTIONS))
    lines.append(json.dumps(total))
    return "\n".join(lines) + "\n"


def _plot(runs: list[SoakRun], path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2))
    FigureCanvasAgg(fig)
    timeline, bars = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 2]})
    for run in runs:
        if not run.fired:
            continue
        start = run.fired[0][0]
        minutes = [(t - start) / 60.0 for t, _, _ in run.fired]
        timeline.step(minutes, range(1, len(minutes) + 1), where="post", label=run.name)
    timeline.set_xlabel("minutes since the run's first fault")
    timeline.set_ylabel("drawn faults fired (cumulative)")
    total = totals(runs)
    timeline.set_title(
        f"{total['faults_injected']} faults injected in {total['runs']} runs: "
        f"{total['samples_lost']} samples lost, restores matched {total['restores_matched']}",
        fontsize=10,
    )
    timeline.legend(fontsize=8)
    counts = Counter((action, phase) for run in runs for _, action, phase in run.fired)
    width = 0.8 / len(ACTIONS)
    for i, action in enumerate(ACTIONS):
        xs = [p + i * width for p in range(len(PHASES))]
        bars.bar(xs, [counts[(action, phase)] for phase in PHASES], width, label=action)
    bars.set_xticks([p + width for p in range(len(PHASES))])
    bars.set_xticklabels([p.replace("_", "\n") for p in PHASES], fontsize=8)
    bars.set_ylabel("faults")
    bars.set_title(
        f"+ {total['node_losses']} node losses, {total['notice_preemptions']} preemptions "
        "with notice",
        fontsize=10,
    )
    bars.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--run",
        action="append",
        required=True,
        help="REPORT:OUT, the soak's printed report and its --out folder (repeat per run)",
    )
    parser.add_argument("--output", type=Path, required=True)
    args = parser.parse_args(argv)
    runs = []
    for spec in args.run:
        report, _, out = spec.partition(":")
        if not out:
            parser.error(f"--run {spec!r}: expected REPORT:OUT")
        runs.append(read_run(Path(report), Path(out)))
    args.output.mkdir(parents=True, exist_ok=True)
    text = _summary_text(runs)
    (args.output / "summary.txt").write_text(text)
    _plot(runs, args.output / "soak.png")
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
