"""``data.cache``: samples decoded once per node into memory-mapped arrays, shared by every
worker, fit and trial on it; a changed file or option decodes afresh; samples that cannot be
stacked, and unwritable roots, keep a per-worker copy."""

from __future__ import annotations

import json
import multiprocessing
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from raytrain_hetero.app.config import JobConfig
from raytrain_hetero.app.datasets import data_source, open_worker_data
from raytrain_hetero.app.job import prepare_dataset
from raytrain_hetero.worker.data.dataset_agreement import dataset_fingerprint
from raytrain_hetero.workloads.cache import DecodedArrays, InMemoryDataset, node_shared_dataset
from raytrain_hetero.workloads.data import decoded_once_per_node, open_datasets


class LoggedSamples:
    """Samples built from their index; every read appends the index to ``log`` (so a test
    counts decodes across processes)."""

    def __init__(self, size: int, log: Path, shape=(3, 4, 4)) -> None:
        self.size, self.log, self.shape = size, log, shape

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict:
        if not 0 <= index < self.size:
            raise IndexError(index)
        with open(self.log, "a") as fh:
            fh.write(f"{index}\n")
        image = torch.arange(np.prod(self.shape), dtype=torch.float32).reshape(self.shape)
        return {
            "image": image * (index + 1) + 0.25,
            "label": torch.tensor(index % 3),
            "mask": np.full((2,), index, dtype=np.uint8),
            "weight": float(index) / 7,
            "id": index,
        }


