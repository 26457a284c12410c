"""Large-cluster simulator: the real allocation and re-planning policy on simulated workers.

Drives :func:`raytrain_hetero.core.allocation.allocate` and
:func:`raytrain_hetero.core.policy.decide` (the code the live scheduler runs) with simulated
per-worker speed traces, for 10 to 10,000 workers, and compares four ways of carving each
synchronous step's global batch:

* ``equal``: B/N per worker (what stock DDP does);
* ``static``: one probe at the start of every worker group (noisy measurement of the true
  costs), then a fixed makespan-optimal plan (raytrain_hetero with ``live=False``);
* ``live``: the same start, then the live policy re-plans from per-step busy times, with the
  same windows, hysteresis and plan-agreement delay as the scheduler actor;
* ``oracle``: the makespan-optimal plan for the *true* current costs at every step, free of
  charge. It is the optimum of this data-parallel scheme, the yardstick for the others.

Worker model: step time ``t_i = (alpha_i + beta_i(s) * b_i) * noise_i(s)``; ``beta`` is
lognormally spread across workers, drifts as a random walk in log space, and some workers slow
down suddenly; some fail and some join (each membership change restarts the group, as a Ray
Train elastic resize does: a restart cost for everyone, a probe for the probing strategies).
A step lasts the slowest worker's time plus an allreduce of the gradients (2(N-1)/N of the
model's bytes over the link, as a ring moves them, and 2 log2(N) latency hops, as a tree
does). Measurement noise is per worker and step, so a bigger group waits for a longer tail:
that loss is the oracle's too.

Pure: standard library, numpy and :mod:`raytrain_hetero.core` (no Ray, no torch), so it runs
anywhere in seconds. ``raytrain-hetero sim`` prints the table and writes a plot.

Modules: :mod:`~raytrain_hetero.sim.traces` (settings, simulated worker costs),
:mod:`~raytrain_hetero.sim.strategies` (the simulation loop and sweeps) and this one (the
table, the plot and the command line; it re-exports the public names of the other two).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from raytrain_hetero.sim.strategies import (
    STRATEGIES,
    StrategyResult,
    allocation_time,
    run_sweep,
    simulate,
)
from raytrain_hetero.sim.traces import JOIN_CALIBRATION, SimConfig

__all__ = [
    "ALLOCATION_GOAL_MS",
    "STRATEGIES",
    "SimConfig",
    "StrategyResult",
    "add_arguments",
    "allocation_time",
    "format_table",
    "main",
    "plot_results",
    "run_from_args",
    "run_sweep",
    "simulate",
]

#: Goal: a plan (and a policy decision) for 10,000 workers in under this many milliseconds.
ALLOCATION_GOAL_MS = 50.0

#: Goal: live re-planning reaches this fraction of the oracle's samples/s.
LIVE_GOAL = 0.95

# ----------------------------------------------------------------------------- output


def format_table(sweep: dict[str, Any]) -> str:
    """Fixed-width table of a sweep, with the allocation-time goal beside the timings."""
    header = (
        f"{'workers':>7}  {'strategy':<8}  {'samples/s':>11}  {'eff vs opt':>10}  "
        f"{'step eff':>8}  {'eff vs sum s':>12}  {'replans':>7}  {'moved/replan':>12}  "
        f"{'restarts':>8}"
    )
    lines = [header, "-" * len(header)]
    for row in sweep["rows"]:
        lines.append(
            f"{row['workers']:>7}  {row['strategy']:<8}  {row['samples_per_s']:>11.0f}  "
            f"{row['efficiency_vs_optimum']:>10.3f}  {row['stepping_efficiency']:>8.3f}  "
            f"{row['efficiency_vs_bound']:>12.3f}  "
            f"{row['replans']:>7}  {row['moved_fraction']:>12.1%}  {row['restarts']:>8}"
        )
    lines.append("")
    lines.append(
        f"{'workers':>7}  {'allocate ms':>11}  {'decide ms':>10}  {'decide cols ms':>14}  "
        f"{'sim s':>7}"
    )
    for n, t in sweep["timings"].items():
        lines.append(
            f"{n:>7}  {t['allocate_ms']:>11.2f}  {t['decide_ms']:>10.1f}  "
            f"{t.get('decide_columns_ms', float('nan')):>14.1f}  {t['simulation_s']:>7.1f}"
        )
    biggest = max(sweep["timings"], key=int)
    ms = sweep["timings"][biggest]["allocate_ms"]
    both = ms + sweep["timings"][biggest]["decide_ms"]
    for what, value in (("plan", ms), ("decide (from StepSample objects) + allocate", both)):
        verdict = (
            "not met"
            if value >= ALLOCATION_GOAL_MS
            else ("met" if int(biggest) >= 10_000 else "not measured at 10,000 workers")
        )
        lines.append(
            f"{what} for {int(biggest):,} workers: {value:.1f} ms "
            f"(goal: < {ALLOCATION_GOAL_MS:.0f} ms for 10,000 workers): {verdict}"
        )
    live = [r for r in sweep["rows"] if r["strategy"] == "live"]
    if live:
        worst = min(r["efficiency_vs_optimum"] for r in live)
        worst_step = min(r["stepping_efficiency"] for r in live)
        lines.append(
            f"live vs oracle: >= {worst:.3f} overall, >= {worst_step:.3f} while stepping "
            f"(goal: >= {LIVE_GOAL:.2f}): " + ("met" if worst >= LIVE_GOAL else "not met")
        )
    config = sweep["config"]
    lines.append(
        f"restart {config['restart_s']:.1f} s, probe {config['probe_s']:.1f} s per (re)start; "
        f"defaults: {JOIN_CALIBRATION}"
    )
    return "\n".join(lines)


def plot_results(sweep: dict[str, Any], path: str | Path) -> Path:
    """Efficiency vs the optimum per strategy against cluster size, and allocation time."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax_eff, ax_time = fig.subplots(1, 2)
    for strategy in dict.fromkeys(r["strategy"] for r in sweep["rows"]):
        rows = sorted(
            (r for r in sweep["rows"] if r["strategy"] == strategy), key=lambda r: r["workers"]
        )
        x, y = [r["workers"] for r in rows], [r["efficiency_vs_optimum"] for r in rows]
        ax_eff.plot(x, y, marker="o", label=strategy)
    sizes = sorted(int(n) for n in sweep["timings"])
    for key, marker, label in (
        ("allocate_ms", "o", "allocate (one plan)"),
        ("decide_ms", "s", "decide (estimates + plan)"),
    ):
        y = [sweep["timings"][str(n)][key] for n in sizes]
        ax_time.plot(sizes, y, marker=marker, label=label)
    ax_time.axhline(ALLOCATION_GOAL_MS, color="0.4", ls="--", lw=1, label="goal: 50 ms")
    ax_eff.set_ylim(0, 1.05)
    ax_time.set_yscale("log")
    for ax, title, ylabel in (
        (
            ax_eff,
            "Simulated: drift, sudden slowdowns, a failure, a join",
            "efficiency vs optimum (oracle time / time)",
        ),
        (ax_time, "Planning time", "milliseconds"),
    ):
        ax.set(xscale="log", xlabel="workers", ylabel=ylabel, title=title)
        ax.grid(alpha=0.3)
        ax.legend()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out


