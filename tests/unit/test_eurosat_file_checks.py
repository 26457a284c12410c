"""EuroSAT files are checked up front by default (decoded, 13 bands each), with an opt-out;
a wrong file is named with the expected and found band count (issue 11, found 5)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import rasterio

from raytrain_hetero.errors import DataError
from raytrain_hetero.workloads.data import bad_files, generate_dataset, open_datasets
from raytrain_hetero.workloads.eurosat import eurosat_datasets
from raytrain_hetero.workloads.registry import DataSource, GenerateOptions

BASE = Path("ds/images/remote_sensing/otherDatasets/sentinel_2/tif")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    source = DataSource(
        "eurosat", tmp_path / "eurosat", generate=GenerateOptions(samples_per_class=3, size=16)
    )
    generated = generate_dataset(source)
    assert generated is not None
    return generated.resolve()  # write the bad file into the current version itself


def _rewrite_with_bands(path: Path, bands: int) -> None:
    with rasterio.open(path) as src:
        profile = src.profile
        data = src.read()
    profile.update(count=bands)
    with rasterio.open(path, "w", **profile) as dst:
        dst.write(np.resize(data, (bands, *data.shape[1:])).astype(data.dtype))


def _train_file(root: Path) -> Path:
    name = (root / "eurosat-train.txt").read_text().split()[0]
    return root / BASE / name.rsplit("_", 1)[0] / name


def test_default_check_names_a_file_with_the_wrong_band_count(root: Path) -> None:
    assert bad_files(DataSource("eurosat", root)) == []  # the default check runs, all good
    bad = _train_file(root)
    _rewrite_with_bands(bad, 12)
    with pytest.raises(DataError) as info:
        bad_files(DataSource("eurosat", root))  # on_bad_file unset: EuroSAT checks by default
    message = str(info.value)
    assert f"{bad}: EuroSAT image has 12 band(s), expected 13" in message
    assert "Fix:" in message and "on_bad_file: skip" in message


def test_default_check_names_a_truncated_file(root: Path) -> None:
    bad = _train_file(root)
    bad.write_bytes(bad.read_bytes()[:300])
    with pytest.raises(DataError, match=rf"{bad}: cannot read EuroSAT image"):
        bad_files(DataSource("eurosat", root))


def test_skip_leaves_the_file_out_and_off_checks_nothing_up_front(root: Path) -> None:
    bad = _train_file(root)
    _rewrite_with_bands(bad, 4)
    skipped = bad_files(DataSource("eurosat", root, on_bad_file="skip"))
    assert skipped == [str(bad)]
    workload = open_datasets(DataSource("eurosat", root, on_bad_file="skip"), ("train",))
    assert str(bad) not in {p for p, _ in workload.datasets["train"].samples}
    # Opt-out: nothing checked up front; the file still fails clearly when it is read.
    assert bad_files(DataSource("eurosat", root, on_bad_file="off")) == []
    train = eurosat_datasets(root, splits=("train",))["train"]
    index = [p for p, _ in train.samples].index(str(bad))
    with pytest.raises(DataError, match=r"has 4 band\(s\), expected 13"):
        train[index]
