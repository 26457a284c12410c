"""Job configuration: frozen pydantic v2 models, YAML loading and friendly errors.

A job is described by one YAML file (see ``examples/configs/eurosat_local.yaml``) that
validates into a :class:`JobConfig`. Every model is frozen and rejects unknown keys, so a
typo never silently falls back to a default.

:func:`load_config` turns *every* validation problem into one
:class:`~raytrain_hetero.errors.ConfigError` whose message lists each problem on its own
line as::

    <file>: <key.path>: <what is wrong>. Fix: <how to fix it>

e.g. ``job.yaml: train.learning_rate: unknown key 'learning_rate' under 'train'; valid
keys: epochs, global_batch_size, lr, ... Fix: rename it to 'lr'.`` List items appear as
``workers[1].device``. The raised error also carries the problems as
``err.problems`` (a tuple of :class:`ConfigProblem`).

Command-line overrides (``--set train.epochs=1``) go through :func:`parse_override` /
:func:`parse_overrides` and are merged over the YAML before validation.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import reprlib
import tempfile
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from raytrain_hetero.config import (
    _BOOL_AS_NUMBER,
    _INVALID,
    _MULTI,
    Float,
    Int,
    NonNegFloat,
    PositiveFloat,
    PositiveInt,
    ProbeConfig,
    SlowdownInjection,
    WorkerSpec,
    _absolute,
    _check_name,
    _invalid,
    _Model,
)
from raytrain_hetero.errors import ConfigError, DataError

__all__ = [
    "ConfigProblem",
    "DATASET_KINDS",
    "DataConfig",
    "EUROSAT_BAND_NAMES",
    "GENERATE_KEYS",
    "GenerateConfig",
    "HyperspectralConfig",
    "JobConfig",
    "ModelConfig",
    "ProbeConfig",
    "RayConfig",
    "SchedulerConfig",
    "SearchDistribution",
    "SlowdownInjection",
    "ElasticConfig",
    "TUNABLE_SECTIONS",
    "TrainConfig",
    "TuneConfig",
    "WorkerSpec",
    "check_data_root",
    "dotted_to_nested",
    "dump_config",
    "load_config",
    "merge_overrides",
    "parse_override",
    "parse_overrides",
    "validate_config",
]

logger = logging.getLogger(__name__)

#: Sentinel-2 band names as torchgeo's ``EuroSAT`` names them (its ``all_band_names``).
EUROSAT_BAND_NAMES: tuple[str, ...] = (
    "B01", "B02", "B03", "B04", "B05", "B06", "B07",
    "B08", "B09", "B10", "B11", "B12", "B8A",
)  # fmt: skip

# ------------------------------------------------------------------------------ workers


# ------------------------------------------------------------------------------ data & model


class GenerateConfig(_Model):
    """Parameters of the synthetic-data generator of ``data.dataset`` (real on-disk layout,
    cached).

    Which keys apply depends on the dataset (see :data:`GENERATE_KEYS`; others are
    rejected): eurosat, uc_merced: samples_per_class, seed, size; multimodal: those and
    cloud_fraction; hyperspectral: seed, height, width, spectral_bands, classes, file_format.
    ``size`` left unset means the dataset's real size (EuroSAT 64, UC Merced 256, So2Sat 32).
    """

    samples_per_class: Int = Field(
        100, ge=3, description="images per class (>= 3: every class needs train/val/test)"
    )
    seed: Int = Field(0, ge=0, description="generator seed")
    size: Int | None = Field(
        None, ge=16, description="image side in pixels (default: the real size, EuroSAT 64)"
    )
    height: Int | None = Field(None, ge=8, description="hyperspectral scene rows (default 145)")
    width: Int | None = Field(None, ge=8, description="hyperspectral scene columns (default 145)")
    spectral_bands: Int | None = Field(
        None, ge=4, description="hyperspectral bands (default 200, like Indian Pines)"
    )
    classes: Int | None = Field(
        None, ge=2, le=255, description="hyperspectral classes (default 16)"
    )
    file_format: Literal["mat", "tif"] | None = Field(
        None, description="hyperspectral files: mat (Indian Pines style) or tif (GeoTIFF)"
    )
    cloud_fraction: Float | None = Field(
        None, ge=0, lt=1, allow_inf_nan=False,
        description="multimodal: share of Sentinel-2 patches under cloud (default 0.4)",
    )


#: Generator keys that apply to each dataset kind.
GENERATE_KEYS: dict[str, tuple[str, ...]] = {
    "eurosat": ("samples_per_class", "seed", "size"),
    "uc_merced": ("samples_per_class", "seed", "size"),
    "multimodal": ("samples_per_class", "seed", "size", "cloud_fraction"),
    "hyperspectral": ("seed", "height", "width", "spectral_bands", "classes", "file_format"),
}

#: Dataset kinds of ``data.dataset``.
DATASET_KINDS: tuple[str, ...] = ("eurosat", "uc_merced", "hyperspectral", "multimodal")


class HyperspectralConfig(_Model):
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

    image: str | None = Field(None, description="cube file, e.g. Indian_pines_corrected.mat")
    labels: str | None = Field(None, description="label file, e.g. Indian_pines_gt.mat")
    image_key: str | None = Field(None, description=".mat variable of the cube")
    label_key: str | None = Field(None, description=".mat variable of the labels")
    patch_size: PositiveInt = Field(9, description="patch side k (odd)")
    split: Literal["block", "random"] = Field("block", description="block or random")
    block_size: PositiveInt = Field(16, description="split block side in pixels")
    guard: bool = Field(True, description="keep every patch inside its own split's blocks")
    fractions: list[NonNegFloat] = Field(
        default_factory=lambda: [0.6, 0.2, 0.2], description="train/val/test fractions"
    )

    @field_validator("patch_size")
    @classmethod
    def _odd(cls, value: int) -> int:
        if value % 2 == 0:
            raise _invalid(
                f"patch_size must be odd (a centre pixel), got {value}",
                f"use {value + 1} or {value - 1}",
            )
        return value

    @field_validator("fractions")
    @classmethod
    def _three_fractions(cls, value: list[float]) -> list[float]:
        if len(value) != 3 or abs(sum(value) - 1.0) > 1e-6 or value[0] <= 0 or value[1] <= 0:
            raise _invalid(
                f"fractions must be three numbers (train, val, test) summing to 1 with train "
                f"and val > 0, got {value}",
                "write e.g. fractions: [0.6, 0.2, 0.2]",
            )
        return value


class DataConfig(_Model):
    """Where the data lives and how to read it.

    Attributes:
        dataset: Dataset kind: ``"eurosat"`` (Sentinel-2 13 bands), ``"uc_merced"`` (aerial
            RGB), ``"hyperspectral"`` (one scene cut into patches), ``"multimodal"``
            (Sentinel-1 + Sentinel-2 pairs).
        root: Dataset root directory. A relative path is resolved against the current
            working directory when the config is validated, so the model always holds an
            absolute path (Ray workers run in other directories).
        bands: EuroSAT only: ``"all"`` (13 bands), ``"rgb"`` or a list of band names.
        generate: If set and ``root`` holds no dataset, generate a synthetic one there.
        num_workers: DataLoader worker processes per training worker.
        cache: Decode every sample once and keep it in memory in each worker (small datasets).
        image_size: UC Merced only: resize the 256 x 256 images further (cheaper training).
        on_bad_file: Decode every file on the driver before training; ``"error"`` stops with
            a list of corrupt/truncated files, ``"skip"`` leaves them out. ``None``: "error"
            for uc_merced and multimodal, no up-front check for eurosat (as before). A bad
            hyperspectral scene file always fails (a scene cannot be skipped).
        hyperspectral: Scene files and patch/split settings (dataset hyperspectral).
    """

    dataset: Literal["eurosat", "uc_merced", "hyperspectral", "multimodal"] = Field(
        "eurosat", description="dataset kind: eurosat, uc_merced, hyperspectral, multimodal"
    )
    root: Path = Field(description="dataset root directory, e.g. data/eurosat_synth")
    bands: Literal["all", "rgb"] | list[str] = Field(
        "all", description="'all', 'rgb' or a list of band names such as [B04, B03, B02]"
    )
    generate: GenerateConfig | None = Field(
        None, description="generate synthetic data at root if absent ({} for defaults)"
    )
    num_workers: Int = Field(0, ge=0, description="DataLoader worker processes per worker")
    cache: bool = Field(
        False, description="keep decoded samples in memory in every worker (small datasets)"
    )
    image_size: Int | None = Field(
        None, ge=8, description="uc_merced: resize images to this side (default 256)"
    )
    on_bad_file: Literal["error", "skip"] | None = Field(
        None, description="corrupt files: error (list them) or skip (leave them out)"
    )
    hyperspectral: HyperspectralConfig | None = Field(
        None, description="hyperspectral scene files, patch size and split"
    )

    @model_validator(mode="after")
    def _dataset_specific_keys(self) -> DataConfig:
        kind = self.dataset
        if kind != "eurosat" and self.bands != "all":
            raise _invalid(
                f"bands selects EuroSAT bands; dataset {kind!r} has fixed bands",
                "remove data.bands (or use dataset: eurosat)",
                ("bands",),
            )
        if self.image_size is not None and kind != "uc_merced":
            raise _invalid(
                f"image_size applies to dataset uc_merced, not {kind!r}",
                "remove data.image_size",
                ("image_size",),
            )
        if self.hyperspectral is not None and kind != "hyperspectral":
            raise _invalid(
                f"the hyperspectral section applies to dataset hyperspectral, not {kind!r}",
                "remove data.hyperspectral, or set dataset: hyperspectral",
                ("hyperspectral",),
            )
        if kind == "hyperspectral" and self.on_bad_file == "skip":
            raise _invalid(
                "a hyperspectral scene is one image: a bad scene file cannot be skipped",
                "remove on_bad_file (a corrupt scene file always stops with its name)",
                ("on_bad_file",),
            )
        if self.generate is not None:
            allowed = GENERATE_KEYS[kind]
            fields = GenerateConfig.model_fields
            extra = sorted(
                k for k in self.generate.model_fields_set
                if k not in allowed and getattr(self.generate, k) != fields[k].default
            )
            if extra:
                raise _invalid(
                    f"generate.{extra[0]} does not apply to dataset {kind!r}; its generator "
                    f"takes {', '.join(allowed)}",
                    f"remove generate.{extra[0]}",
                    ("generate", extra[0]),
                )
        return self

    @field_validator("root", mode="before")
    @classmethod
    def _non_empty_root(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            raise _invalid("the data root is empty", "set data.root to a directory path")
        return value

    @field_validator("root")
    @classmethod
    def _resolve_root(cls, value: Path) -> Path:
        return _absolute(value)

    @field_validator("bands", mode="before")
    @classmethod
    def _valid_bands(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value in ("all", "rgb"):
                return value
            close = _closest(value, ["all", "rgb"])
            raise _invalid(
                f"bands must be 'all', 'rgb' or a list of band names, got {value!r}",
                f"use bands: {close}" if close else "use bands: all, bands: rgb, or a list "
                "such as [B04, B03, B02]",
            )
        if isinstance(value, (list, tuple)):
            if not value:
                raise _invalid("bands is an empty list", "list at least one band, or use all")
            bad = [b for b in value if not isinstance(b, str) or b not in EUROSAT_BAND_NAMES]
            if bad:
                hints = [
                    f"{b!r} -> {c!r}" for b in bad if (c := _closest(str(b), EUROSAT_BAND_NAMES))
                ]
                raise _invalid(
                    f"unknown band name(s) {', '.join(repr(b) for b in bad)}; valid names: "
                    + ", ".join(EUROSAT_BAND_NAMES),
                    ("rename " + "; ".join(hints)) if hints else "use names from that list",
                )
            dupes = sorted({b for b in value if list(value).count(b) > 1})
            if dupes:
                raise _invalid(
                    f"band(s) listed more than once: {', '.join(dupes)}", "list each band once"
                )
            return list(value)
        raise _invalid(
            f"bands must be 'all', 'rgb' or a list of band names, got {_show(value)}",
            "use bands: all, bands: rgb, or a list such as [B04, B03, B02]",
        )


class ModelConfig(_Model):
    """Which network to train.

    Attributes:
        name: ``small_cnn``, ``resnet18``, ``resnet50`` (timm/torchgeo, any band count),
            ``cnn3d`` (spectral-spatial 3-D CNN, hyperspectral patches) or ``fusion_cnn``
            (two-branch SAR + multispectral late fusion, dataset multimodal).
        width: Base channel width (small_cnn, cnn3d, fusion_cnn branches).
        pretrained: ``false``, or the name of torchgeo weights for a ResNet
            (``ResNet18_Weights.SENTINEL2_ALL_MOCO``), loaded from the local torch hub cache
            only; ``true`` is refused (nothing can be downloaded).
        in_channels: Bands the model takes; checked against the data before training starts
            (``None``: whatever the data has).
        modalities: fusion_cnn: branches to build, ``[s1, s2]`` (fusion, the default),
            ``[s1]`` or ``[s2]`` (single-branch ablations).
    """

    name: Literal["small_cnn", "resnet18", "resnet50", "cnn3d", "fusion_cnn"] = Field(
        "small_cnn", description="architecture"
    )
    width: PositiveInt = Field(32, description="base channel width (small_cnn, cnn3d, fusion_cnn)")
    pretrained: bool | str = Field(
        False, description="false, or torchgeo weights name for resnet18/50 (local cache only)"
    )
    in_channels: PositiveInt | None = Field(
        None, description="bands the model takes (checked against the data); null: the data's"
    )
    modalities: list[Literal["s1", "s2"]] | None = Field(
        None, min_length=1, max_length=2, description="fusion_cnn branches: [s1, s2], [s1] or [s2]"
    )

    @model_validator(mode="after")
    def _pretrained_available(self) -> ModelConfig:
        if self.pretrained and self.name not in ("resnet18", "resnet50"):
            raise _invalid(
                f"{self.name} has no pretrained weights",
                "set pretrained: false, or use name: resnet18 / resnet50",
                ("pretrained",),
            )
        if isinstance(self.pretrained, str) and "_Weights." not in self.pretrained:
            raise _invalid(
                f"pretrained must be false or a torchgeo weights name, got {self.pretrained!r}",
                f"write e.g. pretrained: {self.name.replace('resnet', 'ResNet')}_Weights."
                "SENTINEL2_ALL_MOCO (present in the local torch hub cache), or false",
                ("pretrained",),
            )
        if self.modalities is not None:
            if self.name != "fusion_cnn":
                raise _invalid(
                    f"modalities applies to fusion_cnn, not {self.name}",
                    "remove model.modalities, or use name: fusion_cnn",
                    ("modalities",),
                )
            if len(set(self.modalities)) != len(self.modalities):
                raise _invalid("modalities lists a branch twice", "write [s1, s2], [s1] or [s2]",
                               ("modalities",))
        return self


# ------------------------------------------------------------------------------ training


class TrainConfig(_Model):
    """Optimisation and batch-carving settings.

    Attributes:
        epochs: Passes over the training split.
        global_batch_size: Samples per optimizer step, summed over all workers.
        lr: SGD learning rate. momentum: SGD momentum. weight_decay: L2 penalty.
        seed: Seed of the model init and the per-epoch permutations.
        weighting: ``"proportional"``: each worker's gradient weighs n_i/sum(n) (exact
            global-batch gradient); ``"uniform"``: 1/world_size (the biased baseline).
        fixed_shares: One relative share per worker (expanded order); skips probing.
        min_slice: Smallest slice any worker is given per step (never empty).
    """

    epochs: PositiveInt = Field(3, description="passes over the training split")
    global_batch_size: PositiveInt = Field(192, description="samples per step over all workers")
    lr: PositiveFloat = Field(0.05, description="learning rate")
    momentum: Float = Field(0.9, ge=0, lt=1, allow_inf_nan=False, description="SGD momentum")
    weight_decay: NonNegFloat = Field(5e-4, description="L2 weight decay")
    seed: Int = Field(0, ge=0, description="seed of init and shuffles")
    weighting: Literal["proportional", "uniform"] = Field(
        "proportional", description="gradient weighting across workers"
    )
    fixed_shares: list[PositiveFloat] | None = Field(
        None, min_length=1, description="one share per worker, in expanded order; skips probing"
    )
    min_slice: PositiveInt = Field(1, description="smallest per-step slice of any worker")


class SchedulerConfig(_Model):
    """The live scheduler: re-planning from measured step times while training runs.

    Attributes:
        live: Re-plan from live measurements (off: keep the probe's plan).
        window_steps: Steps per rank in each estimation window.
        improvement_threshold: Re-plan only if the predicted step time improves by more.
        confirm_windows: Consecutive windows that must agree (hysteresis).
        min_steps_between_replans: Minimum spacing of re-plans.
        straggler_timeout_s: A rank silent this long is treated as a straggler.
        plan_sync_every: Steps between the ranks' agreement on a pending plan.
        slowdown_schedule: EMULATION: injected slowdowns for tests and demos.
    """

    live: bool = Field(True, description="re-plan from live measurements")
    window_steps: PositiveInt = Field(8, description="steps per estimation window")
    improvement_threshold: float = Field(0.10, ge=0.0, lt=1.0, description="minimum predicted gain")
    confirm_windows: PositiveInt = Field(2, description="consecutive windows that must agree")
    min_steps_between_replans: Int = Field(8, ge=0, description="minimum steps between re-plans")
    straggler_timeout_s: float = Field(60.0, gt=0, description="silence that marks a straggler")
    plan_sync_every: PositiveInt = Field(5, description="steps between plan agreements")
    slowdown_schedule: list[SlowdownInjection] = Field(
        default_factory=list, description="emulated slowdown injections"
    )

    def policy(self) -> dict[str, Any]:
        """The PolicyConfig fields."""
        return {
            "window_steps": self.window_steps,
            "improvement_threshold": self.improvement_threshold,
            "confirm_windows": self.confirm_windows,
            "min_steps_between_replans": self.min_steps_between_replans,
            "straggler_timeout_s": self.straggler_timeout_s,
        }


class ElasticConfig(_Model):
    """Ray Train V2 elastic scaling between ``min_workers`` and all worker slots.

    Attributes:
        min_workers: Smallest group to train with (None: fixed size). Slots fill in order.
        resize_monitor_interval_s: How often Ray Train looks for room to grow.
    """

    min_workers: PositiveInt | None = Field(None, description="smallest worker group (None: fixed)")
    resize_monitor_interval_s: float = Field(5.0, gt=0, description="seconds between resize checks")


class RayConfig(_Model):
    """How to reach Ray.

    Attributes:
        address: Address of an existing cluster (``"auto"``, ``"ray://host:10001"``, ...);
            ``None`` starts an embedded local Ray.
        num_cpus: CPUs of the embedded local Ray (``None``: all of this machine's).
        dashboard_host: Interface the dashboard binds to.
        storage_path: Ray Train storage (checkpoints); resolved to an absolute path.
    """

    address: str | None = Field(None, description="cluster address; null = embedded local Ray")
    num_cpus: PositiveInt | None = Field(None, description="CPUs of the embedded local Ray")
    dashboard_host: str = Field("127.0.0.1", description="dashboard bind address")
    storage_path: Path | None = Field(None, description="Ray Train storage directory")

    @field_validator("address")
    @classmethod
    def _non_empty_address(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise _invalid(
                "address is empty",
                "remove it (or set it to null) for a local Ray, or give e.g. 'auto'",
            )
        return value

    @field_validator("storage_path")
    @classmethod
    def _absolute_storage(cls, value: Path | None) -> Path | None:
        return None if value is None else _absolute(value)


# ------------------------------------------------------------------------------ tune

#: Sections of a job whose keys a search space may vary (``workers``, ``data`` and ``ray``
#: decide placement and data layout, which every trial must share).
TUNABLE_SECTIONS: tuple[str, ...] = ("train", "model", "probe")

_DISTRIBUTION_KINDS: tuple[str, ...] = ("choice", "grid", "uniform", "loguniform", "randint")


class SearchDistribution(_Model):
    """How one hyperparameter is drawn; exactly one key is set.

    Attributes:
        choice: Draw one of these values at random per trial.
        grid: Try every value (each grid point runs ``num_samples`` times).
        uniform: ``[low, high]``: a float drawn uniformly.
        loguniform: ``[low, high]`` with ``0 < low``: a float drawn uniformly in log space.
        randint: ``[low, high]``: an integer drawn uniformly, both ends included.
    """

    choice: list[Any] | None = Field(None, min_length=1, description="values to draw from")
    grid: list[Any] | None = Field(None, min_length=1, description="values to try each")
    uniform: list[Float] | None = Field(
        None, min_length=2, max_length=2, description="[low, high] of a uniform float"
    )
    loguniform: list[PositiveFloat] | None = Field(
        None, min_length=2, max_length=2, description="[low, high] of a log-uniform float"
    )
    randint: list[Int] | None = Field(
        None, min_length=2, max_length=2, description="[low, high] of an integer, inclusive"
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> SearchDistribution:
        given = [kind for kind in _DISTRIBUTION_KINDS if getattr(self, kind) is not None]
        if len(given) != 1:
            raise _invalid(
                f"a distribution needs exactly one of {', '.join(_DISTRIBUTION_KINDS)}; "
                f"got {', '.join(given) if given else 'none'}",
                "write e.g. {loguniform: [0.01, 0.2]} or {choice: [16, 32]}",
            )
        kind = given[0]
        if kind in ("uniform", "loguniform", "randint"):
            low, high = getattr(self, kind)
            if not low < high:
                raise _invalid(
                    f"{kind} needs low < high, got [{low}, {high}]",
                    "write the smaller bound first, or use choice: [value] for a constant",
                    (kind,),
                )
        return self

    @property
    def kind(self) -> str:
        """Which distribution this is (``"choice"``, ``"loguniform"``, ...)."""
        return next(kind for kind in _DISTRIBUTION_KINDS if getattr(self, kind) is not None)

    def candidate_values(self) -> list[Any]:
        """Values worth checking against the job: every listed value, or both bounds."""
        return list(getattr(self, self.kind))


class TuneConfig(_Model):
    """A hyperparameter search over the job (``raytrain-hetero tune``).

    Each trial trains the job with the search-space values merged over it. The trial's
    driver holds ``trial_cpus``; its worker group reserves the workers' resources through
    Ray Train's own placement group, atomically, so trials never hold half a worker group.

    Attributes:
        search_space: Dotted job keys (``train.lr``, ``model.width``, ...) and their
            distributions.
        num_samples: Trials to run (each grid point this many times).
        metric: Metric the search optimises. mode: ``"max"`` or ``"min"``.
        scheduler: ``"asha"`` stops weak trials early (per epoch); ``"fifo"`` runs all.
        grace_period: Epochs every trial gets before ASHA may stop it.
        reduction_factor: ASHA keeps the best 1/reduction_factor of trials per rung.
        max_concurrent_trials: Trials running at once; ``None``: as many as the cluster
            holds at once (their worker groups all placed).
        trial_cpus: CPUs each trial's driver process reserves (it only coordinates).
        seed: Seed of the search (which values are drawn).
    """

    search_space: dict[str, SearchDistribution] = Field(
        min_length=1, description="dotted job keys and distributions, e.g. train.lr"
    )
    num_samples: PositiveInt = Field(4, description="trials (per grid point)")
    metric: Literal["val_accuracy", "samples_per_s"] = Field(
        "val_accuracy", description="metric to optimise"
    )
    mode: Literal["max", "min"] = Field("max", description="maximise or minimise the metric")
    scheduler: Literal["asha", "fifo"] = Field(
        "asha", description="asha (early stopping) or fifo (run every trial to the end)"
    )
    grace_period: PositiveInt = Field(1, description="epochs before ASHA may stop a trial")
    reduction_factor: Float = Field(
        2.0, gt=1, allow_inf_nan=False, description="ASHA keeps 1/reduction_factor per rung"
    )
    max_concurrent_trials: PositiveInt | None = Field(
        None, description="trials at once; null = as many as the cluster holds"
    )
    trial_cpus: NonNegFloat = Field(0.25, description="CPUs reserved by each trial's driver")
    seed: Int | None = Field(0, ge=0, description="seed of the search; null = random")


def _section_fields(section: str) -> list[str]:
    model = {"train": TrainConfig, "model": ModelConfig, "probe": ProbeConfig}[section]
    return list(model.model_fields)


def dotted_to_nested(values: Mapping[str, Any]) -> dict[str, Any]:
    """``{"train.lr": 0.1}`` -> ``{"train": {"lr": 0.1}}`` (for :func:`merge_overrides`)."""
    nested: dict[str, Any] = {}
    for key, value in values.items():
        *parents, leaf = key.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


# ------------------------------------------------------------------------------ job


class JobConfig(_Model):
    """A complete training job; the root of the YAML file."""

    name: str = Field("raytrain-hetero", description="job name (used for Ray run names)")
    data: DataConfig = Field(description="dataset settings (needs at least root)")
    model: ModelConfig = Field(default_factory=ModelConfig, description="network")
    train: TrainConfig = Field(default_factory=TrainConfig, description="optimisation")
    probe: ProbeConfig = Field(default_factory=ProbeConfig, description="throughput probing")
    workers: list[WorkerSpec] = Field(
        min_length=1, description="worker groups, e.g. [{name: fast}, {name: slow}]"
    )
    ray: RayConfig = Field(default_factory=RayConfig, description="Ray connection")
    scheduler: SchedulerConfig = Field(
        default_factory=SchedulerConfig, description="live re-planning and slowdown injection"
    )
    elastic: ElasticConfig = Field(
        default_factory=ElasticConfig, description="elastic scaling (min workers)"
    )
    output_dir: Path = Field(Path("outputs/run"), description="where metrics and plots go")
    tune: TuneConfig | None = Field(
        None, description="hyperparameter search for raytrain-hetero tune"
    )

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        return _check_name(value, "job name")

    @property
    def total_workers(self) -> int:
        """Number of training workers (sum of the groups' ``count``)."""
        return sum(w.count for w in self.workers)

    def expanded_workers(self) -> list[WorkerSpec]:
        """One :class:`WorkerSpec` per worker (``count == 1``), in rank order.

        Groups with ``count > 1`` expand to ``<name>-0``, ``<name>-1``, ...; groups with
        ``count == 1`` keep their name.
        """
        out: list[WorkerSpec] = []
        for spec in self.workers:
            if spec.count == 1:
                out.append(spec)
            else:
                out.extend(
                    spec.model_copy(update={"name": f"{spec.name}-{i}", "count": 1})
                    for i in range(spec.count)
                )
        return out

    @model_validator(mode="after")
    def _model_fits_dataset(self) -> JobConfig:
        kind, name = self.data.dataset, self.model.name
        if name == "fusion_cnn" and kind != "multimodal":
            raise _invalid(
                f"fusion_cnn needs two modalities, but data.dataset is {kind!r}",
                "use data.dataset: multimodal, or another model.name",
                ("model", "name"),
            )
        if kind == "multimodal" and name != "fusion_cnn":
            raise _invalid(
                f"dataset multimodal stacks SAR and multispectral bands; {name} would mix "
                "them in one branch",
                "use model.name: fusion_cnn (model.modalities: [s1] or [s2] for one branch)",
                ("model", "name"),
            )
        return self

    @model_validator(mode="after")
    def _consistent(self) -> JobConfig:
        problems: list[tuple[tuple[str | int, ...], str, str]] = []
        first_index: dict[str, int] = {}
        for i, spec in enumerate(self.workers):
            if spec.name in first_index:
                problems.append(
                    (
                        ("workers", i, "name"),
                        f"duplicate worker name {spec.name!r} "
                        f"(also workers[{first_index[spec.name]}])",
                        "give every worker group a unique name",
                    )
                )
            else:
                first_index[spec.name] = i
        if not problems:
            expanded = [w.name for w in self.expanded_workers()]
            clashes = sorted({n for n in expanded if expanded.count(n) > 1})
            if clashes:
                problems.append(
                    (
                        ("workers",),
                        f"expanded worker names clash: {', '.join(clashes)} (a group with "
                        "count > 1 is expanded to <name>-0, <name>-1, ...)",
                        "rename the group whose name looks like another group's expanded name",
                    )
                )
        n = self.total_workers
        tr = self.train
        if tr.fixed_shares is not None and len(tr.fixed_shares) != n:
            names = [w.name for w in self.expanded_workers()]
            shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
            problems.append(
                (
                    ("train", "fixed_shares"),
                    f"has {len(tr.fixed_shares)} entries but the job has {n} workers (sum of "
                    f"workers[*].count); {n} shares are needed",
                    f"give exactly {n} shares, one per worker in this order: {shown}",
                )
            )
        if tr.global_batch_size < n * tr.min_slice:
            problems.append(
                (
                    ("train", "global_batch_size"),
                    f"{tr.global_batch_size} is too small: {n} workers x min_slice "
                    f"{tr.min_slice} need at least {n * tr.min_slice} samples per step",
                    f"set global_batch_size >= {n * tr.min_slice} or lower train.min_slice",
                )
            )
        for i, spec in enumerate(self.workers):
            if spec.max_batch is not None and spec.max_batch < tr.min_slice:
                problems.append(
                    (
                        ("workers", i, "max_batch"),
                        f"{spec.max_batch} is below train.min_slice {tr.min_slice}, so no "
                        "slice fits this worker",
                        f"raise max_batch to >= {tr.min_slice} or lower train.min_slice",
                    )
                )
        if all(w.max_batch is not None for w in self.workers):
            capacity = sum(w.count * w.max_batch for w in self.workers)  # type: ignore[operator]
            if capacity < tr.global_batch_size:
                problems.append(
                    (
                        ("train", "global_batch_size"),
                        f"{tr.global_batch_size} exceeds what all workers can hold per step "
                        f"(sum of count x max_batch = {capacity})",
                        f"lower global_batch_size to <= {capacity}, raise some max_batch, or "
                        "remove a max_batch cap",
                    )
                )
        if problems:
            raise PydanticCustomError(
                _MULTI,
                "{summary}",
                {"summary": "; ".join(p[1] for p in problems), "problems": problems},
            )
        return self

    @model_validator(mode="after")
    def _tune_space_fits(self) -> JobConfig:
        if self.tune is None:
            return self
        problems: list[tuple[tuple[str | int, ...], str, str]] = []
        tunable = [f"{s}.{f}" for s in TUNABLE_SECTIONS for f in _section_fields(s)]
        base = self.model_dump(mode="json", exclude={"tune"})
        for key, distribution in self.tune.search_space.items():
            at: tuple[str | int, ...] = ("tune", "search_space", key)
            section, _, rest = key.partition(".")
            if section not in TUNABLE_SECTIONS or rest not in _section_fields(section):
                close = _closest(rest or key, [t.partition(".")[2] for t in tunable])
                guess = next((t for t in tunable if t.endswith("." + close)), None) if close else None
                problems.append(
                    (
                        at,
                        f"{key!r} is not a tunable key; tunable keys are those of "
                        f"{', '.join(TUNABLE_SECTIONS)}, e.g. train.lr, model.width",
                        f"rename it to {guess!r}" if guess else "use a key such as train.lr, "
                        "train.weight_decay, train.global_batch_size or model.width",
                    )
                )
                continue
            if key == "train.epochs":
                problems.append(
                    (
                        at,
                        "train.epochs cannot be searched: it is every trial's budget (ASHA "
                        "decides how many epochs a weak trial gets)",
                        "set train.epochs in the job and remove it from tune.search_space",
                    )
                )
                continue
            for value in distribution.candidate_values():
                merged = merge_overrides(base, dotted_to_nested({key: value}))
                try:
                    JobConfig.model_validate(merged)
                except ValidationError as exc:
                    inner = [p for e in exc.errors() for p in _describe(e, "")]
                    first = inner[0] if inner else None
                    why = f"{first.path}: {first.message}" if first else str(exc)
                    problems.append(
                        (
                            (*at, distribution.kind),
                            f"the value {_show(value)} makes the job invalid ({why})",
                            "narrow the range or drop that value"
                            + (f"; or {first.fix}" if first else ""),
                        )
                    )
        if problems:
            raise PydanticCustomError(
                _MULTI,
                "{summary}",
                {"summary": "; ".join(p[1] for p in problems), "problems": problems},
            )
        return self


# ------------------------------------------------------------------------------ errors


@dataclass(frozen=True)
class ConfigProblem:
    """One thing wrong with a configuration.

    Attributes:
        source: The file (or other source) the config came from.
        path: Dotted key path, with list items as ``[i]`` (``""`` for the file itself).
        message: What is wrong (no trailing period).
        fix: How to fix it (no trailing period).
    """

    source: str
    path: str
    message: str
    fix: str

    def __str__(self) -> str:
        where = f"{self.source}: {self.path}: " if self.path else f"{self.source}: "
        return f"{where}{self.message}. Fix: {self.fix}."


def _raise_problems(problems: list[ConfigProblem], note: str = "") -> typing.NoReturn:
    if len(problems) == 1:
        text = str(problems[0]) + note
    else:
        header = f"{len(problems)} problems in {problems[0].source}{note}:"
        text = "\n".join([header, *("  " + str(p) for p in problems)])
    err = ConfigError(text)
    err.problems = tuple(problems)  # type: ignore[attr-defined]  # survives pickling
    raise err


def _file_problem(source: str, message: str, fix: str) -> typing.NoReturn:
    _raise_problems([ConfigProblem(source, "", message.rstrip("."), fix.rstrip("."))])


#: Words people write for a valid key or value: word -> candidates, first valid one wins.
_SYNONYMS: dict[str, str | tuple[str, ...]] = {
    "learning_rate": "lr",
    "learningrate": "lr",
    "batch_size": "global_batch_size",
    "batch": "global_batch_size",
    "num_epochs": "epochs",
    "n_epochs": "epochs",
    "epoch": "epochs",
    "wd": "weight_decay",
    "worker": "workers",
    "num_workers_per_group": "count",
    "replicas": "count",
    "num_replicas": "count",
    "slowdown": "emulated_slowdown",
    "gpu": ("cuda", "device"),
    "labels": "label_selector",
    "path": "root",
    "data_dir": "root",
    "dir": "root",
    "output": "output_dir",
    "out_dir": "output_dir",
    "outdir": "output_dir",
    "arch": "name",
    "architecture": "name",
    "shares": "fixed_shares",
    "weights": "weighting",
}


def _closest(key: str, candidates: Iterable[str]) -> str | None:
    """The valid key the user most likely meant, or ``None``."""
    cands = [c for c in candidates if isinstance(c, str)]
    low = {c.lower(): c for c in cands}
    k = key.lower().strip().replace("-", "_")
    if k in low:
        return low[k]
    synonyms = _SYNONYMS.get(k, ())
    for word in (synonyms,) if isinstance(synonyms, str) else synonyms:
        if word in cands:
            return word
    parts = [p for p in k.split("_") if p]
    if len(parts) > 1:
        acronym = "".join(p[0] for p in parts)
        if acronym in low:
            return low[acronym]
    match = difflib.get_close_matches(k, list(low), n=1, cutoff=0.6)
    if match:
        return low[match[0]]
    if len(k) >= 3:
        contained = [c for c in cands if k in c.lower() or (len(c) >= 3 and c.lower() in k)]
        if len(contained) == 1:
            return contained[0]
    return None


_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlist = 8
_repr.maxdict = 8


def _show(value: Any) -> str:
    """A short YAML-flavoured rendering of a user-supplied value, with its type."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    kind = {dict: "mapping", list: "list", str: "string", int: "integer", float: "number"}.get(
        type(value), type(value).__name__
    )
    return f"{_repr.repr(value)} ({kind})"


def _loc_path(loc: Iterable[str | int]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _unwrap(tp: Any) -> Any:
    """Strip ``Annotated`` and ``Optional`` from a type; ``None`` for other unions."""
    while True:
        origin = typing.get_origin(tp)
        if origin is Annotated:
            tp = typing.get_args(tp)[0]
        elif origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) != 1:
                return None
            tp = args[0]
        else:
            return tp


def _model_at(loc: Iterable[str | int]) -> type[BaseModel] | None:
    """The pydantic model that validates the mapping at ``loc`` (``()``: JobConfig)."""
    tp: Any = JobConfig
    for part in loc:
        tp = _unwrap(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = tp.model_fields.get(part) if isinstance(part, str) else None
            if field is None:
                return None
            tp = field.annotation
        elif typing.get_origin(tp) is list and isinstance(part, int):
            tp = typing.get_args(tp)[0]
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
        else:
            return None
    tp = _unwrap(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


_EXPECTED: dict[str, str] = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "a string",
    "dict_type": "a mapping (key: value)",
    "list_type": "a list",
    "path_type": "a path (string)",
    "model_type": "a mapping (key: value)",
    "model_attributes_type": "a mapping (key: value)",
    "none_required": "null",
}


def _describe(err: Mapping[str, Any], source: str) -> list[ConfigProblem]:
    """Turn one pydantic error dict into one or more :class:`ConfigProblem`."""
    etype: str = err["type"]
    loc = tuple(err.get("loc", ()))
    ctx = err.get("ctx") or {}
    given = err.get("input")
    path = _loc_path(loc)

    def problem(message: str, fix: str, at_loc: tuple = loc) -> ConfigProblem:
        return ConfigProblem(
            source, _loc_path(at_loc) or "(top level)", message.rstrip("."), fix.rstrip(".")
        )

    if etype == _MULTI:
        return [problem(m, f, tuple(sub)) for sub, m, f in ctx["problems"]]
    if etype == _INVALID:
        return [problem(ctx["message"], ctx["fix"], loc + tuple(ctx.get("at", ())))]
    if etype == "extra_forbidden":
        key, parent = loc[-1], loc[:-1]
        model = _model_at(parent)
        valid = list(model.model_fields) if model is not None else []
        where = f"under '{_loc_path(parent)}'" if parent else "at the top level"
        message = f"unknown key {str(key)!r} {where}"
        if valid:
            message += "; valid keys: " + ", ".join(valid)
        close = _closest(str(key), valid) if valid else None
        fix = f"rename it to {close!r}" if close else "remove it (or correct its spelling)"
        return [problem(message, fix)]
    if etype == "missing":
        key, parent = loc[-1], loc[:-1]
        model = _model_at(parent)
        desc = None
        if model is not None and isinstance(key, str) and key in model.model_fields:
            desc = model.model_fields[key].description
        where = f"under '{_loc_path(parent)}'" if parent else "at the top level"
        fix = f"add '{key}' {where}" + (f" ({desc})" if desc else "")
        return [problem(f"required key {str(key)!r} is missing", fix)]
    if etype == _BOOL_AS_NUMBER:
        expected = ctx.get("expected", "a number")
        return [problem(f"expected {expected}, got {_show(given)}", f"write {expected} here")]
    if etype in _EXPECTED:
        expected = _EXPECTED[etype]
        if etype in ("model_type", "model_attributes_type"):
            model = _model_at(loc)
            if model is not None:
                expected += " with keys " + ", ".join(model.model_fields)
        fix = f"write {_EXPECTED[etype]} here"
        if etype == "string_type" and isinstance(given, (int, float, bool)):
            fix = f"quote it: '{given}'" if not isinstance(given, bool) else "quote it"
        if etype in ("model_type", "dict_type") and given is None:
            fix = "fill in the section, or remove the key to use the defaults"
        return [problem(f"expected {expected}, got {_show(given)}", fix)]
    if etype == "literal_error":
        allowed = str(ctx.get("expected", ""))
        close = _closest(str(given), re.findall(r"'([^']*)'", allowed))
        fix = f"use {close!r}" if close else f"use one of {allowed}"
        return [problem(f"must be one of {allowed}, got {_show(given)}", fix)]
    bounds = {
        "greater_than": (">", "gt"),
        "greater_than_equal": (">=", "ge"),
        "less_than": ("<", "lt"),
        "less_than_equal": ("<=", "le"),
    }
    if etype in bounds:
        op, key = bounds[etype]
        limit = ctx.get(key)
        return [problem(f"must be {op} {limit}, got {_show(given)}", f"use a value {op} {limit}")]
    if etype == "finite_number":
        return [problem(f"must be a finite number, got {_show(given)}", "use a finite number")]
    if etype in ("too_short", "too_long"):
        lo, hi = ctx.get("min_length"), ctx.get("max_length")
        need = f"at least {lo}" if etype == "too_short" else f"at most {hi}"
        got = ctx.get("actual_length", "?")
        return [problem(f"needs {need} item(s), got {got}", f"give {need} item(s)")]
    # Anything else: pydantic's own words, plus what was given.
    logger.debug("unmapped pydantic error type %s at %s", etype, path)
    return [problem(f"{err.get('msg', etype)}, got {_show(given)}", "correct this value")]


# ------------------------------------------------------------------------------ loading


def validate_config(
    data: Mapping[str, Any], source: str = "<config>", note: str = ""
) -> JobConfig:
    """Validate a plain mapping into a :class:`JobConfig`, with :func:`load_config`'s errors.

    Args:
        data: The parsed configuration (e.g. from YAML), overrides already merged.
        source: Name used as the ``<file>`` part of problem messages.
        note: Extra text for the error's first line (e.g. which overrides were applied).

    Returns:
        The validated, frozen job configuration.

    Raises:
        ConfigError: One error listing every problem found.
    """
    if not isinstance(data, Mapping):
        _file_problem(
            source,
            f"the top level must be a mapping (key: value), got {_show(data)}",
            "start the file with keys such as name:, data:, workers:",
        )
    try:
        return JobConfig.model_validate(dict(data))
    except ValidationError as exc:
        problems = [p for e in exc.errors() for p in _describe(e, source)]
        _raise_problems(problems, note)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys instead of silently keeping the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                hash(key)
            except TypeError:
                continue
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r} (first on line {seen[key]})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _yaml_error_text(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc)
    if mark is not None:
        return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"
    return problem


def load_config(
    path: str | os.PathLike[str], overrides: Mapping[str, Any] | None = None
) -> JobConfig:
    """Read a YAML job file, merge ``overrides`` over it, validate it.

    Args:
        path: The YAML file.
        overrides: Nested mapping merged over the file's content before validation (see
            :func:`parse_overrides`); list items are addressed by index keys (``"0"``).

    Returns:
        The validated, frozen job configuration.

    Raises:
        ConfigError: The file is missing, unreadable, not YAML or not a mapping, or any
            value is invalid; the message lists every problem with its fix.
    """
    source = str(path)
    p = Path(path)
    if not p.exists():
        _file_problem(
            source,
            f"config file not found (looked at {_absolute(p)})",
            "check the path; example configs live in examples/configs/",
        )
    if not p.is_file():
        _file_problem(source, "is not a file", "pass the path of a YAML config file")
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        _file_problem(source, f"cannot be read: {exc}", "check the file's permissions and encoding")
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - SafeLoader subclass
    except yaml.YAMLError as exc:
        duplicate = "duplicate key" in str(getattr(exc, "problem", ""))
        _file_problem(
            source,
            f"is not valid YAML: {_yaml_error_text(exc)}",
            "keep only one of the duplicate keys"
            if duplicate
            else "correct the YAML syntax there (indentation, colons, quotes)",
        )
    if data is None:
        _file_problem(source, "is empty", "add at least data: and workers: sections")
    if not isinstance(data, Mapping):
        _file_problem(
            source,
            f"the top level must be a mapping (key: value), got {_show(data)}",
            "start the file with keys such as name:, data:, workers:",
        )
    note = ""
    if overrides:
        data = merge_overrides(data, overrides, source=source)
        note = " (after overrides: " + ", ".join(_flat_keys(overrides)) + ")"
    cfg = validate_config(data, source=source, note=note)
    logger.debug("loaded config %s (%d workers)", source, cfg.total_workers)
    return cfg


def _flat_keys(tree: Mapping[str, Any], prefix: str = "") -> list[str]:
    keys: list[str] = []
    for k, v in tree.items():
        full = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping) and v:
            keys.extend(_flat_keys(v, full))
        else:
            keys.append(full)
    return keys


# ------------------------------------------------------------------------------ overrides


def parse_override(text: str) -> dict[str, Any]:
    """Parse one ``KEY.PATH=VALUE`` override into a nested dict.

    The value is parsed as YAML, so ``train.epochs=1`` gives ``{"train": {"epochs": 1}}``,
    ``data.generate={}`` an empty mapping, ``ray.address=null`` ``None`` and
    ``probe.batch_sizes=[8,32]`` a list. List items are addressed by index:
    ``workers.0.emulated_slowdown=2``.

    Raises:
        ConfigError: No ``=``, an empty key segment, or a value that is not valid YAML.
    """
    source = f"override {text!r}"
    key, sep, raw = text.partition("=")
    if not sep:
        _file_problem(source, "has no '='", "write KEY.PATH=VALUE, e.g. train.epochs=1")
    parts = [s.strip() for s in key.split(".")]
    if not parts or any(not s for s in parts):
        _file_problem(
            source,
            f"has an empty key segment in {key!r}",
            "write KEY.PATH=VALUE, e.g. train.epochs=1",
        )
    try:
        value = yaml.load(raw, Loader=_StrictLoader) if raw.strip() else None  # noqa: S506
    except yaml.YAMLError as exc:
        _file_problem(
            source,
            f"value {raw!r} is not valid YAML: {_yaml_error_text(exc)}",
            "quote the value, e.g. name='my run'",
        )
    tree: dict[str, Any] = {parts[-1]: value}
    for part in reversed(parts[:-1]):
        tree = {part: tree}
    return tree


def parse_overrides(items: Iterable[str]) -> dict[str, Any]:
    """Parse several ``KEY.PATH=VALUE`` overrides into one nested dict (later ones win)."""
    merged: dict[str, Any] = {}
    for item in items:
        merged = merge_overrides(merged, parse_override(item), source=f"override {item!r}")
    return merged


def merge_overrides(
    base: Mapping[str, Any], overrides: Mapping[str, Any], source: str = "<overrides>"
) -> dict[str, Any]:
    """Deep-merge ``overrides`` over ``base`` (neither is modified).

    Mappings merge key by key; any other override value replaces the base value. When the
    base value is a list, the override's keys are list indices (``"0"``, ``"-1"``).

    Raises:
        ConfigError: An index into a list is not an integer or is out of range.
    """
    return _merge(base, overrides, (), source)


def _merge(base: Any, over: Any, loc: tuple[str | int, ...], source: str) -> Any:
    if not isinstance(over, Mapping):
        return over
    if isinstance(base, list):
        out_list = list(base)
        for k, v in over.items():
            try:
                idx = int(k)
            except (TypeError, ValueError):
                _raise_problems(
                    [
                        ConfigProblem(
                            source,
                            _loc_path(loc),
                            f"is a list, so {k!r} must be an item index",
                            f"address items by index, e.g. {_loc_path(loc)}.0.<key>=...",
                        )
                    ]
                )
            if not -len(out_list) <= idx < len(out_list):
                _raise_problems(
                    [
                        ConfigProblem(
                            source,
                            _loc_path(loc),
                            f"has {len(out_list)} item(s), so index {idx} is out of range",
                            f"use an index from 0 to {len(out_list) - 1}",
                        )
                    ]
                )
            out_list[idx] = _merge(out_list[idx], v, (*loc, idx), source)
        return out_list
    out: dict[str, Any] = dict(base) if isinstance(base, Mapping) else {}
    for k, v in over.items():
        out[k] = _merge(out.get(k), v, (*loc, k), source) if isinstance(v, Mapping) else v
    return out


# ------------------------------------------------------------------------------ helpers


def check_data_root(cfg: DataConfig) -> None:
    """Fail early, on the driver, if the data root cannot work.

    Args:
        cfg: The data section.

    Raises:
        DataError: ``root`` is missing and ``generate`` is not set, or ``root`` exists but
            is not a directory. The message names the absolute path and the fix.
    """
    root = _absolute(cfg.root)
    what = {
        "eurosat": "EuroSAT",
        "uc_merced": "UC Merced",
        "hyperspectral": "hyperspectral scene",
        "multimodal": "multimodal (So2Sat-style) dataset",
    }[cfg.dataset]
    if root.exists() and not root.is_dir():
        raise DataError(
            f"data.root {root} exists but is not a directory. Fix: point data.root at a "
            f"directory (a downloaded {what}, or an empty/new one with data.generate set)."
        )
    if not root.exists() and cfg.generate is None:
        raise DataError(
            f"data.root {root} does not exist and data.generate is not set. Fix: set "
            f"data.generate: {{}} to generate a synthetic {what} there, or point data.root at a "
            f"downloaded {what}."
        )
    logger.debug("data root %s: exists=%s generate=%s", root, root.exists(), cfg.generate)


def dump_config(cfg: JobConfig, path: str | os.PathLike[str]) -> Path:
    """Write ``cfg`` as YAML (paths absolute as resolved), atomically; return the path.

    The file loads back with :func:`load_config` into an equal :class:`JobConfig`.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
