"""Benchmark data: a synthetic EuroSAT read once through torchgeo's loader, kept as arrays.

Every contender of a benchmark trains on exactly the same samples: the synthetic EuroSAT in
torchgeo's on-disk layout (:func:`~raytrain_hetero.workloads.synthetic.eurosat.generate_eurosat`) is
decoded once, on the driver, through torchgeo's ``EuroSAT`` dataset with the package's
per-band standardisation, and saved as ``.npy`` arrays. Workers memory-map them, so three
workers on one machine share one copy in the page cache and nobody decodes TIFFs inside a
timed step. The train split is cut to a multiple of the global batch, so every step of every
contender carries exactly B samples (stock's DistributedSampler pads otherwise).

EMULATED slow storage (:func:`slow_storage_view`): a directory of links to the same arrays
plus a ``read_delay.json``; an :class:`ArrayDataset` opened there sleeps that long per sample
it reads (``__getitem__``: every contender's training loader and the alone measurements;
evaluation reads the arrays directly and waits for nothing). A sleep, not work: it makes a
worker loader-bound without taking a core from anyone, as storage or a network file system
would.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ArrayDataset", "BenchData", "prepare_bench_data", "slow_storage_view"]

_FORMAT = 1

#: The file of a slow-storage view holding its EMULATED read delay.
READ_DELAY_FILE = "read_delay.json"


@dataclass(frozen=True)
class BenchData:
    """Paths of the cached arrays and their sizes (picklable, shipped to the workers).

    Attributes:
        directory: Directory holding train_x.npy, train_y.npy, val_x.npy, val_y.npy.
        train_size: Samples in the train split (before cutting to a multiple of B).
        val_size: Samples in the validation split.
        bands: Channels per image.
        num_classes: Classes.
    """

    directory: str
    train_size: int
    val_size: int
    bands: int
    num_classes: int

    def path(self, name: str) -> str:
        """Path of one array, e.g. ``train_x``."""
        return os.path.join(self.directory, f"{name}.npy")

    def train_limit(self, global_batch_size: int) -> int:
        """Largest multiple of the global batch that fits the train split."""
        limit = self.train_size // global_batch_size * global_batch_size
        if limit == 0:
            raise ValueError(
                f"the train split has {self.train_size} samples, fewer than one global batch "
                f"of {global_batch_size}: generate more (--samples-per-class) or lower the batch"
            )
        return limit


class ArrayDataset:
    """Map-style dataset over cached arrays; items are torchgeo-style dicts.

    ``{"image": float32 tensor (C, H, W), "label": int64 scalar tensor}``; the arrays are
    memory-mapped lazily (so the dataset pickles as two paths), and ``limit`` keeps only the
    first ``limit`` samples.
    """

    def __init__(self, images: str, labels: str, limit: int | None = None) -> None:
        self.images_path = images
        self.labels_path = labels
        self._x: Any = None
        self._y: Any = None
        size = int(np.load(labels, mmap_mode="r").shape[0])
        self.size = size if limit is None else min(size, int(limit))
        marker = Path(images).parent / READ_DELAY_FILE
        # EMULATED slow storage (slow_storage_view): seconds each sample read waits.
        self.read_delay_s = (
            float(json.loads(marker.read_text())["seconds_per_sample"]) if marker.exists() else 0.0
        )

    def _open(self) -> None:
        if self._x is None:
            self._x = np.load(self.images_path, mmap_mode="r")
            self._y = np.load(self.labels_path, mmap_mode="r")

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_x"] = state["_y"] = None
        return state

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, Any]:
        import torch

        if not 0 <= index < self.size:
            raise IndexError(index)
        self._open()
        if self.read_delay_s > 0:
            time.sleep(self.read_delay_s)
        return {
            "image": torch.from_numpy(np.array(self._x[index], dtype=np.float32)),
            "label": torch.tensor(int(self._y[index]), dtype=torch.int64),
        }

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The (memory-mapped) images and labels, cut to ``limit``."""
        self._open()
        return self._x[: self.size], self._y[: self.size]


