"""YAML-only job sections about the data and the network: ``data:`` and ``model:``.

They have no library counterpart (the library trains whatever loop it is given); the job's
loop (:mod:`raytrain_hetero.app.job`) reads them. Every model is frozen and rejects unknown keys.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from raytrain_hetero.config.base import HeteroModel
from raytrain_hetero.config.fields import (
    Int,
    PositiveInt,
    absolute,
    invalid,
)
from raytrain_hetero.config.problems import closest, show
from raytrain_hetero.workloads.formats import EUROSAT_BANDS
from raytrain_hetero.workloads.registry import (
    GenerateOptions,
    SceneOptions,
    dataset_adapter,
    dataset_names,
    model_names,
    model_registering_module,
    registering_module,
)

__all__ = [
    "DataConfig",
    "ModelConfig",
]


class DataConfig(HeteroModel):
    """Where the data lives and how to read it.

    Attributes:
        dataset: A registered dataset name
            (:func:`~raytrain_hetero.workloads.registry.dataset_names`): the built-in
            ``"eurosat"`` (Sentinel-2 13 bands), ``"uc_merced"`` (aerial RGB),
            ``"hyperspectral"`` (one scene cut into patches), ``"multimodal"`` (Sentinel-1 +
            Sentinel-2 pairs), or one added with
            :func:`~raytrain_hetero.workloads.registry.register_dataset` before the config
            is loaded (its registering module is then added to ``modules``).
        modules: Modules that register datasets, imported before ``dataset`` is checked,
            on the driver and on every Ray worker (which validates the job config again).
        root: Dataset root directory. A relative path is resolved against the current
            working directory when the config is validated, so the model always holds an
            absolute path (Ray workers run in other directories).
        bands: EuroSAT only: ``"all"`` (13 bands), ``"rgb"`` or a list of band names.
        generate: If set and ``root`` holds no dataset, generate a synthetic one there.
        num_workers: DataLoader worker processes per training worker.
        cache: Decode every sample once per node, into memory-mapped arrays under the
            root's ``.raytrain_hetero_cache`` that every worker, fit, restart and Tune trial
            on the node shares; decoded afresh (the old copy deleted) when a file, option
            or the library changes. Disk: the decoded size once per node (700 13-band
            64x64 float32 EuroSAT images: 142 MiB). Small datasets; samples that are not
            dicts of fixed-shape tensors, or a read-only root, keep a copy in each worker.
        image_size: UC Merced only: resize the 256 x 256 images further (cheaper training).
        on_bad_file: Decode every file on the driver before training; ``"error"`` stops with
            a list of corrupt/truncated files (EuroSAT: or files without 13 bands),
            ``"skip"`` leaves them out, ``"off"`` checks nothing up front (a bad file then
            fails when read). ``None``: "error" for eurosat, uc_merced and multimodal. A bad
            hyperspectral scene file always fails (a scene cannot be skipped).
        hyperspectral: Scene files and patch/split settings (dataset hyperspectral).
        source: ``files``: every training worker reads its slices itself (DataLoader);
            ``ray_data``: the train split is decoded in Ray Data tasks on any node and the
            stream carved by the plan (:mod:`raytrain_hetero.app.ray_data_source`).
        datamodule: Lightning datamodule for ``model.task``: ``torchgeo.<Name>DataModule`` or
            ``raytrain_hetero.SceneSegmentationDataModule`` (``root``: its paths or root).
        datamodule_args: Its arguments as the class takes them, e.g. ``{bands: [...]}``.
    """

    dataset: str = "eurosat"
    modules: list[str] = Field(default_factory=list)
    root: Path = Field(description="dataset root directory, e.g. data/eurosat_synth")
    bands: Literal["all", "rgb"] | list[str] = "all"
    generate: GenerateOptions | None = None
    num_workers: Int = Field(0, ge=0)
    cache: bool = False
    image_size: Int | None = Field(None, ge=8)
    on_bad_file: Literal["error", "skip", "off"] | None = None
    hyperspectral: SceneOptions | None = None
    source: Literal["files", "ray_data"] = "files"
    datamodule: str | None = None
    datamodule_args: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _datamodule_arguments(self) -> DataConfig:
        if self.datamodule is None:
            if self.datamodule_args:
                raise invalid(
                    "datamodule_args without a datamodule",
                    "set data.datamodule (e.g. torchgeo.EuroSATDataModule), or remove them",
                    ("datamodule_args",),
                )
            return self
        _check_named_class("datamodule", self.datamodule, self.datamodule_args)
        return self

    @model_validator(mode="after")
    def _dataset_specific_keys(self) -> DataConfig:
        kind = self.dataset
        adapter = dataset_adapter(kind)
        given = {"bands": self.bands != "all", "image_size": self.image_size is not None}
        given["scene"] = self.hyperspectral is not None
        for key in (k for k, is_set in given.items() if is_set and k not in adapter.source_keys):
            yaml_key = "hyperspectral" if key == "scene" else key
            takers = [n for n in dataset_names() if key in dataset_adapter(n).source_keys]
            raise invalid(
                f"{yaml_key} does not apply to dataset {kind!r} (it applies to "
                f"{', '.join(takers) or 'no registered dataset'})",
                f"remove data.{yaml_key}, or use a dataset it applies to",
                (yaml_key,),
            )
        if adapter.scan_files is None and self.on_bad_file == "skip":
            raise invalid(
                f"{adapter.title} files cannot be skipped: the dataset has no per-file check "
                "(a hyperspectral scene is one image)",
                "remove on_bad_file (a corrupt file always stops the job with its name)",
                ("on_bad_file",),
            )
        if self.generate is not None:
            allowed = dataset_adapter(kind).generate_keys
            fields = GenerateOptions.model_fields
            extra = sorted(
                k
                for k in self.generate.model_fields_set
                if k not in allowed and getattr(self.generate, k) != fields[k].default
            )
            if extra:
                raise invalid(
                    f"generate.{extra[0]} does not apply to dataset {kind!r}; its generator "
                    f"takes {', '.join(allowed)}",
                    f"remove generate.{extra[0]}",
                    ("generate", extra[0]),
                )
        return self

    @model_validator(mode="before")
    @classmethod
    def _import_dataset_modules(cls, raw: Any) -> Any:
        return _import_modules(raw, "dataset", registering_module)

    @field_validator("dataset")
    @classmethod
    def _registered_dataset(cls, value: str) -> str:
        return _registered(value, dataset_names(), "dataset")

    @field_validator("root", mode="before")
    @classmethod
    def _non_empty_root(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():
            raise invalid("the data root is empty", "set data.root to a directory path")
        return value

    @field_validator("root")
    @classmethod
    def _resolve_root(cls, value: Path) -> Path:
        return absolute(value)

    @field_validator("bands", mode="before")
    @classmethod
    def _valid_bands(cls, value: Any) -> Any:
        if isinstance(value, str):
            if value in ("all", "rgb"):
                return value
            close = closest(value, ["all", "rgb"])
            raise invalid(
                f"bands must be 'all', 'rgb' or a list of band names, got {value!r}",
                f"use bands: {close}"
                if close
                else "use bands: all, bands: rgb, or a list such as [B04, B03, B02]",
            )
        if isinstance(value, (list, tuple)):
            if not value:
                raise invalid("bands is an empty list", "list at least one band, or use all")
            bad = [b for b in value if not isinstance(b, str) or b not in EUROSAT_BANDS]
            if bad:
                hints = [f"{b!r} -> {c!r}" for b in bad if (c := closest(str(b), EUROSAT_BANDS))]
                raise invalid(
                    f"unknown band name(s) {', '.join(repr(b) for b in bad)}; valid names: "
                    + ", ".join(EUROSAT_BANDS),
                    ("rename " + "; ".join(hints)) if hints else "use names from that list",
                )
            dupes = sorted({b for b in value if list(value).count(b) > 1})
            if dupes:
                raise invalid(
                    f"band(s) listed more than once: {', '.join(dupes)}", "list each band once"
                )
            return list(value)
        raise invalid(
            f"bands must be 'all', 'rgb' or a list of band names, got {show(value)}",
            "use bands: all, bands: rgb, or a list such as [B04, B03, B02]",
        )


def _import_modules(raw: Any, key: str, registered_by: Callable[[str], str | None]) -> Any:
    """Import the section's ``modules`` (they register datasets or models), and add the
    module that registered ``raw[key]`` in this process, so that Ray workers, which validate
    the job config again, register it too."""
    if not isinstance(raw, dict) or not isinstance(raw.get("modules", []), list):
        return raw  # the field validation names what is wrong
    modules = list(raw.get("modules", []))
    for index, module in enumerate(modules):
        try:
            importlib.import_module(str(module))
        except ImportError as exc:
            raise invalid(
                f"cannot import module {module!r}: {exc}",
                "install it or put it on PYTHONPATH (every Ray worker imports it too)",
                ("modules", index),
            ) from None
    module = registered_by(str(raw.get(key)))
    if module not in (None, "__main__", *modules):
        raw = {**raw, "modules": [*modules, module]}
    return raw


def _registered(value: str, names: tuple[str, ...], kind: str) -> str:
    """``value`` if a registered ``kind`` (dataset or model) has that name, else one error
    listing the names, the closest one, and how to register one."""
    if value in names:
        return value
    close = closest(value, names)
    key, section = ("dataset", "data") if kind == "dataset" else ("name", "model")
    how = (
        f"register yours with raytrain_hetero.workloads.registry.register_{kind}(...) at the "
        f"top level of a module that {section}.modules lists (Ray workers import it too)"
    )
    raise invalid(
        f"unknown {kind} {value!r}; registered {kind}s: {', '.join(names)}",
        f"use {key}: {close}, or {how}" if close else f"use one of them, or {how}",
    )


class ModelConfig(HeteroModel):
    """Which network to train.

    Attributes:
        name: ``small_cnn``, ``resnet18``, ``resnet50`` (timm/torchgeo, any band count),
            ``cnn3d`` (spectral-spatial 3-D CNN, hyperspectral patches), ``fusion_cnn``
            (two-branch SAR + multispectral late fusion, dataset multimodal) or
            ``marques_cnn`` (Marques et al.'s two wide conv layers, ``conv1`` and ``conv2``:
            the conv-split network), or a name added with
            :func:`~raytrain_hetero.workloads.registry.register_model`.
        width: Base channel width (small_cnn, cnn3d, fusion_cnn branches; marques_cnn:
            kernels of conv1, 500 is the paper's network).
        pretrained: ``false``, or the name of torchgeo weights for a ResNet
            (``ResNet18_Weights.SENTINEL2_ALL_MOCO``), loaded from the local torch hub cache
            only; ``true`` is refused (nothing can be downloaded).
        in_channels: Bands the model takes; checked against the data before training starts
            (``None``: whatever the data has).
        modules: Modules that register models
            (:func:`~raytrain_hetero.workloads.registry.register_model`), imported before
            ``name`` is checked, on the driver and on every Ray worker.
        modalities: fusion_cnn: branches to build, ``[s1, s2]`` (fusion, the default),
            ``[s1]`` or ``[s2]`` (single-branch ablations).
        task: Train this Lightning task (with ``data.datamodule``) instead of ``name``.
        task_args: The task's init arguments, e.g. ``{model: resnet18, in_channels: 13,
            num_classes: 10, lr: 0.001}``.
    """

    name: str = "small_cnn"
    modules: list[str] = Field(default_factory=list)
    width: PositiveInt = 32
    pretrained: bool | str = False
    in_channels: PositiveInt | None = None
    modalities: list[Literal["s1", "s2"]] | None = Field(None, min_length=1, max_length=2)
    task: Literal["torchgeo.ClassificationTask", "torchgeo.SemanticSegmentationTask"] | None = None
    task_args: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _import_model_modules(cls, raw: Any) -> Any:
        return _import_modules(raw, "name", model_registering_module)

    @field_validator("name")
    @classmethod
    def _registered_model(cls, value: str) -> str:
        return _registered(value, model_names(), "model")

    @model_validator(mode="after")
    def _task_arguments(self) -> ModelConfig:
        if self.task is None:
            if self.task_args:
                raise invalid(
                    "task_args without a task",
                    "set model.task (e.g. torchgeo.ClassificationTask), or remove them",
                    ("task_args",),
                )
            return self
        _check_named_class("task", self.task, self.task_args)
        return self

    @model_validator(mode="after")
    def _pretrained_available(self) -> ModelConfig:
        if self.pretrained and self.name not in ("resnet18", "resnet50"):
            raise invalid(
                f"{self.name} has no pretrained weights",
                "set pretrained: false, or use name: resnet18 / resnet50",
                ("pretrained",),
            )
        if isinstance(self.pretrained, str) and "_Weights." not in self.pretrained:
            raise invalid(
                f"pretrained must be false or a torchgeo weights name, got {self.pretrained!r}",
                f"write e.g. pretrained: {self.name.replace('resnet', 'ResNet')}_Weights."
                "SENTINEL2_ALL_MOCO (present in the local torch hub cache), or false",
                ("pretrained",),
            )
        if self.modalities is not None:
            if self.name != "fusion_cnn":
                raise invalid(
                    f"modalities applies to fusion_cnn, not {self.name}",
                    "remove model.modalities, or use name: fusion_cnn",
                    ("modalities",),
                )
            if len(set(self.modalities)) != len(self.modalities):
                raise invalid(
                    "modalities lists a branch twice",
                    "write [s1, s2], [s1] or [s2]",
                    ("modalities",),
                )
        return self


def _check_named_class(kind: str, name: str, arguments: dict[str, Any]) -> None:
    """A ``model.task`` / ``data.datamodule`` name and its arguments, checked against the
    class's signature (imports torchgeo only when the key is set)."""
    from raytrain_hetero.errors import ConfigError
    from raytrain_hetero.workloads.lightning_tasks import (
        check_arguments,
        resolve_datamodule,
        resolve_task,
    )

    try:
        cls = resolve_task(name) if kind == "task" else resolve_datamodule(name)
        check_arguments(cls, arguments, f"{kind}_args")
    except ConfigError as exc:
        raise invalid(
            str(exc), f"fix {kind} / {kind}_args (see the class's documentation)", (kind,)
        ) from None
