"""UC Merced Land Use (aerial RGB, 21 classes) read by torchgeo's own ``UCMerced`` class.

:func:`uc_merced_datasets` builds torchgeo's ``UCMerced`` datasets over any root in torchgeo's
layout (:mod:`~raytrain_hetero.workloads.formats`) -- one written by
:func:`~raytrain_hetero.workloads.synthetic.uc_merced.generate_uc_merced` or the real dataset,
through the same code path -- with per-band standardisation statistics computed from the
training split (and cached), an optional extra resize (``image_size``), and the bad-file
policy of :mod:`~raytrain_hetero.workloads.file_checks`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from raytrain_hetero.errors import ConfigError, DataError
from raytrain_hetero.workloads.file_checks import CheckedLoader, drop_samples
from raytrain_hetero.workloads.formats import (
    SPLITS,
    UCMERCED_CLASSES,
    UCMERCED_IMAGE_DIR,
    UCMERCED_SPLIT_FILE,
)
from raytrain_hetero.workloads.generated_tree import resolve_version
from raytrain_hetero.workloads.normalization import Standardize, files_band_stats
from raytrain_hetero.workloads.registry import (
    CACHE_DIR_NAME,
    BadFileScan,
    DatasetAdapter,
    DataSource,
    WorkloadData,
    check_splits,
    data_root,
    missing_data,
    register_dataset,
    run_generator,
)
from raytrain_hetero.workloads.synthetic.uc_merced import generate_uc_merced

__all__ = [
    "UCMERCED_CLASSES",
    "UCMERCED_SPLITS",
    "uc_merced_datasets",
]

logger = logging.getLogger(__name__)

UCMERCED_SPLITS: tuple[str, ...] = SPLITS
# ------------------------------------------------------------------------------ loaders


_REAL = (
    "put the real dataset there (UCMerced_LandUse.zip or its extracted UCMerced_LandUse/Images/ "
    "plus torchgeo's uc_merced-{train,val,test}.txt split files: "
    "torchgeo.datasets.UCMerced(root, download=True) on a machine with internet)"
)


def _missing(root: Path, detail: str) -> DataError:
    return missing_data("UC Merced", "generate_uc_merced", root, detail, _REAL)


def _open_split(root: Path, split: str, transforms: Any) -> Any:
    from torchgeo.datasets import UCMerced
    from torchgeo.datasets.errors import DatasetNotFoundError

    split_file = root / UCMERCED_SPLIT_FILE.format(split=split)
    if (root / UCMERCED_IMAGE_DIR).is_dir() and not split_file.is_file():
        raise _missing(root, f"the split file {split_file.name} is missing")
    try:
        dataset = UCMerced(str(root), split=split, transforms=transforms, download=False)
    except DatasetNotFoundError:
        raise _missing(root, f"no {UCMERCED_IMAGE_DIR}/ (nor UCMerced_LandUse.zip)") from None
    except FileNotFoundError as exc:  # ImageFolder: a class folder with no image in the split
        raise DataError(f"UC Merced at {root}, split {split!r}: {exc}") from None
    dataset.loader = CheckedLoader(dataset.loader, "UC Merced image")
    return dataset


def uc_merced_datasets(
    root: str | os.PathLike[str],
    *,
    splits: Sequence[str] = ("train", "val"),
    normalize: bool = True,
    image_size: int | None = None,
    exclude_files: Sequence[str] = (),
    cache_dir: str | os.PathLike[str] | None = "auto",
) -> dict[str, Any]:
    """torchgeo ``UCMerced`` datasets over ``root`` (generated or real), one per split.

    Items are torchgeo's ``{"image": float32 (3, S, S), "label": int64}`` with S = 256
    (torchgeo resizes every image) or ``image_size`` if given (a further antialiased resize,
    for cheaper training). With ``normalize=True`` images are standardised per band with the
    mean/std of the *training* split's pixels (computed once, cached as JSON under
    ``cache_dir``; ``"auto"`` = ``root/.raytrain_hetero_cache``, ``None`` = no cache).

    Bad files: every read goes through :class:`~raytrain_hetero.workloads.file_checks.
    CheckedLoader`, so a corrupt TIFF raises a DataError naming it. ``exclude_files`` leaves
    out files found bad up front (:func:`~raytrain_hetero.workloads.data.bad_files`).

    Raises:
        DataError: Missing root / split files / images, or no readable image in a split.
        ConfigError: Unknown split names or an invalid ``image_size``.
    """
    split_tuple = check_splits("UC Merced", splits, UCMERCED_SPLITS)
    if image_size is not None and (isinstance(image_size, bool) or image_size < 8):
        raise ConfigError(
            f"UC Merced image_size must be an integer >= 8 or None, got {image_size!r}"
        )
    root_path = data_root(root, "UC Merced", "generate_uc_merced", _REAL)
    datasets = {split: _open_split(root_path, split, None) for split in split_tuple}
    for split, ds in datasets.items():
        removed = drop_samples(ds, exclude_files)
        if removed:
            logger.warning("UC Merced %s: left out %d unreadable file(s)", split, removed)
        if len(ds) == 0:
            raise DataError(f"UC Merced at {root_path}, split {split!r}: no readable image left")

    stats = None
    if normalize:  # statistics of the training split's pixels (0..255 scale), cached
        train = datasets["train"] if "train" in datasets else _open_split(root_path, "train", None)
        drop_samples(train, exclude_files)
        if cache_dir == "auto":
            cache_dir = root_path / CACHE_DIR_NAME
        images = (train[i]["image"] for i in range(len(train)))
        files = [p for p, _ in train.samples]
        stats = files_band_stats("uc_merced-train", files, images, cache_dir)
    if stats is not None or image_size is not None:
        for ds in datasets.values():
            ds.transforms = Standardize(stats, resize_to=image_size)
    return datasets


# ------------------------------------------------------------------------------ adapter


def _open(source: DataSource, splits: tuple[str, ...], exclude: list[str]) -> WorkloadData:
    datasets = uc_merced_datasets(
        source.root, splits=splits, image_size=source.image_size, exclude_files=exclude
    )
    return WorkloadData(
        datasets,
        len(UCMERCED_CLASSES),
        3,
        class_names=UCMERCED_CLASSES,
    )


def _scan_files(source: DataSource) -> BadFileScan:
    root = resolve_version(source.root)  # the paths the opened datasets hold
    return BadFileScan.of_image_folders(_open_split(root, split, None) for split in UCMERCED_SPLITS)


#: UC Merced in the registry (aerial RGB, every file checked before training by default).
UC_MERCED = register_dataset(
    DatasetAdapter(
        name="uc_merced",
        title="UC Merced",
        generate=partial(run_generator, generate_uc_merced),
        open=_open,
        splits=UCMERCED_SPLITS,
        scan_files=_scan_files,
        source_keys=("image_size",),
    )
)
