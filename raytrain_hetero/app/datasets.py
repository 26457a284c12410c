"""The job's data section -> generated data, datasets, bad-file checks and model arguments.

One place maps :class:`~raytrain_hetero.app.config.DataConfig` (``data.dataset`` = ``eurosat``,
``uc_merced``, ``hyperspectral`` or ``multimodal``) onto this package's generators and
loaders, so the training job (:mod:`raytrain_hetero.app.job`), the predictor
(:mod:`raytrain_hetero.inference.predict`) and the loader benchmark read data the same way.

Bad files are found once, on the driver, by :func:`configured_bad_files`; the result is cached
as JSON keyed by the identities (path, size, mtime) of every file, so the Ray workers that
call it again read the list instead of decoding the dataset a second time.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raytrain_hetero.app.config import DataConfig, ModelConfig
from raytrain_hetero.errors import DataError

__all__ = [
    "WorkloadData",
    "configured_bad_files",
    "generate_configured_dataset",
    "model_arguments",
    "open_configured_datasets",
    "scene_files",
]

logger = logging.getLogger(__name__)

_UC_MERCED_SIZE = 256
_MULTIMODAL_SIZE = 32
_EUROSAT_SIZE = 64


@dataclass
class WorkloadData:
    """Datasets of a configured workload and what a model needs to know about them.

    Attributes:
        datasets: ``{split: dataset}``; items are ``{"image": (C, ...), "label": int64}``.
        num_classes: Number of classes.
        in_channels: Bands (channels) of one sample.
        s1_channels: Multimodal only: how many leading channels are SAR.
        class_names: Class names, label order.
        scene: Hyperspectral only: the loaded scene (for class maps).
        excluded_files: Files left out as unreadable (``on_bad_file: skip``).
    """

    datasets: dict[str, Any]
    num_classes: int
    in_channels: int
    s1_channels: int | None = None
    class_names: tuple[str, ...] = ()
    scene: Any = None
    excluded_files: list[str] = field(default_factory=list)


def _cache_dir(data: DataConfig) -> Path:
    return Path(data.root) / ".raytrain_hetero_cache"


def scene_files(data: DataConfig) -> tuple[Path, Path]:
    """The hyperspectral (image, labels) files a config names (or the ones found in root)."""
    from raytrain_hetero.workloads.hyperspectral import find_scene_files

    root = Path(data.root)
    hs = data.hyperspectral
    if hs is not None and hs.image is not None and hs.labels is not None:
        return root / hs.image, root / hs.labels
    if not root.is_dir():
        raise DataError(f"hyperspectral scene directory {root} does not exist. Fix: set data.root, "
                        "or data.generate to create a synthetic scene")
    image, labels = find_scene_files(root)
    if hs is not None and hs.image is not None:
        image = root / hs.image
    if hs is not None and hs.labels is not None:
        labels = root / hs.labels
    return image, labels


def generate_configured_dataset(data: DataConfig) -> Path | None:
    """Run the dataset's generator if ``data.generate`` is set (cached); return the root."""
    gen = data.generate
    if gen is None:
        return None
    root = Path(data.root)
    if data.dataset == "eurosat":
        from raytrain_hetero.workloads.eurosat import generate_eurosat

        return generate_eurosat(root, samples_per_class=gen.samples_per_class, seed=gen.seed,
                                size=gen.size or _EUROSAT_SIZE)
    if data.dataset == "uc_merced":
        from raytrain_hetero.workloads.uc_merced import generate_uc_merced

        return generate_uc_merced(root, samples_per_class=gen.samples_per_class, seed=gen.seed,
                                  size=gen.size or _UC_MERCED_SIZE)
    if data.dataset == "multimodal":
        from raytrain_hetero.workloads.multimodal import generate_multimodal

        kwargs: dict[str, Any] = {}
        if gen.cloud_fraction is not None:
            kwargs["cloud_fraction"] = gen.cloud_fraction
        return generate_multimodal(root, samples_per_class=gen.samples_per_class, seed=gen.seed,
                                   size=gen.size or _MULTIMODAL_SIZE, **kwargs)
    from raytrain_hetero.workloads.hyperspectral import generate_hyperspectral_scene

    kwargs = {
        key: value for key, value in (
            ("height", gen.height), ("width", gen.width), ("bands", gen.spectral_bands),
            ("classes", gen.classes), ("file_format", gen.file_format),
        ) if value is not None
    }
    return generate_hyperspectral_scene(root, seed=gen.seed, **kwargs)


