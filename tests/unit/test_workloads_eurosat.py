"""Synthetic EuroSAT generator (torchgeo's real on-disk layout), torchgeo loaders, models."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import rasterio
import torch
from torch.utils.data import DataLoader
from torchgeo.datasets import EuroSAT

from raytrain_hetero.errors import ConfigError, DataError
from raytrain_hetero.workloads import (
    EUROSAT_BANDS,
    EUROSAT_CLASSES,
    SmallCNN,
    build_model,
    eurosat_datasets,
    generate_eurosat,
)
from raytrain_hetero.workloads import eurosat as eurosat_mod
from raytrain_hetero.workloads.synthetic import eurosat as synthetic_eurosat

BASE = Path("ds/images/remote_sensing/otherDatasets/sentinel_2/tif")
SPC = 20  # samples per class of the shared fixture (14 train / 3 val / 3 test)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_eurosat(tmp_path_factory.mktemp("eurosat") / "data", samples_per_class=SPC)


def _tree_state(path: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(path)): (p.stat().st_mtime_ns, p.stat().st_size)
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


def test_real_layout_dtype_shape_bands(root: Path) -> None:
    assert (root / eurosat_mod.MARKER_NAME).is_file()
    for split in ("train", "val", "test"):
        assert (root / f"eurosat-{split}.txt").is_file()
    assert sorted(p.name for p in (root / BASE).iterdir()) == list(EUROSAT_CLASSES)
    for cls in EUROSAT_CLASSES:
        files = sorted((root / BASE / cls).glob("*.tif"))
        assert {f.name for f in files} == {f"{cls}_{k}.tif" for k in range(1, SPC + 1)}
    with rasterio.open(root / BASE / "Forest" / "Forest_1.tif") as f:
        assert (f.count, f.height, f.width) == (13, 64, 64)
        assert f.dtypes == ("uint16",) * 13
        assert f.crs is not None and f.crs.is_projected
        assert f.res == (10.0, 10.0)
        arr = f.read()
    assert arr.dtype == np.uint16 and arr.shape == (13, 64, 64)
    # Sentinel-2 L1C scale: forest NIR (B08, index 7) well above red (B04, index 3); B10 tiny.
    assert arr[7].mean() > 2 * arr[3].mean()
    assert arr[9].mean() < 50


def test_torchgeo_loads_every_split_disjoint_and_complete(root: Path) -> None:
    seen: dict[str, set[str]] = {}
    for split in ("train", "val", "test"):
        ds = EuroSAT(str(root), split=split, download=False)  # torchgeo, unchanged
        names = {os.path.basename(p) for p, _ in ds.samples}
        listed = set((root / f"eurosat-{split}.txt").read_text().split())
        assert names == listed
        assert {label for _, label in ds.samples} == set(range(10))  # every class present
        for path, label in ds.samples:
            assert Path(path).parent.name == EUROSAT_CLASSES[label]
        item = ds[0]
        assert item["image"].shape == (13, 64, 64) and item["image"].dtype == torch.float32
        assert item["label"].dtype == torch.int64
        seen[split] = names
    assert not (seen["train"] & seen["val"] or seen["train"] & seen["test"])
    assert not seen["val"] & seen["test"]
    all_files = {p.name for p in (root / BASE).rglob("*.tif")}
    assert seen["train"] | seen["val"] | seen["test"] == all_files
    assert [len(seen[s]) for s in ("train", "val", "test")] == [140, 30, 30]


def test_eurosat_datasets_items_bands_and_collate(root: Path) -> None:
    ds = eurosat_datasets(root, splits=("train", "val", "test"))
    assert set(ds) == {"train", "val", "test"} and len(ds["train"]) == 140
    batch = next(iter(DataLoader(ds["train"], batch_size=8, shuffle=False)))
    assert set(batch) == {"image", "label"}
    assert batch["image"].shape == (8, 13, 64, 64) and batch["image"].dtype == torch.float32
    assert batch["label"].shape == (8,) and batch["label"].dtype == torch.int64
    # Normalised to roughly unit range.
    assert -4 < float(batch["image"].mean()) < 4 and float(batch["image"].std()) < 4

    rgb = eurosat_datasets(root, bands="rgb", splits=("val",), normalize=False)["val"]
    two = eurosat_datasets(root, bands=["B08", "B8A"], splits=("val",), normalize=False)["val"]
    path, _ = rgb.samples[0]
    with rasterio.open(path) as f:
        raw = f.read().astype(np.float32)
    assert torch.equal(rgb[0]["image"], torch.from_numpy(raw[[3, 2, 1]]))  # B04, B03, B02
    assert torch.equal(two[0]["image"], torch.from_numpy(raw[[7, 12]]))
    with pytest.raises(ConfigError, match="B13"):
        eurosat_datasets(root, bands=["B02", "B13"])
    with pytest.raises(ConfigError, match="rgb"):
        eurosat_datasets(root, bands="nir")
    with pytest.raises(ConfigError, match="splits"):
        eurosat_datasets(root, splits=("training",))


def test_cache_marker_second_call_rewrites_nothing(root: Path) -> None:
    before = _tree_state(root)
    assert generate_eurosat(root, samples_per_class=SPC) == root
    assert _tree_state(root) == before
    marker = json.loads((root / eurosat_mod.MARKER_NAME).read_text())
    assert marker["samples_per_class"] == SPC and marker["seed"] == 0


def test_deterministic_and_seed_dependent(tmp_path: Path) -> None:
    a = generate_eurosat(tmp_path / "a", samples_per_class=3, size=16, seed=7)
    b = generate_eurosat(tmp_path / "b", samples_per_class=3, size=16, seed=7)
    c = generate_eurosat(tmp_path / "c", samples_per_class=3, size=16, seed=8)
    rel = BASE / "River" / "River_2.tif"
    read = lambda r: rasterio.open(r / rel).read()
    assert np.array_equal(read(a), read(b)) and not np.array_equal(read(a), read(c))
    assert (a / "eurosat-train.txt").read_text() == (b / "eurosat-train.txt").read_text()


def test_changed_parameters_regenerate_our_own_tree(tmp_path: Path) -> None:
    r = generate_eurosat(tmp_path / "d", samples_per_class=3, size=16)
    generate_eurosat(r, samples_per_class=4, size=16)
    assert len(list((r / BASE / "Forest").glob("*.tif"))) == 4
    assert json.loads((r / eurosat_mod.MARKER_NAME).read_text())["samples_per_class"] == 4
    # No temporary leftovers: the pointer plus its version store (issue 11: versioned roots).
    assert sorted(p.name for p in tmp_path.iterdir()) == [".d.versions", "d"]


def test_empty_existing_directory_is_filled(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    r = generate_eurosat(tmp_path / "empty", samples_per_class=3, size=16)
    assert len(EuroSAT(str(r), split="test")) == 10


def test_foreign_non_empty_directory_is_refused_and_untouched(tmp_path: Path) -> None:
    foreign = tmp_path / "real_eurosat"
    (foreign / "ds").mkdir(parents=True)
    (foreign / "eurosat-train.txt").write_text("Forest_1.tif\n")
    before = _tree_state(foreign)
    with pytest.raises(DataError, match="refusing"):
        generate_eurosat(foreign, samples_per_class=3, size=16)
    assert _tree_state(foreign) == before
    assert sorted(p.name for p in foreign.iterdir()) == ["ds", "eurosat-train.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["real_eurosat"]


def test_interrupted_generation_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = synthetic_eurosat._write_tree

    def crash(tmp: Path, *args: object) -> None:
        real(tmp, *args)  # every file written, the completion marker not yet
        raise KeyboardInterrupt

    monkeypatch.setattr(synthetic_eurosat, "_write_tree", crash)
    with pytest.raises(KeyboardInterrupt):
        generate_eurosat(tmp_path / "x", samples_per_class=3, size=16)
    assert list(tmp_path.iterdir()) == []


def test_missing_root_is_a_data_error_naming_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "eurosat"
    with pytest.raises(DataError) as exc:
        eurosat_datasets(missing)
    msg = str(exc.value)
    assert str(missing) in msg and "generate_eurosat" in msg and "download" in msg
    (tmp_path / "exists_but_empty").mkdir()
    with pytest.raises(DataError, match="eurosat-train.txt"):
        eurosat_datasets(tmp_path / "exists_but_empty")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"samples_per_class": 2},
        {"size": 8},
        {"seed": -1},
        {"split_fractions": (0.5, 0.5)},
        {"split_fractions": (0.8, 0.2, 0.0)},
        {"split_fractions": (0.7, 0.2, 0.2)},
    ],
)
def test_invalid_generator_parameters(tmp_path: Path, kwargs: dict) -> None:
    with pytest.raises(ConfigError):
        generate_eurosat(tmp_path / "e", **kwargs)
    assert not (tmp_path / "e").exists()


def _features(ds: EuroSAT) -> tuple[np.ndarray, np.ndarray]:
    """Brightness-normalised per-band log means + two texture statistics per image."""
    xs, ys = [], []
    for i in range(len(ds)):
        item = ds[i]
        img = item["image"].double().numpy()
        band_means = img.mean(axis=(1, 2))
        level = band_means.mean()
        gray = img.mean(axis=0)
        grad = np.abs(np.diff(gray, axis=0)).mean() + np.abs(np.diff(gray, axis=1)).mean()
        xs.append(
            np.r_[np.log(band_means / level), np.log(grad / level), np.log(gray.std() / level)]
        )
        ys.append(int(item["label"]))
    return np.asarray(xs), np.asarray(ys)


def test_learnable_nearest_centroid_beats_chance(root: Path) -> None:
    ds = eurosat_datasets(root, splits=("train", "val"), normalize=False)
    xt, yt = _features(ds["train"])
    xv, yv = _features(ds["val"])
    mu, sd = xt.mean(0), xt.std(0) + 1e-9
    xt, xv = (xt - mu) / sd, (xv - mu) / sd
    centroids = np.stack([xt[yt == k].mean(0) for k in range(10)])
    pred = ((xv[:, None, :] - centroids[None]) ** 2).sum(-1).argmin(1)
    accuracy = float((pred == yv).mean())
    assert accuracy >= 0.8, f"nearest-centroid val accuracy {accuracy:.2f} (chance 0.1)"


# ------------------------------------------------------------------------------ models


@pytest.mark.parametrize("channels", [13, 3])
def test_small_cnn_shapes_and_batchnorm(channels: int) -> None:
    model = build_model("small_cnn", in_channels=channels, num_classes=10)
    assert isinstance(model, SmallCNN)
    assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules()) == 3
    out = model(torch.randn(4, channels, 64, 64))
    assert out.shape == (4, 10)
    out.sum().backward()


def test_small_cnn_trains_on_a_collated_batch(root: Path) -> None:
    ds = eurosat_datasets(root, splits=("train",))["train"]
    batch = next(iter(DataLoader(ds, batch_size=16, shuffle=True)))
    model = SmallCNN(in_channels=len(EUROSAT_BANDS), num_classes=10, width=8)
    loss = torch.nn.functional.cross_entropy(model(batch["image"]), batch["label"])
    loss.backward()
    assert torch.isfinite(loss)


def test_resnet18_shape() -> None:
    model = build_model("resnet18", in_channels=13, num_classes=10)
    assert model(torch.randn(2, 13, 64, 64)).shape == (2, 10)


def test_pretrained_and_unknown_name_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="cannot be downloaded"):
        build_model("resnet18", in_channels=13, num_classes=10, pretrained=True)
    with pytest.raises(ConfigError, match="small_cnn.*resnet18"):
        build_model("vit", in_channels=13, num_classes=10)
    with pytest.raises(ConfigError, match="in_channels"):
        build_model("small_cnn", in_channels=0, num_classes=10)


def test_regenerating_never_changes_the_files_under_an_open_dataset(tmp_path: Path) -> None:
    """Versioned roots: a run that opened the root keeps its version while another
    parameter set is generated and the pointer moves (issue 11)."""
    root = generate_eurosat(tmp_path / "d", samples_per_class=3, size=16)
    reading = eurosat_datasets(root, splits=("train",))["train"]
    first = reading[0]["image"].clone()
    opened_at = Path(reading.samples[0][0])
    before = _tree_state(opened_at.parents[len(BASE.parts) + 1])
    generate_eurosat(root, samples_per_class=4, size=16)
    assert root.is_symlink()
    assert json.loads((root / eurosat_mod.MARKER_NAME).read_text())["samples_per_class"] == 4
    # The open dataset still reads its own, unchanged version.
    assert opened_at.is_file() and opened_at.resolve() != (root / BASE).resolve()
    assert torch.equal(reading[0]["image"], first)
    assert _tree_state(opened_at.parents[len(BASE.parts) + 1]) == before
    # Back to the first parameters: its version is reused, nothing is rewritten.
    versions = sorted(p.name for p in (tmp_path / ".d.versions").iterdir())
    generate_eurosat(root, samples_per_class=3, size=16)
    assert sorted(p.name for p in (tmp_path / ".d.versions").iterdir()) == versions
    assert len(list((root / BASE / "Forest").glob("*.tif"))) == 3


def test_a_link_to_a_foreign_directory_is_not_repointed(tmp_path: Path) -> None:
    foreign = tmp_path / "real"
    foreign.mkdir()
    (foreign / "eurosat-train.txt").write_text("Forest_1.tif\n")
    (tmp_path / "link").symlink_to(foreign)
    with pytest.raises(DataError, match="refusing to repoint"):
        generate_eurosat(tmp_path / "link", samples_per_class=3, size=16)
    assert os.readlink(tmp_path / "link") == str(foreign)
