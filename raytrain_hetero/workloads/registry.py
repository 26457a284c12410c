"""Dataset registry: a dataset name -> the adapter that knows how to generate, check and open it.

Everything that depends on *which* dataset is read lives in that dataset's module (one module
per dataset), which registers a :class:`DatasetAdapter` when imported. Callers describe what to
read with a :class:`DataSource` (a frozen, picklable library object; the YAML layer converts
its ``data:`` section into one) and never dispatch on the dataset name themselves::

    source = DataSource("eurosat", root, bands="rgb", generate=GenerateOptions())
    generate_dataset(source)
    workload = open_datasets(source, ("train", "val"))

The built-in datasets are imported on first look-up, so importing this module costs nothing
(no torch, no torchgeo). A third-party dataset registers its own adapter with
:func:`register_dataset`.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from raytrain_hetero.config.base import HeteroModel
from raytrain_hetero.config.fields import Float, Int, NonNegFloat, PositiveInt, invalid
from raytrain_hetero.errors import ConfigError, DataError
from raytrain_hetero.workloads.generated_tree import resolve_version

logger = logging.getLogger(__name__)

#: Name of the per-root cache directory (band statistics, bad-file lists).
CACHE_DIR_NAME = ".raytrain_hetero_cache"


class GenerateOptions(HeteroModel):
    """Parameters of the synthetic-data generator of ``data.dataset`` (real on-disk layout,
    cached).

    Which keys apply depends on the dataset (its registered adapter's ``generate_keys``;
    others are rejected): eurosat, uc_merced: samples_per_class, seed, size; multimodal:
    those and cloud_fraction; hyperspectral: seed, height, width, spectral_bands, classes,
    file_format.

    Attributes:
        samples_per_class: Images per class (>= 3: every class needs train/val/test).
        seed: Generator seed.
        size: Image side in pixels (``None``: the real size; EuroSAT 64, UC Merced 256).
        height: Hyperspectral scene rows (default 145). width: Its columns (default 145).
        spectral_bands: Hyperspectral bands (default 200, like Indian Pines).
        classes: Hyperspectral classes (default 16).
        file_format: Hyperspectral files: ``mat`` (Indian Pines style), ``tif`` (GeoTIFF) or
            ``l7irish`` (torchgeo's L7Irish layout: 5 scenes, 9 bands, classes <= 4).
        cloud_fraction: Multimodal: share of Sentinel-2 patches under cloud (default 0.4).
    """

    samples_per_class: Int = Field(default=100, ge=3)
    seed: Int = Field(default=0, ge=0)
    size: Int | None = Field(default=None, ge=16)
    height: Int | None = Field(default=None, ge=8)
    width: Int | None = Field(default=None, ge=8)
    spectral_bands: Int | None = Field(default=None, ge=4)
    classes: Int | None = Field(default=None, ge=2, le=255)
    file_format: Literal["mat", "tif", "l7irish"] | None = None
    cloud_fraction: Float | None = Field(default=None, ge=0, lt=1, allow_inf_nan=False)


class SceneOptions(HeteroModel):
    """Which scene files to read and how to cut them into patch samples.

    Attributes:
        image: Cube file (``.mat`` or GeoTIFF), relative to ``data.root`` or absolute;
            ``None`` finds it by the public naming (``*_corrected.mat`` beside ``*_gt.mat``).
        labels: Label-map file, likewise (``None``: the one ``*_gt`` file).
        image_key: ``.mat`` variable of the cube (``None``: the only 3-D one).
        label_key: ``.mat`` variable of the labels (``None``: the only 2-D one).
        patch_size: k of the k x k patches (odd).
        split: ``"block"`` (spatially disjoint blocks; honest, the default) or ``"random"``
            pixels (optimistic: neighbouring, overlapping patches land in train and test).
        block_size: Side of the split blocks in pixels.
        guard: Drop centres whose patch reaches into another split's block.
        fractions: Train/val/test fractions of the labelled pixels.
    """

    image: str | None = None
    labels: str | None = None
    image_key: str | None = None
    label_key: str | None = None
    patch_size: PositiveInt = 9
    split: Literal["block", "random"] = "block"
    block_size: PositiveInt = 16
    guard: bool = True
    fractions: tuple[NonNegFloat, ...] = (0.6, 0.2, 0.2)

    @field_validator("patch_size")
    @classmethod
    def _odd(cls, value: int) -> int:
        if value % 2 == 0:
            raise invalid(
                f"patch_size must be odd (a centre pixel), got {value}",
                f"use {value + 1} or {value - 1}",
            )
        return value

    @field_validator("fractions")
    @classmethod
    def _three_fractions(cls, value: tuple[float, ...]) -> tuple[float, ...]:
        if len(value) != 3 or abs(sum(value) - 1.0) > 1e-6 or value[0] <= 0 or value[1] <= 0:
            raise invalid(
                f"fractions must be three numbers (train, val, test) summing to 1 with train "
                f"and val > 0, got {value}",
                "write e.g. fractions: [0.6, 0.2, 0.2]",
            )
        return value


@dataclass(frozen=True)
class DataSource:
    """What to read: a registered dataset name, its root and the options that apply to it.

    Attributes:
        dataset: Registered dataset name (see :func:`dataset_names`).
        root: Dataset root directory (absolute paths travel safely to Ray workers).
        bands: EuroSAT only: ``"all"``, ``"rgb"`` or band names.
        image_size: UC Merced only: resize images to this side.
        on_bad_file: ``"error"``, ``"skip"``, ``"off"`` (no up-front check) or ``None``
            (the dataset's default).
        scene: Hyperspectral only: scene files and patch/split settings.
        generate: Generate a synthetic copy at ``root`` (cached) before reading, if set.
    """

    dataset: str
    root: Path
    bands: str | tuple[str, ...] = "all"
    image_size: int | None = None
    on_bad_file: str | None = None
    scene: SceneOptions | None = None
    generate: GenerateOptions | None = None

    @property
    def cache_dir(self) -> Path:
        """Where cached statistics and bad-file lists of this root go."""
        return Path(self.root) / CACHE_DIR_NAME


@dataclass
class WorkloadData:
    """Opened datasets of a source and what a model needs to know about them.

    Attributes:
        datasets: ``{split: dataset}``; items are ``{"image": (C, ...), "label": int64}``.
        num_classes: Number of classes.
        in_channels: Bands (channels) of one sample.
        s1_channels: Multimodal only: how many leading channels are SAR.
        class_names: Class names, label order.
        scene: Hyperspectral only: the loaded scene (for class maps).
    """

    datasets: dict[str, Any]
    num_classes: int
    in_channels: int
    s1_channels: int | None = None
    class_names: tuple[str, ...] = ()
    scene: Any = None


@dataclass(frozen=True)
class BadFileScan:
    """Every file of a dataset, a reader that fully decodes one, and (for datasets whose
    samples are not files) a file -> sample id map.

    Attributes:
        files: Paths to check, sorted.
        read: Decodes one path completely (raises on a corrupt file).
        sample_ids: ``None`` when samples are the files themselves; otherwise path -> id.
    """

    files: list[str]
    read: Callable[[str], Any] | None
    sample_ids: dict[str, str] | None = None

    @classmethod
    def of_image_folders(cls, datasets: Iterable[Any]) -> BadFileScan:
        """Scan of torchvision-``ImageFolder``-style datasets (one file per sample).

        Args:
            datasets: The opened splits; each has ``samples`` (``(path, label)`` pairs) and a
                ``loader`` that decodes one path (they share it, so the first one's is used).
        """
        datasets = list(datasets)
        files = sorted({path for ds in datasets for path, _ in ds.samples})
        return cls(files, datasets[0].loader)


@dataclass(frozen=True)
class DatasetAdapter:
    """How one dataset is generated, checked and opened.

    Attributes:
        name: Registry name (``data.dataset`` in a job config).
        title: Human name for messages (e.g. ``"EuroSAT"``).
        generate: Writes the synthetic copy described by ``source.generate``; returns the root.
        open: ``open(source, splits, exclude) -> WorkloadData``; ``exclude`` lists files
            (or sample ids) to leave out.
        splits: The dataset's labelled splits.
        whole_scene: ``open`` also accepts the split ``"scene"`` (every pixel of a scene,
            unlabelled ones included; predictions then make a class map).
        generate_keys: Fields of :class:`GenerateOptions` its generator takes.
        default_on_bad_file: Bad-file policy when the source sets none (``None``: no
            up-front check).
        scan_files: Lists the files to check and how to read them; ``None`` when no
            per-file check applies (a single scene file is checked when it is read).
        expected_bands: Bands per sample the source's options ask for, if they fix it.
        source_keys: The dataset-specific fields of :class:`DataSource` it reads
            (``bands``, ``image_size``, ``scene``); a job setting another one is refused.
    """

    name: str
    title: str
    generate: Callable[[DataSource], Path]
    open: Callable[[DataSource, tuple[str, ...], list[str]], WorkloadData]
    splits: tuple[str, ...] = ("train", "val", "test")
    whole_scene: bool = False
    generate_keys: tuple[str, ...] = ("samples_per_class", "seed", "size")
    default_on_bad_file: str | None = "error"
    scan_files: Callable[[DataSource], BadFileScan] | None = None
    expected_bands: Callable[[DataSource], int | None] = field(default=lambda source: None)
    source_keys: tuple[str, ...] = ()


def check_splits(title: str, splits: str | Sequence[str], valid: Sequence[str]) -> tuple[str, ...]:
    """``splits`` (one name or several) as a tuple, checked against a dataset's ``valid`` ones.

    Raises:
        ConfigError: ``splits`` is empty or names a split ``title`` does not have.
    """
    wanted = (splits,) if isinstance(splits, str) else tuple(splits)
    if not wanted or any(s not in valid for s in wanted):
        raise ConfigError(
            f"{title} splits must be a non-empty subset of {list(valid)}, got {list(wanted)}"
        )
    return wanted


def missing_data(title: str, generator: str, root: Path, detail: str, real: str) -> DataError:
    """The error for ``title`` data missing at ``root``: ``detail``, then both fixes (generate a
    synthetic copy with ``generator``, or put the real dataset there as ``real`` says)."""
    return DataError(
        f"{title} data not found at {root}: {detail}. Fix: generate a synthetic copy (set "
        f"data.generate, or call raytrain_hetero.workloads.{generator}({str(root)!r})), or {real}."
    )


def data_root(root: str | os.PathLike[str], title: str, generator: str, real: str) -> Path:
    """``root`` as the directory it stands for now (one version of a generated root, pinned for
    the open dataset: :func:`~raytrain_hetero.workloads.generated_tree.resolve_version`).

    Raises:
        DataError: There is no directory (:func:`missing_data`).
    """
    path = resolve_version(root)
    if not path.is_dir():
        raise missing_data(title, generator, path, "the directory does not exist", real)
    return path


_REGISTRY: dict[str, DatasetAdapter] = {}

# Built-in datasets: imported (and so registered) on first look-up.
_BUILTIN_MODULES: dict[str, str] = {
    "eurosat": "raytrain_hetero.workloads.eurosat",
    "uc_merced": "raytrain_hetero.workloads.uc_merced",
    "hyperspectral": "raytrain_hetero.workloads.hyperspectral",
    "multimodal": "raytrain_hetero.workloads.multimodal",
}


_REGISTERED_BY: dict[str, str] = {}


def register_dataset(adapter: DatasetAdapter) -> DatasetAdapter:
    """Add ``adapter`` under ``adapter.name`` (replacing an earlier one of that name).

    The calling module is remembered (:func:`registering_module`): a job config naming the
    dataset carries it to the Ray workers, which import it and so register the same adapter.
    Register at module level of an importable module for that to work.
    """
    if adapter.name in _REGISTRY and _REGISTRY[adapter.name] is not adapter:
        logger.info("dataset %r re-registered", adapter.name)
    _REGISTRY[adapter.name] = adapter
    _REGISTERED_BY[adapter.name] = sys._getframe(1).f_globals.get("__name__", "__main__")
    return adapter


def registering_module(name: str) -> str | None:
    """The module that registered dataset ``name``, ``None`` for a built-in or unknown name."""
    if name in _BUILTIN_MODULES:
        return None
    return _REGISTERED_BY.get(name)


def dataset_names() -> tuple[str, ...]:
    """Every registered dataset name, built-ins included, sorted."""
    return tuple(sorted(set(_REGISTRY) | set(_BUILTIN_MODULES)))


def dataset_adapter(name: str) -> DatasetAdapter:
    """The adapter registered under ``name``.

    Raises:
        ConfigError: No dataset of that name (the message lists the registered names).
    """
    if name not in _REGISTRY and name in _BUILTIN_MODULES:
        importlib.import_module(_BUILTIN_MODULES[name])
    adapter = _REGISTRY.get(name)
    if adapter is None:
        raise ConfigError(
            f"unknown dataset {name!r}; registered datasets: {', '.join(dataset_names())}. "
            "Fix: use one of them (data.dataset), or register an adapter with "
            "raytrain_hetero.workloads.registry.register_dataset."
        )
    return adapter


def run_generator(generator: Callable[..., Path], source: DataSource, **renamed: str) -> Path:
    """``generator(source.root, **options)``: the options are the fields of ``source.generate``
    its dataset's adapter lists in ``generate_keys`` that are set (``None`` leaves the
    generator's default); ``renamed`` maps an option to the generator's argument name."""
    options = source.generate or GenerateOptions()
    values = {key: getattr(options, key) for key in dataset_adapter(source.dataset).generate_keys}
    kwargs = {renamed.get(k, k): v for k, v in values.items() if v is not None}
    return generator(source.root, **kwargs)


# ------------------------------------------------------------------------------ models

#: Names :func:`~raytrain_hetero.workloads.models.build_model` builds itself.
BUILTIN_MODELS: tuple[str, ...] = (
    "small_cnn",
    "resnet18",
    "resnet50",
    "cnn3d",
    "fusion_cnn",
    "marques_cnn",
)
_MODELS: dict[str, Callable[..., Any]] = {}
_MODELS_REGISTERED_BY: dict[str, str] = {}


def register_model(name: str, builder: Callable[..., Any]) -> Callable[..., Any]:
    """Make ``build_model(name, ...)`` (and ``model.name`` in a job config) build
    ``builder(in_channels=..., num_classes=..., width=...)``, a ``torch.nn.Module``.

    Like :func:`register_dataset`, the calling module is remembered so that a job config
    naming the model carries it to the Ray workers (``model.modules``).

    Raises:
        ConfigError: ``name`` is a built-in model's.
    """
    if name in BUILTIN_MODELS:
        raise ConfigError(f"model name {name!r} is built in; register yours under another name")
    _MODELS[name] = builder
    _MODELS_REGISTERED_BY[name] = sys._getframe(1).f_globals.get("__name__", "__main__")
    return builder


def model_names() -> tuple[str, ...]:
    """Every model name ``build_model`` accepts: the built-ins, then registered ones (sorted)."""
    return BUILTIN_MODELS + tuple(sorted(_MODELS))


def model_builder(name: str) -> Callable[..., Any] | None:
    """The builder registered under ``name`` (``None`` for a built-in or unknown name)."""
    return _MODELS.get(name)


def model_registering_module(name: str) -> str | None:
    """The module that registered model ``name``, ``None`` for a built-in or unknown name."""
    return _MODELS_REGISTERED_BY.get(name)