def _policy(data: DataConfig) -> str | None:
    if data.on_bad_file is not None:
        return data.on_bad_file
    return None if data.dataset in ("eurosat", "hyperspectral") else "error"


def _files_and_reader(data: DataConfig) -> tuple[list[str], Any, Any]:
    """Every file of every split, a reader that fully decodes one, and a path -> id map."""
    root = Path(data.root)
    if data.dataset in ("eurosat", "uc_merced"):
        if data.dataset == "eurosat":
            from raytrain_hetero.workloads.eurosat import eurosat_datasets

            opened = eurosat_datasets(root, splits=("train", "val", "test"), normalize=False)
        else:
            from raytrain_hetero.workloads.uc_merced import _open_split

            opened = {s: _open_split(root.absolute(), s, None) for s in ("train", "val", "test")}
        files = sorted({p for ds in opened.values() for p, _ in ds.samples})
        loader = next(iter(opened.values())).loader
        return files, loader, None
    from raytrain_hetero.workloads.multimodal import MultimodalPatches

    if (root / "training.h5").is_file():  # So2Sat HDF5: no per-sample files to check
        return [], None, None
    splits = [MultimodalPatches(root, s) for s in ("train", "val", "test")]
    first = splits[0]
    by_path = {ds.paths(i)[0]: i for ds in splits for i in ds.ids}
    files = sorted(by_path)

    def read(path: str) -> Any:
        return first.read_pair(by_path[path])

    return files, read, by_path


def configured_bad_files(data: DataConfig) -> list[str]:
    """Find unreadable files per ``data.on_bad_file`` (cached); return what to leave out.

    For multimodal data the returned entries are sample ids (a bad SAR or optical file drops
    the pair). Returns ``[]`` when no check applies (eurosat without ``on_bad_file``,
    hyperspectral: its scene files are checked when they are read).

    Raises:
        DataError: ``on_bad_file`` is ``"error"`` (the default for uc_merced and multimodal)
            and some file is unreadable; the message lists them.
    """
    from raytrain_hetero.workloads.file_checks import apply_bad_file_policy, find_unreadable_files
    from raytrain_hetero.workloads.normalization import cached_json, file_identity

    policy = _policy(data)
    if policy is None:
        return []
    files, read, by_path = _files_and_reader(data)
    if not files:
        return []
    key = {"kind": f"bad-files-{data.dataset}", "files": [file_identity(f) for f in files]}

    def compute() -> list[list[str]]:
        return [list(item) for item in find_unreadable_files(files, read)]

    bad = [tuple(item) for item in cached_json(key, compute, _cache_dir(data), prefix="bad_files")]
    skipped = apply_bad_file_policy(bad, policy, dataset_name=f"{data.dataset} at {data.root}")
    return [by_path[p] for p in skipped] if by_path is not None else skipped


