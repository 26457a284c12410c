"""Every workload trains through HeteroTrainer with two workers (the job's own loop), and
data problems stop the job on the driver before any worker starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import registered_datasets
import torch

from raytrain_hetero import BatchConfig, HeteroTrainer
from raytrain_hetero.app.config import JobConfig
from raytrain_hetero.app.job import classification_loop, prepare_dataset
from raytrain_hetero.errors import DataError

TWO_WORKERS = [{"name": "fast", "resources": {"CPU": 1}}, {"name": "slow", "resources": {"CPU": 1}}]

WORKLOADS = {
    "uc_merced": {
        "data": {
            "dataset": "uc_merced",
            "generate": {"samples_per_class": 5, "size": 32},
            "image_size": 32,
            "cache": True,
        },
        "model": {"name": "small_cnn", "width": 8},
    },
    "hyperspectral": {
        "data": {
            "dataset": "hyperspectral",
            "generate": {"height": 32, "width": 32, "spectral_bands": 16, "classes": 4},
            "hyperspectral": {"patch_size": 5, "block_size": 8},
        },
        "model": {"name": "cnn3d", "width": 4},
    },
    "multimodal": {
        "data": {
            "dataset": "multimodal",
            "generate": {"samples_per_class": 8, "size": 16},
            "cache": True,
        },
        "model": {"name": "fusion_cnn", "width": 8},
    },
    # A dataset registered before the config is loaded (registered_datasets.py).
    registered_datasets.REGISTERED_EUROSAT.name: {
        "data": {
            "dataset": registered_datasets.REGISTERED_EUROSAT.name,
            "generate": {"samples_per_class": 5, "size": 16},
            "bands": "rgb",
            "cache": True,
        },
        "model": {"name": "small_cnn", "width": 4},
    },
}


def make_job(kind: str, root: Path, **changes) -> JobConfig:
    spec = WORKLOADS[kind]
    raw = {
        "name": f"test-{kind}",
        "data": {**spec["data"], "root": str(root)},
        "model": dict(spec["model"]),
        "train": {"epochs": 1, "global_batch_size": 24, "lr": 0.05, "fixed_shares": [2, 1]},
        "workers": TWO_WORKERS,
        "output_dir": str(root.parent / "out"),
    }
    for section, values in changes.items():
        raw[section] = {**raw[section], **values}
    return JobConfig.model_validate(raw)


@pytest.mark.ray
@pytest.mark.parametrize("kind", list(WORKLOADS))
def test_workload_trains_through_hetero_trainer(
    kind, ray_local, run_config, tmp_path: Path
) -> None:
    job = make_job(kind, tmp_path / "data")
    sizes = prepare_dataset(job)  # generates the data in its real format, checks it
    assert sizes["train"] >= 2 * 12
    trainer = HeteroTrainer(
        classification_loop,
        train_loop_config={"job": job.model_dump(mode="json")},
        workers=job.workers,
        batch=BatchConfig(
            global_batch_size=job.train.global_batch_size,
            fixed_shares=job.train.fixed_shares,
        ),
        run_config=run_config,
    )
    result = trainer.fit()
    assert result.error is None
    assert 0.0 <= result.metrics["val_accuracy"] <= 1.0
    records = trainer.step_records
    assert {r.rank for r in records} == {0, 1}
    steps = -(-sizes["train"] // 24)
    assert len({r.step for r in records}) == steps
    assert {r.slice for r in records if r.rank == 0} >= {16}  # shares 2:1 of 24
    with result.checkpoint.as_directory() as directory:
        state = torch.load(Path(directory) / "model.pt", weights_only=True)
    assert state["meta"]["dataset"] == kind and state["meta"]["in_channels"] == sizes["bands"]


def test_band_mismatch_is_reported_before_training(tmp_path: Path) -> None:
    job = make_job("uc_merced", tmp_path / "data", model={"in_channels": 13})
    with pytest.raises(
        DataError,
        match=r"band-count mismatch: .*data has 3 band\(s\) per sample but "
        r"model.in_channels is 13.*Fix",
    ):
        prepare_dataset(job)
    job = make_job("hyperspectral", tmp_path / "hs", model={"in_channels": 200})
    with pytest.raises(
        DataError, match=r"has 16 band\(s\) per sample but model.in_channels is 200"
    ):
        prepare_dataset(job)


def test_corrupt_file_stops_the_job_or_is_skipped(tmp_path: Path) -> None:
    job = make_job("uc_merced", tmp_path / "data")
    sizes = prepare_dataset(job)
    bad = next((tmp_path / "data" / "UCMerced_LandUse" / "Images" / "harbor").glob("*.tif"))
    bad = bad.resolve()  # errors name the file in the root's current version (versioned roots)
    bad.write_bytes(bad.read_bytes()[:256])
    with pytest.raises(DataError, match=rf"1 unreadable file\(s\):\n  {bad}: cannot read"):
        prepare_dataset(job)
    skipping = make_job("uc_merced", tmp_path / "data", data={"on_bad_file": "skip"})
    skipped = prepare_dataset(skipping)
    in_train = bad.name in (tmp_path / "data" / "uc_merced-train.txt").read_text().split()
    assert skipped["train"] == sizes["train"] - int(in_train)
    # A corrupt hyperspectral scene names the file (a scene cannot be skipped).
    job = make_job("hyperspectral", tmp_path / "hs")
    prepare_dataset(job)
    scene = next((tmp_path / "hs").glob("*_corrected.mat"))
    scene.write_bytes(scene.read_bytes()[:4000])
    with pytest.raises(DataError, match=rf"{scene}: cannot read image cube"):
        prepare_dataset(job)
