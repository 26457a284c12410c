"""Sentinel-1 + Sentinel-2 pairs: generated layout, loader, bad files, fusion vs one branch."""

from __future__ import annotations

import functools
import operator
import shutil
from pathlib import Path

import numpy as np
import pytest
import rasterio
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from raytrain_hetero.errors import DataError
from raytrain_hetero.workloads import (
    MULTIMODAL_CLASSES,
    S1_BANDS,
    S2_BANDS,
    build_model,
    generate_multimodal,
    multimodal_datasets,
)
from raytrain_hetero.workloads.data import bad_files
from raytrain_hetero.workloads.registry import DataSource

SPC = 6  # 4 train / 1 val / 1 test per class


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_multimodal(
        tmp_path_factory.mktemp("mm") / "data", samples_per_class=SPC, size=16
    )


def test_documented_layout_coregistered_pairs(root: Path) -> None:
    assert (root / "classes.txt").read_text().split() == list(MULTIMODAL_CLASSES)
    ids = {s: (root / f"multimodal-{s}.txt").read_text().split() for s in ("train", "val", "test")}
    assert [len(ids[s]) for s in ("train", "val", "test")] == [28, 7, 7]
    assert len(set(functools.reduce(operator.iadd, ids.values(), []))) == 42
    with (
        rasterio.open(root / "s1" / f"{ids['val'][0]}.tif") as s1,
        rasterio.open(root / "s2" / f"{ids['val'][0]}.tif") as s2,
    ):
        assert (s1.count, s1.dtypes[0], s1.descriptions) == (2, "float32", S1_BANDS)
        assert (s2.count, s2.dtypes[0], s2.descriptions) == (10, "uint16", S2_BANDS)
        assert (
            s1.transform == s2.transform and s1.crs == s2.crs and s1.shape == s2.shape == (16, 16)
        )
        sar = s1.read()
    assert -45 < sar.mean() < 15  # backscatter in dB


def test_loader_stacks_sar_first_and_standardises(root: Path) -> None:
    ds = multimodal_datasets(root, splits=("train", "val"))
    train = ds["train"]
    assert train.s1_channels == 2 and train.num_classes == 7 and len(train) == 28
    item = train[0]
    assert item["image"].shape == (12, 16, 16) and item["label"].dtype == torch.int64
    batch = next(iter(DataLoader(train, batch_size=28)))
    means = batch["image"].mean(dim=(0, 2, 3))
    assert torch.allclose(means, torch.zeros(12), atol=1e-3)  # statistics of this very split
    raw = multimodal_datasets(root, splits=("val",), normalize=False)["val"]
    with rasterio.open(root / "s1" / f"{raw.ids[0]}.tif") as s1:
        assert np.array_equal(raw[0]["image"][:2].numpy(), s1.read())


def test_bad_pairs_are_named_skipped_or_reported_as_band_mismatch(
    root: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "mm"
    shutil.copytree(root, copy, ignore=shutil.ignore_patterns(".raytrain_hetero_cache"))
    sample = (copy / "multimodal-train.txt").read_text().split()[3]
    optical = copy / "s2" / f"{sample}.tif"
    optical.write_bytes(optical.read_bytes()[:400])
    with pytest.raises(DataError, match=f"{optical}: cannot read patch"):
        bad_files(DataSource("multimodal", copy))  # on_bad_file: error, the default
    left_out = bad_files(DataSource("multimodal", copy, on_bad_file="skip"))
    assert left_out == [sample]  # a pair is left out by its sample id
    skipped = multimodal_datasets(copy, splits=("train",), exclude=left_out, cache_dir=None)
    assert len(skipped["train"]) == 27 and sample not in skipped["train"].ids
    # A Sentinel-2 patch with a band missing is a band-count mismatch, named as such.
    with rasterio.open(root / "s2" / f"{sample}.tif") as src:
        profile, data = src.profile, src.read()
    profile.update(count=9)
    optical.unlink()
    with rasterio.open(optical, "w", **profile) as dst:
        dst.write(data[:9])
    ds = multimodal_datasets(copy, splits=("train",), normalize=False)["train"]
    with pytest.raises(DataError, match=f"band-count mismatch: {optical} has 9 band.*expected 10"):
        ds[ds.ids.index(sample)]


def _accuracy(modalities, train, test) -> float:
    torch.manual_seed(0)
    model = build_model(
        "fusion_cnn", in_channels=12, num_classes=7, width=16, s1_channels=2, modalities=modalities
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(15):
        model.train()
        for batch in DataLoader(train, batch_size=32, shuffle=True, generator=generator):
            loss = F.cross_entropy(model(batch["image"]), batch["label"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    with torch.no_grad():
        batch = next(iter(DataLoader(test, batch_size=len(test))))
        return float((model(batch["image"]).argmax(1) == batch["label"]).float().mean())


@pytest.fixture
def one_torch_thread():
    """One intra-op thread for this test only (restored after): on a busy 2-core machine
    spinning torch threads slow small models down by an order of magnitude."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_fusion_beats_either_single_branch(tmp_path: Path, one_torch_thread) -> None:
    root = generate_multimodal(
        tmp_path / "mm", samples_per_class=50, size=16, seed=1, split_fractions=(0.5, 0.1, 0.4)
    )
    ds = multimodal_datasets(root, splits=("train", "test"))
    train = [ds["train"][i] for i in range(len(ds["train"]))]
    test = [ds["test"][i] for i in range(len(ds["test"]))]
    sar, optical, fused = (_accuracy(m, train, test) for m in (("s1",), ("s2",), ("s1", "s2")))
    # Seeds 1-3 give (SAR, optical, fused) = (.87, .69, .95-.97), (.89, .61, .97), (.86, .67, .96)
    # with 1 or 2 torch threads: clouds hide the optical branch, SAR confuses soil and crops.
    assert fused > max(sar, optical) + 0.05, (sar, optical, fused)
    assert min(sar, optical) > 2 / 7  # each modality alone is informative
