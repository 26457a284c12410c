"""The job's Lightning path: ``model.task`` + ``data.datamodule`` trained on HeteroTrainer.

:func:`lightning_loop` builds the task from ``model.task_args`` and the datamodule from
``data.datamodule_args`` (``data.root`` as the ``paths`` or ``root`` the class takes) and trains
them with a Trainer prepared by :mod:`raytrain_hetero.worker.lightning`; the task's own
optimiser applies, epochs, batch, seed and workers are the job's. On the driver,
:func:`check_task_job` (the resolved job's Lightning part) builds both once and runs one
validation batch through the task, so a wrong band or class count fails before any worker
starts. :func:`run_task_predict` writes GeoTIFF class maps.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raytrain_hetero.app.config import JobConfig, validate_config
from raytrain_hetero.app.datasets import DataSizes
from raytrain_hetero.atomic import atomic_write_json
from raytrain_hetero.config.problems import construct
from raytrain_hetero.errors import ConfigError, DataError

if TYPE_CHECKING:
    import lightning.pytorch as pl

    from raytrain_hetero.workloads.registry import DataSource

__all__ = [
    "ACCURACY_KEYS",
    "CheckedTask",
    "build_datamodule",
    "build_task",
    "check_task_job",
    "lightning_loop",
    "prepare_lightning_data",
    "run_task_predict",
]

logger = logging.getLogger(__name__)

#: Validation accuracy as torchgeo's tasks log it, by task (the summary's final_val_accuracy).
ACCURACY_KEYS: tuple[str, ...] = ("val_OverallAccuracy", "val_MulticlassAccuracy", "val_Accuracy")


def build_task(job: JobConfig) -> pl.LightningModule:
    """The configured task (``model.task`` with ``model.task_args``).

    Raises:
        ConfigError: The task's constructor failed (naming ``model.task_args``).
    """
    from raytrain_hetero.workloads.lightning_tasks import resolve_task

    if job.model.task is None:
        raise ConfigError("build_task needs model.task")
    cls = resolve_task(job.model.task)
    return construct(
        f"building model.task {job.model.task} with model.task_args {job.model.task_args}",
        lambda: cls(**job.model.task_args),
        "correct model.task_args (model, backbone, in_channels, num_classes...).",
    )


def build_datamodule(job: JobConfig, stage: str | None = None) -> pl.LightningDataModule:
    """The configured datamodule (set up for ``stage`` if given): ``data.datamodule_args`` plus,
    unless they set them, ``data.root`` as the ``paths`` or ``root`` the class takes,
    ``batch_size`` ``train.global_batch_size`` and ``num_workers`` ``data.num_workers``.

    Raises:
        ConfigError: The datamodule or its dataset failed to build (one line naming the settings).
    """
    from raytrain_hetero.workloads.lightning_tasks import location_argument, resolve_datamodule

    if job.data.datamodule is None:
        raise ConfigError(
            "model.task needs a datamodule. Fix: set data.datamodule, e.g. "
            "torchgeo.EuroSATDataModule or raytrain_hetero.SceneSegmentationDataModule."
        )
    given = job.data.datamodule_args
    cls = resolve_datamodule(job.data.datamodule)
    args: dict[str, Any] = {"batch_size": job.train.global_batch_size}
    args["num_workers"] = job.data.num_workers
    location = location_argument(cls)
    if location is not None and "root" not in given and "paths" not in given:
        args[location] = str(job.data.root)
    args.update(given)
    what = f"building data.datamodule {job.data.datamodule} with {args}"
    fix = "correct data.root (or datamodule_args paths/root) and data.datamodule_args."
    datamodule = construct(what, lambda: cls(**args), fix)
    if stage is not None:
        construct(f"{what}: setup({stage!r})", lambda: datamodule.setup(stage), fix)
    return datamodule


@dataclass(frozen=True, eq=False)
class CheckedTask:
    """A task job's Lightning part, built and checked once on the driver.

    Attributes:
        sizes: Training draws per epoch (a ``GeoDataModule``: its sampler's), validation
            samples and bands, as the datamodule gives them.
        task: The task (``model.task`` with ``model.task_args``), in eval mode.
        datamodule: The datamodule, set up for ``"fit"``.
    """

    sizes: DataSizes
    task: pl.LightningModule
    datamodule: pl.LightningDataModule


def prepare_lightning_data(job: JobConfig) -> dict[str, int]:
    """Driver-side checks of a task job (:func:`check_task_job`); returns split sizes (and
    ``bands``) like :func:`~raytrain_hetero.app.job.prepare_dataset`."""
    return check_task_job(job).sizes.as_dict()


def check_task_job(job: JobConfig, source: DataSource | None = None) -> CheckedTask:
    """Build the task job's datamodule and task once and check them against each other and
    the workers: one validation batch through the task, its class count against the labels,
    the training size against the workers' ``train.min_slice`` each. ``source``: the job's
    data source (generated first if ``data.generate`` is set); converted from ``job.data`` if
    not given.

    Raises:
        DataError: Missing data, or a task that cannot take the datamodule's batches.
        ConfigError: The datamodule, its dataset or the task failed to build, or too few
            training samples for the workers.
    """
    import torch

    from raytrain_hetero.worker.lightning import geo_draws
    from raytrain_hetero.workloads.data import generate_dataset

    if job.data.generate is not None:
        if source is None:
            from raytrain_hetero.app.datasets import data_source

            source = data_source(job.data)
        generate_dataset(source)
    if not Path(job.data.root).exists():
        raise DataError(
            f"data.root {job.data.root} does not exist. Fix: point it at the dataset, or set "
            "data.generate to create a synthetic one."
        )
    datamodule = build_datamodule(job, "fit")
    fix = "correct data.datamodule_args (patch_size, length, splits) for the data at data.root."
    train_loader = construct(
        "the datamodule's train_dataloader()", datamodule.train_dataloader, fix
    )
    draws = geo_draws(train_loader, job.train.seed)
    train_size = len(draws) if draws is not None else len(train_loader.dataset)
    need = job.total_workers * job.train.min_slice_samples
    if train_size < need:
        raise ConfigError(
            f"the datamodule's training set has {train_size} samples but {job.total_workers} "
            f"workers need at least {need}; use more data (or datamodule_args length) or "
            "fewer workers."
        )
    val_loader = construct("the datamodule's val_dataloader()", datamodule.val_dataloader, fix)
    batch = construct("reading a validation batch", lambda: next(iter(val_loader)), fix)
    task = build_task(job)
    task.eval()
    try:
        with torch.no_grad():
            out = task(batch["image"])
    except RuntimeError as exc:
        raise DataError(
            f"{job.model.task} with task_args {job.model.task_args} cannot take the "
            f"datamodule's images of shape {tuple(batch['image'].shape)}: {exc}. Fix: "
            "task_args.in_channels (bands) and the datamodule's bands."
        ) from exc
    labels = batch.get("mask", batch.get("label"))
    classes = out.shape[1]
    if labels is not None and int(labels.max()) >= classes:
        raise DataError(
            f"the datamodule has class id {int(labels.max())} but the task predicts "
            f"{classes} classes. Fix: task_args.num_classes >= {int(labels.max()) + 1}."
        )
    sizes = DataSizes(train_size, len(val_loader.sampler), int(batch["image"].shape[1]))
    return CheckedTask(sizes=sizes, task=task, datamodule=datamodule)


def _report_callback() -> Any:
    from raytrain_hetero.worker.lightning import HeteroReportCallback

    class JobReportCallback(HeteroReportCallback):
        """Adds ``val_accuracy`` (what the job summary reads) from torchgeo's metric name."""

        def collect_metrics(self, trainer: pl.Trainer) -> dict[str, Any]:
            metrics = super().collect_metrics(trainer)
            for key in ACCURACY_KEYS:
                if key in metrics:
                    metrics["val_accuracy"] = metrics[key]
                    break
            return metrics

    return JobReportCallback()


def lightning_loop(config: dict[str, Any]) -> None:
    """Per-worker loop of a task job: the task and datamodule through a prepared Trainer."""
    import lightning.pytorch as pl
    import torch

    import raytrain_hetero as rh
    from raytrain_hetero.worker import lightning as rhl

    job = validate_config(config["job"], source="job config on a worker")
    torch.manual_seed(job.train.seed)
    task = build_task(job)
    datamodule = build_datamodule(job)
    device = rh.get_device()
    trainer = pl.Trainer(
        max_epochs=job.train.epochs,
        accelerator="gpu" if device.type == "cuda" else "cpu",
        devices=[device.index or 0] if device.type == "cuda" else 1,
        strategy=rhl.HeteroDDPStrategy(),
        plugins=[rhl.HeteroLightningEnvironment()],
        callbacks=[_report_callback()],
        use_distributed_sampler=False,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    rhl.fit(rhl.prepare_trainer(trainer), task, datamodule=datamodule)


def run_task_predict(
    job: JobConfig,
    checkpoint: str | Path,
    *,
    output_dir: str | Path | None = None,
    overwrite: bool = False,
    quiet: bool = False,
) -> dict[str, Any]:
    """``predict`` for a segmentation task: a GeoTIFF class map of every scene image.

    Each ``<name>.tif`` under ``data.root`` (not ``*_gt.tif``) gives
    ``<output>/<name>_class_map.tif`` with the scene's CRS and transform; the summary
    (``predict_summary.json``) holds the pixel accuracy on labelled pixels.
    """
    import numpy as np
    import rasterio

    from raytrain_hetero.app.runs import check_output_dir
    from raytrain_hetero.workloads.lightning_tasks import resolve_task
    from raytrain_hetero.workloads.scene_segmentation import predict_class_map

    if job.model.task != "torchgeo.SemanticSegmentationTask":
        raise ConfigError(
            f"predict for model.task {job.model.task} is not supported; it writes class maps "
            "of torchgeo.SemanticSegmentationTask scenes. Fix: evaluate with Lightning's "
            "trainer.test on the checkpoint."
        )
    out = Path(output_dir or (Path(job.output_dir) / "predict")).resolve()
    check_output_dir(out, overwrite=overwrite, resume=False)
    from raytrain_hetero.inference.checkpoints import find_checkpoint_file
    from raytrain_hetero.worker.lightning import CHECKPOINT_NAME

    file = find_checkpoint_file(Path(checkpoint), CHECKPOINT_NAME)
    task = resolve_task(job.model.task).load_from_checkpoint(file, map_location="cpu")
    patch = int(job.data.datamodule_args.get("patch_size", 32))
    scenes = sorted(p for p in Path(job.data.root).glob("*.tif") if not p.stem.endswith("_gt"))
    if not scenes:
        raise DataError(f"{job.data.root}: no scene GeoTIFF (<name>.tif) to predict.")
    results = []
    for scene in scenes:
        written = predict_class_map(
            task.model, scene, out / f"{scene.stem}_class_map.tif", patch_size=patch
        )
        truth_file = scene.with_name(f"{scene.stem}_gt.tif")
        if truth_file.exists():
            with rasterio.open(truth_file) as src:
                truth = src.read(1)
            with rasterio.open(written["class_map"]) as src:
                predicted = src.read(1)
            labelled = truth > 0
            written["pixel_accuracy"] = float(np.mean(predicted[labelled] == truth[labelled]))
        results.append(written)
    summary = {"checkpoint": str(file), "scenes": results}
    atomic_write_json(out / "predict_summary.json", summary)
    if not quiet:
        for r in results:
            print(f"class map: {r['class_map']} (accuracy {r.get('pixel_accuracy', 'n/a')})")
    return summary
