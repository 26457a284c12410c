"""Experiment tracking end to end on local Ray: a ``train`` job and the Python API with
tracking on (a Tune search with ``tracking:`` is test_tune.py's ASHA search), read back from
the TensorBoard event files (TensorBoard's own reader) and the MLflow store (MLflow's client on
a local sqlite database; MLflow 3 keeps ``file:`` stores in maintenance mode, refused unless
``MLFLOW_ALLOW_FILE_STORE=true``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from mlflow import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from raytrain_hetero.app.config import validate_config
from raytrain_hetero.driver.tracking import flatten_params

pytestmark = pytest.mark.ray

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "configs" / "eurosat_tune.yaml"


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    return tmp_path_factory.mktemp("eurosat")


def tiny_job(data_root: Path, tmp_path: Path, **extra) -> dict:
    """Two CPU workers, 20 samples per class, one or two short epochs, tracking on."""
    data = yaml.safe_load(EXAMPLE.read_text())
    data.pop("tune")
    data["name"] = "tracked"
    data["data"].update(root=str(data_root), generate={"samples_per_class": 20})
    data["model"]["width"] = 4
    data["train"].update(epochs=2, global_batch_size=32)
    data["probe"] = {"batch_sizes": [4, 8], "warmup": 1, "repeats": 1, "calibration_rounds": 1}
    data["tracking"] = {
        "tensorboard": {"enabled": True},
        "mlflow": {
            "enabled": True,
            "tracking_uri": f"sqlite:///{tmp_path}/mlflow.db",
            "artifact_location": str(tmp_path / "artifacts"),
        },
    }
    return {**data, **extra}


def events(directory: Path) -> EventAccumulator:
    accumulator = EventAccumulator(str(directory), size_guidance={"tensors": 0, "scalars": 0})
    accumulator.Reload()
    return accumulator


@pytest.mark.timeout(300)
def test_train_job_logs_scalars_plans_params_and_plots(ray_local, data_root, tmp_path):
    from raytrain_hetero.app.job import run_job

    job = validate_config(tiny_job(data_root, tmp_path), "job.yaml")
    out = tmp_path / "out"
    summary = run_job(job, output_dir=out, progress=False)

    # TensorBoard: one run directory named after the Ray run, under <output>/tensorboard.
    run_dir = out / "tensorboard" / summary["run"]["name"]
    acc = events(run_dir)
    scalars = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/samples_per_s", "val_accuracy", "plan/version"} <= scalars
    for rank in (0, 1):
        assert {f"worker/rank{rank}/{k}" for k in ("slice", "weight", "samples_per_s")} <= scalars
    steps = summary["steps"]
    assert [e.step for e in acc.Scalars("train/loss")] == list(range(steps))
    slices = [e.value for e in acc.Scalars("worker/rank0/slice")]
    assert len(slices) == steps and all(s >= 1 for s in slices)
    assert [e.step for e in acc.Scalars("val_accuracy")][-1] == steps  # after the last step
    plans = summary["plans"]
    texts = [e.tensor_proto.string_val[0].decode() for e in acc.Tensors("plans/text_summary")]
    assert texts == [
        f"plan v{p['version']} from step {p['effective_step']}: slices {p['slices']} "
        f"({p['reason']})"
        for p in plans
    ]

    # MLflow: one finished run in the job's experiment, params = the resolved job.
    client = MlflowClient(tracking_uri=job.tracking.mlflow.tracking_uri)
    experiment = client.get_experiment_by_name("tracked")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == summary["run"]["name"]
    assert run.data.params == flatten_params(job.model_dump(mode="json"))
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert [m.step for m in history] == list(range(steps))
    assert len(client.get_metric_history(run.info.run_id, "val_accuracy")) == 2  # per epoch
    final = client.get_metric_history(run.info.run_id, "val_accuracy")[-1].value
    assert final == pytest.approx(summary["final_val_accuracy"])
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"throughput.png", "summary.json", "metrics.csv", "plans.json"} <= artifacts


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
