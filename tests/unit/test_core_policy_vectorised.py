"""The vectorised policy makes the same decisions as the per-object one it replaced.

``reference_*`` below is the policy's estimate-and-decide code before it was vectorised (issue
13), kept here verbatim as the reference: hypothesis draws random windows (invalid and
out-of-range samples, equal steps, tied and outlying per-sample costs, silent ranks, caps,
min slices, thresholds and hysteresis states at their edges) and both must return equal
decisions and states, or raise the same error.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import replace

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from raytrain_hetero.core.allocation import CostModel, allocate, makespan
from raytrain_hetero.core.plan_words import explain_slices
from raytrain_hetero.core.policy import (
    Decision,
    Estimates,
    Noop,
    PolicyConfig,
    PolicyState,
    Replan,
    SampleColumns,
    StepSample,
    decide,
    estimate_costs,
)
from raytrain_hetero.errors import HeteroError

# ----------------------------------------------------------------------------- the reference


def reference_robust_per_sample_cost(values: Sequence[float], outlier_factor: float) -> float:
    """Median per-sample cost after dropping values far from the first median."""
    first = statistics.median(values)
    kept = [v for v in values if first / outlier_factor <= v <= first * outlier_factor]
    return statistics.median(kept) if kept else first


def reference_estimate_costs(
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
            beta = reference_robust_per_sample_cost(per_sample, cfg.outlier_factor)
        elif prior is not None:
            beta = prior[rank].beta
        else:
            return None
        if silent:
            beta *= cfg.straggler_penalty
        costs.append(CostModel(alpha=alpha, beta=beta))
    return Estimates(costs=tuple(costs), stragglers=tuple(stragglers))


def reference_decide(
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
    estimates = reference_estimate_costs(samples, world, prior, cfg, now)
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
    words = explain_slices(best, estimates.costs, min_slice)
    silent = f"; silent ranks {list(estimates.stragglers)}" if estimates.stragglers else ""
    reason = (
        f"measured costs ({words}){silent}: slices {list(slices)} -> {list(best)}, "
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


# ----------------------------------------------------------------------------- the properties

# Few distinct values so that ties (equal steps, equal costs, equal medians) are common.
_BUSY = st.sampled_from([0.01, 0.02, 0.02, 0.03, 0.05, 0.5, 0.0, -1.0, math.nan, math.inf])
_TIMES = st.sampled_from([0.0, 1.0, 5.0, 9.0, 10.0])


@st.composite
def _windows(draw: st.DrawFn) -> dict[str, object]:
    world = draw(st.integers(1, 5))
    window = draw(st.integers(1, 4))
    samples = draw(
        st.lists(
            st.builds(
                StepSample,
                rank=st.integers(-1, world),
                step=st.integers(0, 8),
                samples=st.integers(0, 6),
                busy_s=_BUSY,
                time_s=_TIMES,
            ),
            max_size=40,
        )
    )
    # A full window for every rank most of the time, so that decisions are actually made.
    if draw(st.booleans()):
        samples += [
            StepSample(r, s, draw(st.integers(1, 6)), draw(_BUSY.filter(math.isfinite)), 10.0)
            for r in range(world)
            for s in range(window)
        ]
    min_slice = draw(st.integers(1, 3))
    caps = draw(
        st.none() | st.lists(st.none() | st.integers(min_slice, 12), min_size=world, max_size=world)
    )
    slices = draw(st.lists(st.integers(min_slice, 10), min_size=world, max_size=world))
    prior = draw(
        st.none()
        | st.lists(
            st.builds(
                CostModel,
                alpha=st.sampled_from([0.0, 0.001, 0.01, 0.05]),
                beta=st.sampled_from([0.001, 0.002, 0.005]),
            ),
            min_size=world,
            max_size=world,
        )
    )
    cfg = PolicyConfig(
        window_steps=window,
        improvement_threshold=draw(st.sampled_from([0.0, 0.05, 0.1, 0.5])),
        confirm_windows=draw(st.integers(1, 3)),
        urgent_improvement=1.0,  # the fast path came after the reference; tested apart
        min_steps_between_replans=draw(st.integers(0, 10)),
        outlier_factor=draw(st.sampled_from([1.5, 3.0])),
        straggler_timeout_s=draw(st.sampled_from([1.0, 4.0, 60.0])),
        straggler_penalty=draw(st.sampled_from([1.0, 10.0])),
    )
    step = draw(st.integers(0, 12))
    state = PolicyState(
        streak=draw(st.integers(0, 3)),
        last_replan_step=draw(st.integers(0, 10)),
        # Mostly a complete window (step - last_decision_step >= window_steps), sometimes not.
        last_decision_step=draw(st.integers(-1, max(-1, step - window)) | st.integers(-1, 12)),
    )
    return {
        "slices": tuple(slices),
        "samples": samples,
        "state": state,
        "cfg": cfg,
        "now": draw(st.sampled_from([0.0, 10.0, 12.0, 30.0])),
        "step": step,
        "prior": prior,
        "caps": caps,
        "min_slice": min_slice,
    }


def _outcome(function, case: dict[str, object]) -> object:
    """The decision and state, or the error's type and message."""
    try:
        return function(**case)
    except HeteroError as error:
        return (type(error).__name__, str(error))


