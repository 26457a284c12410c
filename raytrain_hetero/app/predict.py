"""``raytrain-hetero predict``: classify a split of a job's dataset with a trained checkpoint.

Everything checkable (data root, unreadable files, checkpoint against model and data) is
checked on the driver before any actor starts; then the library's actor pools
(:mod:`raytrain_hetero.inference.predict`) run and ``predictions/`` (Parquet),
``predict_summary.json`` and, for a scene, ``class_map.tif`` are written atomically. The
checkpoint and the output may be local paths or URIs (through ``ray.storage_filesystem``).
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raytrain_hetero.app.config import JobConfig, check_data_root
from raytrain_hetero.app.outputs import write_summary
from raytrain_hetero.app.runs import check_output_dir
from raytrain_hetero.atomic import move_into_place
from raytrain_hetero.errors import ConfigError
from raytrain_hetero.inference.checkpoints import (
    check_meta_fits,
    check_state_fits,
    find_checkpoint_file,
    load_checkpoint,
)
from raytrain_hetero.inference.predict import (
    PREDICT_MODES,
    PredictMode,
    PredictorSpec,
    format_summary,
    measure_worker_speeds,
    plan_actor_pools,
    run_actor_pools,
    scene_class_map,
    summarise,
)
from raytrain_hetero.storage import StagingDir, StorageLocation, storage_location
from raytrain_hetero.workloads.registry import DataSource

__all__ = ["predictor_spec", "run_predict"]

logger = logging.getLogger(__name__)

_SPLITS = ("train", "val", "test", "scene")


def predictor_spec(
    job: JobConfig,
    checkpoint: Path | StorageLocation,
    split: str,
    exclude: Sequence[str],
    workload: Any = None,
    source: DataSource | None = None,
) -> PredictorSpec:
    """The library's description of a prediction of ``job``'s data and model (``workload``:
    the split opened, ``source``: the job's data source, if the caller holds them)."""
    from raytrain_hetero.app.datasets import (
        data_source,
        model_arguments,
        open_configured_datasets,
    )

    if workload is None:
        workload = open_configured_datasets(job.data, (split,), exclude=list(exclude))
    decode = None
    if job.data.source == "ray_data":  # decoded in Ray Data tasks, not in the predictor actors
        from raytrain_hetero.app.ray_data_source import decode_rows

        decode = functools.partial(decode_rows, data_json=job.data.model_dump_json(), split=split)
    return PredictorSpec(
        source=source if source is not None else data_source(job.data),
        model_name=job.model.name,
        model_kwargs=model_arguments(job.model, workload),
        checkpoint=checkpoint if isinstance(checkpoint, StorageLocation) else str(checkpoint),
        split=split,
        samples=len(workload.datasets[split]),
        exclude=tuple(exclude),
        decode=decode,
    )


def run_predict(
    job: JobConfig,
    checkpoint: str | os.PathLike[str] | StorageLocation,
    *,
    output_dir: str | os.PathLike[str] | None = None,
    split: str | None = None,
    mode: PredictMode = "proportional",
    batch_size: int = 128,
    speeds: Sequence[float] | None = None,
    probe_repeats: int = 3,
    quiet: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Predict a split (default ``test``; a hyperspectral scene: every pixel) and write it;
    returns the summary (also ``predict_summary.json``).

    Args:
        job: The job config the checkpoint was trained with (data, model, workers).
        checkpoint: ``model.pt``, a checkpoint directory, or a training output or run
            directory; a local path or a URI (``s3://bucket/runs/NAME``).
        output_dir: Where the outputs go (default: ``<job.output_dir>/predict``).
        split: ``train`` / ``val`` / ``test``, or ``scene`` (hyperspectral only).
        mode: ``proportional``, ``equal`` or ``single`` (:mod:`raytrain_hetero.inference.predict`).
        batch_size: Batch of the fastest actor (proportional) or of every actor.
        speeds: Per-group samples/s to use instead of probing.
        probe_repeats: Timed batches per probe. quiet: Print nothing.
        overwrite: Write into a non-empty output directory (``predictions/`` is replaced only
            if it holds nothing but Parquet parts).

    Raises:
        DataError: Missing/unreadable checkpoint or data; checkpoint trained on other bands.
        ConfigError: Invalid mode/split/batch size; a non-empty output directory without
            ``overwrite``; a ``predictions/`` holding files predict did not write.
    """
    import pyarrow.parquet as pq
    import ray

    from raytrain_hetero.app.resolved import resolve_data
    from raytrain_hetero.workloads.data import bad_files, open_datasets
    from raytrain_hetero.workloads.hyperspectral import write_class_map
    from raytrain_hetero.workloads.models import build_model
    from raytrain_hetero.workloads.registry import dataset_adapter, dataset_names

    if job.model.task is not None:  # a Lightning task's checkpoint: its own predict
        from raytrain_hetero.app.lightning_job import run_task_predict

        return run_task_predict(
            job, checkpoint, output_dir=output_dir, overwrite=overwrite, quiet=quiet
        )
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
    if mode not in PREDICT_MODES:
        raise ConfigError(f"--mode must be one of {list(PREDICT_MODES)}, got {mode!r}")
    # The source and its adapter, once (the root is checked below, after the outputs).
    data = resolve_data(job, check_root=False)
    is_scene = data.adapter.whole_scene
    split = split or ("scene" if is_scene else "test")
    if split == "scene" and not is_scene:
        scenes = [name for name in dataset_names() if dataset_adapter(name).whole_scene]
        raise ConfigError(
            f"split 'scene' (every pixel) applies to scene datasets "
            f"({', '.join(scenes)}) only, not {job.data.dataset!r}"
        )
    if split not in _SPLITS:
        raise ConfigError(f"split must be train, val, test or scene, got {split!r}")
    target = job.ray.location(output_dir or f"{job.output_dir}/predict")
    check_output_dir(target, overwrite=overwrite, resume=False)
    _check_replaceable(target.join("predictions"))
    checkpoint_file = find_checkpoint_file(job.ray.location(checkpoint))
    # Written to a local directory (for a URI: a fresh one), then published.
    outputs = StagingDir(target)
    out = outputs.local
    predictions_dir = out / "predictions"

    # Everything checkable happens here, before any actor starts.
    check_data_root(job.data, adapter=data.adapter)
    exclude = bad_files(data.source, adapter=data.adapter)
    workload = open_datasets(data.source, (split,), exclude=exclude, adapter=data.adapter)
    total = len(workload.datasets[split])
    spec = predictor_spec(job, checkpoint_file, split, exclude, workload, source=data.source)
    model = build_model(spec.model_name, **spec.model_kwargs)
    state, meta = load_checkpoint(checkpoint_file)
    check_meta_fits(meta, checkpoint=str(checkpoint_file), data=workload)
    check_state_fits(model, state, checkpoint=str(checkpoint_file), data_bands=workload.in_channels)
    del model, state

    if not ray.is_initialized():
        # Until the driver owns Ray sessions, the job's own start-up (address or local Ray).
        from raytrain_hetero.app.job import init_ray

        init_ray(job)
    if speeds is None:
        speeds = measure_worker_speeds(spec, job.workers, batch_size, probe_repeats)
    plans = plan_actor_pools(job.workers, list(speeds), total, batch_size, mode)
    # Written into a fresh directory of our own, then moved into place: an old predictions/
    # is replaced only after the new one is complete, and only its Parquet parts are deleted.
    out.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".predictions-", dir=out))
    try:
        wall = run_actor_pools(spec, plans, staging / "predictions")
        _remove_parquet_parts(predictions_dir)
        move_into_place(staging / "predictions", predictions_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # created above, by this call

    table = pq.read_table(predictions_dir).to_pandas()
    summary = summarise(table, plans, wall, mode, split, checkpoint_file, total)
    summary["source"] = job.data.source
    if is_scene and split == "scene":
        class_map = scene_class_map(workload, table)
        written = write_class_map(class_map, out / "class_map.tif", profile=workload.scene.profile)
        summary["class_map"] = str(target.join(written.name) if target.remote else written)
    write_summary(summary, out / "predict_summary.json")  # NaN (no labelled sample): null
    if target.remote:
        _remove_parquet_parts(target.join("predictions"))
        outputs.publish()
    if not quiet:
        print(format_summary(summary))
        print(f"outputs: {target}")
    return summary


def _check_replaceable(predictions_dir: Path | StorageLocation) -> None:
    """Refuse a ``predictions/`` that holds anything predict does not write."""
    location = storage_location(predictions_dir)
    foreign = [
        name
        for name in location.list_names()
        if not (name.endswith(".parquet") and location.join(name).is_file())
    ]
    if foreign:
        raise ConfigError(
            f"{predictions_dir} holds files predict did not write ({', '.join(foreign[:3])}); "
            "it will not delete them. Fix: choose another --output, or move them away."
        )


def _remove_parquet_parts(predictions_dir: Path | StorageLocation) -> None:
    """Delete the Parquet parts of an earlier prediction, then the (now empty) directory."""
    location = storage_location(predictions_dir)
    if not location.exists():
        return
    _check_replaceable(location)
    for name in location.list_names():
        location.filesystem.delete_file(location.join(name).path)
    location.filesystem.delete_dir(location.path)
