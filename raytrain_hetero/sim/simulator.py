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
model's bytes over the link, as a ring moves them, and 2 log2(N) latency hops, as a tree does). Measurement noise is per worker
and step, so a bigger group waits for a longer tail: that loss is the oracle's too.

Pure: standard library, numpy and :mod:`raytrain_hetero.core` (no Ray, no torch), so it runs
anywhere in seconds. ``raytrain-hetero sim`` prints the table and writes a plot.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from raytrain_hetero.core.allocation import CostModel, allocate, proportional_slices
from raytrain_hetero.core.policy import PolicyConfig, PolicyState, Replan, StepSample, decide

__all__ = [
    "STRATEGIES",
    "SimConfig",
    "StrategyResult",
    "allocation_time",
    "format_table",
    "main",
    "plot_results",
    "run_sweep",
    "simulate",
]

STRATEGIES: tuple[str, ...] = ("equal", "static", "live", "oracle")

#: Goal: a plan for 10,000 workers in under this many milliseconds.
ALLOCATION_GOAL_MS = 50.0


@dataclass(frozen=True)
class SimConfig:
    """One simulated cluster and run.

    Attributes:
        workers: Workers at the start.
        steps: Synchronous steps to simulate.
        batch_per_worker: Global batch = this times the starting worker count (fixed after).
        sample_s: Median seconds per sample across workers.
        spread: Sigma of the lognormal spread of per-sample cost across workers.
        alpha_s: Median fixed seconds per step.
        alpha_spread: Sigma of the lognormal spread of the fixed cost across workers.
        drift: Per-step sigma of each worker's log-speed random walk.
        noise: Per-step, per-worker sigma of lognormal multiplicative noise on step time.
        sudden_fraction: Fraction of workers (at least one if > 0) that slow down suddenly.
        sudden_factor: Their slowdown factor.
        sudden_at: Step of the sudden slowdown (fraction of ``steps``).
        fail_fraction: Fraction of workers (at least one if > 0) that fail.
        fail_at: Step of the failures (fraction of ``steps``).
        join_fraction: Workers that join, as a fraction of the starting count (>= 1 if > 0).
        join_at: Step of the join (fraction of ``steps``).
        probe_error: Sigma of the lognormal relative error of a probe's per-sample cost.
        model_bytes: Gradient bytes all-reduced per step.
        bandwidth_bytes_s: Link bandwidth of the all-reduce.
        latency_s: Per-hop latency of the all-reduce.
        restart_s: Seconds a worker-group restart costs (every strategy).
        probe_s: Extra seconds the probe costs at each (re)start (static and live).
        plan_delay_steps: Steps from a policy decision until every rank uses the plan.
        policy: The live policy's settings (the scheduler's defaults).
        seed: Seed of every random draw (identical traces for every strategy).
    """

    workers: int
    steps: int = 500
    batch_per_worker: int = 64
    sample_s: float = 1e-3
    spread: float = 0.5
    alpha_s: float = 0.005
    alpha_spread: float = 0.3
    drift: float = 0.01
    noise: float = 0.05
    sudden_fraction: float = 0.02
    sudden_factor: float = 3.0
    sudden_at: float = 0.3
    fail_fraction: float = 0.01
    fail_at: float = 0.5
    join_fraction: float = 0.02
    join_at: float = 0.7
    probe_error: float = 0.05
    model_bytes: float = 10e6
    bandwidth_bytes_s: float = 1.25e9
    latency_s: float = 50e-6
    restart_s: float = 5.0
    probe_s: float = 1.0
    plan_delay_steps: int = 5
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if self.batch_per_worker < 1:
            raise ValueError(f"batch_per_worker must be >= 1, got {self.batch_per_worker}")
        for name in ("sudden_fraction", "fail_fraction", "join_fraction"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        for name in ("sudden_at", "fail_at", "join_at"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        if self.sudden_factor < 1.0:
            raise ValueError(f"sudden_factor must be >= 1, got {self.sudden_factor}")

    @property
    def global_batch(self) -> int:
        """Samples per step (fixed for the whole run)."""
        return self.workers * self.batch_per_worker


@dataclass(frozen=True)
class StrategyResult:
    """What one strategy achieved on one simulated run.

    Attributes:
        strategy: equal, static, live or oracle.
        workers: Workers at the start.
        samples_per_s: Samples over total simulated time (restarts and probes included).
        efficiency_vs_optimum: Oracle's total time / this strategy's (1.0 = the optimum).
        efficiency_vs_bound: Samples/s while stepping (restarts and probes excluded) over the
            mean of sum_i(1/beta_i), the physical limit of data parallelism (no fixed cost,
            no communication, no noise).
        total_s: Total simulated seconds (restarts and probes included).
        overhead_s: Seconds of restarts and probes within ``total_s``.
        replans: Plan changes decided by the policy (restarts not counted).
        moved_fraction: Mean fraction of the global batch that changed hands per re-plan.
        restarts: Worker-group restarts (joins and failures).
    """

    strategy: str
    workers: int
    samples_per_s: float
    efficiency_vs_optimum: float
    efficiency_vs_bound: float
    total_s: float
    overhead_s: float
    replans: int
    moved_fraction: float
    restarts: int


# ----------------------------------------------------------------------------- traces


@dataclass
class _Trace:
    """Per-step true costs of every worker slot that ever exists, and who is present."""

    alpha: np.ndarray  # (slots,)
    beta: np.ndarray  # (steps, slots) true seconds per sample
    noise: np.ndarray  # (steps, slots) multiplicative noise on the step time
    present: np.ndarray  # (steps, slots) bool
    probe_error: np.ndarray  # (restarts + 1, slots) multiplicative probe error
    restart_steps: tuple[int, ...]


def _count(fraction: float, of: int) -> int:
    return 0 if fraction <= 0 else max(1, round(fraction * of))


def _make_trace(cfg: SimConfig) -> _Trace:
    rng = np.random.default_rng(cfg.seed)
    n0 = cfg.workers
    joins = _count(cfg.join_fraction, n0)
    slots = n0 + joins
    steps = cfg.steps
    alpha = cfg.alpha_s * rng.lognormal(0.0, cfg.alpha_spread, slots)
    base = cfg.sample_s * rng.lognormal(0.0, cfg.spread, slots)
    walk = np.cumsum(rng.normal(0.0, cfg.drift, (steps, slots)), axis=0)
    beta = base[None, :] * np.exp(walk - walk[:1])
    sudden_step = min(steps - 1, int(cfg.sudden_at * steps))
    sudden = rng.choice(n0, size=min(n0, _count(cfg.sudden_fraction, n0)), replace=False)
    beta[sudden_step:, sudden] *= cfg.sudden_factor
    noise = (
        rng.lognormal(0.0, cfg.noise, (steps, slots)) if cfg.noise > 0 else np.ones((steps, slots))
    )
    present = np.zeros((steps, slots), dtype=bool)
    present[:, :n0] = True
    restart_steps: list[int] = []
    failures = min(n0 - 1, _count(cfg.fail_fraction, n0))
    if failures > 0:
        fail_step = min(steps - 1, max(1, int(cfg.fail_at * steps)))
        gone = rng.choice(n0, size=failures, replace=False)
        present[fail_step:, gone] = False
        restart_steps.append(fail_step)
    if joins > 0:
        join_step = min(steps - 1, max(1, int(cfg.join_at * steps)))
        present[join_step:, n0:] = True
        restart_steps.append(join_step)
    restart_steps = sorted(set(restart_steps))
    probe_error = rng.lognormal(0.0, cfg.probe_error, (len(restart_steps) + 1, slots))
    return _Trace(alpha, beta, noise, present, probe_error, tuple(restart_steps))


def _allreduce_s(cfg: SimConfig, n: int) -> float:
    if n <= 1:
        return 0.0
    # Bandwidth term of a ring; latency term of a tree (log2 N hops each way), as NCCL and
    # gloo switch to for large groups: a flat ring's 2(N-1) hops would dominate at 10,000.
    return (
        2 * math.ceil(math.log2(n)) * cfg.latency_s
        + 2 * (n - 1) / n * cfg.model_bytes / cfg.bandwidth_bytes_s
    )


def _costs(alpha: np.ndarray, beta: np.ndarray) -> list[CostModel]:
    return [CostModel(float(a), float(b)) for a, b in zip(alpha, beta)]


# ----------------------------------------------------------------------------- one strategy


def _run_strategy(cfg: SimConfig, trace: _Trace, strategy: str) -> dict[str, Any]:
    """Simulate one strategy over the trace; returns totals and per-step times."""
    total = cfg.global_batch
    steps = cfg.steps
    step_s = np.zeros(steps)
    overhead_s = 0.0
    replans = 0
    moved: list[float] = []
    restarts = 0
    members = np.flatnonzero(trace.present[0])
    slices: np.ndarray | None = None
    plan_costs: list[CostModel] | None = None
    pending: tuple[int, np.ndarray, list[CostModel]] | None = None
    state = PolicyState()
    window: list[tuple[int, np.ndarray, np.ndarray]] = []  # (step, slices, busy) per step
    clock = 0.0
    restart_index = 0

    def start_group(step: int) -> None:
        nonlocal slices, plan_costs, pending, state, window
        pending = None
        window = []
        n = members.size
        if strategy == "equal":
            slices = np.asarray(proportional_slices(total, [1.0] * n))
            plan_costs = None
        elif strategy in ("static", "live"):
            err = trace.probe_error[restart_index, members]
            plan_costs = _costs(trace.alpha[members], trace.beta[step, members] * err)
            slices = np.asarray(allocate(total, plan_costs))
        state = PolicyState(last_replan_step=step, last_decision_step=step - 1)

    start_group(0)
    for step in range(steps):
        if step in trace.restart_steps:
            members = np.flatnonzero(trace.present[step])
            restarts += 1
            restart_index += 1
            overhead_s += cfg.restart_s + (cfg.probe_s if strategy in ("static", "live") else 0.0)
            start_group(step)
        alpha = trace.alpha[members]
        beta = trace.beta[step, members]
        if strategy == "oracle":
            slices = np.asarray(allocate(total, _costs(alpha, beta)))
        if pending is not None and step >= pending[0]:
            new = pending[1]
            moved.append(float(np.abs(new - slices).sum()) / (2 * total))
            slices, plan_costs = new, pending[2]
            pending = None
            replans += 1
            state = PolicyState(last_replan_step=step, last_decision_step=step - 1)
            window = []
        busy = (alpha + beta * slices) * trace.noise[step, members]
        step_s[step] = float(busy.max()) + _allreduce_s(cfg, members.size)
        clock += step_s[step]
        if strategy != "live" or pending is not None:
            continue
        window.append((step, slices, busy))
        del window[: -cfg.policy.window_steps]
        # decide() returns at once until a window is complete; skip building its inputs.
        if step - state.last_decision_step < cfg.policy.window_steps:
            continue
        samples = [
            StepSample(rank=r, step=s, samples=int(b[r]), busy_s=float(t[r]), time_s=clock)
            for s, b, t in window
            for r in range(members.size)
        ]
        decision, state = decide(
            tuple(int(b) for b in slices),
            samples,
            state,
            cfg.policy,
            clock,
            step=step,
            prior=plan_costs,
        )
        if isinstance(decision, Replan):
            pending = (
                step + cfg.plan_delay_steps,
                np.asarray(decision.slices),
                list(decision.costs),
            )
    bound = float(np.mean([np.sum(1.0 / trace.beta[s, trace.present[s]]) for s in range(steps)]))
    total_s = float(step_s.sum()) + overhead_s
    return {
        "total_s": total_s,
        "samples_per_s": total * steps / total_s,
        "stepping_samples_per_s": total * steps / float(step_s.sum()),
        "overhead_s": overhead_s,
        "bound_samples_per_s": bound,
        "replans": replans,
        "moved_fraction": statistics.fmean(moved) if moved else 0.0,
        "restarts": restarts,
        "step_s": step_s,
    }


def simulate(cfg: SimConfig, strategies: Sequence[str] = STRATEGIES) -> list[StrategyResult]:
    """Run every strategy on the same simulated trace; efficiency is against the oracle."""
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise ValueError(f"unknown strategies {unknown}; choose from {list(STRATEGIES)}")
    trace = _make_trace(cfg)
    runs = {s: _run_strategy(cfg, trace, s) for s in dict.fromkeys([*strategies, "oracle"])}
    oracle = runs["oracle"]["total_s"]
    return [
        StrategyResult(
            strategy=s,
            workers=cfg.workers,
            samples_per_s=runs[s]["samples_per_s"],
            efficiency_vs_optimum=oracle / runs[s]["total_s"],
            efficiency_vs_bound=runs[s]["stepping_samples_per_s"] / runs[s]["bound_samples_per_s"],
            total_s=runs[s]["total_s"],
            overhead_s=runs[s]["overhead_s"],
            replans=runs[s]["replans"],
            moved_fraction=runs[s]["moved_fraction"],
            restarts=runs[s]["restarts"],
        )
        for s in strategies
    ]


def allocation_time(
    workers: int, *, repeats: int = 5, seed: int = 0, batch_per_worker: int = 64
) -> dict[str, float]:
    """Median wall milliseconds of one :func:`allocate` and one :func:`decide` at this size.

    ``decide`` is timed on a full window of samples for every rank (the policy's real work:
    robust per-rank estimates, then an allocation).
    """
    rng = np.random.default_rng(seed)
    costs = _costs(0.005 * rng.lognormal(0, 0.3, workers), 1e-3 * rng.lognormal(0, 0.5, workers))
    total = workers * batch_per_worker
    alloc: list[float] = []
    for _ in range(repeats):
        started = time.perf_counter()
        slices = allocate(total, costs)
        alloc.append((time.perf_counter() - started) * 1e3)
    cfg = PolicyConfig()
    samples = [
        StepSample(
            rank=r,
            step=s,
            samples=slices[r],
            busy_s=costs[r].time(slices[r]) * float(rng.lognormal(0, 0.05)),
            time_s=0.0,
        )
        for s in range(cfg.window_steps)
        for r in range(workers)
    ]
    state = PolicyState(last_replan_step=0, last_decision_step=-1)
    dec: list[float] = []
    for _ in range(max(1, repeats // 2)):
        started = time.perf_counter()
        decide(slices, samples, state, cfg, 0.0, step=cfg.window_steps, prior=costs)
        dec.append((time.perf_counter() - started) * 1e3)
    return {"allocate_ms": statistics.median(alloc), "decide_ms": statistics.median(dec)}


def run_sweep(
    sizes: Sequence[int],
    *,
    base: SimConfig | None = None,
    strategies: Sequence[str] = STRATEGIES,
    timing_repeats: int = 5,
) -> dict[str, Any]:
    """Simulate every size; returns rows (one per size and strategy) and timings per size."""
    base = base or SimConfig(workers=10)
    rows: list[dict[str, Any]] = []
    timings: dict[int, dict[str, float]] = {}
    for n in sizes:
        cfg = replace(base, workers=int(n))
        started = time.perf_counter()
        results = simulate(cfg, strategies)
        elapsed = time.perf_counter() - started
        timings[int(n)] = allocation_time(
            int(n), repeats=timing_repeats, seed=base.seed, batch_per_worker=base.batch_per_worker
        )
        timings[int(n)]["simulation_s"] = elapsed
        rows.extend(asdict(r) for r in results)
    config = asdict(base)
    config.pop("workers")
    return {"config": config, "rows": rows, "timings": {str(k): v for k, v in timings.items()}}


# ----------------------------------------------------------------------------- output


def format_table(sweep: dict[str, Any]) -> str:
    """Fixed-width table of a sweep, with the allocation-time goal beside the timings."""
    header = (
        f"{'workers':>7}  {'strategy':<8}  {'samples/s':>11}  {'eff vs opt':>10}  "
        f"{'eff vs sum s':>12}  {'replans':>7}  {'moved/replan':>12}  {'restarts':>8}"
    )
    lines = [header, "-" * len(header)]
    for row in sweep["rows"]:
        lines.append(
            f"{row['workers']:>7}  {row['strategy']:<8}  {row['samples_per_s']:>11.0f}  "
            f"{row['efficiency_vs_optimum']:>10.3f}  {row['efficiency_vs_bound']:>12.3f}  "
            f"{row['replans']:>7}  {row['moved_fraction']:>12.1%}  {row['restarts']:>8}"
        )
    lines.append("")
    lines.append(f"{'workers':>7}  {'allocate ms':>11}  {'decide ms':>10}  {'sim s':>7}")
    for n, t in sweep["timings"].items():
        lines.append(
            f"{n:>7}  {t['allocate_ms']:>11.2f}  {t['decide_ms']:>10.1f}  {t['simulation_s']:>7.1f}"
        )
    biggest = max(sweep["timings"], key=int)
    ms = sweep["timings"][biggest]["allocate_ms"]
    verdict = (
        "met"
        if int(biggest) >= 10_000 and ms < ALLOCATION_GOAL_MS
        else ("not met" if ms >= ALLOCATION_GOAL_MS else "not measured at 10,000 workers")
    )
    lines.append(
        f"plan for {int(biggest):,} workers: {ms:.1f} ms "
        f"(goal: < {ALLOCATION_GOAL_MS:.0f} ms for 10,000 workers): {verdict}"
    )
    return "\n".join(lines)


def plot_results(sweep: dict[str, Any], path: str | Path) -> Path:
    """Efficiency vs the optimum per strategy against cluster size, and allocation time."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax_eff, ax_time = fig.subplots(1, 2)
    strategies = list(dict.fromkeys(r["strategy"] for r in sweep["rows"]))
    for strategy in strategies:
        rows = sorted(
            (r for r in sweep["rows"] if r["strategy"] == strategy), key=lambda r: r["workers"]
        )
        ax_eff.plot(
            [r["workers"] for r in rows],
            [r["efficiency_vs_optimum"] for r in rows],
            marker="o",
            label=strategy,
        )
    ax_eff.set_xscale("log")
    ax_eff.set_ylim(0, 1.05)
    ax_eff.set_xlabel("workers")
    ax_eff.set_ylabel("efficiency vs optimum (oracle time / time)")
    ax_eff.set_title("Simulated: drift, sudden slowdowns, a failure, a join")
    ax_eff.grid(alpha=0.3)
    ax_eff.legend()
    sizes = sorted(int(n) for n in sweep["timings"])
    ax_time.plot(
        sizes,
        [sweep["timings"][str(n)]["allocate_ms"] for n in sizes],
        marker="o",
        label="allocate (one plan)",
    )
    ax_time.plot(
        sizes,
        [sweep["timings"][str(n)]["decide_ms"] for n in sizes],
        marker="s",
        label="decide (estimates + plan)",
    )
    ax_time.axhline(ALLOCATION_GOAL_MS, color="0.4", ls="--", lw=1, label="goal: 50 ms")
    ax_time.set_xscale("log")
    ax_time.set_yscale("log")
    ax_time.set_xlabel("workers")
    ax_time.set_ylabel("milliseconds")
    ax_time.set_title("Planning time")
    ax_time.grid(alpha=0.3)
    ax_time.legend()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``raytrain-hetero sim`` (also ``python -m raytrain_hetero.sim.simulator``)."""
    parser.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[10, 100, 1000, 10000],
        help="cluster sizes to simulate (default 10 100 1000 10000)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=SimConfig.steps,
        help=f"steps per run (default {SimConfig.steps})",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--spread",
        type=float,
        default=SimConfig.spread,
        help="lognormal sigma of worker speeds (default 0.5)",
    )
    parser.add_argument(
        "--drift",
        type=float,
        default=SimConfig.drift,
        help="per-step sigma of the log-speed random walk (default 0.01)",
    )
    parser.add_argument(
        "--noise",
        type=float,
        default=SimConfig.noise,
        help="per-step noise sigma of step times (default 0.05)",
    )
    parser.add_argument("--sudden-fraction", type=float, default=SimConfig.sudden_fraction)
    parser.add_argument("--fail-fraction", type=float, default=SimConfig.fail_fraction)
    parser.add_argument("--join-fraction", type=float, default=SimConfig.join_fraction)
    parser.add_argument(
        "--output",
        type=Path,
        default=Path("outputs/sim"),
        help="directory for sim.json and sim.png (default outputs/sim)",
    )


def run_from_args(args: argparse.Namespace) -> int:
    """Run a sweep from parsed arguments; print the table, write sim.json and sim.png."""
    base = SimConfig(
        workers=min(args.workers),
        steps=args.steps,
        seed=args.seed,
        spread=args.spread,
        drift=args.drift,
        noise=args.noise,
        sudden_fraction=args.sudden_fraction,
        fail_fraction=args.fail_fraction,
        join_fraction=args.join_fraction,
    )
    sweep = run_sweep(args.workers, base=base)
    sweep["command"] = _command_line(args)
    print(
        "SIMULATED cluster (no real workers): the real core.allocation and core.policy on "
        "synthetic speed traces"
    )
    table = format_table(sweep)
    print(table)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "sim.json").write_text(json.dumps(sweep, indent=2, default=_json_default))
    (args.output / "COMMAND").write_text(sweep["command"] + "\n")
    (args.output / "table.txt").write_text(table + "\n")
    plot_results(sweep, args.output / "sim.png")
    print(f"wrote {args.output / 'sim.json'} and {args.output / 'sim.png'}")
    return 0


def _command_line(args: argparse.Namespace) -> str:
    """The ``raytrain-hetero sim`` command that repeats this sweep (every option explicit)."""
    import shlex

    words = ["raytrain-hetero", "sim", "--workers", *map(str, args.workers)]
    for option in (
        "steps",
        "seed",
        "spread",
        "drift",
        "noise",
        "sudden_fraction",
        "fail_fraction",
        "join_fraction",
        "output",
    ):
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
