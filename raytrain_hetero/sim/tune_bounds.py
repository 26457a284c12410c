"""Bounds of a simulated Tune search's makespan (:mod:`raytrain_hetero.sim.tune_search`).

Two yardsticks for ``ours``, both on the work it did (its trials' epochs, ASHA's stops):

* :func:`lower_bound`, **clairvoyant**: an LP relaxation of every schedule of that work. It
  knows which trials ASHA will promote, so it may give the 3-4 trials that reach the last
  rung the cluster from the start, though they look like the other 60 until rung 9: no online
  allocator can be sure to reach it.
* :func:`online_bound`, **reachable online**: the makespan an idealized online allocator
  reaches that knows ASHA's promotion probabilities but not the draw. At the start and at
  every rung a trial reaches (and every trial's end) it solves the same LP for the live
  trials' *expected* remaining work (:func:`~raytrain_hetero.core.trial_allocation.
  asha_expected_epochs`, the epochs to the next rung certain, each later segment weighted
  by its chance ``eta^-k``), and runs each live trial at the pace that ends its expected work
  at that LP's makespan (fractional workers, free moves: what it ignores only helps it) until
  the next such event; the trials stop where ``ours``' stopped. It uses exactly the
  information ``ours`` has, so it is a target an online allocator can reach, not a lower
  bound of every online one (another objective can do better on a given draw).

Pure: numpy, scipy (the LP) and :mod:`raytrain_hetero.core`; deterministic.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from raytrain_hetero.core.trial_allocation import asha_expected_epochs
from raytrain_hetero.sim.tune_search import TrialSpec, TuneSimConfig, make_cluster, make_trials

__all__ = ["lower_bound", "online_bound"]

Table = Mapping[str, Mapping[str, Mapping[str, float]]]


def _type_counts(cfg: TuneSimConfig) -> dict[str, int]:
    slots, _ = make_cluster(cfg)
    counts: dict[str, int] = {}
    for s in slots:
        counts[s.worker_type] = counts.get(s.worker_type, 0) + 1
    return counts


def lower_bound(
    table: Table,
    cfg: TuneSimConfig,
    samples: Sequence[float],
) -> float:
    """A lower bound of the makespan of running ``samples`` per trial (e.g. what ``ours``
    ran) on the cluster: an LP relaxation of every schedule.

    Per trial ``j`` and type ``t``: ``x`` worker-seconds held, ``y`` worker-steps, ``z`` steps
    run on one worker of type ``t`` alone, ``u`` samples processed; ``M`` the makespan. Each
    is what any schedule (of this simulator's step model) satisfies:

    * each type's held worker-seconds fit: ``sum_j x[j, t] <= n_t * M``;
    * a worker-step costs its fixed and per-sample time, and the exchange's
      ``sync_s * 2 (N - 1) / N >= sync_s`` unless it runs alone:
      ``x >= alpha_t y + beta_t u + sync_s (y - z)``;
    * ``sum_t u = samples``; ``sum_t y >= steps`` (>= 1 worker per step); ``z <= y``;
      ``sum_t z <= steps``; a lone step processes the whole batch: ``B z <= u``;
    * the trial's wall time: its start (``restart_s``, paid by every trial under every
      policy), each lone step's ``alpha_t + beta_t B`` and each other step at least
      :func:`_fastest_group_step`, within ``M``.

    What it leaves out (restarts after the start, ASHA's order, integrality, which slot
    is where) only adds time, so the bound stays below every policy's makespan.
    """
    specs = make_trials(table, cfg)
    return _lp_makespan(specs, _type_counts(cfg), samples, cfg.restart_s)


def _lp_makespan(
    specs: Sequence[TrialSpec],
    counts: Mapping[str, int],
    samples: Sequence[float],
    start_s: float,
) -> float:
    """The LP of :func:`lower_bound` for ``samples`` per trial (trials with none left out),
    every trial starting after ``start_s``."""
    from scipy.optimize import linprog

    chosen = [(spec, float(work)) for spec, work in zip(specs, samples) if work > 0]
    if not chosen:
        return start_s
    types = sorted(counts)
    n_trials, n_types = len(chosen), len(types)
    size = n_trials * n_types
    # variable blocks (row-major per trial, type): x, y, z, u; then M
    x0, y0, z0, u0, m_index = 0, size, 2 * size, 3 * size, 4 * size
    width = 4 * size + 1
    rows: list[np.ndarray] = []
    rhs: list[float] = []

    def constraint(entries: dict[int, float], bound: float) -> None:
        row = np.zeros(width)
        for index, value in entries.items():
            row[index] += value
        rows.append(row)
        rhs.append(bound)

    for k, t in enumerate(types):
        entries = {x0 + j * n_types + k: 1.0 for j in range(n_trials)}
        entries[m_index] = -float(counts[t])
        constraint(entries, 0.0)
    for j, (spec, work) in enumerate(chosen):
        steps = work / spec.global_batch
        multi_step = _fastest_group_step(spec, counts)
        wall: dict[int, float] = {m_index: -1.0}
        for k, t in enumerate(types):
            c = spec.costs[t]
            i = j * n_types + k
            constraint(
                {
                    y0 + i: c.alpha + spec.sync_s,
                    u0 + i: c.beta,
                    z0 + i: -spec.sync_s,
                    x0 + i: -1.0,
                },
                0.0,
            )
            constraint({z0 + i: 1.0, y0 + i: -1.0}, 0.0)
            constraint({z0 + i: float(spec.global_batch), u0 + i: -1.0}, 0.0)
            wall[z0 + i] = c.time(spec.global_batch) - multi_step
        constraint({u0 + j * n_types + k: -1.0 for k in range(n_types)}, -work)
        constraint({y0 + j * n_types + k: -1.0 for k in range(n_types)}, -steps)
        constraint({z0 + j * n_types + k: 1.0 for k in range(n_types)}, steps)
        constraint(wall, -start_s - steps * multi_step)
    objective = np.zeros(width)
    objective[m_index] = 1.0
    result = linprog(objective, A_ub=np.array(rows), b_ub=np.array(rhs), method="highs")
    if not result.success:  # pragma: no cover - the LP is always feasible
        raise RuntimeError(f"the bound's LP failed: {result.message}")
    return float(result.x[m_index])


def _fastest_group_step(spec: TrialSpec, counts: Mapping[str, int]) -> float:
    """A lower bound of one step of ``spec`` on any group of >= 2 of the slots: on ``N``
    workers ``T >= min alpha + B / (the N largest 1/beta)`` (every worker's slice is at most
    ``(T - alpha_min) / beta``) plus the ring's ``sync_s * 2 (N - 1) / N``; the least over N."""
    rates = sorted(
        (1.0 / spec.costs[t].beta for t, n in counts.items() for _ in range(n)), reverse=True
    )
    alpha = min(spec.costs[t].alpha for t in counts)
    best, total = math.inf, rates[0]
    for n, rate in enumerate(rates[1:], start=2):
        total += rate
        best = min(best, alpha + spec.global_batch / total + spec.sync_s * 2 * (n - 1) / n)
    return best


