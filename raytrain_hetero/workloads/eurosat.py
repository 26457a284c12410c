"""EuroSAT (Sentinel-2, 13 bands, 10 classes) read by torchgeo's own ``EuroSAT`` class.

:func:`eurosat_datasets` builds torchgeo's ``EuroSAT`` datasets over any root in torchgeo's
layout (:mod:`~raytrain_hetero.workloads.formats`) -- one written by
:func:`~raytrain_hetero.workloads.synthetic.eurosat.generate_eurosat` or the real downloaded
dataset, through the same code path -- with a fixed per-band standardisation
(:func:`eurosat_band_stats` through the package's one normaliser,
:class:`~raytrain_hetero.workloads.normalization.Standardize`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import partial
from typing import Any

from raytrain_hetero.errors import ConfigError, DataError
from raytrain_hetero.workloads.file_checks import CheckedLoader, drop_samples
from raytrain_hetero.workloads.formats import (
    EUROSAT_BANDS,
    EUROSAT_CLASSES,
    EUROSAT_IMAGE_DIR,
    EUROSAT_RGB_BANDS,
    EUROSAT_SPLIT_FILE,
    SPLITS,
)
from raytrain_hetero.workloads.generated_tree import MARKER_NAME
from raytrain_hetero.workloads.normalization import BandStats, Standardize
from raytrain_hetero.workloads.registry import (
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
from raytrain_hetero.workloads.synthetic.eurosat import generate_eurosat

__all__ = [
    "EUROSAT_BANDS",
    "EUROSAT_CLASSES",
    "EUROSAT_MEAN",
    "EUROSAT_RGB_BANDS",
    "EUROSAT_SPLITS",
    "EUROSAT_STD",
    "MARKER_NAME",
    "eurosat_band_stats",
    "eurosat_datasets",
    "resolve_eurosat_bands",
]

EUROSAT_SPLITS: tuple[str, ...] = SPLITS

#: Per-band mean / std of the real EuroSAT (raw DN = reflectance * 10000), copied from
#: ``torchgeo.datamodules.eurosat.MEAN`` / ``STD`` (torchgeo 0.8.1) so that importing this
#: module does not pull in Lightning. :func:`eurosat_band_stats` hands them to ``Standardize``.
EUROSAT_MEAN: dict[str, float] = {
    "B01": 1354.40546513, "B02": 1118.24399958, "B03": 1042.92983953,
    "B04": 947.62620298, "B05": 1199.47283961, "B06": 1999.79090914,
    "B07": 2369.22292565, "B08": 2296.82608323, "B09": 732.08340178,
    "B10": 12.11327804, "B11": 1819.01027855, "B12": 1118.92391149,
    "B8A": 2594.14080798,
}  # fmt: skip
EUROSAT_STD: dict[str, float] = {
    "B01": 245.71762908, "B02": 333.00778264, "B03": 395.09249139,
    "B04": 593.75055589, "B05": 566.4170017, "B06": 861.18399006,
    "B07": 1086.63139075, "B08": 1117.98170791, "B09": 404.91978886,
    "B10": 4.77584468, "B11": 1002.58768311, "B12": 761.30323499,
    "B8A": 1231.58581042,
}  # fmt: skip

# ------------------------------------------------------------------------------ loaders


def resolve_eurosat_bands(bands: str | Sequence[str]) -> tuple[str, ...]:
    """``"all"`` -> the 13 bands, ``"rgb"`` -> (B04, B03, B02), or a sequence of band names
    (validated against :data:`EUROSAT_BANDS`). The result's length is the channel count."""
    presets = {"all": EUROSAT_BANDS, "rgb": EUROSAT_RGB_BANDS}
    resolved = presets.get(bands, ()) if isinstance(bands, str) else tuple(bands)
    bad = [b for b in resolved if b not in EUROSAT_BANDS]
    if not resolved or bad:
        raise ConfigError(
            f"EuroSAT bands must be 'all', 'rgb' or a list of band names from "
            f"{list(EUROSAT_BANDS)}; got {bands!r}" + (f" (unknown: {bad})" if bad else "")
        )
    return resolved


def eurosat_band_stats(bands: Sequence[str]) -> BandStats:
    """The fixed EuroSAT statistics of ``bands``, for :class:`Standardize`.

    ``image <- (image - EUROSAT_MEAN[band]) / EUROSAT_STD[band]`` on raw DN (reflectance *
    10000); the constants are the real EuroSAT statistics torchgeo's ``EuroSATDataModule``
    uses, so real and synthetic data are scaled the same way (values roughly in [-3, 3]).
    """
    return BandStats(
        mean=tuple(EUROSAT_MEAN[b] for b in bands),
        std=tuple(EUROSAT_STD[b] for b in bands),
        count=0,  # published constants, not counted from this data
    )


