"""Ranks compare (length, file-list hash) of their datasets; differences name rank and node."""

from __future__ import annotations

import pytest

from raytrain_hetero.errors import DataError
from raytrain_hetero.worker.data.dataset_agreement import (
    DatasetFingerprint,
    RankDataset,
    check_agreement,
    dataset_fingerprint,
)


class Folder:
    """Shaped like torchvision's ImageFolder / torchgeo's classification datasets."""

    def __init__(self, root: str, names: list[str]) -> None:
        self.root = root
        self.samples = [(f"{root}/cls/{n}.tif", 0) for n in names]

    def __len__(self) -> int:
        return len(self.samples)


class Cache:
    """Shaped like the app's InMemoryDataset / torch's Subset (a wrapped ``dataset``)."""

    def __init__(self, dataset, indices=None) -> None:
        self.dataset = dataset
        if indices is not None:
            self.indices = indices


def test_same_files_under_different_roots_agree():
    a = dataset_fingerprint(Folder("/node1/data", ["x", "y"]), 2)
    b = dataset_fingerprint(Folder("/mnt/other", ["x", "y"]), 2)
    assert a == b and a.files_hash is not None and a.files_attribute == "samples"
    wrapped = dataset_fingerprint(Cache(Folder("/d", ["x", "y"])), 2)
    assert wrapped.files_hash == a.files_hash and wrapped.files_attribute == "dataset.samples"
    assert dataset_fingerprint(Folder("/d", ["x", "z"]), 2).files_hash != a.files_hash
    subset = dataset_fingerprint(Cache(Folder("/d", ["x", "y"]), indices=[1]), 1)
    assert subset.files_hash != a.files_hash
    assert dataset_fingerprint(object(), 5) == DatasetFingerprint(5)


def test_the_rank_that_differs_is_named_with_its_node_and_what_differs():
    same = DatasetFingerprint(10, "aaaa", "samples")
    other = DatasetFingerprint(9, "bbbb", "samples")
    ranks = [
        RankDataset(0, "n0 (host0)", same),
        RankDataset(1, "n1 (host1)", other),
        RankDataset(2, "n0 (host0)", same),
    ]
    with pytest.raises(DataError) as info:
        check_agreement(ranks)
    message = str(info.value)
    assert "rank 1 on node n1 (host1) sees 9 samples, file list bbbb" in message
    assert "rank(s) [0, 2] see 10 samples, file list aaaa" in message
    assert "Fix:" in message
    check_agreement([RankDataset(0, "n", same), RankDataset(1, "m", same)])
