"""Synthetic UC Merced in torchgeo's real layout, torchgeo's UCMerced loader, bad files."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import DataLoader
from torchgeo.datasets import UCMerced

from raytrain_hetero.errors import DataError
from raytrain_hetero.workloads import UCMERCED_CLASSES, generate_uc_merced, uc_merced_datasets
from raytrain_hetero.workloads import normalization as norm_mod
from raytrain_hetero.workloads.data import bad_files
from raytrain_hetero.workloads.registry import DataSource

IMAGES = Path("UCMerced_LandUse/Images")
SPC = 5  # per class: 3 train / 1 val / 1 test


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_uc_merced(
        tmp_path_factory.mktemp("ucm") / "data", samples_per_class=SPC, size=48
    )


def test_real_layout_rgb_uint8_and_varying_sizes(root: Path) -> None:
    assert sorted(p.name for p in (root / IMAGES).iterdir()) == list(UCMERCED_CLASSES)
    sizes = set()
    for cls in UCMERCED_CLASSES:
        files = sorted((root / IMAGES / cls).glob("*.tif"))
        assert [f.name for f in files] == [f"{cls}{k:02d}.tif" for k in range(SPC)]
        for f in files:
            with Image.open(f) as im:
                assert im.mode == "RGB" and im.format == "TIFF"
                sizes.add(im.size)
    assert (48, 48) in sizes and len(sizes) > 1  # most full size, some cut shorter
    assert all(w <= 48 and h <= 48 and min(w, h) >= 44 for w, h in sizes)
    listed = {
        s: set((root / f"uc_merced-{s}.txt").read_text().split()) for s in ("train", "val", "test")
    }
    assert [len(listed[s]) for s in ("train", "val", "test")] == [63, 21, 21]
    assert not (
        listed["train"] & listed["val"]
        or listed["train"] & listed["test"]
        or listed["val"] & listed["test"]
    )


def test_torchgeo_ucmerced_loads_generated_files_resized_to_256(root: Path) -> None:
    ds = UCMerced(str(root), split="val", download=False)  # torchgeo, unchanged
    assert len(ds) == 21 and {label for _, label in ds.samples} == set(range(21))
    item = ds[0]
    assert item["image"].shape == (3, 256, 256) and item["image"].dtype == torch.float32
    assert float(item["image"].min()) >= 0 and float(item["image"].max()) <= 255


def test_train_split_statistics_normalise_and_are_cached(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ds = uc_merced_datasets(root, splits=("train", "test"), image_size=32)
    assert ds["test"][0]["image"].shape == (3, 32, 32)
    raw = UCMerced(str(root), split="train")
    pixels = torch.stack([raw[i]["image"] for i in range(len(raw))])  # (N, 3, 256, 256)
    expected_mean = pixels.double().mean(dim=(0, 2, 3))
    stats = ds["train"].transforms.stats
    assert np.allclose(stats.mean, expected_mean.numpy(), rtol=1e-6)
    assert np.allclose(
        stats.std, pixels.double().std(dim=(0, 2, 3), unbiased=False).numpy(), rtol=1e-5
    )
    cached = list((root / ".raytrain_hetero_cache").glob("band_stats-*.json"))
    assert len(cached) == 1
    # A second open reads the cache: computing again would fail here.
    monkeypatch.setattr(norm_mod.BandStatsAccumulator, "update", lambda *a, **k: 1 / 0)
    again = uc_merced_datasets(root, splits=("train",), image_size=32)
    assert again["train"].transforms.stats == stats
    batch = next(iter(DataLoader(again["train"], batch_size=63)))
    assert abs(float(batch["image"].mean())) < 0.15 and 0.7 < float(batch["image"].std()) < 1.3


def test_classes_are_learnable_by_a_nearest_centroid(root: Path) -> None:
    ds = uc_merced_datasets(root, splits=("train", "test"), image_size=32)

    def features(d):
        x = torch.stack([d[i]["image"] for i in range(len(d))])
        grad = (x[:, :, 1:] - x[:, :, :-1]).abs().mean(dim=(2, 3))
        return torch.cat([x.mean(dim=(2, 3)), x.std(dim=(2, 3)), grad], 1).numpy(), np.array(
            [int(d[i]["label"]) for i in range(len(d))]
        )

    xtr, ytr = features(ds["train"])
    xte, yte = features(ds["test"])
    centroids = np.stack([xtr[ytr == c].mean(0) for c in range(21)])
    pred = np.argmin(((xte[:, None] - centroids[None]) ** 2).sum(-1), axis=1)
    assert (pred == yte).mean() > 4 / 21  # chance is 1/21


@pytest.fixture
def damaged(root: Path, tmp_path: Path) -> tuple[Path, Path, Path]:
    copy = tmp_path / "ucm"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns(".raytrain_hetero_cache"))
    train_names = (copy / "uc_merced-train.txt").read_text().split()
    truncated = copy / IMAGES / "forest" / next(n for n in train_names if n.startswith("forest"))
    truncated.write_bytes(truncated.read_bytes()[:300])
    garbage = copy / IMAGES / "river" / next(n for n in train_names if n.startswith("river"))
    garbage.write_bytes(b"this is not a tiff")
    return copy, truncated, garbage


def test_corrupt_files_are_named_or_skipped(damaged: tuple[Path, Path, Path]) -> None:
    copy, truncated, garbage = damaged
    with pytest.raises(DataError) as err:
        bad_files(DataSource("uc_merced", copy))  # on_bad_file: error, the default
    message = str(err.value)
    assert (
        "2 unreadable file(s)" in message and str(truncated) in message and str(garbage) in message
    )
    assert "on_bad_file: skip" in message
    left_out = bad_files(DataSource("uc_merced", copy, on_bad_file="skip"))
    assert sorted(left_out) == sorted([str(truncated), str(garbage)])
    skipped = uc_merced_datasets(copy, splits=("train",), exclude_files=left_out, cache_dir=None)
    assert len(skipped["train"]) == 63 - 2
    assert {p for p, _ in skipped["train"].samples}.isdisjoint({str(truncated), str(garbage)})
    # Without the up-front check, reading the bad file raises a DataError naming it.
    ds = uc_merced_datasets(copy, splits=("train",), normalize=False)["train"]
    index = next(i for i, (p, _) in enumerate(ds.samples) if p == str(truncated))
    with pytest.raises(DataError, match="forest.*cannot read UC Merced image"):
        ds[index]


def test_missing_root_and_split_files_name_the_fix(root: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist.*generate_uc_merced"):
        uc_merced_datasets(tmp_path / "nothing")
    partial = tmp_path / "partial"
    shutil.copytree(root / "UCMerced_LandUse", partial / "UCMerced_LandUse")
    with pytest.raises(DataError, match="uc_merced-train.txt is missing"):
        uc_merced_datasets(partial)
    with pytest.raises(DataError, match="refusing to write"):
        generate_uc_merced(partial, samples_per_class=3, size=32)