def prepare_bench_data(
    root: str | os.PathLike[str], samples_per_class: int, *, seed: int = 0
) -> BenchData:
    """Generate (cached) the synthetic EuroSAT under ``root`` and cache it as arrays.

    The TIFF tree goes to ``root/eurosat_spc<n>_seed<s>`` and the arrays to
    ``root/arrays_spc<n>_seed<s>``; both are reused when present and complete. Arrays are
    published like a generated tree (temporary sibling renamed into place).
    """
    from raytrain_hetero.workloads.eurosat import eurosat_datasets
    from raytrain_hetero.workloads.generated_tree import generate_tree
    from raytrain_hetero.workloads.synthetic.eurosat import generate_eurosat

    base = Path(root).expanduser().absolute()
    tag = f"spc{samples_per_class}_seed{seed}"
    arrays = base / f"arrays_{tag}"
    marker = arrays / "meta.json"
    if marker.exists():
        meta = json.loads(marker.read_text())
        if meta.get("format") == _FORMAT:
            return BenchData(
                str(arrays),
                meta["train_size"],
                meta["val_size"],
                meta["bands"],
                meta["num_classes"],
            )
    tree = generate_eurosat(base / f"eurosat_{tag}", samples_per_class=samples_per_class, seed=seed)
    datasets = eurosat_datasets(tree, bands="all", splits=("train", "val"))

    def write(directory: Path) -> None:
        sizes: dict[str, int] = {}
        bands = 0
        for split, dataset in datasets.items():
            n = len(dataset)
            first = dataset[0]["image"].numpy()
            bands = int(first.shape[0])
            images = np.lib.format.open_memmap(
                directory / f"{split}_x.npy", mode="w+", dtype=np.float32, shape=(n, *first.shape)
            )
            labels = np.empty(n, dtype=np.int64)
            for i in range(n):
                item = dataset[i]
                images[i] = item["image"].numpy()
                labels[i] = int(item["label"])
            images.flush()
            del images
            np.save(directory / f"{split}_y.npy", labels)
            sizes[split] = n
        meta = {
            "format": _FORMAT,
            "train_size": sizes["train"],
            "val_size": sizes["val"],
            "bands": bands,
            "num_classes": 10,
            "samples_per_class": samples_per_class,
            "seed": seed,
        }
        (directory / "meta.json").write_text(json.dumps(meta, indent=2))

    # The one directory-publish mechanism: written in a temporary sibling, renamed into place.
    params = {
        "generator": "bench_arrays",
        "format": _FORMAT,
        "samples_per_class": samples_per_class,
        "seed": seed,
    }
    generate_tree(arrays, params, write, what="prepare_bench_data")
    meta = json.loads(marker.read_text())
    return BenchData(
        str(arrays), meta["train_size"], meta["val_size"], meta["bands"], meta["num_classes"]
    )


def slow_storage_view(data: BenchData, seconds_per_sample: float) -> BenchData:
    """The same arrays behind EMULATED slow storage: each sample read waits this long.

    A sibling directory ``<arrays>_read<microseconds>us`` of symbolic links to the arrays
    and their ``meta.json``, plus :data:`READ_DELAY_FILE`; made once, reused after. 0 returns
    ``data`` itself.

    Raises:
        ValueError: A negative or non-finite delay.
    """
    delay = float(seconds_per_sample)
    if not (delay >= 0 and delay < float("inf")):
        raise ValueError(f"a read delay must be >= 0 seconds per sample, got {seconds_per_sample}")
    if delay == 0:
        return data
    source = Path(data.directory)
    view = source.with_name(f"{source.name}_read{round(delay * 1e6)}us")
    marker = view / READ_DELAY_FILE
    if not marker.exists():
        view.mkdir(parents=True, exist_ok=True)
        for item in source.iterdir():
            link = view / item.name
            if not link.exists():
                link.symlink_to(item.resolve())
        from raytrain_hetero.atomic import atomic_write_text

        atomic_write_text(marker, json.dumps({"seconds_per_sample": delay, "emulated": True}))
    return replace(data, directory=str(view))
