"""Experiment tracking end to end on local Ray through the Python API, read back from the
TensorBoard event files (TensorBoard's own reader) and the MLflow store (MLflow's client on a
local sqlite database; MLflow 3 keeps ``file:`` stores in maintenance mode, refused unless
``MLFLOW_ALLOW_FILE_STORE=true``). The YAML job's tracking is read back from test_cli.py's
``train`` run, a Tune search's from test_tune.py's ASHA search."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

pytestmark = pytest.mark.ray


def events(directory: Path) -> EventAccumulator:
    accumulator = EventAccumulator(str(directory), size_guidance={"tensors": 0, "scalars": 0})
    accumulator.Reload()
    return accumulator


@pytest.mark.timeout(180)
def test_python_api_tracking_opens_feeds_and_closes_its_own_run(ray_local, tmp_path, run_config):
    from train_loops import live_loop

    from raytrain_hetero import BatchConfig, HeteroTrainer, TrackingConfig, WorkerSpec

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    trainer = HeteroTrainer(
        live_loop,
        train_loop_config={"size": 60, "epochs": 1, "out": str(tmp_path)},
        workers=[WorkerSpec(name="a"), WorkerSpec(name="b")],
        batch=BatchConfig(global_batch_size=20, fixed_shares=[3.0, 1.0]),
        tracking=TrackingConfig(
            tensorboard={"enabled": True, "log_dir": str(tmp_path / "tb")},
            mlflow={
                "enabled": True,
                "tracking_uri": uri,
                "experiment_name": "py",
                "artifact_location": str(tmp_path / "artifacts"),
            },
        ),
        run_config=run_config,
    )
    assert trainer.fit().error is None
    acc = events(tmp_path / "tb" / run_config.name)
    assert [e.value for e in acc.Scalars("worker/rank0/slice")] == [15.0] * 3
    assert [e.value for e in acc.Scalars("worker/rank1/weight")] == [0.25] * 3
    assert [e.step for e in acc.Scalars("done")] == [3]  # the loop's last report
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("py").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == run_config.name
    assert run.data.params["batch.global_batch_size"] == "20"
    assert run.data.params["workers.1.name"] == '"b"'
    assert run.data.params["train_loop_config.size"] == "60"
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"plans.json"}
