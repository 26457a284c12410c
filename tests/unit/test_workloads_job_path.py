"""Every built-in workload through the job's own worker path, without Ray: the driver's
``prepare_dataset`` (generation in the real format, checks), the worker's
``open_worker_data`` (torchgeo's loaders, the in-memory cache, the configured model), two
SGD steps on DataLoader batches of two uneven slices, validation counts and the
checkpoint's metadata; and the data problems that stop a job on the driver.

That these pieces run inside ``classification_loop`` on real Ray workers (carved slices,
sharded validation, Ray Train checkpoints) is proven once, for a user-registered dataset
(tests/integration/test_workloads_training.py), and by every YAML job of the suite.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from raytrain_hetero.app.config import JobConfig
from raytrain_hetero.app.datasets import open_worker_data
from raytrain_hetero.app.job import prepare_dataset
from raytrain_hetero.app.train_loop import _checkpoint_meta
from raytrain_hetero.errors import DataError
from raytrain_hetero.workloads.evaluation import correct_counts

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
}

SLICES = (16, 8)  # two uneven workers' slices of a global batch of 24


def make_job(kind: str, root: Path, **changes) -> JobConfig:
    spec = WORKLOADS[kind]
    raw = {
        "name": f"test-{kind}",
        "data": {**spec["data"], "root": str(root)},
        "model": dict(spec["model"]),
        "train": {"epochs": 1, "global_batch_size": sum(SLICES), "lr": 0.05},
        "workers": [{"name": "fast"}, {"name": "slow"}],
        "output_dir": str(root.parent / "out"),
    }
    for section, values in changes.items():
        raw[section] = {**raw[section], **values}
    return JobConfig.model_validate(raw)


def _pairs(loader):
    return ((batch["image"], batch["label"]) for batch in loader)


@pytest.mark.parametrize("kind", list(WORKLOADS))
def test_workload_opens_trains_validates_and_checkpoints_on_a_worker(
    kind, tmp_path: Path, one_thread
) -> None:
    job = make_job(kind, tmp_path / "data")
    sizes = prepare_dataset(job)  # the driver: generates the data in its real format, checks it
    assert sizes["train"] >= sum(SLICES) and sizes["val"] > 0
    torch.manual_seed(job.train.seed)
    workload, datasets, model = open_worker_data(job, ("train", "val"))  # a worker's view
    assert len(datasets["train"]) == sizes["train"] and workload.in_channels == sizes["bands"]
    optimizer = torch.optim.SGD(model.parameters(), lr=job.train.lr)
    for size in SLICES:  # each worker's slice is a DataLoader batch of the job's dataset
        image, label = next(_pairs(DataLoader(datasets["train"], batch_size=size)))
        assert image.shape[0] == size and label.shape == (size,)
        loss = torch.nn.functional.cross_entropy(model(image.float()), label)
        optimizer.zero_grad()
        loss.backward()
        assert torch.isfinite(loss)
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
        optimizer.step()
    correct, seen = correct_counts(
        model, _pairs(DataLoader(datasets["val"], batch_size=7)), torch.device("cpu")
    )
    assert seen == sizes["val"] and 0 <= correct <= seen
    path = tmp_path / "model.pt"
    torch.save({"model": model.state_dict(), "meta": _checkpoint_meta(job, workload)}, path)
    meta = torch.load(path, weights_only=True)["meta"]
    assert meta["dataset"] == kind and meta["in_channels"] == sizes["bands"]
    assert meta["num_classes"] == workload.num_classes and meta["parallel_mode"] == "data"


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