_REAL = (
    "download the real dataset there (torchgeo.datasets.EuroSAT(root, download=True) on a "
    "machine with internet)"
)


def eurosat_datasets(
    root: str | os.PathLike[str],
    *,
    bands: str | Sequence[str] = "all",
    splits: Sequence[str] = ("train", "val"),
    normalize: bool = True,
) -> dict[str, Any]:
    """torchgeo ``EuroSAT`` datasets over ``root`` (generated or real), one per split.

    Returns ``{split: torchgeo.datasets.EuroSAT(root, split, bands, download=False, ...)}``.
    Items are torchgeo's dicts ``{"image": float32 (C, H, W), "label": int64 scalar}`` and
    pass through ``torch.utils.data.default_collate`` unchanged. With ``normalize=True`` (the
    default) images are standardised by :func:`eurosat_band_stats`; with False they are raw
    DN (reflectance * 10000). ``bands``: see :func:`resolve_eurosat_bands`; ``C`` is its
    length. The same call works for the real dataset (``EuroSATallBands.zip`` extracted, or
    the zip itself, which torchgeo extracts on first use).

    Raises:
        DataError: ``root`` or its split files / image directory are missing (the message
            names the path and how to fix it).
        ConfigError: unknown split or band names.
    """
    from torchgeo.datasets import EuroSAT
    from torchgeo.datasets.errors import DatasetNotFoundError

    band_tuple = resolve_eurosat_bands(bands)
    split_tuple = check_splits("EuroSAT", splits, EUROSAT_SPLITS)
    root_path = data_root(root, "EuroSAT", "generate_eurosat", _REAL)
    transforms = Standardize(eurosat_band_stats(band_tuple)) if normalize else None
    out: dict[str, Any] = {}
    for split in split_tuple:
        try:
            out[split] = EuroSAT(
                str(root_path),
                split=split,
                bands=band_tuple,
                transforms=transforms,
                download=False,
            )
        except DatasetNotFoundError:
            detail = f"no {EUROSAT_SPLIT_FILE.format(split=split)} or no {EUROSAT_IMAGE_DIR}/"
            raise missing_data(
                "EuroSAT",
                "generate_eurosat",
                root_path,
                f"{detail} (nor EuroSATallBands.zip)",
                _REAL,
            ) from None
        except FileNotFoundError as exc:  # ImageFolder: a class with no image in this split
            raise DataError(f"EuroSAT at {root_path}, split {split!r}: {exc}") from None
        # A corrupt or truncated TIFF, or one without all 13 bands (torchgeo would index
        # bands out of range or misread them), raises a DataError naming the file.
        out[split].loader = CheckedLoader(
            out[split].loader, "EuroSAT image", bands=len(EUROSAT_BANDS)
        )
    return out


# ------------------------------------------------------------------------------ adapter


def _open(source: DataSource, splits: tuple[str, ...], exclude: list[str]) -> WorkloadData:
    datasets = eurosat_datasets(source.root, bands=source.bands, splits=splits)
    for dataset in datasets.values():
        drop_samples(dataset, exclude)
    channels = int(next(iter(datasets.values()))[0]["image"].shape[0])
    return WorkloadData(
        datasets,
        len(EUROSAT_CLASSES),
        channels,
        class_names=EUROSAT_CLASSES,
    )


def _scan_files(source: DataSource) -> BadFileScan:
    opened = eurosat_datasets(source.root, splits=EUROSAT_SPLITS, normalize=False)
    return BadFileScan.of_image_folders(opened.values())


#: EuroSAT in the registry. Every file is decoded and its band count checked up front by
#: default (``on_bad_file: error``; measured cost in docs/reliability/security.md);
#: ``on_bad_file: off`` skips that (a bad file then fails when a worker reads it).
EUROSAT = register_dataset(
    DatasetAdapter(
        name="eurosat",
        title="EuroSAT",
        generate=partial(run_generator, generate_eurosat),
        open=_open,
        splits=EUROSAT_SPLITS,
        default_on_bad_file="error",
        scan_files=_scan_files,
        expected_bands=lambda source: len(resolve_eurosat_bands(source.bands)),
        source_keys=("bands",),
    )
)
