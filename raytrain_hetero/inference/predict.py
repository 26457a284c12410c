"""Distributed inference on heterogeneous workers: Ray Data ``map_batches`` over actor pools.

``raytrain-hetero predict --config JOB.yaml --checkpoint DIR`` classifies a split of the job's
dataset (or, for a hyperspectral scene, every pixel) with a trained checkpoint.

How the work is divided (``mode="proportional"``, the default):

1. *Measure*: one probe actor per worker group of the job's ``workers:`` section (same
   resources, placement labels and emulated slowdown as that group's predictors) times
   whole predict batches -- reading and decoding the samples plus the forward pass -- and
   reports samples/s. Groups are probed one after another, so they do not contend.
2. *Size*: every group gets its own actor pool (``count`` actors, a ``map_batches`` stage
   with that group's ``num_cpus`` / ``num_gpus`` / ``resources`` / ``label_selector``), a
   per-actor batch size proportional to its measured speed (the fastest group gets
   ``batch_size``), and a share of the samples proportional to its pool's total speed. Every
   actor then runs about the same number of batches of about the same duration, so the pools
   finish together -- the inference analogue of the trainer's carving.
3. *Run*: the per-group datasets are unioned and written as Parquet (one row per sample:
   index, sample id, label, prediction, confidence, worker, batch timing). For a
   hyperspectral scene the predicted class map is also written as a GeoTIFF (georeferenced
   if the scene was).

``mode="equal"`` gives every actor the same batch size and the same share (speed-unaware,
the usual setup) and ``mode="single"`` runs one actor of the fastest group: the two
baselines the proportional plan is compared with. ``emulated_slowdown`` of a worker group is
EMULATION for CPU-only machines: an actor sleeps (factor - 1) x the process CPU time of each
batch, imitating a slower device.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from raytrain_hetero.app.config import JobConfig, WorkerSpec
from raytrain_hetero.core.allocation import largest_remainder
from raytrain_hetero.errors import ConfigError, DataError

__all__ = [
    "ActorPlan",
    "ModelPredictor",
    "PredictMode",
    "find_checkpoint_file",
    "load_checkpoint",
    "load_checkpoint_state",
    "plan_actor_pools",
    "run_predict",
]

logger = logging.getLogger(__name__)

PredictMode = Literal["proportional", "equal", "single"]
PREDICT_MODES: tuple[str, ...] = ("proportional", "equal", "single")
CHECKPOINT_FILE = "model.pt"


# ----------------------------------------------------------------------------- checkpoints


def find_checkpoint_file(path: str | os.PathLike[str]) -> Path:
    """Resolve ``path`` to a ``model.pt``: the file itself, a checkpoint directory holding
    one, or a run/output directory (the newest ``checkpoint_*/model.pt`` below it).

    Raises:
        DataError: Nothing usable at ``path`` (the message says what was looked for).
    """
    p = Path(path).expanduser()
    if p.is_file():
        return p
    if (p / CHECKPOINT_FILE).is_file():
        return p / CHECKPOINT_FILE
    if p.is_dir():
        found = sorted(p.rglob(f"checkpoint_*/{CHECKPOINT_FILE}"), key=lambda f: f.stat().st_mtime)
        if found:
            logger.info("using the newest checkpoint under %s: %s", p, found[-1])
            return found[-1]
    raise DataError(
        f"no checkpoint at {p}: expected a {CHECKPOINT_FILE} file, a checkpoint directory "
        f"holding one, or a training output directory with checkpoint_*/{CHECKPOINT_FILE}. "
        "Fix: pass --checkpoint pointing at one (raytrain-hetero train writes them under "
        "<output>/ray_results/)."
    )


def load_checkpoint_state(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The model ``state_dict`` of a trainer checkpoint (``{"model": ..., "optimizer": ...}``)
    or of a bare state dict file, loaded with ``weights_only=True``.

    Raises:
        DataError: Unreadable or foreign file (naming it).
    """
    return load_checkpoint(path)[0]


