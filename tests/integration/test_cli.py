"""The main job through the real CLI: outputs, and clear errors that leave nothing behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from raytrain_hetero.app.cli import main
from raytrain_hetero.app.datasets import model_arguments, open_configured_datasets
from raytrain_hetero.app.outputs import read_metrics_csv
from raytrain_hetero.inference.checkpoints import load_checkpoint
from raytrain_hetero.workloads import build_model
from raytrain_hetero.workloads.evaluation import dataset_accuracy

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "configs" / "eurosat_local.yaml"


@pytest.fixture(scope="module")
def _runs() -> dict:
    """Runs shared by the tests of this module (each fit costs a worker-group start)."""
    return {}


@pytest.fixture
def cli_train(ray_local, tmp_path_factory, monkeypatch, capsys, _runs):
    """``raytrain-hetero train`` on the example, smaller, with TensorBoard and MLflow tracking
    on (MLflow on a local sqlite database), run once in this process from a fresh folder (the
    job's relative data root is below it). Returns (folder, the job as the CLI resolved it,
    what it printed)."""
    if "train" not in _runs:
        from raytrain_hetero.app.config import load_config, parse_overrides

        folder = tmp_path_factory.mktemp("cli-train")
        sets = [
            "data.generate.samples_per_class=30",
            "train.epochs=2",
            "train.global_batch_size=48",
            "model.width=8",
            "tracking.tensorboard.enabled=true",
            "tracking.mlflow.enabled=true",
            f"tracking.mlflow.tracking_uri=sqlite:///{folder}/mlflow.db",
            f"tracking.mlflow.artifact_location={folder / 'artifacts'}",
        ]
        monkeypatch.chdir(folder)
        argv = ["train", "--config", str(EXAMPLE), "--output", str(folder / "out")]
        code = main([*argv, "--no-progress", *(p for v in sets for p in ("--set", v))])
        printed = capsys.readouterr().out
        assert code == 0
        job = load_config(EXAMPLE, parse_overrides(sets))
        _runs["train"] = (folder, job, printed)
    return _runs["train"]


@pytest.mark.ray
def test_train_writes_outputs_and_prints_accuracy(cli_train):
    folder, job, printed = cli_train
    out = folder / "out"
    assert "final validation accuracy:" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert 0.0 <= summary["final_val_accuracy"] <= 1.0
    assert summary["samples_per_s"] > 0
    workers = {w["worker"]: w for w in summary["workers"]}
    assert set(workers) == {"fast", "medium", "slow"}
    assert sum(w["slice"] for w in workers.values()) == 48
    # Emulated slowdowns 1, 2, 4: the probe gives the fast worker the largest slice.
    assert workers["fast"]["slice"] > workers["medium"]["slice"] > workers["slow"]["slice"]
    reported = summary["reported"]
    assert {f"hetero/rank{r}/slice" for r in range(3)} <= set(reported)
    assert reported["hetero/plan_version"] >= 1
    # The start the user waits: the fit's call to its first step holds the library's part.
    assert reported["hetero/fit_start_s"] > reported["hetero/startup_s"] > 0
    rows = read_metrics_csv(out / "metrics.csv")
    assert {r["rank"] for r in rows} == {0, 1, 2}
    assert len(rows) == 3 * summary["steps"]
    png = (out / "throughput.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    # The synthetic dataset was generated in the real torchgeo layout under the relative root.
    assert (folder / "data" / "eurosat_synth" / "eurosat-train.txt").exists()
    # Validation ran sharded by speed over the three uneven workers: the summed counts are
    # the one-device accuracy of the final checkpoint on the whole validation split.
    val = open_configured_datasets(
        job.data.model_copy(update={"root": str(folder / "data" / "eurosat_synth")}), ("val",)
    )
    model = build_model(job.model.name, **model_arguments(job.model, val))
    model.load_state_dict(load_checkpoint(out)[0])
    assert dataset_accuracy(model, val.datasets["val"], "cpu") == summary["final_val_accuracy"]
    assert reported["hetero/val_samples"] == summary["val_samples"] == len(val.datasets["val"])


@pytest.mark.ray
def test_train_job_logs_scalars_plans_params_and_plots(cli_train):
    """Tracking read back from the TensorBoard event files (TensorBoard's own reader) and the
    MLflow store (MLflow's client on a local sqlite database; see test_carving_e2e.py)."""
    from mlflow import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from raytrain_hetero.driver.tracking import flatten_params

    folder, job, _printed = cli_train
    out = folder / "out"
    summary = json.loads((out / "summary.json").read_text())

    # TensorBoard: one run directory named after the Ray run, under <output>/tensorboard.
    acc = EventAccumulator(
        str(out / "tensorboard" / summary["run"]["name"]),
        size_guidance={"tensors": 0, "scalars": 0},
    )
    acc.Reload()
    scalars = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/samples_per_s", "val_accuracy", "plan/version"} <= scalars
    for rank in (0, 1, 2):
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
    experiment = client.get_experiment_by_name(job.name)
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


def test_unknown_key_is_one_clear_error(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("  lr: 0.05", "  learning_rate: 0.05"))
    out = tmp_path / "out"
    code = main(["train", "--config", str(bad), "--output", str(out)])
    assert code == 2
    err = capsys.readouterr().err
    assert "learning_rate" in err and "lr" in err and "Fix" in err
    assert not out.exists()


def test_missing_data_root_names_the_path_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    missing = tmp_path / "no_such_eurosat"
    code = main(
        [
            "train",
            "--config",
            str(EXAMPLE),
            "--output",
            str(out),
            "--set",
            f"data.root={missing}",
            "--set",
            "data.generate=null",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert str(missing) in err
    assert not out.exists() and not missing.exists()


def test_console_script_help_runs():
    done = subprocess.run(
        [sys.executable, "-m", "raytrain_hetero", "train", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--config" in done.stdout


@pytest.mark.ray
def test_probe_prints_each_worker_and_the_plan(ray_local, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = main(
        [
            "probe",
            "--config",
            str(EXAMPLE),
            "--set",
            "data.generate.samples_per_class=12",
            "--set",
            "train.global_batch_size=24",
            "--set",
            "model.width=8",
            "--set",
            "probe.calibration_steps=1",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    for name in ("fast", "medium", "slow"):
        assert name in printed
    plan_line = next(line for line in printed.splitlines() if line.startswith("plan v1"))
    slices = [int(x) for x in plan_line.split("[")[1].split("]")[0].split(",")]
    assert sum(slices) == 24 and min(slices) >= 1
    # The group table: one verdict per worker with the numbers, then the decision's summary.
    lines = printed.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("group: samples/s"))
    rows = lines[head + 2 : head + 5]
    verdicts = ("train:", "STAND BY:", "FEED:")
    assert all(any(v in row for v in verdicts) and " ms " in row for row in rows), rows
    assert sorted(row.split()[2] for row in rows) == ["fast", "medium", "slow"]
    assert lines[head + 5].strip() and not any(v in lines[head + 5] for v in verdicts)
