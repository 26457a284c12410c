"""Re-planning policy with an injected clock (no Ray, no torch)."""

from __future__ import annotations

import math
import random

import pytest

from raytrain_hetero.core.allocation import CostModel, allocate, makespan
from raytrain_hetero.core.policy import (
    Noop,
    PolicyConfig,
    PolicyState,
    Replan,
    StepSample,
    decide,
    estimate_costs,
)
from raytrain_hetero.errors import ConfigError

B = 192


class SimulatedRun:
    """Drives `decide` step by step over synthetic per-rank speeds (seconds per sample)."""

    def __init__(self, per_sample_s, cfg=PolicyConfig(), noise=0.0, seed=0):
        self.per_sample_s = list(per_sample_s)
        self.cfg = cfg
        self.noise = noise
        self.rng = random.Random(seed)
        costs = [CostModel(0.0, s) for s in self.per_sample_s]
        self.slices = allocate(B, costs)
        self.samples: list[StepSample] = []
        self.state = PolicyState()
        self.replans: list[tuple[int, Replan]] = []
        self.now = 0.0

    def step(self, step):
        times = []
        for rank, (b, s) in enumerate(zip(self.slices, self.per_sample_s)):
            jitter = 1 + self.rng.uniform(-self.noise, self.noise)
            times.append(b * s * jitter)
            self.samples.append(StepSample(rank, step, b, b * s * jitter, self.now))
        self.now += max(times)
        self.samples = self.samples[-200:]
        decision, self.state = decide(
            self.slices, self.samples, self.state, self.cfg, self.now, step=step
        )
        if isinstance(decision, Replan):
            self.replans.append((step, decision))
            self.slices = decision.slices
        return decision


def optimum(per_sample_s):
    costs = [CostModel(0.0, s) for s in per_sample_s]
    best = allocate(B, costs)
    return best, makespan(best, costs)


def test_injected_3x_slowdown_replans_within_30_steps_near_optimum():
    speeds = [0.001, 0.002, 0.004]
    run = SimulatedRun(speeds)
    for step in range(40):
        run.step(step)
    assert run.replans == []
    run.per_sample_s[0] *= 3  # the fast worker slows down 3x at step 40
    for step in range(40, 100):
        run.step(step)
        if run.replans:
            break
    assert run.replans, "no re-plan after a 3x slowdown"
    replan_step, decision = run.replans[0]
    assert replan_step - 40 <= 30
    best, best_s = optimum(run.per_sample_s)
    for got, want in zip(decision.slices, best):
        assert abs(got - want) <= 0.1 * want + 1
    costs = [CostModel(0.0, s) for s in run.per_sample_s]
    assert makespan(decision.slices, costs) <= 1.1 * best_s
    assert "->" in decision.reason and "faster" in decision.reason


@pytest.mark.parametrize("seed", range(5))
def test_ten_percent_noise_on_constant_speeds_rarely_replans(seed):
    run = SimulatedRun([0.001, 0.002, 0.004], noise=0.10, seed=seed)
    for step in range(300):
        run.step(step)
    # At most one re-plan per 100 steps.
    assert len(run.replans) <= 3
    per_100 = [sum(1 for s, _ in run.replans if lo <= s < lo + 100) for lo in (0, 100, 200)]
    assert max(per_100) <= 1


def test_no_decision_until_every_rank_has_a_window():
    samples = [StepSample(0, s, 10, 0.01, float(s)) for s in range(20)]
    decision, _ = decide((10, 10), samples, PolicyState(), PolicyConfig(), 20.0, step=20)
    assert isinstance(decision, Noop) and "warming up" in decision.reason


def test_silent_rank_is_treated_as_straggler():
    cfg = PolicyConfig(straggler_timeout_s=5.0, confirm_windows=1)
    samples = [StepSample(r, s, 10, 0.01, float(s)) for s in range(10) for r in (0, 1)]
    # Rank 2 reported long ago and then went silent.
    samples += [StepSample(2, s, 10, 0.01, 0.0) for s in range(8)]
    decision, _ = decide((10, 10, 10), samples, PolicyState(), cfg, 12.0, step=10)
    assert isinstance(decision, Replan)
    assert decision.slices[2] < 10 and "silent ranks [2]" in decision.reason


def test_absurd_measurements_are_ignored():
    cfg = PolicyConfig(window_steps=4)
    good = [StepSample(r, s, 10, 0.01 * (r + 1), float(s)) for s in range(4) for r in (0, 1)]
    bad = [
        StepSample(0, 5, 10, float("nan"), 5.0),
        StepSample(1, 5, 10, -1.0, 5.0),
        StepSample(1, 6, 0, 0.5, 6.0),
    ]
    est = estimate_costs(good + bad, 2, None, cfg, 6.0)
    assert est is not None
    assert est.costs[0].beta == pytest.approx(0.001)
    assert est.costs[1].beta == pytest.approx(0.002)


def test_outliers_do_not_move_the_estimate():
    cfg = PolicyConfig(window_steps=8)
    samples = [StepSample(0, s, 10, 0.01, float(s)) for s in range(8)]
    samples[3] = StepSample(0, 3, 10, 0.5, 3.0)  # a 50x hiccup
    est = estimate_costs(samples, 1, None, cfg, 8.0)
    assert est.costs[0].beta == pytest.approx(0.001)


def test_bad_policy_config_names_the_field():
    with pytest.raises(ConfigError, match="improvement_threshold"):
        PolicyConfig(improvement_threshold=1.5)


@pytest.mark.parametrize(
    ("field", "value", "valid"),
    [
        ("straggler_timeout_s", math.inf, "a finite number of seconds > 0"),
        ("straggler_timeout_s", 0.0, "a finite number of seconds > 0"),
        ("outlier_factor", math.nan, "a finite number > 1"),
        ("straggler_penalty", math.inf, "a finite number >= 1"),
        ("improvement_threshold", 1.0, "a fraction in [0, 1)"),
        ("window_steps", 0, "an integer >= 1"),
    ],
)
def test_invalid_policy_values_name_the_field_and_the_valid_range(field, value, valid):
    with pytest.raises(ConfigError) as info:
        PolicyConfig(**{field: value})
    assert f"{field}={value!r}" in str(info.value) and f"use {valid}" in str(info.value)


def _first_replan_after_slowdown(cfg):
    run = SimulatedRun([0.001, 0.002, 0.004], cfg=cfg)
    for step in range(40):
        run.step(step)
    run.per_sample_s[0] *= 3
    for step in range(40, 120):
        run.step(step)
        if run.replans:
            return run.replans[0][0] - 40
    return None


def test_a_large_predicted_gain_replans_without_waiting_for_confirmation():
    fast = _first_replan_after_slowdown(PolicyConfig())
    confirmed = _first_replan_after_slowdown(PolicyConfig(urgent_improvement=1.0))
    assert fast is not None and confirmed is not None
    # One window (8 steps) sooner: the confirmation window is skipped.
    assert fast <= confirmed - PolicyConfig().window_steps
    assert fast <= 16


def test_urgent_improvement_is_validated():
    with pytest.raises(ConfigError, match="urgent_improvement"):
        PolicyConfig(urgent_improvement=1.5)
