"""``python -m benchmarks.tune_check DIR...``: the simulator checked against real searches.

For every ``timeline.json`` under the given directories (``benchmarks.tune_asha`` writes one
per ``auto`` and ``fixed`` search), the simulator (:func:`~raytrain_hetero.sim.tune_replay.
predict_run`) predicts the search's makespan from what the search measured (its trials'
launches, starts, epochs and step costs, the per-epoch overhead, restarts, contention and
errors: :func:`benchmarks.tune_record.recorded_run`), and the table gives the error per run.
``--output`` writes ``check.json`` and ``check.md`` there.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.tune_record import recorded_run
from raytrain_hetero.atomic import atomic_write_text
from raytrain_hetero.sim.tune_replay import predict_run

__all__ = ["TARGET_ERROR", "check_timelines", "format_check", "main"]

#: Done-when of issue 44: the simulator predicts each real makespan within 15 %.
TARGET_ERROR = 0.15


def check_timelines(paths: Sequence[Path]) -> list[dict[str, Any]]:
    """One row per timeline: measured and predicted makespan, the error, the moves, and the
    measured inputs the prediction used."""
    rows = []
    for path in paths:
        timeline = json.loads(Path(path).read_text())
        run = recorded_run(timeline)
        prediction = predict_run(run)
        events = (timeline.get("allocation") or {}).get("events") or []
        rows.append(
            {
                "timeline": str(path),
                "contender": run.policy,
                "trials": len(run.trials),
                "epochs": sum(t.epochs for t in run.trials),
                "measured_s": prediction.measured_s,
                "predicted_s": prediction.makespan_s,
                "error": prediction.error,
                "moves_predicted": prediction.moves,
                "moves_measured": sum(1 for e in events if e.get("gain_s") is not None),
                "inputs": {
                    "epoch_overhead_s": run.epoch_overhead_s,
                    "restart_s": run.restart_s,
                    "contention": run.contention,
                    "step_error": run.step_error,
                    "tail_s": run.tail_s,
                    "first_starts_s": [round(t.start_s, 1) for t in run.trials],
                },
            }
        )
    return rows


def format_check(rows: Sequence[dict[str, Any]]) -> str:
    """The table (Markdown)."""
    lines = [
        "| run | contender | trials / epochs | measured s | predicted s | error | moves "
        "(predicted / measured) | overhead s / restart s / contention |",
        "|---|---|---|---:|---:|---:|---|---|",
    ]
    for r in rows:
        i = r["inputs"]
        lines.append(
            f"| {Path(r['timeline']).parent} | {r['contender']} | {r['trials']} / {r['epochs']} "
            f"| {r['measured_s']:.0f} | {r['predicted_s']:.0f} | {r['error']:+.1%} | "
            f"{r['moves_predicted']} / {r['moves_measured']} | {i['epoch_overhead_s']:.1f} / "
            f"{i['restart_s']:.0f} / {i['contention']:.2f} |"
        )
    if rows:
        worst = max(abs(r["error"]) for r in rows)
        met = "met" if worst <= TARGET_ERROR else "NOT met"
        lines += ["", f"Largest error {worst:.1%} (goal within {TARGET_ERROR:.0%}): {met}."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.tune_check DIR... [--output DIR]``."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tune_check", description=__doc__)
    parser.add_argument("dirs", nargs="+", type=Path, help="searched for timeline.json files")
    parser.add_argument("--output", type=Path, default=None)
    args = parser.parse_args(argv)
    paths = sorted(p for d in args.dirs for p in Path(d).rglob("timeline.json"))
    if not paths:
        parser.error(
            f"no timeline.json under {', '.join(map(str, args.dirs))}: run "
            "python -m benchmarks.tune_asha first (runs before issue 44 kept none)"
        )
    rows = check_timelines(paths)
    table = format_check(rows)
    print(table)
    if args.output is not None:
        args.output.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.output / "check.json", json.dumps(rows, indent=1) + "\n")
        atomic_write_text(args.output / "check.md", table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
