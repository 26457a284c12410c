"""Where an admission decision goes: the scheduler keeps the first one, the driver drains it,
the probe command prints it, and the settings refuse nonsense."""

from __future__ import annotations

import pytest

from raytrain_hetero import ConfigError
from raytrain_hetero.app.outputs import format_admission_table
from raytrain_hetero.config import ProbeConfig, WorkerSpec
from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.group_decision import decide_group
from raytrain_hetero.core.group_price import ExchangePrice, LinkCost, WorkerPrice
from raytrain_hetero.driver.scheduler import HeteroScheduler
from raytrain_hetero.worker.plan.admission import admission_record

COLLECTIVE = [0.0, 0.002, 0.302]


def _decision():
    costs = [CostModel(0.002, 0.001), CostModel(0.002, 0.001), CostModel(0.002, 0.02)]
    prices = [WorkerPrice(n, c) for n, c in zip(["fast-0", "fast-1", "slow"], costs)]
    return decide_group(
        48,
        prices,
        ExchangePrice(gradient_bytes=4e3, gloo=LinkCost(5e-4, 1e9)),
        noise=0.02,
        mode="train",
        measured_gradient_s={(0, 1): 0.002, (0, 1, 2): 0.302},
    )


def test_the_scheduler_keeps_the_first_decision_and_hands_it_to_the_driver():
    scheduler = HeteroScheduler("run", live=False, clock=lambda: 0.0)
    assert scheduler.admission() is None and scheduler.admitted_slots() is None
    first = dict(admission_record(_decision(), COLLECTIVE, [0, 1]), summary="first")
    scheduler.record_admission(first)
    scheduler.record_admission(dict(first, summary="second", keep_slots=[0, 1, 2]))  # once
    assert scheduler.admitted_slots() == (0, 1)
    assert scheduler.drain().admission["summary"] == "first"


def test_the_probe_table_names_the_left_out_worker_with_its_numbers():
    decision = _decision()
    record = admission_record(decision, COLLECTIVE, [0, 1])
    assert record["excluded"] == [2] and record["admitted"] == [0, 1]
    lines = format_admission_table(record).splitlines()
    slow = next(line for line in lines if " slow " in line)
    assert "STAND BY" in slow and "302.0 ms" in slow
    assert f"{decision.workers[2].alternative_samples_per_s:.1f}" in slow
    assert all("train:" in line for line in lines[2:-1] if "fast-" in line)
    assert lines[-1] == decision.summary() and "stand by slow" in lines[-1]


def test_admission_and_the_emulated_link_delay_are_checked():
    assert ProbeConfig().admission is None  # the old name of group
    with pytest.raises(ConfigError, match="admission"):
        ProbeConfig(admission="sometimes")
    with pytest.raises(ConfigError, match="emulated_collective_delay_s"):
        WorkerSpec(name="w", emulated_collective_delay_s=-1)
