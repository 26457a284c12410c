"""The cheap start's decisions (pure): the prior from remembered cost models, and the first
measured plan from a few passively timed training steps."""

from __future__ import annotations

import random

from hypothesis import example, given, settings
from hypothesis import strategies as st

from raytrain_hetero.core.allocation import CostModel, allocate, makespan
from raytrain_hetero.core.policy import (
    Noop,
    PolicyConfig,
    Replan,
    StepSample,
    decide_first_measured,
    prior_costs,
)

CFG = PolicyConfig()  # improvement_threshold 0.10

speeds = st.lists(st.floats(10.0, 5000.0), min_size=1, max_size=6)


def timed(slices, per_sample_s, steps=3, noise=0.0, seed=0, alpha=0.0):
    """Passive timings of ``steps`` training steps at ``slices`` (one sample per rank and step)."""
    rng = random.Random(seed)
    return [
        StepSample(
            rank=r,
            step=1 + k,
            samples=b,
            busy_s=(alpha + b * s) * (1 + rng.uniform(-noise, noise)),
            time_s=100.0 + k,
        )
        for k in range(steps)
        for r, (b, s) in enumerate(zip(slices, per_sample_s))
    ]


def equal(total, world):
    return [total // world + (1 if r < total % world else 0) for r in range(world)]


@settings(max_examples=200, deadline=None)
@given(speeds, st.integers(0, 200), st.floats(0.0, 0.05))
# Four equal speeds whose estimates come out an ulp apart (a CI-style flake before the tolerance).
@example(
    [2062.816778917847, 1037.647860618221, 2062.816778917847] + [2062.816778917847] * 2, 171, 0.0
)
def test_measured_plan_is_the_optimum_for_the_measured_speeds(rates, extra, noise):
    world = len(rates)
    total = 4 * world + extra
    slices = equal(total, world)
    per_sample = [1.0 / v for v in rates]
    estimates, decision = decide_first_measured(slices, timed(slices, per_sample, noise=noise), CFG)
    assert estimates is not None
    for estimate, truth in zip(estimates.costs, per_sample):
        assert abs(estimate.beta / truth - 1) <= noise + 1e-9  # the median of noisy steps
    best = allocate(total, estimates.costs)
    gain = 1 - makespan(best, estimates.costs) / makespan(slices, estimates.costs)
    if isinstance(decision, Replan):
        assert decision.slices == best and sum(decision.slices) == total
        assert gain > CFG.improvement_threshold
        assert "->" in decision.reason
        # A faster rank never gets a smaller slice. Equal speeds may be estimated an ulp apart
        # (b * s / b need not round back to s); rounding then breaks their tie by rank.
        for a in range(world):
            for b in range(world):
                if estimates.costs[a].beta < estimates.costs[b].beta * (1 - 1e-9):
                    assert decision.slices[a] >= decision.slices[b]
    else:
        assert gain <= CFG.improvement_threshold or tuple(best) == tuple(slices)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 6), st.integers(0, 100), st.floats(1e-5, 1.0))
def test_identical_workers_keep_equal_slices(world, extra, per_sample):
    """homogeneous: nothing to gain, so the cheap start costs nothing after the prior."""
    slices = equal(4 * world + extra, world)
    _, decision = decide_first_measured(slices, timed(slices, [per_sample] * world), CFG)
    assert isinstance(decision, Noop)


@settings(max_examples=100, deadline=None)
@given(speeds, st.integers(0, 100), st.sampled_from([2.0**-10, 0.25, 2.0, 1024.0]), st.randoms())
def test_decision_ignores_sample_order_and_time_units(rates, extra, scale, rnd):
    world = len(rates)
    slices = equal(4 * world + extra, world)
    samples = timed(slices, [1.0 / v for v in rates])
    _, decision = decide_first_measured(slices, samples, CFG)
    shuffled = list(samples)
    rnd.shuffle(shuffled)
    scaled = [StepSample(s.rank, s.step, s.samples, s.busy_s * scale, s.time_s) for s in shuffled]
    _, again = decide_first_measured(slices, scaled, CFG)
    assert type(again) is type(decision)
    if isinstance(decision, Replan):
        assert again.slices == decision.slices


def test_a_right_prior_stays_and_a_wrong_one_is_replaced():
    per_sample = [0.001, 0.003]  # speeds 1 and 1/3 (hetero2)
    right = [144, 48]
    _, stays = decide_first_measured(right, timed(right, per_sample), CFG)
    assert isinstance(stays, Noop)
    _, moves = decide_first_measured([96, 96], timed([96, 96], per_sample), CFG)
    assert isinstance(moves, Replan) and moves.slices == (144, 48)


def test_prior_fixed_costs_are_kept_and_caps_respected():
    prior = [CostModel(0.01, 0.001), CostModel(0.01, 0.001)]
    samples = timed([50, 50], [0.001, 0.004], alpha=0.01)
    estimates, decision = decide_first_measured(
        [50, 50], samples, CFG, prior=prior, caps=[70, None], min_slice=5
    )
    assert [c.alpha for c in estimates.costs] == [0.01, 0.01]
    assert abs(estimates.costs[1].beta - 0.004) < 1e-12
    assert isinstance(decision, Replan) and decision.slices == (70, 30)


def test_no_decision_without_a_valid_timing_from_every_rank():
    samples = timed([10, 10], [0.01, 0.01])
    only_rank0 = [s for s in samples if s.rank == 0]
    assert decide_first_measured([10, 10], only_rank0, CFG) == (
        None,
        Noop("no valid passive timing from every rank"),
    )
    broken = [StepSample(1, 1, 10, float("nan"), 1.0), *only_rank0]
    assert decide_first_measured([10, 10], broken, CFG)[0] is None


@given(st.lists(st.one_of(st.none(), st.floats(1e-4, 1.0)), min_size=1, max_size=8))
def test_prior_keeps_known_costs_and_guesses_the_median_for_the_rest(betas):
    known = [None if b is None else CostModel(0.001, b) for b in betas]
    prior = prior_costs(known)
    have = sorted(b for b in betas if b is not None)
    if not have:
        assert prior is None  # nothing remembered: equal slices
        return
    assert len(prior) == len(known)
    for got, want in zip(prior, known):
        if want is not None:
            assert got == want
        else:
            assert have[0] <= got.beta <= have[-1]
