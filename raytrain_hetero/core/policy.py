"""Re-planning policy: when do measured speeds justify a new plan? (pure; clock injected)

From passive per-step measurements (samples processed, busy seconds excluding collective
waits), the policy keeps a robust per-sample cost per rank over a sliding window (median after
rejecting outliers) and re-plans only when the best plan is predicted faster than the current
one by more than a threshold in several consecutive windows (hysteresis), never more often
than a minimum spacing. A rank silent for ``straggler_timeout_s`` is a straggler. Pure, so it
is tested with an injected clock and reused by the large-cluster simulator.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from raytrain_hetero.core.allocation import CostModel, allocate, cost_arrays, makespan
from raytrain_hetero.core.plan_words import explain_slices
from raytrain_hetero.errors import ConfigError


@dataclass(frozen=True)
class PolicyConfig:
    """Knobs of the re-planning policy.

    Attributes:
        window_steps: Steps per rank in each estimation window.
        improvement_threshold: Re-plan only if the predicted step time improves by more than
            this fraction (0.1 = 10 %).
        confirm_windows: Consecutive windows that must all predict that improvement.
        urgent_improvement: A predicted improvement above this fraction re-plans after one
            window, without waiting for ``confirm_windows`` or ``min_steps_between_replans``
            (a worker slowed down 3x: every window of waiting costs about 2x the step time).
            Noise does not predict gains this large, so the noise target is kept. 1.0 turns
            the fast path off.
        min_steps_between_replans: Minimum global steps between two re-plans.
        outlier_factor: Samples whose per-sample cost is more than this factor away from the
            window median are rejected (e.g. a step that hit a garbage collection).
        straggler_timeout_s: A rank silent for this long is treated as a straggler.
        straggler_penalty: Cost multiplier applied to a silent rank's estimate.
    """

    window_steps: int = 8
    improvement_threshold: float = 0.10
    confirm_windows: int = 2
    urgent_improvement: float = 0.30
    min_steps_between_replans: int = 8
    outlier_factor: float = 3.0
    straggler_timeout_s: float = 60.0
    straggler_penalty: float = 10.0

    def __post_init__(self) -> None:
        # name -> (holds, what a valid value is); NaN and infinity fail every float rule.
        checks = {
            "window_steps": (self.window_steps >= 1, "an integer >= 1"),
            "improvement_threshold": (
                0 <= self.improvement_threshold < 1,
                "a fraction in [0, 1)",
            ),
            "confirm_windows": (self.confirm_windows >= 1, "an integer >= 1"),
            "urgent_improvement": (
                0 <= self.urgent_improvement <= 1,
                "a fraction in [0, 1]; 1 turns the fast path off",
            ),
            "min_steps_between_replans": (self.min_steps_between_replans >= 0, "an integer >= 0"),
            "outlier_factor": (
                math.isfinite(self.outlier_factor) and self.outlier_factor > 1,
                "a finite number > 1",
            ),
            "straggler_timeout_s": (
                math.isfinite(self.straggler_timeout_s) and self.straggler_timeout_s > 0,
                "a finite number of seconds > 0",
            ),
            "straggler_penalty": (
                math.isfinite(self.straggler_penalty) and self.straggler_penalty >= 1,
                "a finite number >= 1",
            ),
        }
        bad = [
            f"{name}={getattr(self, name)!r} (use {valid})"
            for name, (ok, valid) in checks.items()
            if not ok
        ]
        if bad:
            raise ConfigError(f"Invalid PolicyConfig values: {'; '.join(bad)}.")


@dataclass(frozen=True)
class StepSample:
    """One rank's measurement of one step: ``busy_s`` counts compute and loading, not
    waiting; ``time_s`` is on the same clock as the policy's ``now``; ``compute_s`` is the
    compute alone (``nan``: not measured apart), so ``busy_s - compute_s`` is the loading."""

    rank: int
    step: int
    samples: int
    busy_s: float
    time_s: float
    compute_s: float = math.nan

    @property
    def valid(self) -> bool:
        """Finite, positive, and for a non-empty slice."""
        return (
            self.samples > 0
            and isinstance(self.busy_s, (int, float))
            and math.isfinite(self.busy_s)
            and self.busy_s > 0
        )


@dataclass(frozen=True)
class PolicyState:
    """What the policy remembers between decisions.

    Attributes:
        streak: Consecutive windows that predicted a worthwhile improvement.
        last_replan_step: Global step of the last re-plan (or the plan's start).
        last_decision_step: Global step of the last evaluated window.
    """

    streak: int = 0
    last_replan_step: int = 0
    last_decision_step: int = -1


@dataclass(frozen=True)
class Noop:
    """Keep the current plan."""

    reason: str


@dataclass(frozen=True)
class Replan:
    """Switch to new ``slices`` (of a full global batch), computed from ``costs``, with the
    predicted step times of the new and the current slices and a readable reason."""

    slices: tuple[int, ...]
    costs: tuple[CostModel, ...]
    predicted_step_s: float
    current_step_s: float
    reason: str


Decision = Noop | Replan


@dataclass(frozen=True)
class PendingReplan:
    """A live re-plan the scheduler decided, waiting for the ranks to install it.

    Attributes:
        based_on_version: Version of the plan whose measurements it was decided from.
        decided_at_step: The newest step every rank had reported when it was decided.
        replan: The decision (new slices, the cost models behind them, the reason).
    """

    based_on_version: int
    decided_at_step: int
    replan: Replan


@dataclass(frozen=True)
class Estimates:
    """Per-rank cost estimates from a window, plus the ranks that went silent."""

    costs: tuple[CostModel, ...]
    stragglers: tuple[int, ...] = field(default=())


@dataclass(frozen=True)
class SampleColumns:
    """Step measurements as columns: the form :func:`decide` computes on.

    A list of :class:`StepSample` is converted once (:meth:`from_samples`); a caller that
    already holds arrays (the large-cluster simulator) builds this directly and skips the
    per-object work, which at 10,000 ranks x a window of 8 steps is most of the cost.

    Attributes:
        rank: Rank of each measurement (int64).
        step: Global step (int64).
        samples: Samples processed (float64).
        busy_s: Busy seconds (float64; NaN where the measurement was not a number).
        time_s: Clock time of the measurement (float64).
    """

    rank: np.ndarray
    step: np.ndarray
    samples: np.ndarray
    busy_s: np.ndarray
    time_s: np.ndarray

    @classmethod
    def from_samples(cls, samples: Sequence[StepSample]) -> SampleColumns:
        """Columns of ``samples``; a non-numeric ``busy_s`` becomes NaN (invalid)."""
        n = len(samples)
        numeric = (int, float)
        busy = np.fromiter(
            (s.busy_s if isinstance(s.busy_s, numeric) else math.nan for s in samples),
            dtype=np.float64,
            count=n,
        )
        return cls(
            rank=np.fromiter((s.rank for s in samples), dtype=np.int64, count=n),
            step=np.fromiter((s.step for s in samples), dtype=np.int64, count=n),
            samples=np.fromiter((s.samples for s in samples), dtype=np.float64, count=n),
            busy_s=busy,
            time_s=np.fromiter((s.time_s for s in samples), dtype=np.float64, count=n),
        )


def _row_medians(values: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Median of the first ``counts[i]`` finite entries of each row (NaN-padded rows).

    Same arithmetic as :func:`statistics.median`: the middle value, or the mean of the two
    middle values as ``(a + b) / 2``. Rows with a zero count give NaN.
    """
    ordered = np.sort(values, axis=1)  # NaN padding sorts last
    low = np.clip((counts - 1) // 2, 0, None)
    high = np.clip(counts // 2, 0, values.shape[1] - 1)
    rows = np.arange(values.shape[0])
    medians: np.ndarray = (ordered[rows, low] + ordered[rows, high]) / 2
    medians[counts == 0] = np.nan
    return medians


def _estimate_arrays(
    columns: SampleColumns,
    world_size: int,
    prior_alpha: np.ndarray | None,
    prior_beta: np.ndarray | None,
    cfg: PolicyConfig,
    now: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Vectorised core of :func:`estimate_costs`: (alpha, beta, silent mask) or None."""
    window = cfg.window_steps
    keep = (
        (columns.rank >= 0)
        & (columns.rank < world_size)
        & (columns.samples > 0)
        & np.isfinite(columns.busy_s)
        & (columns.busy_s > 0)
    )
    rank = columns.rank[keep]
    step = columns.step[keep]
    samples = columns.samples[keep]
    busy = columns.busy_s[keep]
    seen_at = columns.time_s[keep]
    # Stable order by (rank, step), input order among equal steps, as sorted() keeps it.
    order = np.lexsort((np.arange(rank.size), step, rank))
    rank, samples, busy = rank[order], samples[order], busy[order]
    per_rank = np.bincount(rank, minlength=world_size)
    recent_count = np.minimum(per_rank, window)
    last_seen = np.full(world_size, -np.inf)
    np.maximum.at(last_seen, columns.rank[keep], seen_at)
    silent = (per_rank == 0) | (now - last_seen > cfg.straggler_timeout_s)
    if np.any((recent_count < window) & ~silent):
        return None
    if prior_beta is None and np.any(per_rank == 0):
        return None
    alpha = prior_alpha if prior_alpha is not None else np.zeros(world_size)
    # Position of each sample from the end of its rank's run; the newest ``window`` are kept.
    ends = np.cumsum(per_rank)
    from_end = ends[rank] - np.arange(rank.size) - 1
    newest = from_end < window
    table = np.full((world_size, window), np.nan)
    table[rank[newest], window - 1 - from_end[newest]] = (
        np.maximum(busy[newest] - alpha[rank[newest]], 1e-12) / samples[newest]
    )
    first = _row_medians(table, recent_count)
    factor = cfg.outlier_factor
    with np.errstate(invalid="ignore"):
        inside = (first[:, None] / factor <= table) & (table <= first[:, None] * factor)
    kept_count = inside.sum(axis=1)
    second = _row_medians(np.where(inside, table, np.nan), kept_count)
    beta = np.where(kept_count > 0, second, first)
    if prior_beta is not None:
        beta = np.where(recent_count == 0, prior_beta, beta)
    beta = np.where(silent, beta * cfg.straggler_penalty, beta)
    return alpha, beta, silent


def _to_cost_models(alpha: np.ndarray, beta: np.ndarray) -> tuple[CostModel, ...]:
    return tuple(CostModel(a, b) for a, b in zip(alpha.tolist(), beta.tolist()))


def estimate_costs(
    samples: Sequence[StepSample] | SampleColumns,
    world_size: int,
    prior: Sequence[CostModel] | None,
    cfg: PolicyConfig,
    now: float,
) -> Estimates | None:
    """Per-rank affine cost models from the newest ``window_steps`` valid samples of each rank.

    The fixed cost alpha of each rank is kept from ``prior`` (the probe's fit) when given; beta
    is re-estimated as the median of (busy - alpha) / samples after dropping values farther
    than ``outlier_factor`` from the first median, for all ranks at once with numpy.

    Returns:
        The estimates, or None while some rank has fewer than ``window_steps`` valid samples
        and is not yet silent long enough to be a straggler.
    """
    columns = samples if isinstance(samples, SampleColumns) else SampleColumns.from_samples(samples)
    prior_alpha, prior_beta = cost_arrays(prior) if prior is not None else (None, None)
    found = _estimate_arrays(columns, world_size, prior_alpha, prior_beta, cfg, now)
    if found is None:
        return None
    alpha, beta, silent = found
    return Estimates(
        costs=_to_cost_models(alpha, beta),
        stragglers=tuple(int(r) for r in np.flatnonzero(silent)),
    )


def decide(
    slices: Sequence[int],
    samples: Sequence[StepSample] | SampleColumns,
    state: PolicyState,
    cfg: PolicyConfig,
    now: float,
    *,
    step: int,
    prior: Sequence[CostModel] | None = None,
    caps: Sequence[int | None] | None = None,
    min_slice: int = 1,
    quantum: int = 1,
) -> tuple[Decision, PolicyState]:
    """One policy evaluation at global ``step`` (the newest the ``samples`` cover).

    ``state`` is what the previous call returned; ``now`` is on the samples' clock; the
    ``prior`` cost models are the current plan's (their alpha is kept). Returns the decision
    and the state to pass next time.
    """
    world = len(slices)
    if step - state.last_decision_step < cfg.window_steps:
        return Noop("window not complete"), state
    estimates = estimate_costs(samples, world, prior, cfg, now)
    if estimates is None:
        return Noop("warming up: not every rank has a full window"), state
    state = replace(state, last_decision_step=step)
    found = _best_plan(slices, estimates, cfg.improvement_threshold, caps, min_slice, quantum)
    if isinstance(found, Noop):
        return found, replace(state, streak=0)
    improvement = 1.0 - found.predicted_step_s / found.current_step_s
    streak = state.streak + 1
    urgent = improvement > cfg.urgent_improvement
    if streak < cfg.confirm_windows and not urgent:
        return Noop(
            f"gain {improvement:.1%} seen in {streak}/{cfg.confirm_windows} windows"
        ), replace(state, streak=streak)
    if step - state.last_replan_step < cfg.min_steps_between_replans and not urgent:
        return Noop("too soon after the last re-plan"), replace(state, streak=streak)
    return found, PolicyState(streak=0, last_replan_step=step, last_decision_step=step)


def _best_plan(
    slices: Sequence[int],
    estimates: Estimates,
    threshold: float,
    caps: Sequence[int | None] | None,
    min_slice: int,
    quantum: int = 1,
) -> Decision:
    """The makespan-optimal slices under ``estimates`` if predicted more than ``threshold``
    faster than ``slices``, else a Noop (no hysteresis: the callers add theirs)."""
    best = allocate(sum(slices), estimates.costs, caps=caps, min_slice=min_slice, quantum=quantum)
    current_s = makespan(slices, estimates.costs)
    best_s = makespan(best, estimates.costs)
    improvement = 1.0 - best_s / current_s if current_s > 0 else 0.0
    if improvement <= threshold or tuple(best) == tuple(slices):
        return Noop(f"predicted gain {improvement:.1%} <= {threshold:.0%}")
    words = explain_slices(best, estimates.costs, min_slice)
    silent = f"; silent ranks {list(estimates.stragglers)}" if estimates.stragglers else ""
    reason = (
        f"measured costs ({words}){silent}: slices {list(slices)} -> {list(best)}, "
        f"predicted step {current_s * 1e3:.1f} ms -> {best_s * 1e3:.1f} ms "
        f"({improvement:.0%} faster)"
    )
    return Replan(tuple(best), estimates.costs, best_s, current_s, reason)


def decide_first_measured(
    slices: Sequence[int],
    samples: Sequence[StepSample],
    cfg: PolicyConfig,
    *,
    prior: Sequence[CostModel] | None = None,
    caps: Sequence[int | None] | None = None,
    min_slice: int = 1,
    quantum: int = 1,
) -> tuple[Estimates | None, Decision]:
    """The first measured plan of a group that started on a prior (cheap start, no probe).

    Every rank ran the same few training steps at the prior ``slices``; their passive
    timings (all of them, the group agrees on them in one gather) give each rank's
    per-sample cost as :func:`estimate_costs` does (robust median, ``prior``'s fixed cost
    kept). Unlike :func:`decide` there is no hysteresis: the prior was a guess, not a
    measurement, so one window decides, and only a predicted gain above
    ``cfg.improvement_threshold`` switches (a right prior stays).

    Returns:
        The estimates (None while some rank has no valid sample) and the decision.
    """
    world = len(slices)
    per_rank = [sum(1 for s in samples if s.rank == r and s.valid) for r in range(world)]
    if min(per_rank, default=0) == 0:
        return None, Noop("no valid passive timing from every rank")
    # All ranks ran these steps together: none is a straggler (``now`` precedes every sample).
    now = min(s.time_s for s in samples)
    estimates = estimate_costs(samples, world, prior, replace(cfg, window_steps=min(per_rank)), now)
    if estimates is None:  # pragma: no cover - every rank has a full window by construction
        return None, Noop("no valid passive timing from every rank")
    return estimates, _best_plan(
        slices, estimates, cfg.improvement_threshold, caps, min_slice, quantum
    )


def prior_costs(known: Sequence[CostModel | None]) -> tuple[CostModel, ...] | None:
    """The cheap start's prior: each rank's remembered cost model, or for a rank without one
    the median of the others' (a neutral guess the first measured plan corrects).

    Returns:
        One cost model per rank, or None when no rank has one (start on equal slices).
    """
    have = [c for c in known if c is not None]
    if not have:
        return None
    guess = CostModel(
        statistics.median(c.alpha for c in have), statistics.median(c.beta for c in have)
    )
    return tuple(guess if c is None else c for c in known)
