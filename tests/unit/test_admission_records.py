"""Where an admission decision goes: the scheduler keeps the first one, the driver drains it,
the probe command prints it, and the settings refuse nonsense."""

from __future__ import annotations

import pytest

from raytrain_hetero import ConfigError
from raytrain_hetero.app.outputs import format_admission_table
from raytrain_hetero.config import ProbeConfig, WorkerSpec
from raytrain_hetero.core.admission import decide_admission
from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.driver.scheduler import HeteroScheduler


def _decision():
    costs = [CostModel(0.002, 0.001), CostModel(0.002, 0.001), CostModel(0.002, 0.02)]
    return decide_admission(
        48, costs, collective_s=[0.0, 0.002, 0.302], names=["fast-0", "fast-1", "slow"]
    )


def test_the_scheduler_keeps_the_first_decision_and_hands_it_to_the_driver():
    scheduler = HeteroScheduler("run", live=False, clock=lambda: 0.0)
    assert scheduler.admission() is None and scheduler.admitted_slots() is None
    first = dict(_decision().to_dict(), summary="first", keep_slots=[1, 2])
    scheduler.record_admission(first)
    scheduler.record_admission(dict(first, summary="second", keep_slots=[0, 1, 2]))  # once
    assert scheduler.admitted_slots() == (1, 2)
    assert scheduler.drain().admission["summary"] == "first"


def test_the_probe_table_names_the_left_out_worker_with_its_numbers():
    decision = _decision()
    text = format_admission_table(dict(decision.to_dict(), summary=decision.summary()))
    lines = text.splitlines()
    slow = next(line for line in lines if " slow " in line)
    assert "LEAVE OUT" in slow and "302.0 ms" in slow
    assert f"{decision.workers[2].with_samples_per_s:.1f}" in slow
    assert all("admit" in line for line in lines if "fast-" in line)
    assert lines[-1].startswith("admission: leave out slow (rank 2)")


def test_admission_and_the_emulated_link_delay_are_checked():
    assert ProbeConfig().admission is None  # the old name of group
    with pytest.raises(ConfigError, match="admission"):
        ProbeConfig(admission="sometimes")
    with pytest.raises(ConfigError, match="emulated_collective_delay_s"):
        WorkerSpec(name="w", emulated_collective_delay_s=-1)
