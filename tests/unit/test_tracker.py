"""Experiment tracking without Ray: the config, the params flattening, and a RunTracker fed
with step records, plans and epoch reports, read back from real TensorBoard event files and a
real (sqlite) MLflow store."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from raytrain_hetero.app.config import validate_config
from raytrain_hetero.app.tracking import job_tracker, resolved_tracking, trial_tracker
from raytrain_hetero.config import TrackingConfig
from raytrain_hetero.core.plan import Plan
from raytrain_hetero.core.records import StepRecord
from raytrain_hetero.driver.telemetry import FitProgress
from raytrain_hetero.driver.tracking import RunTracker, flatten_params
from raytrain_hetero.errors import ConfigError

BASE = {"data": {"root": "data/x"}, "workers": [{"name": "fast"}, {"name": "slow"}]}


def record(step: int, rank: int, slice_: int, loss: float, *, group: str = "g1") -> StepRecord:
    return StepRecord(
        step=step,
        epoch=0,
        rank=rank,
        worker=("fast", "slow")[rank],
        device="cpu",
        slice=slice_,
        weight=slice_ / 12,
        compute_s=0.1,
        load_s=0.0,
        busy_s=0.1,
        samples_per_s=slice_ / 0.1,
        loss=loss,
        global_samples_per_s=120.0,
        plan_version=1,
        group=group,
        world_size=2,
        wall_s=0.1,
        time=1000.0 + step,
    )


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory):
    """One sqlite MLflow store for the module (creating its tables takes seconds)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"


def events(directory: Path) -> EventAccumulator:
    accumulator = EventAccumulator(str(directory), size_guidance={"tensors": 0, "scalars": 0})
    accumulator.Reload()
    return accumulator


# ------------------------------------------------------------------------------ config


def test_tracking_is_off_by_default_and_rejects_unknown_keys():
    config = TrackingConfig()
    assert not config.active
    assert not config.tensorboard.enabled and not config.mlflow.enabled
    assert TrackingConfig(tensorboard={"enabled": True}).active
    with pytest.raises(ConfigError, match="mlflow"):
        TrackingConfig(mlflow={"enabeld": True})


def test_yaml_tracking_section_validates_into_the_library_config(tmp_path):
    job = validate_config(
        {
            **BASE,
            "output_dir": str(tmp_path / "out"),
            "tracking": {
                "tensorboard": {"enabled": True},
                "mlflow": {"enabled": True, "tracking_uri": "sqlite:////tmp/x.db"},
            },
        }
    )
    assert isinstance(job.tracking, TrackingConfig)
    assert job.tracking.mlflow.tracking_uri == "sqlite:////tmp/x.db"
    # The TensorBoard directory defaults to <output_dir>/tensorboard, made absolute.
    assert resolved_tracking(job, tmp_path / "out").tensorboard.log_dir == (
        tmp_path / "out" / "tensorboard"
    )
    with pytest.raises(ConfigError, match=r"tracking\.tensorboard"):
        validate_config({**BASE, "tracking": {"tensorboard": {"enabled": "sometimes"}}})


def test_missing_package_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # what `import mlflow` sees uninstalled
    config = TrackingConfig(mlflow={"enabled": True})
    assert config.missing_packages() == ["mlflow"]
    with pytest.raises(ConfigError, match=r"pip install 'raytrain_hetero\[tracking\]'"):
        config.check_installed()
    TrackingConfig(tensorboard={"enabled": True}).check_installed()  # mlflow not needed


def test_flatten_params_gives_dotted_keys_and_json_values():
    flat = flatten_params(
        {
            "train": {"lr": 0.05, "fixed_shares": [1.0, 2.0], "seed": None},
            "workers": [{"name": "a", "resources": {"CPU": 1}}, {"name": "b"}],
            "output_dir": Path("/o"),
            "empty": {},
            "note": "x" * 7000,
        }
    )
    assert flat["train.lr"] == "0.05"
    assert flat["train.fixed_shares"] == "[1.0, 2.0]"
    assert flat["train.seed"] == "null"
    assert flat["workers.0.name"] == '"a"'
    assert flat["workers.0.resources.CPU"] == "1"
    assert flat["workers.1.name"] == '"b"'
    assert flat["output_dir"] == "/o"
    assert flat["empty"] == "{}"
    assert len(flat["note"]) == 6000 and flat["note"].endswith("...")


