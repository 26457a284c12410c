"""The job's data section -> a library :class:`~raytrain_hetero.workloads.registry.DataSource`.

The YAML schema (:class:`~raytrain_hetero.app.config.DataConfig`) describes data in the job's
words; :func:`data_source` converts it into the library's frozen ``DataSource``, and every
dataset-specific step (generation, bad-file checks, opening, band counts) is then the
registered adapter's (:mod:`raytrain_hetero.workloads.registry`). The functions here keep the
job-facing names the training job, the predictor and the loader benchmark call.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from raytrain_hetero.app.config import DataConfig, JobConfig, ModelConfig
from raytrain_hetero.config.problems import construct
from raytrain_hetero.errors import DataError
from raytrain_hetero.workloads.data import (
    bad_files,
    decoded_once_per_node,
    generate_dataset,
    open_datasets,
)
from raytrain_hetero.workloads.data import model_arguments as workload_model_arguments
from raytrain_hetero.workloads.registry import (
    DataSource,
    WorkloadData,
)

__all__ = [
    "DataSizes",
    "WorkloadData",
    "check_model_fits_data",
    "configured_bad_files",
    "data_source",
    "generate_configured_dataset",
    "model_arguments",
    "open_configured_datasets",
    "open_worker_data",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class DataSizes:
    """What the driver's checks found in a job's data.

    Attributes:
        train: Training samples per epoch (a ``GeoDataModule``: its sampler's draws).
        val: Validation samples.
        bands: Bands (channels) per sample.
    """

    train: int
    val: int
    bands: int

    def as_dict(self) -> dict[str, int]:
        """``{"train", "val", "bands"}``, as summary.json and the older callers read them."""
        return {"train": self.train, "val": self.val, "bands": self.bands}


def data_source(data: DataConfig) -> DataSource:
    """The library description of what ``data`` asks to read."""
    return DataSource(
        dataset=data.dataset,
        root=Path(data.root),
        bands=tuple(data.bands) if isinstance(data.bands, list) else data.bands,
        image_size=data.image_size,
        on_bad_file=data.on_bad_file,
        scene=data.hyperspectral,
        generate=data.generate,
    )


def generate_configured_dataset(data: DataConfig) -> Path | None:
    """Run the dataset's generator if ``data.generate`` is set (cached); return the root."""
    return generate_dataset(data_source(data))


def configured_bad_files(data: DataConfig) -> list[str]:
    """Unreadable files to leave out per ``data.on_bad_file`` (cached); see
    :func:`raytrain_hetero.workloads.data.bad_files`."""
    return bad_files(data_source(data))


def open_configured_datasets(
    data: DataConfig,
    splits: Sequence[str] = ("train", "val"),
    *,
    exclude: Sequence[str] | None = None,
) -> WorkloadData:
    """Open the configured dataset's splits (after generation), leaving out ``exclude`` (``None``:
    the unreadable files :func:`configured_bad_files` found).
    """
    return open_datasets(data_source(data), splits, exclude=exclude)


def open_worker_data(
    job: JobConfig, splits: Sequence[str]
) -> tuple[WorkloadData, dict[str, Any], Any]:
    """On a worker: the job's splits (with ``data.cache``, decoded once per node and
    memory-mapped) and its model, built; returns ``(workload, datasets, model)``."""
    from raytrain_hetero.workloads.models import build_model

    workload = open_configured_datasets(job.data, splits)
    datasets = workload.datasets
    if job.data.cache:
        datasets = decoded_once_per_node(data_source(job.data), datasets)
    return workload, datasets, build_model(job.model.name, **model_arguments(job.model, workload))


def model_arguments(model: ModelConfig, data: WorkloadData) -> dict[str, Any]:
    """Keyword arguments of :func:`~raytrain_hetero.workloads.models.build_model`."""
    return workload_model_arguments(
        data,
        model.name,
        width=model.width,
        pretrained=model.pretrained,
        modalities=model.modalities,
    )


def check_model_fits_data(
    model_cfg: ModelConfig, data: WorkloadData, source: str | os.PathLike[str]
) -> Any:
    """Build the configured model once on the driver and check its input bands against the
    data, so a mismatch stops the job before any worker starts; returns the model.

    Raises:
        DataError: Band-count mismatch (naming the source, both counts and the fix).
        ConfigError: The model cannot be built (e.g. pretrained weights not cached, a
            registered builder that rejects the settings), one line naming them.
    """
    from raytrain_hetero.workloads.models import build_model, check_input_channels

    if model_cfg.in_channels is not None and model_cfg.in_channels != data.in_channels:
        raise DataError(
            f"band-count mismatch: {source} has {data.in_channels} band(s) per sample but "
            f"model.in_channels is {model_cfg.in_channels}. Fix: set model.in_channels: "
            f"{data.in_channels} (or remove it to take the data's), or select other bands."
        )
    args = model_arguments(model_cfg, data)
    model = construct(
        f"building model.name {model_cfg.name} with {args}",
        lambda: build_model(model_cfg.name, **args),
        "correct the model.* settings (width, in_channels, pretrained) or the model's builder.",
    )
    check_input_channels(model, data.in_channels, source=str(source))
    return model