def online_bound(table: Table, cfg: TuneSimConfig, epochs_run: Sequence[int]) -> float:
    """The makespan of the idealized online allocator (module docstring) on the search whose
    trials ran ``epochs_run`` epochs each (``ours``')."""
    specs = make_trials(table, cfg)
    counts = _type_counts(cfg)
    rungs = set()
    rung = float(cfg.grace_period)
    while rung < cfg.max_t:
        rungs.add(round(rung))
        rung *= cfg.reduction_factor
    done = [0] * len(specs)
    progress = [0.0] * len(specs)  # samples of the current epoch
    live = {j for j, e in enumerate(epochs_run) if e > 0}
    pace: dict[int, float] = {}

    def solve() -> None:
        expected = [
            max(
                asha_expected_epochs(done[j], cfg.max_t, cfg.grace_period, cfg.reduction_factor)
                * specs[j].epoch_samples
                - progress[j],
                1e-9 * specs[j].epoch_samples,
            )
            if j in live
            else 0.0
            for j in range(len(specs))
        ]
        horizon = _lp_makespan(specs, counts, expected, 0.0)
        pace.clear()
        pace.update({j: expected[j] / horizon for j in live})

    now = cfg.restart_s  # every trial starts at once, paying its start
    solve()
    while live:
        dt, j = min(((specs[k].epoch_samples - progress[k]) / pace[k], k) for k in live)
        for k in live:
            progress[k] += pace[k] * dt
        now += dt
        progress[j] = 0.0
        done[j] += 1
        if done[j] >= epochs_run[j]:
            live.discard(j)
        elif done[j] not in rungs:
            continue
        if live:
            solve()
    return now
