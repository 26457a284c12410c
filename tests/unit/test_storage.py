"""Storage locations: local paths behave as before, URIs reach object stores, secrets are
refused; run-name checks, outputs and checkpoints on a real S3-compatible server (moto over
HTTP on 127.0.0.1, no Ray)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from raytrain_hetero.app.config import validate_config
from raytrain_hetero.app.runs import RUN_SNAPSHOT_FILE, check_output_dir, resolve_run
from raytrain_hetero.app.schema import RayConfig
from raytrain_hetero.errors import ConfigError, DataError
from raytrain_hetero.storage import (
    StagingDir,
    StorageFilesystem,
    is_uri,
    storage_location,
)

BASE = {"data": {"root": "data/x"}, "workers": [{"name": "a"}, {"name": "b"}]}


# ------------------------------------------------------------------------------ parsing


def test_local_paths_stay_absolute_paths(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert RayConfig(storage_path="runs").storage_path == tmp_path / "runs"
    job = validate_config({**BASE, "output_dir": "outputs/x"}, source="test")
    assert job.output_dir == Path("outputs/x")  # relative, as before
    location = storage_location("runs")
    assert not location.remote and isinstance(location.filesystem, pafs.LocalFileSystem)
    assert location.local_path == tmp_path / "runs"
    # Ray gets a plain path for a local location, as before (no custom filesystem).
    assert location.run_config_storage() == {"storage_path": str(tmp_path / "runs")}
    assert location.join("run1", "checkpoint_0").path == str(tmp_path / "runs/run1/checkpoint_0")


def test_uris_stay_uris_and_build_the_configured_filesystem():
    assert is_uri("s3://b/runs") and is_uri("gs://b") and not is_uri("s3:/b") and not is_uri("x")
    ray = RayConfig(
        storage_path="s3://bucket/runs/",
        storage_filesystem={"endpoint_override": "http://127.0.0.1:9", "scheme": "http"},
    )
    assert ray.storage_path == "s3://bucket/runs"
    job = validate_config({**BASE, "output_dir": "s3://bucket/out"}, source="test")
    assert job.output_dir == "s3://bucket/out"
    assert job.model_dump(mode="json")["output_dir"] == "s3://bucket/out"  # to the workers
    location = storage_location(ray.storage_path, ray.storage_filesystem)
    assert location.remote and location.uri == "s3://bucket/runs"
    assert location.path == "bucket/runs"
    assert isinstance(location.filesystem, pafs.S3FileSystem)
    storage = location.run_config_storage()
    assert storage["storage_path"] == "bucket/runs"
    assert storage["storage_filesystem"] is location.filesystem
    assert str(location.join("run1")) == "s3://bucket/runs/run1"


def test_bad_uris_and_filesystems_are_one_clear_error():
    with pytest.raises(ConfigError, match="pyarrow cannot open it"):
        storage_location("nosuchscheme://bucket/x")
    with pytest.raises(ConfigError, match="s3:// and gs://"):
        storage_location("hdfs://namenode/x", StorageFilesystem(endpoint_override="h:1"))
    with pytest.raises(ConfigError, match="scheme"):
        StorageFilesystem(scheme="ftp")


@pytest.mark.parametrize(
    "key", ["secret_access_key", "access_key", "session_token", "password", "account_key"]
)
def test_a_secret_in_the_config_is_refused(key):
    with pytest.raises(ConfigError, match=rf"{key}.*never read from a config.*environment"):
        validate_config(
            {**BASE, "ray": {"storage_path": "s3://b/r", "storage_filesystem": {key: "x"}}},
            source="test",
        )


@pytest.mark.parametrize(
    "uri",
    [
        "s3://AKIAEXAMPLE:hunter2@bucket/runs",
        "s3://bucket/runs?access_key=AKIAEXAMPLE&secret_key=hunter2",
        "gs://bucket/runs?credentials=hunter2",
    ],
)
def test_a_secret_in_a_uri_is_refused_and_not_echoed(uri):
    with pytest.raises(ConfigError, match="carries credentials") as info:
        validate_config({**BASE, "ray": {"storage_path": uri}}, source="test")
    assert "hunter2" not in str(info.value)
    with pytest.raises(ConfigError, match="carries credentials") as info:
        storage_location(uri)
    assert "hunter2" not in str(info.value)


# ------------------------------------------------------------------------------ on S3


def _location(s3_store, prefix: str):
    spec = StorageFilesystem(endpoint_override=s3_store.endpoint, scheme="http")
    return storage_location(f"s3://{s3_store.bucket}/{prefix}", spec)


def test_run_name_checks_list_the_remote_store(s3_store):
    storage = _location(s3_store, "names/ray_results")
    fresh = resolve_run("job", storage, "nightly", resume=False)
    assert str(fresh.folder) == f"s3://{s3_store.bucket}/names/ray_results/nightly"
    with pytest.raises(ConfigError, match="no run 'nightly'"):
        resolve_run("job", storage, "nightly", resume=True)
    with storage.filesystem.open_output_stream(f"{storage.path}/nightly/{RUN_SNAPSHOT_FILE}") as f:
        f.write(b"{}")
    with pytest.raises(ConfigError, match="already exists at s3://"):
        resolve_run("job", storage, "nightly", resume=False)
    assert resolve_run("job", storage, "nightly", resume=True).resuming


def test_outputs_are_staged_then_uploaded_and_read_back(s3_store):
    target = _location(s3_store, "outs/run1")
    check_output_dir(target, overwrite=False, resume=False)  # nothing there yet
    staging = StagingDir(target)
    assert staging.local.is_dir() and staging.fetch("metrics.csv") is None
    (staging.local / "metrics.csv").write_text("step\n0\n")
    (staging.local / "summary.json").write_text(json.dumps({"steps": 1}))
    staging.publish()
    staging.cleanup()
    assert not staging.local.exists()
    assert s3_store.keys("outs/run1") == ["outs/run1/metrics.csv", "outs/run1/summary.json"]
    with pytest.raises(ConfigError, match=r"not empty \(metrics.csv, summary.json\)"):
        check_output_dir(target, overwrite=False, resume=False)
    check_output_dir(target, overwrite=False, resume=True)
    # A resumed run reads its earlier metrics.csv back from the store.
    again = StagingDir(target)
    fetched = again.fetch("metrics.csv")
    assert fetched is not None and fetched.read_text() == "step\n0\n"
    again.cleanup()


def test_predict_finds_and_loads_the_newest_remote_checkpoint(s3_store, tmp_path):
    import torch

    from raytrain_hetero.inference.checkpoints import find_checkpoint_file, load_checkpoint

    run = _location(s3_store, "ckpt/ray_results/r1")
    for index, stamp in enumerate(["2026-01-01_00-00-00.000001", "2026-01-01_00-00-09.000001"]):
        local = tmp_path / f"c{index}"
        local.mkdir()
        torch.save(
            {"model": {"w": torch.full((2,), float(index))}, "meta": {"num_classes": 2}},
            local / "model.pt",
        )
        run.join(f"checkpoint_{stamp}").upload(local)
    found = find_checkpoint_file(run)
    assert str(found).endswith("checkpoint_2026-01-01_00-00-09.000001/model.pt")
    state, meta = load_checkpoint(found)
    assert state["w"].tolist() == [1.0, 1.0] and meta == {"num_classes": 2}
    with pytest.raises(DataError, match="no checkpoint at s3://"):
        find_checkpoint_file(_location(s3_store, "ckpt/nothing"))


def test_cli_keeps_uris_as_uris_and_paths_as_paths():
    from raytrain_hetero.app.cli import build_parser

    args = build_parser().parse_args(
        ["predict", "job.yaml", "--checkpoint", "s3://b/runs/r1", "--output", "out/p"]
    )
    assert args.checkpoint == "s3://b/runs/r1" and args.output == Path("out/p")
    args = build_parser().parse_args(["train", "job.yaml", "--output", "gs://b/out"])
    assert args.output == "gs://b/out"  # not Path's "gs:/b/out"
