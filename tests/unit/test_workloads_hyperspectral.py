"""Hyperspectral scenes: .mat / GeoTIFF files, honest splits, patches, statistics, bad files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import rasterio
import scipy.io
import torch
from torch.utils.data import DataLoader

from raytrain_hetero.errors import ConfigError, DataError
from raytrain_hetero.workloads import (
    find_scene_files,
    generate_hyperspectral_scene,
    hyperspectral_datasets,
    load_hyperspectral_scene,
    split_scene_pixels,
)

ARGS = {"height": 40, "width": 44, "bands": 24, "classes": 5, "seed": 3, "region_size": 8.0}


@pytest.fixture(scope="module")
def mat_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_hyperspectral_scene(tmp_path_factory.mktemp("hs") / "mat", **ARGS)


@pytest.fixture(scope="module")
def scene(mat_root: Path):
    return load_hyperspectral_scene(*find_scene_files(mat_root))


def test_mat_files_look_like_indian_pines(mat_root: Path) -> None:
    image, labels = find_scene_files(mat_root)
    assert (image.name, labels.name) == ("Synthetic_pines_corrected.mat", "Synthetic_pines_gt.mat")
    cube = scipy.io.loadmat(image)["synthetic_pines_corrected"]
    gt = scipy.io.loadmat(labels)["synthetic_pines_gt"]
    assert cube.shape == (40, 44, 24) and cube.dtype == np.uint16
    assert gt.shape == (40, 44) and gt.dtype == np.uint8
    assert set(np.unique(gt)) == set(range(6))  # 0 = unlabelled, classes 1..5
    assert 1000 < cube.mean() < 6000  # reflectance * 10000


def test_geotiff_scene_has_the_same_content_and_a_georeference(
    mat_root: Path, scene, tmp_path: Path
) -> None:
    tif_root = generate_hyperspectral_scene(tmp_path / "tif", file_format="tif", **ARGS)
    image, labels = find_scene_files(tif_root)
    assert (image.name, labels.name) == ("Synthetic_pines.tif", "Synthetic_pines_gt.tif")
    tif = load_hyperspectral_scene(image, labels)
    assert np.array_equal(tif.cube, scene.cube) and np.array_equal(tif.labels, scene.labels)
    assert tif.profile["crs"].to_epsg() == 32615 and scene.profile is None
    with rasterio.open(image) as src:
        assert (src.count, src.height, src.width, src.dtypes[0]) == (24, 40, 44, "uint16")


def test_spectra_carry_class_structure(scene) -> None:
    means = np.stack([scene.cube[scene.labels == c].mean(0) for c in range(1, 6)])
    within = np.mean([scene.cube[scene.labels == c].std(0).mean() for c in range(1, 6)])
    between = np.abs(means[:, None] - means[None]).mean(-1)[np.triu_indices(5, 1)]
    assert between.min() > 0.2 * within and between.mean() > within


@pytest.mark.parametrize("method", ["block", "random"])
def test_no_patch_centre_is_in_two_splits(scene, method: str) -> None:
    splits = split_scene_pixels(scene.labels, method=method, block_size=10, patch_size=5, seed=1)
    sets = {name: {tuple(c) for c in centres.tolist()} for name, centres in splits.items()}
    assert all(len(sets[n]) == len(splits[n]) for n in sets)
    assert not (
        sets["train"] & sets["val"] or sets["train"] & sets["test"] or sets["val"] & sets["test"]
    )
    for centres in splits.values():
        assert np.all(scene.labels[centres[:, 0], centres[:, 1]] > 0)
    if method == "random":  # every labelled pixel is used, in proportion
        assert sum(len(s) for s in sets.values()) == int((scene.labels > 0).sum())
        assert abs(len(sets["train"]) / (scene.labels > 0).sum() - 0.6) < 0.05
    assert (
        split_scene_pixels(scene.labels, method=method, block_size=10, patch_size=5, seed=1)[
            "val"
        ].tolist()
        == splits["val"].tolist()
    )


def test_block_split_guard_keeps_every_patch_inside_its_own_split(scene) -> None:
    k, r = 5, 2
    splits = split_scene_pixels(scene.labels, method="block", block_size=10, patch_size=k)
    owner = np.full(scene.labels.shape, -1)
    for s, name in enumerate(("train", "val", "test")):
        owner[splits[name][:, 0], splits[name][:, 1]] = s
    for s, name in enumerate(("train", "val", "test")):
        for y, x in splits[name]:
            window = owner[max(0, y - r) : y + r + 1, max(0, x - r) : x + r + 1]
            assert set(np.unique(window)) <= {-1, s}, (name, y, x)
    loose = split_scene_pixels(
        scene.labels, method="block", block_size=10, patch_size=k, guard=False
    )
    assert (
        sum(map(len, loose.values()))
        == int((scene.labels > 0).sum())
        > sum(map(len, splits.values()))
    )


def test_patches_and_training_pixel_statistics(mat_root: Path, scene) -> None:
    image, labels = find_scene_files(mat_root)
    ds = hyperspectral_datasets(
        image,
        labels,
        splits=("train", "val", "scene"),
        patch_size=5,
        block_size=10,
        cache_dir=mat_root / "cache",
    )
    train = ds["train"]
    centres = train.centres.numpy()
    pixels = scene.cube[centres[:, 0], centres[:, 1]].astype(np.float64)
    mean, std = pixels.mean(0), pixels.std(0)
    stats = json.loads(next((mat_root / "cache").glob("band_stats-*.json")).read_text())["value"]
    assert np.allclose(stats["mean"], mean) and np.allclose(stats["std"], std)
    # An item is the reflect-padded k x k neighbourhood of its centre, standardised.
    norm = (scene.cube - mean) / std
    padded = np.pad(norm, ((2, 2), (2, 2), (0, 0)), mode="reflect")
    full = ds["scene"]
    for i in (0, len(full) - 1, 123):  # corners (reflected) and an interior pixel
        y, x = full.centres[i].tolist()
        expected = padded[y : y + 5, x : x + 5].transpose(2, 0, 1)
        item = full[i]
        assert item["image"].shape == (24, 5, 5)
        assert np.allclose(item["image"].numpy(), expected, atol=1e-4)
        assert int(item["label"]) == scene.labels[y, x] - 1
    assert len(full) == 40 * 44 and int(train[0]["label"]) >= 0
    shared = train.padded.untyped_storage().data_ptr()
    assert train[5]["image"].untyped_storage().data_ptr() == shared  # a view of the scene, no copy
    loaded = next(iter(DataLoader(train, batch_size=16)))
    assert loaded["image"].shape == (16, 24, 5, 5) and loaded["label"].dtype == torch.int64


def test_bad_scene_files_fail_clearly(mat_root: Path, tmp_path: Path) -> None:
    image, labels = find_scene_files(mat_root)
    truncated = tmp_path / "Cut_corrected.mat"
    truncated.write_bytes(image.read_bytes()[:5000])
    with pytest.raises(
        DataError, match=r"Cut_corrected\.mat: cannot read image cube \(\.mat\).*corrupt"
    ):
        load_hyperspectral_scene(truncated, labels)
    junk = tmp_path / "junk_gt.mat"
    junk.write_bytes(b"\x00" * 300)
    with pytest.raises(DataError, match="junk_gt.mat"):
        load_hyperspectral_scene(image, junk)
    v73 = tmp_path / "new_corrected.mat"  # an HDF5-based MATLAB 7.3 header
    header = (
        b"MATLAB 7.3 MAT-file, Platform: GLNXA64".ljust(116, b" ") + b"\x00" * 8 + b"\x00\x02IM"
    )
    v73.write_bytes(header + b"\x00" * 512)
    with pytest.raises(DataError, match="v7.3.*-v7"):
        load_hyperspectral_scene(v73, labels)
    small = tmp_path / "small_gt.mat"
    scipy.io.savemat(small, {"gt": np.ones((10, 10), np.uint8)})
    with pytest.raises(DataError, match="40x44 pixels but .*small_gt.mat is 10x10"):
        load_hyperspectral_scene(image, small)
    with pytest.raises(DataError, match="no variable 'cube'.*synthetic_pines_corrected"):
        load_hyperspectral_scene(image, labels, image_key="cube")
    with pytest.raises(DataError, match="not found"):
        load_hyperspectral_scene(tmp_path / "absent.mat", labels)
    two = tmp_path / "two"
    two.mkdir()
    for name in ("A_gt.mat", "B_gt.mat"):
        shutil.copy(labels, two / name)
    with pytest.raises(DataError, match="exactly one label map"):
        find_scene_files(two)
    with pytest.raises(ConfigError, match="odd"):
        hyperspectral_datasets(image, labels, patch_size=4)


def test_class_map_is_written_atomically_and_reads_back(tmp_path: Path) -> None:
    from raytrain_hetero.workloads.hyperspectral import write_class_map

    class_map = np.arange(12, dtype=np.int64).reshape(3, 4) % 5
    target = tmp_path / "out" / "class_map.tif"
    assert write_class_map(class_map, target) == target
    with rasterio.open(target) as src:
        assert src.read(1).tolist() == class_map.tolist() and src.dtypes[0] == "uint8"
    assert [p.name for p in target.parent.iterdir()] == ["class_map.tif"]  # no temp file left
    # Replacing an existing map is all or nothing: a failing write leaves the old one intact.
    with pytest.raises(ValueError):  # a 3-D array is no class map
        write_class_map(np.zeros((2, 2, 2)), target)
    with rasterio.open(target) as src:
        assert src.read(1).tolist() == class_map.tolist()
    assert [p.name for p in target.parent.iterdir()] == ["class_map.tif"]