#: The ``SimConfig`` fields ``raytrain-hetero sim`` sets (option ``--sudden-fraction`` for
#: ``sudden_fraction``; default: the field's), with their help.
_OPTIONS: dict[str, str] = {
    "steps": "steps per run",
    "seed": "seed of the simulated cluster",
    "spread": "lognormal sigma of worker speeds",
    "drift": "per-step sigma of the log-speed random walk",
    "noise": "per-step noise sigma of step times",
    "sudden_fraction": "fraction of workers that slow down suddenly",
    "fail_fraction": "fraction of workers that fail",
    "join_fraction": "workers that join, as a fraction of the starting count",
    "restart_s": "seconds a restart costs (the measured join)",
    "probe_s": "seconds a probe costs per (re)start (the measured join)",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``raytrain-hetero sim`` (also ``python -m raytrain_hetero.sim.simulator``)."""
    parser.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[10, 100, 1000, 10000],
        help="cluster sizes to simulate (default 10 100 1000 10000)",
    )
    for name, text in _OPTIONS.items():
        default = getattr(SimConfig, name)
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, type=type(default), default=default, help=f"{text} ({default})")
    parser.add_argument(
        "--output",
        type=Path,
        default=Path("outputs/sim"),
        help="directory for bench.json and sim.png (default outputs/sim)",
    )


def run_from_args(args: argparse.Namespace) -> int:
    """Run a sweep from parsed arguments; print the table, write bench.json and sim.png."""
    base = SimConfig(workers=min(args.workers), **{name: getattr(args, name) for name in _OPTIONS})
    sweep = run_sweep(args.workers, base=base)
    sweep["command"] = _command_line(args)
    print(
        "SIMULATED cluster (no real workers): the real core.allocation and core.policy on "
        "synthetic speed traces"
    )
    table = format_table(sweep)
    print(table)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "bench.json").write_text(json.dumps(sweep, indent=2, default=_json_default))
    (args.output / "COMMAND").write_text(sweep["command"] + "\n")
    (args.output / "table.txt").write_text(table + "\n")
    plot_results(sweep, args.output / "sim.png")
    print(f"wrote {args.output / 'bench.json'} and {args.output / 'sim.png'}")
    return 0


def _command_line(args: argparse.Namespace) -> str:
    """The ``raytrain-hetero sim`` command that repeats this sweep (every option explicit)."""
    import shlex

    words = ["raytrain-hetero", "sim", "--workers", *map(str, args.workers)]
    for option in (*_OPTIONS, "output"):
        words += ["--" + option.replace("_", "-"), str(getattr(args, option))]
    return shlex.join(words)


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m raytrain_hetero.sim.simulator``."""
    parser = argparse.ArgumentParser(
        prog="raytrain-hetero sim", description=__doc__.splitlines()[0]
    )
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
