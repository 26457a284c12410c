"""Two-modality land cover: Sentinel-1 SAR + Sentinel-2 multispectral patches.

Samples follow torchgeo's ``So2Sat`` convention: ``{"image": cat(S1 bands, S2 bands),
"label"}``, SAR channels first, so the same two-branch model
(:class:`~raytrain_hetero.workloads.models.TwoBranchFusionCNN`) reads the real So2Sat and the
generated data.

* Real data: a So2Sat root (``training.h5`` / ``validation.h5`` / ``testing.h5``, version 2)
  is read through ``torchgeo.datasets.So2Sat`` (needs h5py; a missing h5py is a clear
  DataError).
* Generated data
  (:func:`~raytrain_hetero.workloads.synthetic.multimodal.generate_multimodal`): one
  co-registered pair of GeoTIFF patches per sample, in the layout documented in
  :mod:`~raytrain_hetero.workloads.formats`, read by :class:`MultimodalPatches`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from raytrain_hetero.errors import DataError
from raytrain_hetero.workloads.formats import (
    MULTIMODAL_CLASSES,
    MULTIMODAL_CLASSES_FILE,
    MULTIMODAL_MODALITIES,
    MULTIMODAL_SPLIT_FILE,
    S1_BANDS,
    S2_BANDS,
    SO2SAT_FILES,
    SPLITS,
)
from raytrain_hetero.workloads.generated_tree import resolve_version
from raytrain_hetero.workloads.hyperspectral_scene import read_geotiff
from raytrain_hetero.workloads.normalization import (
    Standardize,
    cached_band_stats,
    file_identity,
    files_band_stats,
)
from raytrain_hetero.workloads.registry import (
    CACHE_DIR_NAME,
    BadFileScan,
    DatasetAdapter,
    DataSource,
    WorkloadData,
    check_splits,
    data_root,
    register_dataset,
    run_generator,
)
from raytrain_hetero.workloads.synthetic.multimodal import generate_multimodal

__all__ = [
    "MULTIMODAL_CLASSES",
    "MULTIMODAL_SPLITS",
    "S1_BANDS",
    "S2_BANDS",
    "MultimodalPatches",
    "multimodal_datasets",
]


MULTIMODAL_SPLITS: tuple[str, ...] = SPLITS
_SO2SAT_SPLITS = {"train": "train", "val": "validation", "test": "test"}
# ------------------------------------------------------------------------------ loaders


class MultimodalPatches:
    """Co-registered Sentinel-1 / Sentinel-2 patch pairs of one split (generated layout).

    Items are ``{"image": float32 (2 + 10, S, S), "label": int64}``: the S1 bands (VV, VH in
    dB) then the S2 bands, like torchgeo's So2Sat; ``s1_channels`` says where S1 ends.

    Args:
        root: Dataset root in the layout of
            :func:`~raytrain_hetero.workloads.synthetic.multimodal.generate_multimodal`.
        split: ``"train"``, ``"val"`` or ``"test"``.
        transforms: Sample transform (e.g. standardisation), applied last.
        exclude: Sample ids to leave out (unreadable pairs found earlier).

    Raises:
        DataError: Missing split file, classes file or patch files (naming them).
    """

    s1_channels = len(S1_BANDS)

    def __init__(
        self,
        root: str | os.PathLike[str],
        split: str,
        transforms: Any = None,
        exclude: Sequence[str] = (),
    ) -> None:
        self.root = Path(root)
        self.split = split
        self.transforms = transforms
        classes_file = self.root / MULTIMODAL_CLASSES_FILE
        split_file = self.root / MULTIMODAL_SPLIT_FILE.format(split=split)
        for path in (classes_file, split_file):
            if not path.is_file():
                raise DataError(
                    f"multimodal data at {self.root}: {path.name} is missing. Fix: generate the "
                    "dataset (data.generate / generate_multimodal) or point root at a So2Sat copy."
                )
        self.classes = tuple(c for c in classes_file.read_text().split("\n") if c)
        index = {c: i for i, c in enumerate(self.classes)}
        skip = set(exclude)
        self.ids: list[str] = []
        self.targets: list[int] = []
        for line in split_file.read_text().split("\n"):
            sample_id = line.strip()
            if not sample_id or sample_id in skip:
                continue
            cls = sample_id.split("/", 1)[0]
            if cls not in index:
                raise DataError(
                    f"{split_file}: sample {sample_id!r} has unknown class {cls!r} "
                    f"(classes.txt lists {list(self.classes)})"
                )
            self.ids.append(sample_id)
            self.targets.append(index[cls])
        missing = [
            p for i in self.ids[:1] + self.ids[-1:] for p in self.paths(i) if not os.path.isfile(p)
        ]
        if missing:
            raise DataError(f"multimodal data at {self.root}: patch file(s) missing: {missing}")

    @property
    def num_classes(self) -> int:
        """Number of classes (lines of classes.txt)."""
        return len(self.classes)

    def paths(self, sample_id: str) -> tuple[str, str]:
        """The (S1, S2) files of a sample id."""
        s1, s2 = (
            str(self.root / modality / f"{sample_id}.tif") for modality in MULTIMODAL_MODALITIES
        )
        return s1, s2

    def read_pair(self, sample_id: str) -> np.ndarray:
        """The stacked float32 (S1 + S2, S, S) array of one sample; DataError if unreadable."""
        s1_path, s2_path = self.paths(sample_id)
        s1, s2 = (read_geotiff(path, "patch")[0] for path in (s1_path, s2_path))
        if s1.shape[1:] != s2.shape[1:]:
            raise DataError(
                f"{s1_path} ({s1.shape[1]}x{s1.shape[2]}) and {s2_path} ({s2.shape[1]}x"
                f"{s2.shape[2]}) are not co-registered (different sizes). Fix: resample one onto "
                "the other's grid."
            )
        for path, array, bands in ((s1_path, s1, S1_BANDS), (s2_path, s2, S2_BANDS)):
            if array.shape[0] != len(bands):
                raise DataError(
                    f"band-count mismatch: {path} has {array.shape[0]} band(s), expected "
                    f"{len(bands)} ({', '.join(bands)}). Fix: regenerate or re-export the patch "
                    "with these bands, or set data.on_bad_file: skip to leave the pair out."
                )
        return np.concatenate([s1.astype(np.float32), s2.astype(np.float32)], axis=0)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, index: int) -> dict[str, Any]:
        import torch

        sample = {
            "image": torch.from_numpy(self.read_pair(self.ids[index])),
            "label": torch.tensor(self.targets[index], dtype=torch.int64),
        }
        return self.transforms(sample) if self.transforms is not None else sample


def _so2sat_datasets(
    root: Path, splits: Sequence[str], normalize: bool, cache_dir: Any
) -> dict[str, Any]:
    """torchgeo So2Sat (version 2) per split, SAR bands first; needs h5py."""
    from torchgeo.datasets import So2Sat
    from torchgeo.datasets.errors import DependencyNotFoundError

    out: dict[str, Any] = {}
    try:
        for split in splits:
            name = _SO2SAT_SPLITS[split]
            ds = So2Sat(str(root), version="2", split=name, bands=So2Sat.all_band_names)
            ds.s1_channels = len(So2Sat.all_s1_band_names)
            ds.num_classes = len(So2Sat.classes)
            out[split] = ds
    except DependencyNotFoundError as exc:
        raise DataError(
            f"{root} holds So2Sat HDF5 files, which need h5py ({exc}). Fix: pip install h5py."
        ) from None
    if normalize:
        train = out.get("train") or So2Sat(str(root), version="2", split="train")
        key = {"kind": "so2sat-train", "file": file_identity(root / SO2SAT_FILES["train"])}
        picks = np.random.default_rng(0).permutation(len(train))[:5000]
        images = (train[int(i)]["image"] for i in picks)
        stats = cached_band_stats(key, images, cache_dir)
        for ds in out.values():
            ds.transforms = Standardize(stats)
    return out


def multimodal_datasets(
    root: str | os.PathLike[str],
    *,
    splits: Sequence[str] = ("train", "val"),
    normalize: bool = True,
    exclude: Sequence[str] = (),
    cache_dir: str | os.PathLike[str] | None = "auto",
) -> dict[str, Any]:
    """SAR + multispectral datasets over ``root``, one per split.

    ``root`` is either a So2Sat copy (``training.h5`` present: torchgeo's ``So2Sat``, needs
    h5py) or the generated layout of
    :func:`~raytrain_hetero.workloads.synthetic.multimodal.generate_multimodal`. Every dataset
    has ``s1_channels`` and ``num_classes`` attributes. With ``normalize=True`` every band is
    standardised with the training split's mean/std (cached JSON under ``cache_dir``;
    ``"auto"``: ``root/.raytrain_hetero_cache``). ``exclude`` leaves out sample ids found bad
    up front (:func:`~raytrain_hetero.workloads.data.bad_files`).

    Raises:
        DataError: Missing/unreadable data (naming the files), or a split without a sample.
        ConfigError: Unknown split names.
    """
    split_tuple = check_splits("multimodal", splits, MULTIMODAL_SPLITS)
    root_path = data_root(root, "multimodal", "generate_multimodal", "point root at a So2Sat copy")
    if cache_dir == "auto":
        cache_dir = root_path / CACHE_DIR_NAME
    if (root_path / SO2SAT_FILES["train"]).is_file():
        return _so2sat_datasets(root_path, split_tuple, normalize, cache_dir)

    datasets = {s: MultimodalPatches(root_path, s, exclude=exclude) for s in split_tuple}
    for split, ds in datasets.items():
        if len(ds) == 0:
            raise DataError(f"multimodal data at {root_path}, split {split!r}: no readable sample")
    if normalize:  # statistics of the training split's pixels (S1 dB, S2 DN), cached
        train = datasets.get("train") or MultimodalPatches(root_path, "train", exclude=exclude)
        images = (train.read_pair(i) for i in train.ids)
        files = [p for i in train.ids for p in train.paths(i)]
        stats = files_band_stats("multimodal-train", files, images, cache_dir)
        for ds in datasets.values():
            ds.transforms = Standardize(stats)
    return datasets


# ------------------------------------------------------------------------------ adapter


def _open(source: DataSource, splits: tuple[str, ...], exclude: list[str]) -> WorkloadData:
    datasets = multimodal_datasets(source.root, splits=splits, exclude=exclude)
    first = next(iter(datasets.values()))
    channels = int(first[0]["image"].shape[0])
    return WorkloadData(
        datasets,
        int(first.num_classes),
        channels,
        s1_channels=int(first.s1_channels),
        class_names=tuple(getattr(first, "classes", ())),
    )


def _scan_files(source: DataSource) -> BadFileScan:
    root = resolve_version(source.root)  # the paths the opened datasets hold
    if (root / SO2SAT_FILES["train"]).is_file():  # So2Sat HDF5: no per-sample files to check
        return BadFileScan([], None)
    splits = [MultimodalPatches(root, split) for split in MULTIMODAL_SPLITS]
    first = splits[0]
    # A pair is checked through its SAR file's path; a bad SAR or optical file drops the pair.
    by_path = {ds.paths(i)[0]: i for ds in splits for i in ds.ids}

    def read(path: str) -> Any:
        return first.read_pair(by_path[path])

    return BadFileScan(sorted(by_path), read, by_path)


#: Sentinel-1 + Sentinel-2 pairs in the registry (every pair checked by default).
MULTIMODAL = register_dataset(
    DatasetAdapter(
        name="multimodal",
        title="multimodal (So2Sat-style) dataset",
        generate=partial(run_generator, generate_multimodal),
        open=_open,
        splits=MULTIMODAL_SPLITS,
        generate_keys=("samples_per_class", "seed", "size", "cloud_fraction"),
        scan_files=_scan_files,
    )
)
