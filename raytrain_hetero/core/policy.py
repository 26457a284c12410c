"""Re-planning policy: when do measured speeds justify a new plan? (pure; clock injected)

Inputs are passive per-step measurements of every rank: how many samples it processed and how
long it was busy (its own compute and loading, excluding waits in collectives). Per rank the
policy keeps a robust per-sample cost estimate over a sliding window (median after rejecting
outliers), predicts the step time of the current plan and of the best plan under those
estimates, and re-plans only when the best plan is predicted faster by more than a threshold
in several consecutive windows (hysteresis), never more often than a minimum spacing. A rank
that has reported nothing for ``straggler_timeout_s`` is treated as a straggler.

Everything here is a pure function of its arguments, so it is tested with an injected clock
and reused by the large-cluster simulator.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from raytrain_hetero.core.allocation import CostModel, allocate, makespan
from raytrain_hetero.errors import ConfigError


@dataclass(frozen=True)
class PolicyConfig:
    """Knobs of the re-planning policy.

    Attributes:
        window_steps: Steps per rank in each estimation window.
        improvement_threshold: Re-plan only if the predicted step time improves by more than
            this fraction (0.1 = 10 %).
        confirm_windows: Consecutive windows that must all predict that improvement.
        min_steps_between_replans: Minimum global steps between two re-plans.
        outlier_factor: Samples whose per-sample cost is more than this factor away from the
            window median are rejected (e.g. a step that hit a garbage collection).
        straggler_timeout_s: A rank silent for this long is treated as a straggler.
        straggler_penalty: Cost multiplier applied to a silent rank's estimate.
    """

    window_steps: int = 8
    improvement_threshold: float = 0.10
    confirm_windows: int = 2
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
    """One rank's measurement of one step.

    Attributes:
        rank: The rank.
        step: Global step.
        samples: Samples it processed.
        busy_s: Seconds it was busy (compute + loading, not waiting).
        time_s: Clock time the measurement was taken (same clock as ``now``).
    """

    rank: int
    step: int
    samples: int
    busy_s: float
    time_s: float

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
    """Switch to new slices.

    Attributes:
        slices: New per-rank slices for a full global batch.
        costs: Per-rank cost models they were computed from.
        predicted_step_s: Predicted step time of the new slices.
        current_step_s: Predicted step time of the current slices.
        reason: Human-readable reason (old -> new, speeds).
    """

    slices: tuple[int, ...]
    costs: tuple[CostModel, ...]
    predicted_step_s: float
    current_step_s: float
    reason: str


Decision = Noop | Replan


@dataclass(frozen=True)
class Estimates:
    """Per-rank cost estimates from a window, plus the ranks that went silent."""

    costs: tuple[CostModel, ...]
    stragglers: tuple[int, ...] = field(default=())


def robust_per_sample_cost(values: Sequence[float], outlier_factor: float) -> float:
    """Median per-sample cost after dropping values far from the first median."""
    first = statistics.median(values)
    kept = [v for v in values if first / outlier_factor <= v <= first * outlier_factor]
    return statistics.median(kept) if kept else first


def estimate_costs(
    samples: Sequence[StepSample],
    world_size: int,
    prior: Sequence[CostModel] | None,
    cfg: PolicyConfig,
    now: float,
) -> Estimates | None:
    """Per-rank affine cost models from the newest ``window_steps`` valid samples of each rank.

    The fixed cost alpha of each rank is kept from ``prior`` (the probe's fit) when given; beta
    is re-estimated as the robust median of (busy - alpha) / samples.

    Returns:
        The estimates, or None while some rank has fewer than ``window_steps`` valid samples
        and is not yet silent long enough to be a straggler.
    """
    by_rank: dict[int, list[StepSample]] = {r: [] for r in range(world_size)}
    for s in samples:
        if 0 <= s.rank < world_size and s.valid:
            by_rank[s.rank].append(s)
    costs: list[CostModel] = []
    stragglers: list[int] = []
    for rank in range(world_size):
        recent = sorted(by_rank[rank], key=lambda s: s.step)[-cfg.window_steps :]
        alpha = prior[rank].alpha if prior is not None else 0.0
        last_seen = max((s.time_s for s in by_rank[rank]), default=None)
        silent = last_seen is None or now - last_seen > cfg.straggler_timeout_s
        if len(recent) < cfg.window_steps and not silent:
            return None
        if silent:
            stragglers.append(rank)
        if recent:
            per_sample = [max(s.busy_s - alpha, 1e-12) / s.samples for s in recent]
            beta = robust_per_sample_cost(per_sample, cfg.outlier_factor)
        elif prior is not None:
            beta = prior[rank].beta
        else:
            return None
        if silent:
            beta *= cfg.straggler_penalty
        costs.append(CostModel(alpha=alpha, beta=beta))
    return Estimates(costs=tuple(costs), stragglers=tuple(stragglers))


def decide(
    slices: Sequence[int],
    samples: Sequence[StepSample],
    state: PolicyState,
    cfg: PolicyConfig,
    now: float,
    *,
    step: int,
    prior: Sequence[CostModel] | None = None,
    caps: Sequence[int | None] | None = None,
    min_slice: int = 1,
) -> tuple[Decision, PolicyState]:
    """One policy evaluation at global ``step``.

    Args:
        slices: Current per-rank slices.
        samples: Recent measurements (any order; older ones are ignored).
        state: State returned by the previous call.
        cfg: Policy settings.
        now: Current time on the samples' clock.
        step: Newest global step the samples cover.
        prior: Cost models of the current plan (their alpha is kept).
        caps: Per-rank slice caps.
        min_slice: Minimum slice.

    Returns:
        The decision and the state to pass next time.
    """
    world = len(slices)
    if step - state.last_decision_step < cfg.window_steps:
        return Noop("window not complete"), state
    estimates = estimate_costs(samples, world, prior, cfg, now)
    if estimates is None:
        return Noop("warming up: not every rank has a full window"), state
    state = replace(state, last_decision_step=step)
    total = sum(slices)
    best = allocate(total, estimates.costs, caps=caps, min_slice=min_slice)
    current_s = makespan(slices, estimates.costs)
    best_s = makespan(best, estimates.costs)
    improvement = 1.0 - best_s / current_s if current_s > 0 else 0.0
    if improvement <= cfg.improvement_threshold or tuple(best) == tuple(slices):
        return Noop(
            f"predicted gain {improvement:.1%} <= {cfg.improvement_threshold:.0%}"
        ), replace(state, streak=0)
    streak = state.streak + 1
    if streak < cfg.confirm_windows:
        return Noop(
            f"gain {improvement:.1%} seen in {streak}/{cfg.confirm_windows} windows"
        ), replace(state, streak=streak)
    if step - state.last_replan_step < cfg.min_steps_between_replans:
        return Noop("too soon after the last re-plan"), replace(state, streak=streak)
    speeds = ", ".join(f"r{r}:{1.0 / c.beta:.0f}/s" for r, c in enumerate(estimates.costs))
    silent = f"; silent ranks {list(estimates.stragglers)}" if estimates.stragglers else ""
    reason = (
        f"measured speeds ({speeds}){silent}: slices {list(slices)} -> {list(best)}, "
        f"predicted step {current_s * 1e3:.1f} ms -> {best_s * 1e3:.1f} ms "
        f"({improvement:.0%} faster)"
    )
    decision = Replan(
        slices=tuple(best),
        costs=estimates.costs,
        predicted_step_s=best_s,
        current_step_s=current_s,
        reason=reason,
    )
    return decision, PolicyState(streak=0, last_replan_step=step, last_decision_step=step)
