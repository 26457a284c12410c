"""Ray Tune over HeteroTrainer: search-space config, trial packing, and a real ASHA search."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml

from raytrain_hetero.app.cli import main
from raytrain_hetero.app.config import JobConfig, load_config, validate_config
from raytrain_hetero.app.tune_job import format_best, param_space, trial_count, trial_job
from raytrain_hetero.core.records import StepRecord
from raytrain_hetero.errors import ConfigError
from raytrain_hetero.tune.capacity import concurrent_capacity, decide_concurrency
from raytrain_hetero.tune.trial import throughput_metrics

REPO = Path(__file__).resolve().parents[2]
TUNE_EXAMPLE = REPO / "examples" / "configs" / "eurosat_tune.yaml"


def example() -> dict:
    return yaml.safe_load(TUNE_EXAMPLE.read_text())


def job_with(tune: dict, workers: list | None = None, **train) -> JobConfig:
    data = example()
    data["tune"] = {**data["tune"], **tune}
    if workers is not None:
        data["workers"] = workers
    data["train"].update(train)
    return validate_config(data, "tune.yaml")


# ----------------------------------------------------------------------------- config


def test_example_tune_config_loads():
    job = load_config(TUNE_EXAMPLE)
    assert job.tune is not None
    assert set(job.tune.search_space) == {
        "train.lr",
        "train.weight_decay",
        "train.global_batch_size",
        "model.width",
    }
    assert job.tune.scheduler == "asha"


@pytest.mark.parametrize(
    ("space", "expect"),
    [
        ({"train.learning_rate": {"loguniform": [0.01, 0.1]}}, "rename it to 'train.lr'"),
        ({"data.root": {"choice": ["a", "b"]}}, "not a tunable key"),
        ({"train.epochs": {"choice": [1, 2]}}, "train.epochs cannot be searched"),
        ({"model.width": {"choice": [0, 8]}}, "the value 0 (integer) makes the job invalid"),
        ({"train.global_batch_size": {"choice": [1, 64]}}, "too small"),
        ({"train.lr": {"loguniform": [0.1, 0.01]}}, "low < high"),
        ({"train.lr": {"choice": [0.1], "uniform": [0.1, 0.2]}}, "exactly one of"),
        ({"train.lr": {"logunifrom": [0.01, 0.1]}}, "rename it to 'loguniform'"),
    ],
)
def test_bad_search_space_is_one_actionable_error(space, expect):
    with pytest.raises(ConfigError) as info:
        job_with({"search_space": space})
    text = str(info.value)
    assert expect in text and "Fix:" in text and "tune.search_space" in text


def test_param_space_maps_distributions():
    from ray.tune.search.sample import Categorical, Float, Integer

    job = job_with(
        {
            "search_space": {
                "train.lr": {"loguniform": [0.01, 0.2]},
                "train.momentum": {"uniform": [0.5, 0.9]},
                "model.width": {"randint": [4, 8]},
                "train.weight_decay": {"choice": [0.0, 0.001]},
                "train.global_batch_size": {"grid": [64, 128]},
            }
        }
    )
    space = param_space(job.tune.search_space)
    assert isinstance(space["train.lr"], Float) and space["train.lr"].lower == 0.01
    assert isinstance(space["train.momentum"], Float)
    # randint is inclusive in the config, exclusive in Tune.
    assert isinstance(space["model.width"], Integer) and space["model.width"].upper == 9
    assert isinstance(space["train.weight_decay"], Categorical)
    assert space["train.global_batch_size"] == {"grid_search": [64, 128]}


def test_trial_job_merges_values_and_drops_tune():
    import numpy as np

    base = load_config(TUNE_EXAMPLE)
    job = trial_job(base, {"train.lr": np.float64(0.02), "model.width": np.int64(8)})
    assert job.train.lr == 0.02 and job.model.width == 8 and job.tune is None
    assert job.data.root == base.data.root
    with pytest.raises(ConfigError, match=r"trial values: train\.global_batch_size=1"):
        trial_job(base, {"train.global_batch_size": 1})


# ----------------------------------------------------------------------------- resources


def test_capacity_packs_whole_trials_with_driver_cpus():
    job = load_config(TUNE_EXAMPLE)  # two workers of 1 CPU each
    workers = job.expanded_workers()
    one_node = [{"resources": {"CPU": 4.0}, "labels": {}}]
    assert concurrent_capacity(one_node, workers, trial_cpus=0.25, limit=8) == 1  # 2 x 2.25 > 4
    assert concurrent_capacity(one_node, workers, trial_cpus=0.0, limit=8) == 2
    assert concurrent_capacity(one_node, workers, trial_cpus=0.0, limit=1) == 1
    assert concurrent_capacity([{"resources": {"CPU": 1.0}}], workers, 0.25, 8) == 0


def test_capacity_honours_label_selectors_and_gpus():
    workers = [
        {"name": "a100", "resources": {"CPU": 4, "GPU": 1}, "label_selector": {"gpu": "A100"}},
        {
            "name": "cpu",
            "resources": {"CPU": 2},
            "device": "cpu",
            "label_selector": {"pool": "in(cpu,spot)"},
        },
    ]
    job = job_with({}, workers=workers, fixed_shares=None)
    nodes = [
        {"resources": {"CPU": 8, "GPU": 1}, "labels": {"gpu": "A100"}},
        {"resources": {"CPU": 8, "GPU": 1}, "labels": {"gpu": "A100"}},
        {"resources": {"CPU": 16}, "labels": {"pool": "spot"}},
        {"resources": {"CPU": 64, "GPU": 8}, "labels": {"gpu": "A10G"}},  # wrong label
    ]
    # Two A100 nodes -> two trials, although the A10G node has more GPUs.
    assert concurrent_capacity(nodes, job.expanded_workers(), trial_cpus=1, limit=10) == 2
    negated = job_with({}, workers=[dict(workers[1], label_selector={"pool": "!spot"})])
    negated_workers = negated.expanded_workers()
    assert concurrent_capacity(nodes, negated_workers, trial_cpus=0, limit=100) == 4 + 4 + 32


def test_local_ray_too_small_for_one_trial_is_a_config_error():
    job = load_config(TUNE_EXAMPLE)
    assert job.tune is not None
    limits = {
        "trial_cpus": job.tune.trial_cpus,
        "trials": trial_count(job),
        "max_concurrent_trials": job.tune.max_concurrent_trials,
    }
    workers = job.expanded_workers()
    with pytest.raises(ConfigError, match=r"raise ray\.num_cpus to >= 2\.25"):
        decide_concurrency(workers, [{"resources": {"CPU": 2.0}}], local=True, **limits)
    # On a cluster the autoscaler may add nodes: the search starts anyway.
    assert decide_concurrency(workers, [{"resources": {"CPU": 2.0}}], local=False, **limits) == 1


def test_throughput_metrics_per_worker_and_global():
    records = [
        StepRecord(
            step=s,
            epoch=0,
            rank=r,
            worker=w,
            device="cpu",
            slice=b,
            weight=b / 60,
            compute_s=0.1,
            load_s=0.0,
            busy_s=0.1,
            samples_per_s=rate,
            loss=1.0,
            global_samples_per_s=120.0,
            plan_version=1,
            group="g",
            world_size=2,
            wall_s=0.5,
            time=100.0 + s,
        )
        for s in range(3)
        for r, w, b, rate in ((0, "fast", 40, 100.0), (1, "slow", 20, 45.0))
    ]
    out = throughput_metrics(records)
    assert out["samples_per_s"] == pytest.approx(60 / 0.5)
    assert out["workers"]["fast"] == {
        "rank": 0,
        "slice": 40,
        "weight": pytest.approx(2 / 3),
        "samples_per_s": 100.0,
        "device": "cpu",
    }
    assert out["workers"]["slow"]["slice"] == 20


def test_tune_without_tune_section_is_a_clear_cli_error(tmp_path, capsys):
    data = example()
    del data["tune"]
    config = tmp_path / "job.yaml"
    config.write_text(yaml.safe_dump(data))
    assert main(["tune", "--config", str(config), "--output", str(tmp_path / "out")]) == 2
    assert "no tune: section" in capsys.readouterr().err


# ----------------------------------------------------------------------------- real search


@pytest.fixture(scope="module")
def _searches() -> dict:
    """The real search, run once for the tests of this module that read it."""
    return {}


@pytest.fixture
def asha_search(ray_local, tmp_path_factory, _searches):
    """Two sequential trials (grid over model.width) optimising samples/s with ASHA, with
    TensorBoard and MLflow tracking on. Returns (job, output folder, summary).

    The width-64 trial runs second and is far slower than the width-4 trial that finished
    before it, so ASHA stops it after its first epoch.
    """
    if "asha" not in _searches:
        from raytrain_hetero.app.tune_job import run_tune

        base = tmp_path_factory.mktemp("asha")
        data = example()
        data["name"] = "tracked"
        data["data"]["root"] = str(base / "eurosat")
        data["data"]["generate"] = {"samples_per_class": 20}
        data["train"].update(epochs=2, global_batch_size=64, fixed_shares=[2, 1])
        data["tune"] = {
            "search_space": {"model.width": {"grid": [4, 64]}, "train.lr": {"choice": [0.05]}},
            "num_samples": 1,
            "metric": "samples_per_s",
            "mode": "max",
            "scheduler": "asha",
            "grace_period": 1,
            "reduction_factor": 2,
            "max_concurrent_trials": 1,
            "trial_cpus": 0.25,
        }
        data["tracking"] = {
            "tensorboard": {"enabled": True},
            "mlflow": {
                "enabled": True,
                "tracking_uri": f"sqlite:///{base}/mlflow.db",
                "artifact_location": str(base / "artifacts"),
            },
        }
        job = validate_config(data, "tune.yaml")
        out = base / "out"
        _searches["asha"] = (job, out, run_tune(job, output_dir=out, verbose=0))
    return _searches["asha"]


def trial_rows(out: Path) -> dict[int, dict[str, str]]:
    with open(out / "trials.csv", newline="") as fh:
        return {int(r["config/model.width"]): r for r in csv.DictReader(fh)}


@pytest.mark.ray
@pytest.mark.timeout(420)
def test_asha_search_stops_slow_trial_releases_it_and_reports_best(ray_local, asha_search):
    """Stopping must release the slow trial's workers at once (the trial aborts its Train
    run): afterwards no placement group may be left."""
    _job, out, summary = asha_search
    groups = ray_local.util.placement_group_table().values()
    assert [g for g in groups if g["state"] != "REMOVED"] == []
    rows = trial_rows(out)
    assert set(rows) == {4, 64}
    assert all(r["error"] == "" for r in rows.values())
    assert rows[64]["status"] == "stopped early" and rows[64]["epochs"] == "1"
    assert rows[4]["status"] == "completed" and rows[4]["epochs"] == "2"
    for row in rows.values():  # each trial reports its per-worker slices (fixed shares 2:1)
        assert row["workers/fast/slice"] == "43" and row["workers/slow/slice"] == "21"
        assert float(row["samples_per_s"]) > 0
        # Each trial's fit start (its call to the first step) holds the library's start-up.
        assert float(row["fit_start_s"]) > float(row["startup_s"]) > 0, row
    assert summary["best"]["config"]["model.width"] == 4
    assert summary["max_concurrent_trials"] == 1 and summary["failed_trials"] == 0
    assert json.loads((out / "tune_summary.json").read_text())["best"] == summary["best"]
    printed = format_best(summary)  # what `raytrain-hetero tune` prints
    assert printed.startswith(f"best trial {summary['best']['trial_id']}: samples_per_s=")
    assert "best config: model.width=4" in printed and "fast" in printed and "slow" in printed
    png = (out / "trials.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000


@pytest.mark.ray
@pytest.mark.timeout(420)
def test_every_tune_trial_gets_its_own_tensorboard_dir_and_nested_mlflow_run(asha_search):
    """Read back with TensorBoard's own reader and MLflow's client (see test_carving_e2e.py); the
    trial ASHA stopped ends its MLflow run as KILLED."""
    from mlflow import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    job, out, summary = asha_search
    epochs = {width: int(row["epochs"]) for width, row in trial_rows(out).items()}
    client = MlflowClient(tracking_uri=job.tracking.mlflow.tracking_uri)
    experiment = client.get_experiment_by_name("tracked")
    runs = client.search_runs([experiment.experiment_id])
    (parent,) = [r for r in runs if r.info.run_name == summary["experiment"]]
    trials = [r for r in runs if r.info.run_id != parent.info.run_id]
    assert len(trials) == 2
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {
        "trials.csv",
        "trials.png",
        "tune_summary.json",
    }
    assert sorted(int(r.data.params["model.width"]) for r in trials) == [4, 64]
    search_dir = out / "tensorboard" / summary["experiment"]
    for trial in trials:
        width = int(trial.data.params["model.width"])
        assert trial.info.status == ("FINISHED" if width == 4 else "KILLED"), width
        assert trial.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert trial.data.tags["raytrain_hetero.search"] == summary["experiment"]
        # One per epoch: all of the completed trial's; the stopped trial's Train run may end
        # the epoch under way before the abort reaches it, beyond the one Tune acted on.
        history = client.get_metric_history(trial.info.run_id, "val_accuracy")
        if width == 4:
            assert len(history) == epochs[width] == 2
        else:
            assert len(history) >= epochs[width] == 1
        assert client.get_metric_history(trial.info.run_id, "train/loss")
        # Its own TensorBoard run directory, named after its Train run.
        acc = EventAccumulator(str(search_dir / trial.info.run_name), size_guidance={"scalars": 0})
        acc.Reload()
        assert acc.Scalars("train/loss") and acc.Scalars("worker/rank1/slice")
    assert len(list(search_dir.iterdir())) == 2


class _SlowWindDownTracker:
    """A trial's tracker whose catch-up takes longer than the 10 s Tune gives a stopping trial
    when a search ends (MLflow and the run's scheduler can, under load); ``close`` writes how
    the trial's run ended to ``marker``."""

    def __init__(self, marker: str) -> None:
        self.marker = Path(marker)

    def catch_up(self) -> None:
        import time

        time.sleep(15)

    def close(self, *, failed: bool = False, stopped: bool = False) -> None:
        if not self.marker.exists():  # closing again does nothing, as RunTracker's close
            self.marker.write_text("FAILED" if failed else "KILLED" if stopped else "FINISHED")


def _trial_with_slow_wind_down(config: dict, marker: str) -> None:
    import time

    from ray import tune

    from raytrain_hetero.tune.trial import track_trial

    with track_trial(_SlowWindDownTracker(marker), reports=3):
        tune.report({"score": 1.0})
        time.sleep(300)  # Tune stops the trial after its first report


@pytest.mark.ray
@pytest.mark.timeout(240)
def test_a_stopped_trial_ends_its_run_however_long_it_takes(ray_local, tmp_path):
    """The last trial of a search is stopped and its wind-down takes 15 s: Tune would kill it
    after 10 s (leaving its placement group and a RUNNING MLflow run); EndTrainRunOnStop has the
    trial finish it first, so its tracker is closed as stopped when the search returns."""
    from ray import tune

    from raytrain_hetero.tune.trial import EndTrainRunOnStop, abort_train_on_stop

    marker = tmp_path / "closed"
    trainable = abort_train_on_stop(_trial_with_slow_wind_down)
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(trainable, marker=str(marker)), {"cpu": 0.25}),
        run_config=tune.RunConfig(
            name="slow-wind-down",
            storage_path=str(tmp_path / "results"),
            stop={"training_iteration": 1},
            verbose=0,
            callbacks=[EndTrainRunOnStop()],
        ),
    )
    grid = tuner.fit()
    assert grid[0].metrics["score"] == 1.0
    assert marker.read_text() == "KILLED"


