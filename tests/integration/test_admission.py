"""``probe.group: train`` (the old ``admission: auto``) end to end on local Ray (EMULATION: a
20x slower worker whose every gradient all-reduce is delayed 0.3 s, as behind a slow link),
listed FIRST (users do not know which worker is slow before measuring): the decision leaves it
out, Ray Train re-sizes the group to two workers that host the two fast slots, and the run
finishes on them. Decided twice: by an explicit probe before step 0, and under the cheap start
at the end of the passive window (the window's steps are trained again by the kept group).
Re-taken: a group that kept everyone and then runs below its prediction decides again."""

from __future__ import annotations

import json

import pytest
from admission_loops import admission_loop

from raytrain_hetero import HeteroTrainer, WorkerSpec
from raytrain_hetero.config import BatchConfig, EmulationConfig, ProbeConfig

pytestmark = pytest.mark.ray


def test_a_worker_that_costs_more_than_it_adds_is_left_out(ray_local, tmp_path, run_config):
    out = tmp_path / "admission"
    out.mkdir()
    trainer = HeteroTrainer(
        admission_loop,
        train_loop_config={"size": 192, "epochs": 1, "out": str(out)},
        workers=[
            # Every compute stretched (fast 8x, slow 160x: still 20x apart) so that a second
            # fast worker clearly pays for its all-reduce: unstretched, this tiny model's step
            # was about as short as a 2-rank all-reduce and a cold first Ray session once left
            # fast-1 out (the greedy was right on what it measured; the scenario was marginal).
            WorkerSpec(name="slow", emulated_slowdown=160.0, emulated_collective_delay_s=0.3),
            WorkerSpec(name="fast", count=2, emulated_slowdown=8.0),
        ],
        batch=BatchConfig(global_batch_size=48),
        probe=ProbeConfig(mode="probe", group="train", calibration_steps=1, calibration_rounds=1),
        run_config=run_config,
    )
    result = trainer.fit()
    assert result.error is None

    decision = trainer.admission
    assert decision is not None, "the admission decision was not recorded"
    verdicts = {w["worker"]: w for w in decision["workers"]}
    assert not verdicts["slow"]["admitted"]
    # The group decision's verdicts (stand by / train) and its one line.
    assert verdicts["slow"]["verdict"] == "stand_by"
    assert {verdicts[n]["verdict"] for n in ("fast-0", "fast-1")} == {"train"}
    assert decision["standing_by"] == [0] and decision["mode"] == "train"
    assert "stand by slow" in decision["summary"] and "\n" not in decision["summary"]
    assert verdicts["slow"]["with_samples_per_s"] < verdicts["slow"]["without_samples_per_s"]
    assert verdicts["fast-0"]["admitted"] and verdicts["fast-1"]["admitted"]
    assert decision["keep_slots"] == [1, 2]  # slot 0 (slow) dropped though listed first
    # Measured per prefix of the fastest-first order: only the group with the slow link waits.
    assert decision["collective_s"][2] >= 0.3 > decision["collective_s"][1]
    assert decision["admitted_samples_per_s"] > decision["all_samples_per_s"]

    records = [json.loads(p.read_text()) for p in out.glob("*_rank*.json")]
    assert records, "no group finished the loop"
    # Only the re-sized group trained: two ranks, both fast, all four steps each.
    assert {r["world_size"] for r in records} == {2}
    assert sorted(r["worker"] for r in records) == ["fast-0", "fast-1"]
    assert all(r["steps"] == 4 and len(r["slices"]) == 2 for r in records)
    # Every plan the run installed belongs to the two-worker group.
    assert trainer.plans and all(p.world_size == 2 for p in trainer.plans)


def test_the_cheap_start_decides_at_the_passive_windows_end(ray_local, tmp_path, run_config):
    out = tmp_path / "passive"
    out.mkdir()
    trainer = HeteroTrainer(
        admission_loop,
        # 8 steps: the window times steps 1-3 of the prior (equal slices), the decision follows.
        train_loop_config={"size": 384, "epochs": 1, "out": str(out)},
        workers=[
            WorkerSpec(name="slow", emulated_slowdown=160.0, emulated_collective_delay_s=0.3),
            WorkerSpec(name="fast", count=2, emulated_slowdown=8.0),
        ],
        batch=BatchConfig(global_batch_size=48),
        probe=ProbeConfig(group="train", remember=False),  # mode: passive, the default
        run_config=run_config,
    )
    result = trainer.fit()
    assert result.error is None

    decision = trainer.admission
    assert decision is not None, "the passive window's decision was not recorded"
    verdicts = {w["worker"]: w["verdict"] for w in decision["workers"]}
    assert verdicts == {"slow": "stand_by", "fast-0": "train", "fast-1": "train"}
    assert decision["keep_slots"] == [1, 2]
    # Noise from the window's step times: the margin the gain had to beat is recorded.
    assert decision["admitted_samples_per_s"] > decision["all_samples_per_s"]

    records = [json.loads(p.read_text()) for p in out.glob("*_rank*.json")]
    # The three-worker group stopped at the window's end; only the kept group finished, and it
    # trained every step of the epoch (the window's steps again, from the start).
    assert {r["world_size"] for r in records} == {2}
    assert sorted(r["worker"] for r in records) == ["fast-0", "fast-1"]
    assert all(r["steps"] == 8 for r in records)
    # The first group started on the prior (three slices), the run ends on two.
    assert trainer.plans[0].world_size == 3 and trainer.plans[-1].world_size == 2


def test_a_group_that_runs_below_its_prediction_decides_again(ray_local, tmp_path, run_config):
    """Three equal workers: the window's decision keeps all three. From step 4 one of them is
    60x slower (EMULATED, scheduled): the group's next ten steps run far below the decision's
    prediction, so it re-prices from them and decides again. At 60x even a one-sample slice
    costs that worker more than the other two's whole step (at 20x the re-take rightly keeps
    it on a one-sample slice), so it stands by and the run finishes on the other two (from
    the start: the loop keeps no checkpoint)."""
    out = tmp_path / "retake"
    out.mkdir()
    trainer = HeteroTrainer(
        admission_loop,
        train_loop_config={"size": 960, "epochs": 2, "out": str(out)},  # 20 steps an epoch
        workers=[WorkerSpec(name="fast", count=3, emulated_slowdown=8.0)],
        batch=BatchConfig(global_batch_size=48),
        probe=ProbeConfig(group="train", remember=False),
        emulation=EmulationConfig(slowdowns=[{"factor": 60.0, "worker": "fast-2", "from_step": 4}]),
        run_config=run_config,
    )
    result = trainer.fit()
    assert result.error is None

    decision = trainer.admission
    assert decision is not None
    assert "below it" in decision["retake"], decision.get("retake")
    verdicts = {w["worker"]: w["verdict"] for w in decision["workers"]}
    assert verdicts == {"fast-0": "train", "fast-1": "train", "fast-2": "stand_by"}
    assert decision["keep_slots"] == [0, 1]
    records = [json.loads(p.read_text()) for p in out.glob("*_rank*.json")]
    assert {r["world_size"] for r in records} == {2}
    assert sorted(r["worker"] for r in records) == ["fast-0", "fast-1"]
    assert all(r["steps"] == 40 for r in records)
    assert trainer.plans[0].world_size == 3 and trainer.plans[-1].world_size == 2
