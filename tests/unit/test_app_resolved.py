"""The job resolved once (``raytrain_hetero.app.resolved``), without Ray: what the resolution
holds, the run's outputs refused before any data is touched, the roles as one field, and
``run_job`` refusing a resolved job without its run."""

from __future__ import annotations

from pathlib import Path

import pytest

from raytrain_hetero.app.config import JobConfig
from raytrain_hetero.app.job import prepare_dataset, run_job
from raytrain_hetero.app.resolved import RunRequest, resolve_data, resolve_job
from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.carving import EpochCarver
from raytrain_hetero.core.group_decision import decide_group
from raytrain_hetero.core.group_price import ExchangePrice, LinkCost, WorkerPrice
from raytrain_hetero.errors import ConfigError, DataError
from raytrain_hetero.workloads.registry import dataset_adapter


def small_job(root: Path, *, generate: bool = True) -> JobConfig:
    raw = {
        "name": "resolved",
        "data": {"dataset": "eurosat", "root": str(root), "bands": "rgb"},
        "model": {"name": "small_cnn", "width": 4},
        "train": {"epochs": 1, "global_batch_size": 12, "max_failures": 2},
        "workers": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
        "output_dir": str(root.parent / "out"),
    }
    if generate:
        raw["data"]["generate"] = {"samples_per_class": 3, "size": 16}
    return JobConfig.model_validate(raw)


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small generated EuroSAT, shared by the tests that resolve a job on it."""
    return tmp_path_factory.mktemp("resolved") / "eurosat"


def test_the_resolution_holds_what_the_commands_read(data_root: Path) -> None:
    job = small_job(data_root)
    resolved = resolve_job(job)
    assert resolved.job is job and resolved.run is None and resolved.roles is None
    assert resolved.data.adapter is dataset_adapter("eurosat")
    assert resolved.data.source.root == data_root
    assert resolved.sizes.bands == 3 and resolved.sizes.train == 10 and resolved.sizes.val > 0
    assert resolved.sizes.as_dict() == prepare_dataset(job)
    assert resolved.model is not None and resolved.lightning is None
    assert resolved.model.in_channels == 3  # built once, for the data's bands
    assert resolved.world_size == 3 and resolved.max_failures == 2
    assert resolved.batch.global_batch_size == 12 and type(resolved.batch).__name__ == (
        "BatchConfig"
    )
    carver = EpochCarver(10, 12, seed=job.train.seed, min_step_size=3)
    assert resolved.steps_per_epoch == carver.steps_per_epoch
    assert resolve_data(job) == resolved.data


def test_the_run_outputs_are_refused_before_any_data_is_touched(
    tmp_path: Path, data_root: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text("{}")
    with pytest.raises(ConfigError, match="--overwrite"):
        resolve_job(small_job(tmp_path / "eurosat"), outputs=RunRequest(output_dir=out))
    assert not (tmp_path / "eurosat").exists()  # refused before the data was generated
    job = small_job(data_root)
    resolved = resolve_job(job, outputs=RunRequest(output_dir=out, overwrite=True))
    assert resolved.run is not None and resolved.run.outputs.local_path == out
    assert resolved.run.identity.name.startswith("resolved-") and not resolved.run.identity.resuming


def test_a_missing_root_is_named_before_generation_is_considered(tmp_path: Path) -> None:
    job = small_job(tmp_path / "none", generate=False)
    with pytest.raises(DataError, match=r"data.root .*none does not exist.*Fix"):
        resolve_job(job)


def test_the_roles_leave_the_feeders_out_and_what_follows_the_workers(data_root: Path) -> None:
    resolved = resolve_job(small_job(data_root))
    assert resolved.with_roles(None) is resolved
    # a trains; b stands by (slow, nothing to feed); c feeds the loader-bound pipeline.
    roles = decide_group(
        12,
        [
            WorkerPrice("a", CostModel(0.0, 0.01)),
            WorkerPrice("b", CostModel(0.5, 0.5)),
            WorkerPrice("c", CostModel(0.5, 0.5), feed_samples_per_s=200.0),
        ],
        ExchangePrice(gradient_bytes=0.0, gloo=LinkCost(0.01, float("inf"))),
        noise=0.02,
        pipeline_samples_per_s=50.0,
    )
    assert [w.verdict for w in roles.workers] == ["train", "stand_by", "feed"], roles.summary()
    trainers = resolved.with_roles(roles)
    assert [w.name for w in trainers.job.workers] == ["a"] and trainers.world_size == 1
    assert trainers.roles is roles and trainers.model is resolved.model
    assert trainers.sizes == resolved.sizes and trainers.data == resolved.data
    carver = EpochCarver(10, 12, seed=resolved.batch.seed, min_step_size=1)
    assert trainers.steps_per_epoch == carver.steps_per_epoch
    assert resolved.world_size == 3  # frozen: the original stands


def test_run_job_takes_a_resolved_job_with_its_run_only(tmp_path: Path, data_root: Path) -> None:
    resolved = resolve_job(small_job(data_root))
    with pytest.raises(ConfigError, match=r"resolve_job\(job, outputs=RunRequest"):
        run_job(resolved)
    with_run = resolve_job(small_job(data_root), outputs=RunRequest(output_dir=tmp_path / "o"))
    with pytest.raises(ConfigError, match="pass no output_dir"):
        run_job(with_run, output_dir=tmp_path / "elsewhere")
