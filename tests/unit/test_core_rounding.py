"""The one largest-remainder rounding (core.allocation.largest_remainder) and its users."""

from __future__ import annotations

import numpy as np
import pytest

from raytrain_hetero.core.allocation import largest_remainder, proportional_slices


def test_largest_remainder_gives_leftover_to_largest_fractions() -> None:
    assert largest_remainder([1.2, 2.5, 3.3], 7) == (1, 3, 3)
    assert largest_remainder([0.5, 0.5, 0.0], 1) == (1, 0, 0)  # tie: lower index wins
    assert largest_remainder([2.0, 3.0], 5) == (2, 3)


def test_largest_remainder_respects_upper() -> None:
    # entry 0 has the largest fraction but is at its cap
    assert largest_remainder([2.9, 1.05, 1.05], 5, upper=[2, 10, 10]) == (2, 2, 1)


@pytest.mark.parametrize("seed", range(20))
def test_largest_remainder_sums_and_stays_within_one(seed: int) -> None:
    rng = np.random.default_rng(seed)
    weights = rng.random(7) + 0.01
    total = int(rng.integers(0, 500))
    exact = weights / weights.sum() * total
    rounded = largest_remainder(exact, total)
    assert sum(rounded) == total
    assert all(abs(r - e) < 1 for r, e in zip(rounded, exact))


def test_proportional_slices_and_inference_share_the_rounding() -> None:
    pytest.importorskip("torch")
    from raytrain_hetero.config import WorkerSpec
    from raytrain_hetero.inference.predict import plan_actor_pools

    specs = [WorkerSpec(name="a"), WorkerSpec(name="b", count=2)]
    plans = plan_actor_pools(specs, [3.0, 1.0], 101, 16, "proportional")
    weights = np.asarray([3.0, 2.0])
    assert tuple(p.samples for p in plans) == largest_remainder(weights / 5 * 101, 101)
    assert proportional_slices(10, [1.0, 1.0, 1.0]) == (4, 3, 3)