# ------------------------------------------------------------------------------ the tracker


def test_tracker_writes_steps_plans_and_reports_to_tensorboard_and_mlflow(tmp_path, mlflow_uri):
    uri = mlflow_uri
    job = validate_config(
        {
            **BASE,
            "name": "tracked",
            "tracking": {
                "tensorboard": {"enabled": True, "log_dir": str(tmp_path / "tb")},
                "mlflow": {
                    "enabled": True,
                    "tracking_uri": uri,
                    "artifact_location": str(tmp_path / "artifacts"),
                },
            },
        }
    )
    tracker = job_tracker(job, tmp_path / "out", "run-1")
    assert tracker is not None
    plan = Plan.from_shares(12, [2.0, 1.0], reason="probe")
    replan = Plan.from_shares(12, [3.0, 1.0], version=2, effective_step=2, reason="re-plan: drift")
    with tracker:
        # Rank 1's record of step 0 arrives in a later drain: the step is written once whole.
        tracker(FitProgress((record(0, 0, 8, 1.0),), (plan,)))
        tracker(FitProgress((record(0, 1, 4, 4.0), record(1, 0, 8, 1.0)), (plan,)))
        tracker(FitProgress((record(1, 1, 4, 1.0),), (plan, replan)))
        report = {
            "epoch": 0,
            "val_accuracy": 0.5,
            "hetero/global_step": 2,
            "hetero/slices": [9, 3],
            "hetero/rank0/slice": 8,
            "run": "text",
        }
        tracker(FitProgress(plans=(plan, replan), reports=(report,)))
        summary = tmp_path / "summary.json"
        summary.write_text("{}")
        tracker.log_artifacts([summary, tmp_path / "missing.png"])

    acc = events(tmp_path / "tb" / "run-1")
    loss = [(e.step, e.value) for e in acc.Scalars("train/loss")]
    assert loss == [(0, pytest.approx(2.0)), (1, pytest.approx(1.0))]  # (8·1 + 4·4) / 12
    assert [e.value for e in acc.Scalars("worker/rank1/slice")] == [4.0, 4.0]
    assert [e.value for e in acc.Scalars("worker/rank0/weight")] == [pytest.approx(8 / 12)] * 2
    assert len(acc.Scalars("worker/rank0/samples_per_s")) == 2
    assert [(e.step, e.value) for e in acc.Scalars("plan/version")] == [(0, 1.0), (2, 2.0)]
    assert [(e.step, e.value) for e in acc.Scalars("val_accuracy")] == [(2, 0.5)]
    assert "hetero/rank0/slice" not in acc.Tags()["scalars"]
    texts = [e.tensor_proto.string_val[0].decode() for e in acc.Tensors("plans/text_summary")]
    assert texts == [
        "plan v1 from step 0: slices [8, 4] (probe)",
        "plan v2 from step 2: slices [9, 3] (re-plan: drift)",
    ]

    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(tracker.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "run-1"
    assert client.get_experiment(run.info.experiment_id).name == "tracked"
    assert run.data.params == flatten_params(job.model_dump(mode="json"))
    assert run.data.params["train.global_batch_size"] == str(job.train.global_batch_size)
    history = client.get_metric_history(run.info.run_id, "train/loss")
    assert [(m.step, m.value) for m in history] == [(0, 2.0), (1, 1.0)]
    assert len(client.get_metric_history(run.info.run_id, "worker/rank0/slice")) == 2
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert artifacts == {"summary.json", "plans.json"}


def test_trial_tracker_nests_under_the_search_run_and_closes_as_stopped(tmp_path, mlflow_uri):
    uri = mlflow_uri
    job = validate_config(
        {
            **BASE,
            "tracking": {
                "tensorboard": {"enabled": True},
                "mlflow": {
                    "enabled": True,
                    "tracking_uri": uri,
                    "artifact_location": str(tmp_path / "artifacts"),
                },
            },
        }
    )
    parent = RunTracker(job.tracking, run_name="search", params={}, default_log_dir=tmp_path)
    parent.open()
    tracking = resolved_tracking(job, tmp_path / "out").model_dump(mode="json")
    trial = trial_tracker(
        job, tracking, experiment="search", run_name="search-t1", parent_run_id=parent.mlflow_run_id
    )
    assert trial is not None
    trial.open()
    trial(FitProgress((record(0, 0, 8, 1.0), record(0, 1, 4, 1.0))))
    trial.close(stopped=True)
    trial.close()  # again: nothing
    parent.close()
    assert trial.tensorboard_dir == tmp_path / "out" / "tensorboard" / "search" / "search-t1"
    assert events(trial.tensorboard_dir).Scalars("train/loss")
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(trial.mlflow_run_id)
    assert run.info.status == "KILLED"
    assert run.data.tags["mlflow.parentRunId"] == parent.mlflow_run_id
    assert run.data.tags["raytrain_hetero.search"] == "search"


def test_a_trial_stopped_after_its_last_report_closes_finished(tmp_path, mlflow_uri):
    # Tune stops a trial whose last report it has too (ASHA at max_t) while its run winds
    # down; that stop raced the trial's own close and a complete trial ended KILLED (seen in
    # CI). Only a stop before the last report is early.
    from raytrain_hetero.tune.trial import close_active_tracker, track_trial

    job = validate_config(
        {**BASE, "tracking": {"mlflow": {"enabled": True, "tracking_uri": mlflow_uri}}}
    )
    tracking = resolved_tracking(job, tmp_path / "out").model_dump(mode="json")
    statuses = {}
    for name, reports in (("complete", 2), ("early", 1)):
        trial = trial_tracker(job, tracking, experiment="stops", run_name=name, parent_run_id=None)
        assert trial is not None
        with track_trial(trial.open(), reports=2):
            close_active_tracker(reports=reports)  # what Tune's stop does, first
        statuses[name] = MlflowClient(tracking_uri=mlflow_uri).get_run(trial.mlflow_run_id)
    assert statuses["complete"].info.status == "FINISHED"
    assert statuses["early"].info.status == "KILLED"


def test_a_stopped_trial_takes_the_report_tune_acted_on_before_it_closes(tmp_path, mlflow_uri):
    # Tune stops a trial as soon as it has the report it acts on (ASHA at max_t), which can
    # be before the fit's next drain brings that report to the tracker: the last epoch's
    # val_accuracy was missing from MLflow (seen in CI). The stop (the trainable's cleanup)
    # first drains the run through the source the fit attached, then closes.
    from raytrain_hetero.tune.trial import _AbortTrainOnStop, track_trial

    class Trainable:  # the base Tune's function trainable gives the mixin
        cleaned = False

        def cleanup(self) -> None:
            self.cleaned = True

    class Stopping(_AbortTrainOnStop, Trainable):
        training_iteration = 2

    mlflow = {"enabled": True, "tracking_uri": mlflow_uri, "artifact_location": str(tmp_path)}
    job = validate_config({**BASE, "tracking": {"mlflow": mlflow}})
    tracking = resolved_tracking(job, tmp_path / "out").model_dump(mode="json")
    trial = trial_tracker(job, tracking, experiment="catch-up", run_name="t", parent_run_id=None)
    assert trial is not None
    undelivered = [
        FitProgress(reports=({"val_accuracy": 0.75, "epoch": 1, "hetero/global_step": 6},))
    ]
    trainable = Stopping()
    with track_trial(trial.open(), reports=2):
        trial(FitProgress(reports=({"val_accuracy": 0.5, "epoch": 0, "hetero/global_step": 3},)))
        trial.attach_source(lambda: [trial(u) for u in undelivered] and undelivered.clear())
        trainable.cleanup()  # what Tune's stop does, while the fit still runs
    assert trainable.cleaned
    client = MlflowClient(tracking_uri=mlflow_uri)
    history = client.get_metric_history(trial.mlflow_run_id, "val_accuracy")
    assert sorted((m.step, m.value) for m in history) == [(3, 0.5), (6, 0.75)]
    assert client.get_run(trial.mlflow_run_id).info.status == "FINISHED"


def test_unusable_mlflow_store_is_a_config_error_before_training(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    config = TrackingConfig(mlflow={"enabled": True, "tracking_uri": f"sqlite:///{blocker}/x.db"})
    with pytest.raises(ConfigError, match="tracking.mlflow"):
        RunTracker(config, run_name="r", params={}).open()


def test_the_scheduler_keeps_forwarded_reports_for_the_drain():
    from raytrain_hetero.driver.scheduler import HeteroScheduler

    scheduler = HeteroScheduler("run", live=False, clock=lambda: 0.0)
    assert scheduler.drain().reports == ()
    scheduler.record_report({"epoch": 0, "val_accuracy": 0.4, "hetero/global_step": 5})
    scheduler.record_report({"epoch": 1, "val_accuracy": 0.6, "hetero/global_step": 10})
    reports = scheduler.drain().reports
    assert [r["val_accuracy"] for r in reports] == [0.4, 0.6]
    assert scheduler.drain(after=10, incarnation=scheduler.incarnation).reports == reports


def test_a_resumed_run_continues_its_mlflow_run(tmp_path, mlflow_uri):
    config = TrackingConfig(
        tensorboard={"enabled": True, "log_dir": str(tmp_path / "tb")},
        mlflow={
            "enabled": True,
            "tracking_uri": mlflow_uri,
            "experiment_name": "resumed",
            "artifact_location": str(tmp_path / "artifacts"),
        },
    )
    first = RunTracker(config, run_name="r", params={"train": {"lr": 0.1}}).open()
    first(FitProgress((record(0, 0, 8, 1.0), record(0, 1, 4, 1.0))))
    first.close(failed=True)  # killed; resumed from its checkpoint
    again = RunTracker(config, run_name="r", params={"train": {"lr": 0.2}}, resume=True).open()
    again(FitProgress((record(1, 0, 8, 1.0, group="g2"), record(1, 1, 4, 1.0, group="g2"))))
    again.close()
    assert again.mlflow_run_id == first.mlflow_run_id
    client = MlflowClient(tracking_uri=mlflow_uri)
    run = client.get_run(first.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params == {"train.lr": "0.1"}  # MLflow params are immutable
    assert [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")] == [0, 1]
    assert [e.step for e in events(tmp_path / "tb" / "r").Scalars("train/loss")] == [0, 1]
    fresh = RunTracker(config, run_name="r", params={}).open()  # not resuming: a new run
    fresh.close()
    assert fresh.mlflow_run_id != first.mlflow_run_id


def test_a_probe_is_not_tracked_and_the_trainer_logs_its_resolved_groups():
    from ray.train import RunConfig

    from raytrain_hetero.app.job import build_trainer

    job = validate_config({**BASE, "tracking": {"tensorboard": {"enabled": True}}})
    loop = print  # never runs
    assert build_trainer(job, loop, RunConfig()).tracking.active
    assert not build_trainer(job, loop, RunConfig(), probe_only=True).tracking.active
    params = flatten_params(build_trainer(job, loop, RunConfig()).tracked_params())
    assert params["batch.global_batch_size"] == str(job.train.global_batch_size)
    assert params["workers.1.name"] == '"slow"'
    assert params["scheduler.policy.window_steps"] == str(job.scheduler.policy.window_steps)
    assert not any(key.startswith("tracking.") for key in params)
