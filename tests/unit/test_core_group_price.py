"""Pricing a group's step: link costs, exchanges, overlap and the prediction's noise."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.group_price import (
    ExchangeCost,
    ExchangePrice,
    LinkCost,
    WorkerPrice,
    fit_link_cost,
    implied_overlap,
    noise_margin,
    prediction_noise,
    price_exchange,
    relative_noise,
)
from raytrain_hetero.errors import AllocationError


@settings(max_examples=100, deadline=None)
@given(
    latency=st.floats(1e-6, 1e-2),
    bandwidth=st.floats(1e6, 1e11),
    members=st.integers(2, 16),
)
def test_fit_link_cost_recovers_latency_and_bandwidth(latency, bandwidth, members):
    link = LinkCost(latency, bandwidth)
    sizes = [1024.0, 4e6, 4e7]
    seconds = [link.allreduce_s(x, members) for x in sizes]
    fitted = fit_link_cost(sizes, seconds, members)
    assert fitted.latency_s == pytest.approx(latency, rel=1e-6, abs=1e-12)
    assert fitted.bytes_per_s == pytest.approx(bandwidth, rel=1e-6)


def test_a_ring_all_reduce_costs_nothing_alone_and_grows_with_members():
    link = LinkCost(1e-4, 1e9)
    assert link.allreduce_s(1e6, 1) == 0.0
    assert link.allreduce_s(1e6, 2) == pytest.approx(2 * 1e-4 + 1e6 / 1e9)
    assert link.allreduce_s(1e6, 8) > link.allreduce_s(1e6, 2)
    with pytest.raises(AllocationError, match="members"):
        fit_link_cost([1.0, 2.0], [1.0, 2.0], 1)


def test_the_slowest_link_of_the_members_delays_every_gradient_call():
    price = ExchangePrice(gradient_bytes=0.0, gloo=LinkCost(0.0, math.inf), gradient_calls=3)
    fast = WorkerPrice("a", CostModel(0.0, 1e-3))
    slow = WorkerPrice("b", CostModel(0.0, 1e-3), exchange_delay_s=0.1)
    assert price_exchange([fast, slow, fast], price).exposed_s == pytest.approx(0.3)
    assert price_exchange([fast, fast], price).exposed_s == 0.0
    measured = price_exchange([fast, slow], price, measured_gradient_s=0.05)
    assert measured.measured and measured.exposed_s == 0.05 == measured.gradient_s
    # Staging through host memory and BatchNorm's exchanges stay priced beside it.
    gpu = WorkerPrice("g", CostModel(0.0, 1e-4), device="cuda")
    staged = ExchangePrice(
        gradient_bytes=1e6,
        gloo=LinkCost(1e-3, 1e9),
        batchnorm_layers=2,
        batchnorm_bytes=100.0,
        host_bytes_per_s=1e9,
        overlap=0.5,
    )
    mixed = price_exchange([gpu, fast], staged, measured_gradient_s=0.05)
    bn = LinkCost(1e-3, 1e9).allreduce_s(200.0, 2, calls=4) + 2 * 200.0 / 1e9
    assert mixed.gradient_s == pytest.approx(0.05 + 2 * 1e6 / 1e9)
    assert mixed.batchnorm_s == pytest.approx(bn)
    assert mixed.exposed_s == pytest.approx(0.5 * mixed.gradient_s + bn)


def test_implied_overlap_reads_what_a_trained_group_hid():
    cost = ExchangeCost("gloo", gradient_s=0.1, batchnorm_s=0.02, exposed_s=0.12)
    assert implied_overlap(0.42, 0.4, cost) == pytest.approx(1.0)
    assert implied_overlap(0.47, 0.4, cost) == pytest.approx(0.5)
    assert implied_overlap(0.9, 0.4, cost) == 0.0
    assert implied_overlap(1.0, 0.4, ExchangeCost("none", 0.0, 0.0, 0.0)) == 0.0


def test_noise_is_the_largest_robust_spread_the_track_record_or_the_floor():
    assert relative_noise([0.1] * 5) == 0.0
    assert relative_noise([0.1]) == 0.0
    spread = relative_noise([0.9, 1.0, 1.1, 1.0, 5.0])  # one outlier barely moves it
    assert spread == pytest.approx(1.4826 * 0.1)
    assert prediction_noise([[1.0] * 4]) == 0.02
    # The error of a price fitted to n steps: the spread over sqrt(n).
    assert prediction_noise([[1.0] * 4, [0.9, 1.0, 1.1]]) == pytest.approx(1.4826 * 0.1 / 3**0.5)
    nine = [0.9, 1.0, 1.1] * 3
    assert prediction_noise([nine]) == pytest.approx(relative_noise(nine) / 3)
    assert prediction_noise([[1.0] * 4], past_errors=[0.3, -0.3, 0.01]) == pytest.approx(0.3)
    assert prediction_noise([[1.0] * 4], past_errors=[2.0, -3.0]) == 0.9  # capped
    assert noise_margin(0.05) == pytest.approx(1.05 / 0.95 - 1)


def test_bad_prices_are_refused_by_name():
    with pytest.raises(AllocationError, match="overlap"):
        ExchangePrice(gradient_bytes=1.0, gloo=LinkCost(0.0, 1.0), overlap=1.5)
    with pytest.raises(AllocationError, match="bytes_per_s"):
        LinkCost(0.0, 0.0)
    with pytest.raises(AllocationError, match="worker 'x': device"):
        WorkerPrice("x", CostModel(0.0, 1.0), device="tpu")  # type: ignore[arg-type]
    with pytest.raises(AllocationError, match="feed_samples_per_s"):
        WorkerPrice("x", CostModel(0.0, 1.0), feed_samples_per_s=-1.0)
    with pytest.raises(AllocationError, match="host_bytes_per_s"):
        ExchangePrice(gradient_bytes=1.0, gloo=LinkCost(0.0, 1.0), host_bytes_per_s=0.0)


def test_alone_rate_is_loader_bound_and_capped():
    w = WorkerPrice("a", CostModel(0.01, 1e-3), compute=CostModel(0.0, 1e-4), cap=50)
    assert w.alone_samples_per_s(200) == pytest.approx(50 / 0.06)
    assert w.fed_cost() == CostModel(0.0, 1e-4)
    assert WorkerPrice("b", CostModel(0.0, 1e-3), cap=0).alone_samples_per_s(10) == 0.0
