"""The simulation loop: four ways of carving each step's global batch, run over one trace.

Drives :func:`raytrain_hetero.core.allocation.allocate` and
:func:`raytrain_hetero.core.policy.decide` (the code the live scheduler runs) over a
:class:`~raytrain_hetero.sim.traces.Trace`; the strategies are described in
:mod:`raytrain_hetero.sim.simulator`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from raytrain_hetero.core.allocation import CostModel, allocate, proportional_slices
from raytrain_hetero.core.policy import (
    PolicyConfig,
    PolicyState,
    Replan,
    SampleColumns,
    StepSample,
    decide,
)
from raytrain_hetero.sim.traces import SimConfig, Trace, allreduce_s, cost_models, make_trace

STRATEGIES: tuple[str, ...] = ("equal", "static", "live", "oracle")


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
        stepping_efficiency: Oracle's stepping time / this strategy's (restarts and probes
            excluded): how close the plans alone come to the optimum.
        replan_steps: Steps at which the policy's re-plans took effect.
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
    stepping_efficiency: float = 1.0
    replan_steps: tuple[int, ...] = ()


# ----------------------------------------------------------------------------- one strategy


def _run_strategy(cfg: SimConfig, trace: Trace, strategy: str) -> tuple[StrategyResult, float]:
    """Simulate one strategy over the trace; returns its result (not yet relative to the
    oracle) and its seconds of stepping (restarts and probes excluded)."""
    total = cfg.global_batch
    steps = cfg.steps
    step_s = np.zeros(steps)
    overhead_s = 0.0
    replan_steps: list[int] = []
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
            plan_costs = cost_models(trace.alpha[members], trace.beta[step, members] * err)
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
            slices = np.asarray(allocate(total, cost_models(alpha, beta)))
        if pending is not None and step >= pending[0]:
            new = pending[1]
            moved.append(float(np.abs(new - slices).sum()) / (2 * total))
            slices, plan_costs = new, pending[2]
            pending = None
            replan_steps.append(step)
            state = PolicyState(last_replan_step=step, last_decision_step=step - 1)
            window = []
        busy = (alpha + beta * slices) * trace.noise[step, members]
        step_s[step] = float(busy.max()) + allreduce_s(cfg, members.size)
        clock += step_s[step]
        if strategy != "live" or pending is not None:
            continue
        window.append((step, slices, busy))
        del window[: -cfg.policy.window_steps]
        # decide() returns at once until a window is complete; skip building its inputs.
        if step - state.last_decision_step < cfg.policy.window_steps:
            continue
        # The window as columns (what decide computes on): no per-sample objects at 10,000.
        ranks = np.arange(members.size)
        samples = SampleColumns(
            rank=np.tile(ranks, len(window)),
            step=np.repeat([s for s, _, _ in window], members.size),
            samples=np.concatenate([b for _, b, _ in window]).astype(np.float64),
            busy_s=np.concatenate([t for _, _, t in window]),
            time_s=np.full(len(window) * members.size, clock),
        )
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
    result = StrategyResult(
        strategy=strategy,
        workers=cfg.workers,
        samples_per_s=total * steps / total_s,
        efficiency_vs_optimum=1.0,  # relative to the oracle: set by simulate
        efficiency_vs_bound=total * steps / float(step_s.sum()) / bound,
        total_s=total_s,
        overhead_s=overhead_s,
        replans=len(replan_steps),
        moved_fraction=statistics.fmean(moved) if moved else 0.0,
        restarts=restarts,
        replan_steps=tuple(replan_steps),
    )
    return result, float(step_s.sum())


def simulate(cfg: SimConfig, strategies: Sequence[str] = STRATEGIES) -> list[StrategyResult]:
    """Run every strategy on the same simulated trace; efficiency is against the oracle."""
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise ValueError(f"unknown strategies {unknown}; choose from {list(STRATEGIES)}")
    trace = make_trace(cfg)
    runs = {s: _run_strategy(cfg, trace, s) for s in dict.fromkeys([*strategies, "oracle"])}
    oracle, oracle_stepping_s = runs["oracle"]
    return [
        replace(
            result,
            efficiency_vs_optimum=oracle.total_s / result.total_s,
            stepping_efficiency=oracle_stepping_s / stepping_s,
        )
        for result, stepping_s in (runs[s] for s in strategies)
    ]


def allocation_time(
    workers: int, *, repeats: int = 5, seed: int = 0, batch_per_worker: int = 64
) -> dict[str, float]:
    """Median wall milliseconds of one :func:`allocate` and one :func:`decide` at this size.

    ``decide`` is timed on a full window of samples for every rank (the policy's real work:
    robust per-rank estimates, then an allocation), given as :class:`StepSample` objects as
    the scheduler actor passes them (``decide_ms``, conversion to columns included) and as
    :class:`SampleColumns` as the simulator passes them (``decide_columns_ms``).
    """
    rng = np.random.default_rng(seed)
    costs = cost_models(
        0.005 * rng.lognormal(0, 0.3, workers), 1e-3 * rng.lognormal(0, 0.5, workers)
    )
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
    columns = SampleColumns.from_samples(samples)
    dec: list[float] = []
    dec_columns: list[float] = []
    for _ in range(max(1, repeats // 2)):
        for given, times in ((samples, dec), (columns, dec_columns)):
            started = time.perf_counter()
            decide(slices, given, state, cfg, 0.0, step=cfg.window_steps, prior=costs)
            times.append((time.perf_counter() - started) * 1e3)
    return {
        "allocate_ms": statistics.median(alloc),
        "decide_ms": statistics.median(dec),
        "decide_columns_ms": statistics.median(dec_columns),
    }


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
