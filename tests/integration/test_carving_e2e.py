"""Exactly-once carving end to end: plan change mid-epoch, failure and resume mid-epoch."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from ray.train import FailureConfig, RunConfig
from train_loops import ledger_loop

from raytrain_hetero import BatchConfig, HeteroTrainer, WorkerSpec

pytestmark = pytest.mark.ray


def read_ledger(out):
    entries = []
    for path in sorted(out.glob("ledger_rank*_attempt*.jsonl")):
        rank = int(path.name.split("_")[1].removeprefix("rank"))
        attempt = int(path.stem.split("attempt")[1])
        for line in path.read_text().splitlines():
            entries.append({**json.loads(line), "rank": rank, "attempt": attempt})
    return entries


def test_ledger_exactly_once_across_replan_and_mid_epoch_resume(ray_local, tmp_path):
    out = tmp_path / "ledger"
    out.mkdir()
    # 70 samples, B=16, 3 workers: steps of 16,16,16,16 and a short 6 (>= 3, its own step).
    config = {
        "size": 70,
        "epochs": 2,
        "out": str(out),
        "replan_at": 1,
        "new_shares": [3.0, 2.0, 1.0],
        "checkpoint_at": 7,
    }
    trainer = HeteroTrainer(
        ledger_loop,
        train_loop_config=config,
        workers=[WorkerSpec(name="a"), WorkerSpec(name="b"), WorkerSpec(name="c")],
        batch=BatchConfig(global_batch_size=16, fixed_shares=[1.0, 2.0, 3.0]),
        run_config=RunConfig(
            name="ledger",
            storage_path=str(tmp_path / "results"),
            failure_config=FailureConfig(max_failures=1),
        ),
    )
    result = trainer.fit()
    assert result.error is None
    assert (out / "failed_once").exists()
    entries = read_ledger(out)
    attempts = {e["attempt"] for e in entries}
    assert attempts == {0, 1}, "the injected failure must have restarted the group"
    # The failure came right after step 7's checkpoint: attempt 1 starts at step 8, mid-epoch 1.
    assert max(e["step"] for e in entries if e["attempt"] == 0) == 7
    assert min(e["step"] for e in entries if e["attempt"] == 1) == 8
    for epoch in (0, 1):
        ids = Counter(i for e in entries if e["epoch"] == epoch for i in e["ids"])
        assert sorted(ids) == list(range(70)), f"epoch {epoch} missed samples"
        assert max(ids.values()) == 1, f"epoch {epoch} repeated samples"

    # Slices: shares 1:2:3 for steps 0-1, the new plan 3:2:1 from step 2 on, on every rank.
    def slices_at(step):
        return [
            len(e["ids"])
            for e in sorted((e for e in entries if e["step"] == step), key=lambda e: e["rank"])
        ]

    assert slices_at(0) == slices_at(1) == [3, 5, 8]
    assert slices_at(2) == [8, 5, 3]
    assert slices_at(4) == [3, 2, 1]  # the short last step of epoch 0, still under 3:2:1
    # The restarted group starts from its configured shares again (a new plan version).
    assert slices_at(8) == [3, 5, 8]
    assert slices_at(9) == [1, 2, 3]
    finals = [json.loads((out / f"final_rank{r}.json").read_text()) for r in range(3)]
    assert {f["plan_version"] for f in finals} == {3}