def reads(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def assert_same_items(served, source) -> None:
    assert len(served) == len(source)
    for i in range(len(source)):
        got, want = served[i], source[i]
        assert sorted(got) == sorted(want)
        for name, value in want.items():
            assert type(got[name]) is type(value), name
            if isinstance(value, torch.Tensor):
                assert got[name].dtype == value.dtype and torch.equal(got[name], value), name
            elif isinstance(value, np.ndarray):
                assert got[name].dtype == value.dtype and np.array_equal(got[name], value)
            else:
                assert got[name] == value, name


def test_decoded_once_then_served_from_the_arrays_equal_to_the_source(tmp_path: Path) -> None:
    log = tmp_path / "reads"
    source = LoggedSamples(11, log)
    first = node_shared_dataset(source, {"k": 1}, tmp_path / "cache")
    assert isinstance(first, DecodedArrays)
    assert reads(log) == 11  # one decode of every sample
    again = node_shared_dataset(source, {"k": 1}, tmp_path / "cache")
    assert isinstance(again, DecodedArrays) and again.directory == first.directory
    assert reads(log) == 11  # the second worker/fit decoded nothing
    log.unlink()
    assert_same_items(again, LoggedSamples(11, tmp_path / "other"))
    assert again[-1]["id"] == 10
    with pytest.raises(IndexError):
        again[11]
    # Another family (another split or source) is decoded beside it.
    split = node_shared_dataset(source, {"k": 2}, tmp_path / "cache", family="val")
    assert isinstance(split, DecodedArrays) and split.directory != first.directory
    assert reads(log) == 11
    # A new version of the family (a changed file or code) decodes afresh and replaces it.
    log.unlink()
    newer = node_shared_dataset(source, {"k": 3}, tmp_path / "cache")
    assert isinstance(newer, DecodedArrays) and newer.directory != first.directory
    assert reads(log) == 11
    kept = sorted(p.name for p in (tmp_path / "cache").iterdir() if p.is_dir())
    assert kept == sorted([split.directory.name, newer.directory.name])  # nothing staged left


def test_served_items_are_fresh_copies_and_the_dataset_pickles_as_a_path(tmp_path: Path) -> None:
    served = node_shared_dataset(LoggedSamples(4, tmp_path / "r"), {"k": 1}, tmp_path / "c")
    item = served[2]
    item["image"].add_(100.0)  # a loop that normalises in place must not change the cache
    item["mask"][:] = 0
    assert torch.equal(served[2]["image"], LoggedSamples(4, tmp_path / "r")[2]["image"])
    assert served[2]["mask"].tolist() == [2, 2]
    blob = pickle.dumps(served)
    assert len(blob) < 2000  # a path and field specs, not the arrays
    assert_same_items(pickle.loads(blob), LoggedSamples(4, tmp_path / "r2"))
    batches = list(DataLoader(served, batch_size=3, num_workers=1))
    assert [b["id"].tolist() for b in batches] == [[0, 1, 2], [3]]


def test_a_key_that_differs_from_the_stored_one_is_not_served(tmp_path: Path) -> None:
    source = LoggedSamples(3, tmp_path / "r")
    first = node_shared_dataset(source, {"k": 1}, tmp_path / "c")
    # Same directory name, other key inside (a digest collision or a hand-edited cache).
    (first.directory / "key.json").write_text('{"k": 99}\n')
    served = node_shared_dataset(source, {"k": 1}, tmp_path / "c")
    assert reads(tmp_path / "r") == 6  # decoded again, and the directory replaced
    assert json.loads((served.directory / "key.json").read_text()) == {"k": 1}


def _open_in_process(args: tuple[str, str]) -> list[float]:
    cache, log = args
    served = node_shared_dataset(LoggedSamples(40, Path(log)), {"k": 1}, cache)
    return [float(served[i]["image"].sum()) for i in range(len(served))]


def test_workers_starting_together_on_a_node_decode_once(tmp_path: Path) -> None:
    log = tmp_path / "reads"
    with multiprocessing.get_context("spawn").Pool(3) as pool:
        sums = pool.map(_open_in_process, [(str(tmp_path / "c"), str(log))] * 3)
    assert reads(log) == 40  # one worker decoded, the others waited and mapped its arrays
    want = [float(LoggedSamples(40, tmp_path / "x")[i]["image"].sum()) for i in range(40)]
    assert sums == [want, want, want]


@pytest.mark.parametrize(
    ("samples", "why"),
    [
        ([(torch.zeros(2), 0)] * 3, "not dicts"),
        ([{"image": torch.zeros(2)}, {"image": torch.zeros(3)}], "changes"),
        ([{"image": torch.zeros(2)}, {"picture": torch.zeros(2)}], "other fields"),
        ([{"name": "a"}], "str"),
    ],
)
def test_samples_that_cannot_be_stacked_keep_a_per_worker_copy(
    samples, why, tmp_path: Path, caplog
) -> None:
    with caplog.at_level("INFO", logger="raytrain_hetero.workloads.cache"):
        served = node_shared_dataset(samples, {"k": 1}, tmp_path / "c")
    assert isinstance(served, InMemoryDataset)
    assert served.items == samples
    assert why in caplog.text
    assert not [p for p in (tmp_path / "c").iterdir() if p.is_dir()]  # nothing half-written


def test_an_unwritable_cache_directory_keeps_a_per_worker_copy(tmp_path: Path) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    served = node_shared_dataset(LoggedSamples(3, tmp_path / "r"), {"k": 1}, blocker / "cache")
    assert isinstance(served, InMemoryDataset)
    assert_same_items(served, LoggedSamples(3, tmp_path / "r2"))


def test_a_failing_decode_raises_and_publishes_nothing(tmp_path: Path) -> None:
    class Corrupt(LoggedSamples):
        def __getitem__(self, index):
            if index == 2:
                raise OSError("truncated TIFF")
            return super().__getitem__(index)

    with pytest.raises(OSError, match="truncated"):
        node_shared_dataset(Corrupt(4, tmp_path / "r"), {"k": 1}, tmp_path / "c")
    assert not [p for p in (tmp_path / "c").iterdir() if p.is_dir()]


def eurosat_job(root: Path) -> JobConfig:
    return JobConfig.model_validate(
        {
            "name": "cache",
            "data": {
                "root": str(root),
                "generate": {"samples_per_class": 4, "size": 16},
                "cache": True,
            },
            "model": {"name": "small_cnn", "width": 4},
            "train": {"epochs": 1, "global_batch_size": 8},
            "workers": [{"name": "a"}],
            "output_dir": str(root.parent / "out"),
        }
    )


def test_torchgeo_eurosat_through_the_job_path_and_a_changed_file_decodes_afresh(
    tmp_path: Path,
) -> None:
    job = eurosat_job(tmp_path / "eurosat")
    prepare_dataset(job)
    _, served, _ = open_worker_data(job, ("train", "val"))
    source = data_source(job.data)
    plain = open_datasets(source, ("train", "val")).datasets
    for split in ("train", "val"):
        assert isinstance(served[split], DecodedArrays), split
        assert_same_items(served[split], plain[split])
        # Ranks still compare the source's file list through the cached dataset.
        fingerprint = dataset_fingerprint(served[split], len(served[split]))
        assert fingerprint == dataset_fingerprint(InMemoryDataset(plain[split]), len(plain[split]))
        assert fingerprint.files_hash is not None
    directories = {split: served[split].directory for split in served}
    _, again, _ = open_worker_data(job, ("train", "val"))
    assert {split: again[split].directory for split in again} == directories
    # Touch one image (a replaced file): the decoded copy no longer counts as current.
    image = sorted(source.root.resolve().rglob("*.tif"))[0]
    stat = image.stat()
    os.utime(image, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    renewed = decoded_once_per_node(source, open_datasets(source, ("train",)).datasets)
    assert renewed["train"].directory != directories["train"]
