"""The live scheduler end to end on local Ray: re-plans under an injected slowdown, survives its
own death, and keeps the carving exactly-once."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from ray.train import RunConfig
from train_loops import live_loop

from raytrain_hetero import BatchConfig, EmulationConfig, HeteroTrainer, SchedulerConfig, WorkerSpec
from raytrain_hetero.driver.scheduler import lookup_scheduler

pytestmark = pytest.mark.ray

FAST_POLICY = {
    "window_steps": 4,
    "confirm_windows": 2,
    "min_steps_between_replans": 4,
    "improvement_threshold": 0.15,
}


def read_ledger(out):
    entries = []
    for path in sorted(out.glob("ledger_rank*.jsonl")):
        rank = int(path.name.split("_")[1].removeprefix("rank"))
        for line in path.read_text().splitlines():
            entries.append({**json.loads(line), "rank": rank})
    return entries


def assert_exactly_once(entries, size, epochs):
    for epoch in range(epochs):
        ids = Counter(i for e in entries if e["epoch"] == epoch for i in e["ids"])
        assert sorted(ids) == list(range(size)), f"epoch {epoch} missed samples"
        assert max(ids.values()) == 1, f"epoch {epoch} repeated samples"


def test_slowed_rank_gets_a_smaller_slice_and_ledger_stays_exact(ray_local, tmp_path):
    out = tmp_path / "live"
    out.mkdir()
    size, epochs = 470, 3  # B=48: 10 steps per epoch (the tail of 38 is its own step)
    trainer = HeteroTrainer(
        live_loop,
        train_loop_config={"size": size, "epochs": epochs, "out": str(out)},
        workers=[WorkerSpec(name="a"), WorkerSpec(name="b"), WorkerSpec(name="c")],
        batch=BatchConfig(global_batch_size=48, fixed_shares=[1.0, 1.0, 1.0]),
        scheduler=SchedulerConfig(live=True, policy=FAST_POLICY, plan_sync_every=2, flush_every=2),
        emulation=EmulationConfig(slowdowns=[{"rank": 0, "factor": 3.0, "from_step": 6}]),
        run_config=RunConfig(name="live", storage_path=str(tmp_path / "results")),
    )
    result = trainer.fit()
    assert result.error is None
    live_plans = [p for p in trainer.plans if p.reason.startswith("live")]
    assert live_plans, f"no live re-plan; decisions={trainer.decisions}"
    # Under CI load the tiny model's per-step compute is noisy enough that an aggressive policy
    # may re-plan on noise before step 6 (one CI run saw [16, ...] first); what must hold is
    # that the slowdown is answered: a live plan gives rank 0 the smallest slice soon after
    # step 6, and the run's last plan still does.
    shrinks = [p for p in live_plans if p.slices[0] < min(16, *p.slices[1:])]
    assert shrinks, f"rank 0 never got the smallest slice; plans={live_plans}"
    first = shrinks[0]
    assert first.effective_step <= 6 + 30, live_plans
    assert "->" in first.reason
    last = trainer.plans[-1]
    assert last.slices[0] < min(last.slices[1:]), trainer.plans
    # Rank 0 really did get less from the switch on, as every rank saw it.
    entries = read_ledger(out)
    after = [e for e in entries if e["step"] == first.effective_step]
    assert sorted((e["rank"], len(e["ids"])) for e in after) == list(enumerate(first.slices))
    assert_exactly_once(entries, size, epochs)


def test_training_survives_the_scheduler_actor_dying(ray_local, tmp_path):
    out = tmp_path / "kill"
    out.mkdir()
    size, epochs = 200, 2
    trainer = HeteroTrainer(
        live_loop,
        train_loop_config={"size": size, "epochs": epochs, "out": str(out), "kill_scheduler_at": 3},
        workers=[WorkerSpec(name="a"), WorkerSpec(name="b")],
        batch=BatchConfig(global_batch_size=40, fixed_shares=[1.0, 2.0]),
        scheduler=SchedulerConfig(live=True, plan_sync_every=2),
        run_config=RunConfig(name="kill", storage_path=str(tmp_path / "results")),
    )
    trainer.train_loop_config["run_id"] = trainer.run_id
    result = trainer.fit()
    assert result.error is None
    assert (out / "killed_scheduler").read_text() == "3"
    entries = read_ledger(out)
    assert max(e["step"] for e in entries) == 9  # all 10 steps ran
    assert_exactly_once(entries, size, epochs)
    # Ray restarted the scheduler (the driver owns it), and it received the later steps.
    assert any(r.step >= 6 for r in trainer.step_records)
    keys = [r.key for r in trainer.step_records]
    assert len(keys) == len(set(keys))  # resends after the failed push are kept once
    # The driver killed its actor when the run ended: nothing is left behind.
    assert lookup_scheduler(trainer.run_id) is None
