"""The generated So2Sat (version 2) HDF5 root, read through the project's real So2Sat path:
``multimodal_datasets`` on a root holding ``training.h5`` -> ``torchgeo.datasets.So2Sat``."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from fake_so2sat import (
    SO2SAT_CLASSES,
    SO2SAT_FILES,
    SO2SAT_LABELS,
    generate_so2sat,
)
from torchgeo.datasets import So2Sat

from raytrain_hetero.errors import ConfigError, DataError
from raytrain_hetero.workloads.multimodal import MULTIMODAL_CLASSES, multimodal_datasets

SPC = 20  # 12 train / 4 validation / 4 test per class


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_so2sat(tmp_path_factory.mktemp("so2sat") / "data", samples_per_class=SPC)


def test_real_layout_keys_shapes_and_dtypes(root: Path) -> None:
    assert So2Sat.filenames_by_version["2"] == SO2SAT_FILES
    assert So2Sat.classes == SO2SAT_CLASSES
    n = len(MULTIMODAL_CLASSES)
    for split, count in (("train", 12 * n), ("validation", 4 * n), ("test", 4 * n)):
        with h5py.File(root / SO2SAT_FILES[split], "r") as f:
            assert set(f) == {"sen1", "sen2", "label"}
            assert f["sen1"].shape == (count, 32, 32, 8) and f["sen1"].dtype == np.float64
            assert f["sen2"].shape == (count, 32, 32, 10) and f["sen2"].dtype == np.float64
            assert f["label"].shape == (count, 17) and f["label"].dtype == np.float64
            label = f["label"][:]
            sen1, sen2 = f["sen1"][:], f["sen2"][:]
        assert np.array_equal(label.sum(axis=1), np.ones(count))  # one-hot
        assert set(np.unique(label.argmax(axis=1))) == set(SO2SAT_LABELS.values())
        assert np.bincount(label.argmax(axis=1), minlength=17).max() == count // n
        assert sen2.min() > 0 and sen2.max() < 6.6  # reflectance (DN / 1e4)
        assert (sen1[..., 4:6] > 0).all()  # filtered intensities
        # Unfiltered intensity |z|^2 agrees on average with the filtered one.
        vv = sen1[..., 2] ** 2 + sen1[..., 3] ** 2
        assert vv.mean() == pytest.approx(sen1[..., 5].mean(), rel=0.05)


def test_loads_through_the_project_so2sat_path(root: Path) -> None:
    ds = multimodal_datasets(root, splits=("train", "val", "test"), normalize=False)
    assert all(isinstance(d, So2Sat) for d in ds.values())
    assert [len(ds[s]) for s in ("train", "val", "test")] == [84, 28, 28]
    train = ds["train"]
    assert train.s1_channels == 8 and train.num_classes == 17
    item = train[0]
    assert item["image"].shape == (18, 32, 32) and item["image"].dtype == torch.float32
    assert item["label"].dtype == torch.int64 and int(item["label"]) in SO2SAT_LABELS.values()
    with h5py.File(root / "validation.h5", "r") as f:
        expected = np.concatenate([f["sen1"][3], f["sen2"][3]], axis=-1).transpose(2, 0, 1)
        label = int(f["label"][3].argmax())
    assert np.allclose(ds["val"][3]["image"].numpy(), expected.astype(np.float32))
    assert int(ds["val"][3]["label"]) == label


def test_standardised_with_training_statistics(root: Path, tmp_path: Path) -> None:
    ds = multimodal_datasets(root, splits=("train",), cache_dir=tmp_path)
    images = torch.stack([ds["train"][i]["image"] for i in range(len(ds["train"]))])
    assert torch.allclose(images.mean(dim=(0, 2, 3)), torch.zeros(18), atol=1e-3)
    assert torch.allclose(images.std(dim=(0, 2, 3)), torch.ones(18), atol=1e-2)


def _features(dataset: So2Sat) -> tuple[np.ndarray, np.ndarray]:
    """Per patch: the mean and standard deviation of every band (a spectral + texture summary)."""
    images = np.stack([dataset[i]["image"].numpy() for i in range(len(dataset))])
    labels = np.array([int(dataset[i]["label"]) for i in range(len(dataset))])
    sar_power = images[:, 4:6]  # filtered intensities: compare them in dB, like SAR analysts
    images = np.concatenate([10 * np.log10(sar_power), images[:, 8:]], axis=1)
    return np.concatenate([images.mean(axis=(2, 3)), images.std(axis=(2, 3))], axis=1), labels


def test_classes_are_separable(root: Path) -> None:
    ds = multimodal_datasets(root, splits=("train", "test"), normalize=False)
    x_train, y_train = _features(ds["train"])
    x_test, y_test = _features(ds["test"])
    mean, std = x_train.mean(axis=0), x_train.std(axis=0) + 1e-9
    x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    classes = np.unique(y_train)
    centroids = np.stack([x_train[y_train == c].mean(axis=0) for c in classes])
    distances = ((x_test[:, None, :] - centroids[None]) ** 2).sum(axis=2)
    accuracy = (classes[distances.argmin(axis=1)] == y_test).mean()
    assert accuracy >= 0.8, accuracy  # chance: 1/7


def test_cached_deterministic_and_never_over_real_data(root: Path, tmp_path: Path) -> None:
    stamp = (root / "training.h5").stat().st_mtime_ns
    assert generate_so2sat(root, samples_per_class=SPC) == root
    assert (root / "training.h5").stat().st_mtime_ns == stamp  # cached: not rewritten
    again = generate_so2sat(tmp_path / "again", samples_per_class=SPC)
    with h5py.File(root / "testing.h5", "r") as a, h5py.File(again / "testing.h5", "r") as b:
        assert np.array_equal(a["sen2"][:], b["sen2"][:])
        assert np.array_equal(a["label"][:], b["label"][:])
    real = tmp_path / "real"
    real.mkdir()
    (real / "training.h5").write_bytes(b"a real copy")
    with pytest.raises(DataError, match="not empty and was not created"):
        generate_so2sat(real, samples_per_class=SPC)
    assert (real / "training.h5").read_bytes() == b"a real copy"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"samples_per_class": 2}, "samples_per_class must be an integer >= 3"),
        ({"samples_per_class": True}, "samples_per_class must be an integer"),
        ({"seed": -1}, "seed must be an integer >= 0"),
        ({"cloud_fraction": 1.0}, r"cloud_fraction must be a number in \[0, 1\)"),
        ({"split_fractions": (0.5, 0.5)}, "split_fractions must be 3 positive fractions"),
        ({"samples_per_class": 3, "split_fractions": (0.8, 0.1, 0.1)}, "leaves a split empty"),
    ],
)
def test_bad_arguments_name_the_fix(tmp_path: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        generate_so2sat(tmp_path / "data", **kwargs)
    assert not (tmp_path / "data").exists()
