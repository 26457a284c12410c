"""The service path without Ray: run identity, output directories, retries, error unwrapping."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from raytrain_hetero.app.cli import main
from raytrain_hetero.app.config import JobConfig, load_config, parse_overrides
from raytrain_hetero.app.runs import (
    RUN_SNAPSHOT_FILE,
    RunIdentity,
    check_output_dir,
    resolve_run,
    unique_run_name,
)
from raytrain_hetero.errors import ConfigError, DataError

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "configs" / "eurosat_local.yaml"


def _config(tmp_path: Path, **sections: object) -> Path:
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["data"]["root"] = str(tmp_path / "data")
    raw.update(sections)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


# ------------------------------------------------------------------------------ run identity


def test_generated_run_names_are_unique_within_one_second():
    names = {unique_run_name("job") for _ in range(200)}
    assert len(names) == 200
    assert all(n.startswith("job-") and len(n.rsplit("-", 1)[1]) == 6 for n in names)


def test_existing_run_name_needs_resume_and_resume_needs_a_run(tmp_path):
    storage = tmp_path / "ray_results"
    fresh = resolve_run("job", storage, "nightly", resume=False)
    assert fresh == RunIdentity("nightly", storage, resuming=False)
    (storage / "nightly").mkdir(parents=True)
    with pytest.raises(ConfigError, match="--resume"):
        resolve_run("job", storage, "nightly", resume=False)
    (storage / "nightly" / RUN_SNAPSHOT_FILE).write_text("{}")
    resumed = resolve_run("job", storage, "nightly", resume=True)
    assert resumed.resuming and resumed.folder == storage / "nightly"
    with pytest.raises(ConfigError, match="no run 'other'"):
        resolve_run("job", storage, "other", resume=True)
    with pytest.raises(ConfigError, match="--run-name NAME --resume"):
        resolve_run("job", storage, None, resume=True)
    with pytest.raises(ConfigError, match="not a valid name"):
        resolve_run("job", storage, "../escape", resume=False)


def test_output_dir_refused_when_not_empty_unless_overwrite_or_resume(tmp_path):
    out = tmp_path / "out"
    check_output_dir(out, overwrite=False, resume=False)  # absent: fine
    out.mkdir()
    check_output_dir(out, overwrite=False, resume=False)  # empty: fine
    (out / "metrics.csv").write_text("old")
    with pytest.raises(ConfigError, match="--overwrite") as info:
        check_output_dir(out, overwrite=False, resume=False)
    assert "metrics.csv" in str(info.value)
    check_output_dir(out, overwrite=True, resume=False)
    check_output_dir(out, overwrite=False, resume=True)
    with pytest.raises(ConfigError, match="is a file"):
        check_output_dir(out / "metrics.csv", overwrite=True, resume=False)


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def test_cli_train_refuses_a_non_empty_output_before_touching_data(tmp_path, capsys):
    config = _config(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    assert main(["train", str(config), "--output", str(out)]) == 2
    err = _one_line_error(capsys)
    assert "--overwrite" in err and str(out) in err
    assert sorted(p.name for p in out.iterdir()) == ["summary.json"]
    assert (out / "summary.json").read_text() == "{}"
    assert not (tmp_path / "data").exists()  # refused before any data generation


def test_cli_train_existing_run_name_without_resume_is_refused(tmp_path, capsys):
    config = _config(tmp_path)
    out = tmp_path / "out"
    (out / "ray_results" / "nightly").mkdir(parents=True)
    args = ["train", str(config), "--output", str(out), "--run-name", "nightly"]
    assert main(args) == 2
    assert "add --resume" in _one_line_error(capsys)
    assert main(["train", str(config), "--output", str(tmp_path / "o2"), "--resume"]) == 2
    assert "--run-name NAME --resume" in _one_line_error(capsys)
    assert not (tmp_path / "data").exists() and not (tmp_path / "o2").exists()


def test_cli_predict_refuses_a_non_empty_output(tmp_path, capsys):
    config = _config(tmp_path)
    out = tmp_path / "pred"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code = main(["predict", str(config), "--checkpoint", str(tmp_path), "--output", str(out)])
    assert code == 2
    assert "--overwrite" in _one_line_error(capsys)
    assert [p.name for p in out.iterdir()] == ["notes.txt"]


def test_cli_tune_refuses_a_non_empty_output(tmp_path, capsys):
    config = _config(tmp_path, tune={"search_space": {"train.lr": {"choice": [0.1, 0.2]}}})
    out = tmp_path / "out"
    out.mkdir()
    (out / "trials.csv").write_text("old")
    assert main(["tune", str(config), "--output", str(out), "--quiet"]) == 2
    assert "--overwrite" in _one_line_error(capsys)
    assert (out / "trials.csv").read_text() == "old" and len(list(out.iterdir())) == 1
    assert not (tmp_path / "data").exists()


def test_predict_never_deletes_a_predictions_dir_holding_foreign_files(tmp_path):
    from raytrain_hetero.app.predict import _check_replaceable, _remove_parquet_parts

    predictions = tmp_path / "predictions"
    predictions.mkdir()
    (predictions / "part-0.parquet").write_bytes(b"x")
    (predictions / "README").write_text("keep me")
    with pytest.raises(ConfigError, match="README"):
        _check_replaceable(predictions)
    with pytest.raises(ConfigError, match="did not write"):
        _remove_parquet_parts(predictions)
    assert (predictions / "README").exists() and (predictions / "part-0.parquet").exists()
    (predictions / "README").unlink()
    _remove_parquet_parts(predictions)
    assert not predictions.exists()


# ------------------------------------------------------------------------------ retries


def test_max_failures_defaults_and_yaml_key(tmp_path):
    config = _config(tmp_path)
    fixed = load_config(config)
    assert fixed.train.max_failures is None and fixed.resolved_max_failures() == 1
    elastic = load_config(config, parse_overrides(["elastic.min_workers=2"]))
    assert elastic.resolved_max_failures() == 3
    chosen = load_config(config, parse_overrides(["train.max_failures=5"]))
    assert chosen.resolved_max_failures() == 5
    assert (
        load_config(config, parse_overrides(["train.max_failures=0"])).resolved_max_failures() == 0
    )
    with pytest.raises(ConfigError, match=r"train\.max_failures.*>= 0"):
        load_config(config, parse_overrides(["train.max_failures=-1"]))
    with pytest.raises(ConfigError, match=r"train\.max_failures"):
        load_config(config, parse_overrides(["train.max_failures=.inf"]))


def test_run_config_retries_and_keeps_best_and_latest(tmp_path):
    from raytrain_hetero.app.job import run_config

    job: JobConfig = load_config(
        _config(tmp_path), parse_overrides(["train.max_failures=4", "elastic.min_workers=1"])
    )
    rc = run_config(job, RunIdentity("r1", tmp_path / "store"))
    assert rc.name == "r1" and rc.storage_path == str(tmp_path / "store")
    assert rc.failure_config.max_failures == 4
    assert rc.checkpoint_config.checkpoint_score_attribute == "val_accuracy"
    assert rc.checkpoint_config.checkpoint_score_order == "max"
    assert rc.checkpoint_config.num_to_keep == 1  # + the latest Ray always keeps


def test_collective_timeout_is_a_yaml_key_and_must_be_finite(tmp_path):
    config = _config(tmp_path)
    job = load_config(config, parse_overrides(["backend.collective_timeout_s=45"]))
    assert job.backend.collective_timeout_s == 45
    for bad in (".inf", "0", "-5", ".nan"):
        with pytest.raises(ConfigError, match=r"backend\.collective_timeout_s"):
            load_config(config, parse_overrides([f"backend.collective_timeout_s={bad}"]))


# ------------------------------------------------------------------------------ worker errors


def test_hetero_error_cause_unwraps_ray_train_errors():
    from ray.exceptions import RayTaskError
    from ray.train.v2._internal.exceptions import UserExceptionWithTraceback
    from ray.train.v2.api.exceptions import ControllerError, WorkerGroupError

    from raytrain_hetero.driver._ray_compat import hetero_error_cause

    original = DataError("/data/x.tif: truncated TIFF. Fix: regenerate it")
    wrapped = UserExceptionWithTraceback(original, traceback_str="Traceback ...\n  boom")
    group = WorkerGroupError(
        "rank 1 failed", {1: wrapped, 0: UserExceptionWithTraceback(RuntimeError("x"), "tb")}
    )
    assert hetero_error_cause(group) is original
    assert hetero_error_cause(ControllerError(group)) is original
    chained = RuntimeError("outer")
    chained.__cause__ = group
    assert hetero_error_cause(chained) is original
    task_error = RayTaskError("fn", "Traceback ...", original).as_instanceof_cause()
    assert isinstance(task_error, DataError)  # Ray's dual class ...
    assert hetero_error_cause(task_error) is original  # ... but the plain original comes back
    other = WorkerGroupError("x", {0: UserExceptionWithTraceback(ValueError("v"), "tb")})
    assert hetero_error_cause(other) is None
    assert hetero_error_cause(RuntimeError("plain")) is None
