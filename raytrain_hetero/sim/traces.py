"""Simulated clusters: the run's settings and the per-step worker costs every strategy sees.

The worker model is described in :mod:`raytrain_hetero.sim.simulator`. One seed draws one
:class:`Trace`, shared by every strategy so they are compared on identical workers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.policy import PolicyConfig

#: Restart and probe costs measured on this repository's real elastic join
#: (benchmarks/results/join: 2 CPU workers, a third node joins, medians of 3 repeats).
#: raytrain_hetero's join -> first step at full size took 14.0 s; its setup (launch -> first
#: step, probe and calibration included) took 4.16 s against stock DDP's 2.45 s, so the probe
#: costs 1.7 s and the rest of the restart 14.0 - 1.7 = 12.3 s. That rest includes the
#: resize monitor's detection (interval 5 s), during which the old group still trains, so
#: 12.3 s is an upper bound of the time a restart stops training.
JOIN_RESTART_S = 12.3
JOIN_PROBE_S = 1.7
JOIN_CALIBRATION = (
    f"restart {JOIN_RESTART_S:.1f} s + probe {JOIN_PROBE_S:.1f} s per (re)start, calibrated "
    "from benchmarks/results/join (hetero join -> full size 14.0 s; probe = hetero setup "
    "4.16 s - stock setup 2.45 s)"
)


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
        restart_s: Seconds a worker-group restart costs (every strategy). Calibrated from
            the measured join (:data:`JOIN_CALIBRATION`).
        probe_s: Extra seconds the probe (and calibration) costs at each (re)start (static
            and live). Calibrated from the measured join.
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
    restart_s: float = JOIN_RESTART_S
    probe_s: float = JOIN_PROBE_S
    plan_delay_steps: int = 5
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    seed: int = 0

    def __post_init__(self) -> None:
        # (names, check, what the message says a valid value is): one loop, one message shape.
        rules = (
            (("workers", "steps", "batch_per_worker", "sudden_factor"), lambda v: v >= 1, ">= 1"),
            (
                ("sudden_fraction", "fail_fraction", "join_fraction"),
                lambda v: 0 <= v < 1,
                "in [0, 1)",
            ),
            (("sudden_at", "fail_at", "join_at"), lambda v: 0 <= v <= 1, "in [0, 1]"),
        )
        for names, valid, expected in rules:
            for name in names:
                if not valid(getattr(self, name)):
                    raise ValueError(f"{name} must be {expected}, got {getattr(self, name)}")

    @property
    def global_batch(self) -> int:
        """Samples per step (fixed for the whole run)."""
        return self.workers * self.batch_per_worker


@dataclass
class Trace:
    """Per-step true costs of every worker slot that ever exists, and who is present."""

    alpha: np.ndarray  # (slots,)
    beta: np.ndarray  # (steps, slots) true seconds per sample
    noise: np.ndarray  # (steps, slots) multiplicative noise on the step time
    present: np.ndarray  # (steps, slots) bool
    probe_error: np.ndarray  # (restarts + 1, slots) multiplicative probe error
    restart_steps: tuple[int, ...]


def _count(fraction: float, of: int) -> int:
    return 0 if fraction <= 0 else max(1, round(fraction * of))


def make_trace(cfg: SimConfig) -> Trace:
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
    return Trace(alpha, beta, noise, present, probe_error, tuple(restart_steps))


def allreduce_s(cfg: SimConfig, n: int) -> float:
    if n <= 1:
        return 0.0
    # Bandwidth term of a ring; latency term of a tree (log2 N hops each way), as NCCL and
    # gloo switch to for large groups: a flat ring's 2(N-1) hops would dominate at 10,000.
    return (
        2 * math.ceil(math.log2(n)) * cfg.latency_s
        + 2 * (n - 1) / n * cfg.model_bytes / cfg.bandwidth_bytes_s
    )


def cost_models(alpha: np.ndarray, beta: np.ndarray) -> list[CostModel]:
    return [CostModel(float(a), float(b)) for a, b in zip(alpha, beta)]