def open_configured_datasets(
    data: DataConfig,
    splits: Sequence[str] = ("train", "val"),
    *,
    exclude: Sequence[str] | None = None,
) -> WorkloadData:
    """Open the configured dataset's splits (after generation), with its normalisation.

    Args:
        data: The data section.
        splits: Splits to open; hyperspectral also accepts ``"scene"`` (every pixel).
        exclude: Files (multimodal: sample ids) to leave out; ``None`` asks
            :func:`configured_bad_files` (cached).
    """
    root = Path(data.root)
    if exclude is None:
        exclude = configured_bad_files(data)
    excluded = list(exclude)
    if data.dataset == "eurosat":
        from raytrain_hetero.workloads.eurosat import EUROSAT_CLASSES, eurosat_datasets
        from raytrain_hetero.workloads.file_checks import drop_samples

        datasets = eurosat_datasets(root, bands=data.bands, splits=tuple(splits))
        for ds in datasets.values():
            drop_samples(ds, excluded)
        channels = int(next(iter(datasets.values()))[0]["image"].shape[0])
        return WorkloadData(datasets, len(EUROSAT_CLASSES), channels,
                            class_names=EUROSAT_CLASSES, excluded_files=excluded)
    if data.dataset == "uc_merced":
        from raytrain_hetero.workloads.uc_merced import UCMERCED_CLASSES, uc_merced_datasets

        datasets = uc_merced_datasets(root, splits=tuple(splits), image_size=data.image_size,
                                      exclude_files=excluded)
        return WorkloadData(datasets, len(UCMERCED_CLASSES), 3, class_names=UCMERCED_CLASSES,
                            excluded_files=excluded)
    if data.dataset == "multimodal":
        from raytrain_hetero.workloads.multimodal import multimodal_datasets

        datasets = multimodal_datasets(root, splits=tuple(splits), exclude=excluded)
        first = next(iter(datasets.values()))
        channels = int(first[0]["image"].shape[0])
        names = tuple(getattr(first, "classes", ()))
        return WorkloadData(datasets, int(first.num_classes), channels,
                            s1_channels=int(first.s1_channels), class_names=names,
                            excluded_files=excluded)
    from raytrain_hetero.app.config import HyperspectralConfig
    from raytrain_hetero.workloads.hyperspectral import hyperspectral_datasets

    hs = data.hyperspectral or HyperspectralConfig()
    image, labels = scene_files(data)
    out = hyperspectral_datasets(
        image, labels, splits=tuple(splits), patch_size=hs.patch_size, method=hs.split,
        fractions=hs.fractions, block_size=hs.block_size, guard=hs.guard,
        image_key=hs.image_key, label_key=hs.label_key, cache_dir=_cache_dir(data),
        include_scene=True,
    )
    scene = out.pop("_scene")
    names = tuple(f"class_{k}" for k in range(1, scene.num_classes + 1))
    return WorkloadData(out, scene.num_classes, scene.num_bands, class_names=names, scene=scene)


def model_arguments(model: ModelConfig, data: WorkloadData) -> dict[str, Any]:
    """Keyword arguments of :func:`~raytrain_hetero.workloads.models.build_model`."""
    kwargs: dict[str, Any] = {
        "in_channels": data.in_channels,
        "num_classes": data.num_classes,
        "width": model.width,
        "pretrained": model.pretrained,
    }
    if model.name == "fusion_cnn":
        kwargs["s1_channels"] = data.s1_channels
        kwargs["modalities"] = tuple(model.modalities or ("s1", "s2"))
    return kwargs


def check_model_fits_data(model_cfg: ModelConfig, data: WorkloadData, source: str | os.PathLike[str]) -> Any:
    """Build the configured model once and check its input bands against the data.

    Run on the driver before training, so a band-count mismatch (``model.in_channels``,
    pretrained weights made for other bands) or unavailable pretrained weights stop the job
    before any worker starts. Returns the built model.

    Raises:
        DataError: Band-count mismatch (naming the data source, both counts and the fix).
        ConfigError: The model cannot be built (e.g. pretrained weights not cached).
    """
    from raytrain_hetero.workloads.models import build_model, check_input_channels

    if model_cfg.in_channels is not None and model_cfg.in_channels != data.in_channels:
        raise DataError(
            f"band-count mismatch: {source} has {data.in_channels} band(s) per sample but "
            f"model.in_channels is {model_cfg.in_channels}. Fix: set model.in_channels: "
            f"{data.in_channels} (or remove it to take the data's), or select other bands."
        )
    model = build_model(model_cfg.name, **model_arguments(model_cfg, data))
    check_input_channels(model, data.in_channels, source=str(source))
    return model