def _call_decide(function, case: dict[str, object]) -> object:
    args = dict(case)
    return _outcome(
        lambda **kw: function(
            kw["slices"],
            kw["samples"],
            kw["state"],
            kw["cfg"],
            kw["now"],
            step=kw["step"],
            prior=kw["prior"],
            caps=kw["caps"],
            min_slice=kw["min_slice"],
        ),
        args,
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_windows())
def test_vectorised_decide_equals_the_reference(case):
    assert _call_decide(decide, case) == _call_decide(reference_decide, case)
    # The column form a simulator passes decides the same as the objects.
    columns = dict(case, samples=SampleColumns.from_samples(case["samples"]))
    assert _call_decide(decide, columns) == _call_decide(reference_decide, case)


@settings(max_examples=150, deadline=None)
@given(_windows())
def test_vectorised_estimates_equal_the_reference(case):
    world = len(case["slices"])
    args = (case["samples"], world, case["prior"], case["cfg"], case["now"])
    new = estimate_costs(*args)
    old = reference_estimate_costs(*args)
    assert new == old


def test_hysteresis_edges_match_the_reference():
    """Gain exactly at the threshold, streak one short, re-plan one step too soon."""
    cfg = PolicyConfig(
        window_steps=2, confirm_windows=2, min_steps_between_replans=6, urgent_improvement=1.0
    )
    samples = [StepSample(r, s, 10, 0.01 * (r + 1), float(s)) for s in range(2) for r in (0, 1)]
    exact = 1.0 - makespan(
        allocate(20, [CostModel(0, 1e-3), CostModel(0, 2e-3)]),
        [
            CostModel(0, 1e-3),
            CostModel(0, 2e-3),
        ],
    ) / makespan((10, 10), [CostModel(0, 1e-3), CostModel(0, 2e-3)])
    kinds = set()
    for threshold in (exact, math.nextafter(exact, 0.0), 0.0):
        for state in (
            PolicyState(streak=0, last_replan_step=0, last_decision_step=-1),
            PolicyState(streak=1, last_replan_step=0, last_decision_step=-1),
            PolicyState(streak=1, last_replan_step=-5, last_decision_step=-1),
            PolicyState(streak=1, last_replan_step=-4, last_decision_step=-1),
        ):
            policy = replace(cfg, improvement_threshold=threshold)
            args = ((10, 10), samples, state, policy, 2.0)
            new = decide(*args, step=1)
            assert new == reference_decide(*args, step=1)
            kinds.add(new[0].reason.split(" ")[0] if isinstance(new[0], Noop) else "replan")
    # Every branch was reached: below threshold, streak too short, too soon, re-plan.
    assert kinds == {"predicted", "gain", "too", "replan"}