def _trial_waiting_for_room(config: dict, marker: str) -> None:
    from ray import tune

    from raytrain_hetero import WorkerSpec
    from raytrain_hetero.driver.placement_check import ensure_room, placement_wait_limit

    Path(marker).write_text("checking")
    ensure_room(
        [WorkerSpec(name="w", resources={"CPU": 1})],
        min_workers=1,
        timeout_s=placement_wait_limit(1.0),  # elastic.placement_timeout_s: 1 s
        embedded=False,
    )
    tune.report({"placed": 1})


@pytest.mark.ray
@pytest.mark.timeout(240)
def test_inside_a_tune_trial_the_precheck_waits_for_room_past_the_timeout(ray_local, tmp_path):
    """The room a trial needs is held (as the search's other trials hold it) for longer than
    elastic.placement_timeout_s: inside a Tune trial the pre-check waits its turn instead of
    failing the trial (outside one it fails after the timeout: test_placement.py)."""
    import threading

    from ray import tune
    from ray.util.placement_group import placement_group, remove_placement_group

    free = ray_local.available_resources().get("CPU", 0.0)
    held = placement_group([{"CPU": free - 0.25}])  # all but the trial's own 0.25 CPU
    assert held.wait(timeout_seconds=60)
    marker = tmp_path / "marker"

    def give_back() -> None:  # 10 s after the trial began its check, far past its 1 s limit
        while not marker.exists():
            threading.Event().wait(0.2)
        threading.Event().wait(10)
        remove_placement_group(held)

    releaser = threading.Thread(target=give_back, daemon=True)
    releaser.start()
    try:
        grid = tune.Tuner(
            tune.with_resources(
                tune.with_parameters(_trial_waiting_for_room, marker=str(marker)), {"cpu": 0.25}
            ),
            run_config=tune.RunConfig(
                name="wait-for-room", storage_path=str(tmp_path / "results"), verbose=0
            ),
        ).fit()
    finally:
        releaser.join(timeout=60)
    assert grid[0].error is None, grid[0].error
    assert grid[0].metrics["placed"] == 1


@pytest.mark.parametrize("timeout_s", [0, -1.0, float("inf"), "60"])
def test_end_train_run_on_stop_refuses_a_wait_that_is_no_number_of_seconds(timeout_s):
    from raytrain_hetero.tune.trial import EndTrainRunOnStop

    with pytest.raises(ConfigError, match=r"finite number of seconds > 0\. Fix: pass e\.g\."):
        EndTrainRunOnStop(timeout_s)  # type: ignore[arg-type]


def test_tune_subcommand_parses():
    from raytrain_hetero.app.cli import build_parser

    args = build_parser().parse_args(["tune", "--config", "x.yaml", "--set", "tune.num_samples=2"])
    assert args.command == "tune" and str(args.config_flag) == "x.yaml"
    assert args.overrides == ["tune.num_samples=2"]
