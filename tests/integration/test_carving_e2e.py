"""Exactly-once carving end to end: plan change mid-epoch, failure and resume mid-epoch, then
a worker process dying mid-step (the crash test of test_elastic.py, moved onto this fit):
every restore holds the state recorded at its cursor, the committed ledger is exactly-once,
and the final parameters equal a run without failures.

The same fit proves the Python API's experiment tracking through those restarts, read back
from the TensorBoard event files (TensorBoard's own reader) and the MLflow store (MLflow's
client on a local sqlite database; MLflow 3 keeps ``file:`` stores in maintenance mode). The
YAML job's tracking is read back from test_cli.py's ``train`` run, a Tune search's from
test_tune.py's ASHA search."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch
from ledgers import assert_exactly_once, assert_restores_match, committed_ledger, params_digest
from ray.train import FailureConfig, RunConfig
from train_loops import ledger_loop, make_regression_data, one_device_params, plain_model

from raytrain_hetero import BatchConfig, HeteroTrainer, TrackingConfig, WorkerSpec

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
        # Then rank 1's process dies in step 9 (the restarted group's second step): the group
        # restarts again from step 7's checkpoint, the only one.
        "crash_rank_at": 9,
    }
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    trainer = HeteroTrainer(
        ledger_loop,
        train_loop_config=config,
        workers=[WorkerSpec(name="a"), WorkerSpec(name="b"), WorkerSpec(name="c")],
        batch=BatchConfig(global_batch_size=16, fixed_shares=[1.0, 2.0, 3.0]),
        tracking=TrackingConfig(
            tensorboard={"enabled": True, "log_dir": str(tmp_path / "tb")},
            mlflow={
                "enabled": True,
                "tracking_uri": uri,
                "experiment_name": "py",
                "artifact_location": str(tmp_path / "artifacts"),
            },
        ),
        run_config=RunConfig(
            name="ledger",
            storage_path=str(tmp_path / "results"),
            failure_config=FailureConfig(max_failures=2),
        ),
    )
    result = trainer.fit()
    assert result.error is None
    assert (out / "failed_once").exists()
    assert (out / "crashed_once").read_text() == "9"
    entries = read_ledger(out)
    attempts = {e["attempt"] for e in entries}
    assert attempts == {0, 1, 2}, "the injected failure and the crash must each restart"
    # The failure came right after step 7's checkpoint: attempt 1 starts at step 8, mid-epoch 1.
    assert max(e["step"] for e in entries if e["attempt"] == 0) == 7
    assert min(e["step"] for e in entries if e["attempt"] == 1) == 8
    # The crash in step 9 rolled steps 8-9 of attempt 1 back: attempt 2 resumed at step 8.
    assert min(e["step"] for e in entries if e["attempt"] == 2) == 8
    # No attempt repeats epoch 0 (its steps ran once, in attempt 0), and the repeated step 8
    # carved the very same samples on every rank.
    ids = Counter(i for e in entries if e["epoch"] == 0 for i in e["ids"])
    assert sorted(ids) == list(range(70)) and max(ids.values()) == 1, "epoch 0"

    def step_ids(step, attempt):
        return {
            e["rank"]: e["ids"] for e in entries if (e["step"], e["attempt"]) == (step, attempt)
        }

    assert step_ids(8, 1) == step_ids(8, 2) and len(step_ids(8, 2)) == 3
    # Every restore holds the state recorded at its cursor; what reached the final model is
    # every sample once per epoch.
    fresh = params_digest(plain_model(6, 3, torch.float32))
    starts = assert_restores_match(out, fresh)
    assert [s["resume_step"] for s in starts] == [0, 8, 8]
    kept, groups = committed_ledger(out)
    assert len(groups) == 3
    assert_exactly_once(kept, 70, [0, 1])

    # Slices: shares 1:2:3 for steps 0-1, the new plan 3:2:1 from step 2 on, on every rank.
    def slices_at(step, attempt=None):
        return [
            len(e["ids"])
            for e in sorted(
                (e for e in entries if e["step"] == step and attempt in (None, e["attempt"])),
                key=lambda e: e["rank"],
            )
        ]

    assert slices_at(0) == slices_at(1) == [3, 5, 8]
    assert slices_at(2) == [8, 5, 3]
    assert slices_at(4) == [3, 2, 1]  # the short last step of epoch 0, still under 3:2:1
    # Each restarted group starts from its configured shares again (a new plan version).
    # (Attempt 1's step 9 is left out: the crash may end the other ranks before they log it.)
    assert slices_at(8, 1) == slices_at(8, 2) == [3, 5, 8]
    assert slices_at(9, 2) == [1, 2, 3]
    finals = [json.loads((out / f"final_rank{r}.json").read_text()) for r in range(3)]
    # Both restarts restored step 7's checkpoint (plans 1 and 2): each group's plan is the 3rd.
    assert {f["plan_version"] for f in finals} == {3}
    # The parameters a run without the failure and the crash reaches (float32: sums in
    # another order).
    x, y, _ = make_regression_data(70, 6, 3, torch.float32)
    want = one_device_params(plain_model(6, 3, torch.float32), x, y, batch=16, epochs=2, lr=0.1)
    got = np.load(out / "final_params.npy")
    assert np.linalg.norm(got - want) / np.linalg.norm(want) <= 1e-4

    # Tracking: each rank's slice and weight at each step it logged, whichever attempt ran it
    # (steps repeated after a restart carry the same slices, see above; a step whose records
    # had not reached the driver when its group died is not logged); one MLflow run for the
    # whole fit, closed FINISHED with its parameters and the plan history.
    from mlflow import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb" / "ledger"), size_guidance={"scalars": 0})
    events.Reload()
    for rank in range(3):
        logged = events.Scalars(f"worker/rank{rank}/slice")
        steps = {e.step for e in logged}
        assert steps <= set(range(10)) and len(steps) >= 5 and 9 in steps, (rank, steps)
        for event in logged:
            ran = {len(e["ids"]) for e in entries if (e["rank"], e["step"]) == (rank, event.step)}
            assert event.value in ran, (rank, event.step, event.value, ran)
    weights = {e.step: e.value for e in events.Scalars("worker/rank1/weight")}
    slices = {e.step: e.value for e in events.Scalars("worker/rank1/slice")}
    # A rank's weight is its share of its step's samples: 16 a step, 6 in each epoch's last.
    assert weights == pytest.approx(
        {step: n / (6 if step % 5 == 4 else 16) for step, n in slices.items()}
    )
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("py").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "ledger"
    assert run.data.params["batch.global_batch_size"] == "16"
    assert run.data.params["workers.1.name"] == '"b"'
    assert run.data.params["train_loop_config.size"] == "70"
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"plans.json"}