def load_checkpoint(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(state_dict, meta)`` of a checkpoint; ``meta`` is the ``"meta"`` entry the training
    job writes (dataset, in_channels, num_classes, s1_channels), or ``{}``.

    Raises:
        DataError: Unreadable or foreign file (naming it).
    """
    import torch

    file = find_checkpoint_file(path)
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - corrupt, truncated, or not a torch file
        raise DataError(f"{file}: cannot load the checkpoint ({type(exc).__name__}: {exc}). "
                        "Fix: point --checkpoint at a model.pt written by raytrain-hetero train.") from exc
    meta: dict[str, Any] = {}
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        meta = dict(state.get("meta") or {})
        state = state["model"]
    if not isinstance(state, dict) or not all(hasattr(v, "shape") for v in state.values()):
        raise DataError(f"{file}: not a model checkpoint (expected {{'model': state_dict}})")
    return state, meta


def check_meta_fits(meta: dict[str, Any], *, checkpoint: str, data: Any) -> None:
    """Raise a DataError if the checkpoint's recorded data shape differs from ``data``'s
    (catches band changes that leave parameter shapes alone, e.g. the 3-D CNN's bands)."""
    bands = meta.get("in_channels")
    if bands is not None and int(bands) != data.in_channels:
        raise DataError(
            f"band-count mismatch: {checkpoint} was trained on {bands} band(s) per sample but the "
            f"data has {data.in_channels}. Fix: predict on data with the bands the model was "
            "trained on (data.bands / dataset / scene), or retrain."
        )
    classes = meta.get("num_classes")
    if classes is not None and int(classes) != data.num_classes:
        raise DataError(
            f"{checkpoint} was trained for {classes} classes but the data has {data.num_classes}. "
            "Fix: use the dataset the model was trained on."
        )


def check_state_fits(model: Any, state: dict[str, Any], *, checkpoint: str, data_bands: int) -> None:
    """Raise a DataError naming the mismatch if ``state`` cannot load into ``model``.

    A different first-layer input width is reported as a band-count mismatch (the
    checkpoint was trained on other bands than the data has)."""
    own = model.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    wrong = [(k, tuple(state[k].shape), tuple(own[k].shape)) for k in own
             if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if wrong:
        key, theirs, ours = wrong[0]
        if len(theirs) >= 2 and len(ours) >= 2 and theirs[0] == ours[0] and theirs[1] != ours[1] \
                and key == next(k for k, v in own.items() if getattr(v, "ndim", 0) >= 2):
            raise DataError(
                f"band-count mismatch: {checkpoint} was trained on {theirs[1]} input band(s) "
                f"(layer {key} {theirs}) but the data has {data_bands}. Fix: predict on data "
                "with the bands the model was trained on (data.bands / dataset), or retrain."
            )
        raise DataError(
            f"{checkpoint} does not fit the configured model: {key} is {theirs} in the "
            f"checkpoint but {ours} in the model ({len(wrong)} such layer(s)). Fix: use the "
            "config the checkpoint was trained with (model.name, model.width, classes)."
        )
    if missing or unexpected:
        raise DataError(
            f"{checkpoint} does not fit the configured model: missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}. Fix: use the config the checkpoint was trained with."
        )


# ----------------------------------------------------------------------------- the actor


class ModelPredictor:
    """Ray Data ``map_batches`` callable class: one model replica plus its dataset.

    Each call receives a batch ``{"index": int64 array}`` of sample indices, reads and decodes
    those samples itself (so loading runs on the heterogeneous workers, in parallel), runs
    the model and returns one row per sample.

    Args:
        job: ``JobConfig.model_dump(mode="json")``.
        checkpoint: Path of the ``model.pt`` to load.
        split: Dataset split to read (hyperspectral: also ``"scene"``).
        worker: Name of the worker group (recorded with every prediction).
        slowdown: EMULATION factor >= 1 (see the module docstring).
        device: ``"cpu"`` or ``"cuda"``.
        threads: torch intra-op threads (the actor's CPUs).
        exclude: Files / sample ids to leave out (as the driver found them).
    """

    def __init__(
        self,
        job: dict[str, Any],
        checkpoint: str,
        split: str,
        worker: str,
        slowdown: float = 1.0,
        device: str = "cpu",
        threads: int = 1,
        exclude: Sequence[str] = (),
    ) -> None:
        import torch

        from raytrain_hetero.app.datasets import model_arguments, open_configured_datasets
        from raytrain_hetero.workloads.models import build_model

        torch.set_num_threads(max(1, int(threads)))
        from raytrain_hetero.app.config import validate_config

        cfg = validate_config(job, source="job config on a predictor")
        self.workload = open_configured_datasets(cfg.data, (split,), exclude=list(exclude))
        self.dataset = self.workload.datasets[split]
        self.device = torch.device(device)
        model = build_model(cfg.model.name, **model_arguments(cfg.model, self.workload))
        model.load_state_dict(load_checkpoint_state(checkpoint))
        self.model = model.to(self.device).eval()
        self.worker = worker
        self.slowdown = float(slowdown)
        self.sample_id = _sample_ids(self.dataset)

    def _images(self, indices: np.ndarray) -> tuple[Any, Any]:
        import torch
        from torch.utils.data import default_collate

        getitems = getattr(self.dataset, "__getitems__", None)
        items = getitems(indices.tolist()) if getitems else [self.dataset[int(i)] for i in indices]
        batch = default_collate(items)
        return batch["image"], batch["label"].to(torch.int64)

    def predict(self, indices: np.ndarray) -> dict[str, np.ndarray]:
        """Predict the samples at ``indices``; returns the output columns."""
        import torch

        started = time.time()
        cpu0 = time.process_time()
        images, labels = self._images(indices)
        with torch.inference_mode():
            logits = self.model(images.to(self.device, non_blocking=True))
            probs = torch.softmax(logits.float(), dim=1)
            confidence, prediction = probs.max(dim=1)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if self.slowdown > 1.0:  # EMULATION: stretch this actor's own compute
            time.sleep((self.slowdown - 1.0) * (time.process_time() - cpu0))
        ended = time.time()
        n = len(indices)
        return {
            "index": indices.astype(np.int64),
            "sample_id": np.asarray([self.sample_id(int(i)) for i in indices], dtype=str),
            "label": labels.numpy().astype(np.int64),
            "prediction": prediction.cpu().numpy().astype(np.int64),
            "confidence": confidence.cpu().numpy().astype(np.float32),
            "worker": np.asarray([self.worker] * n, dtype=str),
            "batch_size": np.full(n, n, dtype=np.int64),
            "batch_start": np.full(n, started, dtype=np.float64),
            "batch_end": np.full(n, ended, dtype=np.float64),
        }

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.predict(np.asarray(batch["index"], dtype=np.int64))

    def measure(self, batch_size: int, repeats: int = 3, warmup: int = 1, seed: int = 0) -> float:
        """Samples/s of whole predict batches (read + decode + forward), median of ``repeats``."""
        rng = np.random.default_rng(seed)
        size = len(self.dataset)
        times = []
        for r in range(warmup + repeats):
            indices = rng.integers(0, size, size=min(batch_size, size))
            t0 = time.perf_counter()
            self.predict(indices)
            if r >= warmup:
                times.append(time.perf_counter() - t0)
        return float(min(batch_size, size) / float(np.median(times)))

    def size(self) -> int:
        """Number of samples in the split."""
        return len(self.dataset)


def _sample_ids(dataset: Any) -> Any:
    """index -> a stable sample id (file path relative to nothing, pixel 'row_col', id)."""
    if hasattr(dataset, "samples"):  # torchgeo ImageFolder datasets
        paths = [os.path.basename(p) for p, _ in dataset.samples]
        return lambda i: paths[i]
    if hasattr(dataset, "ids"):  # multimodal pairs
        return lambda i: dataset.ids[i]
    if hasattr(dataset, "centres"):  # hyperspectral patches
        centres = dataset.centres.numpy()
        return lambda i: f"{centres[i, 0]}_{centres[i, 1]}"
    return lambda i: str(i)


# ----------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class ActorPlan:
    """One actor pool of the prediction.

    Attributes:
        worker: Worker group name. count: Actors in the pool. batch_size: Per-actor batch.
        samples: Samples the pool predicts. speed: Measured samples/s of one actor.
        spec: The worker group's spec (resources, labels, slowdown).
    """

    worker: str
    count: int
    batch_size: int
    samples: int
    speed: float
    spec: WorkerSpec


def plan_actor_pools(
    specs: Sequence[WorkerSpec],
    speeds: Sequence[float],
    total: int,
    batch_size: int,
    mode: PredictMode,
) -> list[ActorPlan]:
    """Split ``total`` samples over the worker groups' actor pools.

    * proportional: per-actor batch ``batch_size * speed / fastest speed`` (>= 1), pool share
      proportional to ``count * speed`` (largest remainder rounding).
    * equal: every actor gets ``batch_size`` and the same share of the samples.
    * single: one actor of the fastest group predicts everything with ``batch_size``.
    """
    if mode not in PREDICT_MODES:
        raise ConfigError(f"predict mode must be one of {list(PREDICT_MODES)}, got {mode!r}")
    if len(specs) != len(speeds) or not specs:
        raise ConfigError("need one measured speed per worker group")
    if any(not (s > 0 and math.isfinite(s)) for s in speeds):
        raise ConfigError(f"measured speeds must be positive, got {list(speeds)}")
    if mode == "single":
        best = int(np.argmax(speeds))
        return [ActorPlan(specs[best].name, 1, batch_size, total, float(speeds[best]), specs[best])]
    fastest = max(speeds)
    if mode == "proportional":
        weights = [spec.count * s for spec, s in zip(specs, speeds)]
        batches = [max(1, round(batch_size * s / fastest)) for s in speeds]
    else:
        weights = [float(spec.count) for spec in specs]
        batches = [batch_size] * len(specs)
    shares = largest_remainder(np.asarray(weights) / sum(weights) * total, total)
    return [
        ActorPlan(spec.name, spec.count, int(b), int(n), float(s), spec)
        for spec, s, b, n in zip(specs, speeds, batches, shares)
        if n > 0
    ]


# ----------------------------------------------------------------------------- driver


def _remote_options(spec: WorkerSpec) -> dict[str, Any]:
    resources = dict(spec.resources)
    options: dict[str, Any] = {"num_cpus": resources.pop("CPU", 1.0)}
    gpus = resources.pop("GPU", 0.0)
    if gpus:
        options["num_gpus"] = gpus
    if resources:
        options["resources"] = resources
    if spec.label_selector:
        options["label_selector"] = dict(spec.label_selector)
    return options


def _predictor_kwargs(job: JobConfig, checkpoint: Path, split: str, spec: WorkerSpec,
                      exclude: Sequence[str]) -> dict[str, Any]:
    return {
        "job": job.model_dump(mode="json"),
        "checkpoint": str(checkpoint),
        "split": split,
        "worker": spec.name,
        "slowdown": spec.emulated_slowdown,
        "device": spec.resolved_device(),
        "threads": max(1, int(spec.resources.get("CPU", 1))),
        "exclude": list(exclude),
    }


def measure_worker_speeds(
    job: JobConfig, checkpoint: Path, split: str, batch_size: int, exclude: Sequence[str],
    repeats: int = 3,
) -> list[float]:
    """Samples/s of one predictor actor of each worker group, probed one group at a time."""
    import ray

    speeds = []
    for spec in job.workers:
        actor_cls = ray.remote(ModelPredictor).options(**_remote_options(spec))
        actor = actor_cls.remote(**_predictor_kwargs(job, checkpoint, split, spec, exclude))
        try:
            speed = ray.get(actor.measure.remote(batch_size, repeats=repeats), timeout=600)
        finally:
            ray.kill(actor)
        logger.info("worker group %s: %.1f samples/s per actor", spec.name, speed)
        speeds.append(speed)
    return speeds


def run_predict(
    job: JobConfig,
    checkpoint: str | os.PathLike[str],
    *,
    output_dir: str | os.PathLike[str] | None = None,
    split: str | None = None,
    mode: PredictMode = "proportional",
    batch_size: int = 128,
    speeds: Sequence[float] | None = None,
    probe_repeats: int = 3,
    quiet: bool = False,
) -> dict[str, Any]:
    """Predict a split (default ``test``; a hyperspectral scene: every pixel) and write it.

    Args:
        job: The job config the checkpoint was trained with (data, model, workers).
        checkpoint: ``model.pt``, a checkpoint directory, or a training output directory.
        output_dir: Where ``predictions/`` (Parquet), ``class_map.tif`` (scenes) and
            ``predict_summary.json`` go (default: ``<job.output_dir>/predict``).
        split: ``train`` / ``val`` / ``test``, or ``scene`` (hyperspectral only).
        mode: ``proportional`` (default), ``equal`` or ``single``; see the module docstring.
        batch_size: Batch of the fastest actor (proportional) or of every actor.
        speeds: Per-group samples/s to use instead of probing (e.g. from an earlier run).
        probe_repeats: Timed batches per probe.
        quiet: Do not print the result lines.

    Returns:
        The summary (also written as ``predict_summary.json``): samples, wall time,
        samples/s, the actor plan, per-worker rows and accuracy on labelled samples.

    Raises:
        DataError: Missing/unreadable checkpoint or data; checkpoint trained on other bands.
        ConfigError: Invalid mode/split/batch size.
    """
    import pyarrow.parquet as pq
    import ray
    import ray.data

    from raytrain_hetero.app.config import check_data_root
    from raytrain_hetero.app.datasets import (
        configured_bad_files,
        model_arguments,
        open_configured_datasets,
    )
    from raytrain_hetero.workloads.models import build_model

    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive integer, got {batch_size!r}")
    if mode not in PREDICT_MODES:
        raise ConfigError(f"--mode must be one of {list(PREDICT_MODES)}, got {mode!r}")
    is_scene = job.data.dataset == "hyperspectral"
    split = split or ("scene" if is_scene else "test")
    if split == "scene" and not is_scene:
        raise ConfigError("split 'scene' (every pixel) applies to dataset hyperspectral only")
    if split not in ("train", "val", "test", "scene"):
        raise ConfigError(f"split must be train, val, test or scene, got {split!r}")
    checkpoint_file = find_checkpoint_file(checkpoint).resolve()
    out = Path(output_dir or (Path(job.output_dir) / "predict")).resolve()

    # Everything checkable happens here, before any actor starts.
    check_data_root(job.data)
    exclude = configured_bad_files(job.data)
    workload = open_configured_datasets(job.data, (split,), exclude=exclude)
    total = len(workload.datasets[split])
    model = build_model(job.model.name, **model_arguments(job.model, workload))
    state, meta = load_checkpoint(checkpoint_file)
    check_meta_fits(meta, checkpoint=str(checkpoint_file), data=workload)
    check_state_fits(model, state, checkpoint=str(checkpoint_file), data_bands=workload.in_channels)
    del model, state

    if not ray.is_initialized():
        from raytrain_hetero.app.job import init_ray

        init_ray(job)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False

    if speeds is None:
        speeds = measure_worker_speeds(job, checkpoint_file, split, batch_size, exclude, probe_repeats)
    plans = plan_actor_pools(job.workers, list(speeds), total, batch_size, mode)

    import pandas as pd

    parts = []
    start = 0
    for plan in plans:
        indices = np.arange(start, start + plan.samples, dtype=np.int64)
        start += plan.samples
        per_block = max(plan.batch_size, 1) * 4
        frames = [pd.DataFrame({"index": indices[i:i + per_block]})
                  for i in range(0, len(indices), per_block)]
        part = ray.data.from_pandas(frames).map_batches(
            ModelPredictor,
            fn_constructor_kwargs=_predictor_kwargs(job, checkpoint_file, split, plan.spec, exclude),
            batch_size=plan.batch_size,
            compute=ray.data.ActorPoolStrategy(size=plan.count),
            batch_format="numpy",
            **_remote_options(plan.spec),
        )
        parts.append(part)
    dataset = parts[0].union(*parts[1:]) if len(parts) > 1 else parts[0]
    predictions_dir = out / "predictions"
    if predictions_dir.exists():
        import shutil

        shutil.rmtree(predictions_dir)
    out.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    dataset.write_parquet(str(predictions_dir))
    wall = time.perf_counter() - began

    table = pq.read_table(predictions_dir).to_pandas()
    summary = _summarise(table, plans, wall, mode, split, checkpoint_file, total)
    if is_scene and split == "scene":
        summary["class_map"] = str(_write_scene_map(workload, table, out / "class_map.tif"))
    (out / "predict_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if not quiet:
        print(_format_summary(summary))
        print(f"outputs: {out}")
    return summary


def _summarise(table: Any, plans: list[ActorPlan], wall: float, mode: str, split: str,
               checkpoint: Path, total: int) -> dict[str, Any]:
    if len(table) != total or table["index"].nunique() != total:
        raise DataError(f"prediction returned {len(table)} rows for {total} samples "
                        f"({table['index'].nunique()} distinct)")
    span = float(table["batch_end"].max() - table["batch_start"].min())
    labelled = table[table["label"] >= 0]
    accuracy = float((labelled["prediction"] == labelled["label"]).mean()) if len(labelled) else float("nan")
    workers = []
    for name, rows in table.groupby("worker"):
        batches = rows.drop_duplicates(["batch_start", "batch_end", "batch_size"])
        busy = float((batches["batch_end"] - batches["batch_start"]).sum())
        workers.append({
            "worker": name,
            "samples": int(len(rows)),
            "batches": int(len(batches)),
            "batch_size": int(batches["batch_size"].mode().iloc[0]),
            "busy_s": busy,
            "samples_per_busy_s": float(len(rows) / busy) if busy > 0 else float("nan"),
            "last_batch_end_s": float(rows["batch_end"].max() - table["batch_start"].min()),
        })
    return {
        "mode": mode,
        "split": split,
        "checkpoint": str(checkpoint),
        "samples": int(total),
        "wall_s": wall,
        "samples_per_s": total / wall if wall > 0 else float("nan"),
        "compute_span_s": span,
        "samples_per_s_compute_span": total / span if span > 0 else float("nan"),
        "accuracy_on_labelled": accuracy,
        "labelled_samples": int(len(labelled)),
        "plan": [
            {"worker": p.worker, "actors": p.count, "batch_size": p.batch_size,
             "samples": p.samples, "measured_samples_per_s": p.speed}
            for p in plans
        ],
        "workers": workers,
    }


def _format_summary(summary: dict[str, Any]) -> str:
    lines = [
        f"predict ({summary['mode']}): {summary['samples']} samples in {summary['wall_s']:.2f} s "
        f"= {summary['samples_per_s']:.1f} samples/s (incl. actor start-up); compute span "
        f"{summary['compute_span_s']:.2f} s = {summary['samples_per_s_compute_span']:.1f} samples/s",
    ]
    for p, w in zip(summary["plan"], sorted(summary["workers"], key=lambda r: r["worker"])):
        lines.append(
            f"  {p['worker']:<12} actors {p['actors']}  measured {p['measured_samples_per_s']:8.1f}/s  "
            f"batch {p['batch_size']:4d}  samples {p['samples']:6d}"
        )
    for w in summary["workers"]:
        lines.append(f"  {w['worker']:<12} done after {w['last_batch_end_s']:.2f} s "
                     f"({w['batches']} batches, {w['samples_per_busy_s']:.1f} samples/busy s)")
    if summary["labelled_samples"]:
        note = " (every labelled pixel, training pixels included)" if summary["split"] == "scene" else ""
        lines.append(f"accuracy on {summary['labelled_samples']} labelled samples{note}: "
                     f"{summary['accuracy_on_labelled']:.4f}")
    return "\n".join(lines)


def _write_scene_map(workload: Any, table: Any, path: Path) -> Path:
    """Predicted class map (1..K; every pixel predicted) of a hyperspectral scene."""
    from raytrain_hetero.workloads.hyperspectral import write_class_map

    scene = workload.scene
    dataset = next(iter(workload.datasets.values()))
    centres = dataset.centres.numpy()
    class_map = np.zeros(scene.shape, dtype=np.int64)
    order = table["index"].to_numpy()
    class_map[centres[order, 0], centres[order, 1]] = table["prediction"].to_numpy() + 1
    return write_class_map(class_map, path, profile=scene.profile)
