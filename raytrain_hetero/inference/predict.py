"""Distributed inference on heterogeneous workers: Ray Data ``map_batches`` over actor pools.

The library half of prediction (the job half is :mod:`raytrain_hetero.app.predict`): a
dataset is a :class:`~raytrain_hetero.workloads.registry.DataSource`, a model a name plus
keyword arguments (:class:`PredictorSpec`). ``mode="proportional"`` (the default) measures one
probe actor per worker group, one group at a time (read + decode + forward of whole batches),
then gives every group its own actor pool with a per-actor batch proportional to its speed and
a share of the samples proportional to the pool's speed, so the pools finish together (the
inference analogue of the trainer's carving); the rows are written as Parquet.
``mode="equal"`` (same batch and share for every actor) and ``mode="single"`` (one actor of
the fastest group) are the baselines. ``emulated_slowdown`` is EMULATION, as in training.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from raytrain_hetero.config import WorkerSpec
from raytrain_hetero.core.allocation import largest_remainder
from raytrain_hetero.errors import ConfigError, DataError
from raytrain_hetero.inference.checkpoints import load_checkpoint
from raytrain_hetero.storage import StorageLocation
from raytrain_hetero.workloads.registry import DataSource

__all__ = [
    "PREDICT_MODES",
    "ActorPlan",
    "ModelPredictor",
    "PredictMode",
    "PredictorSpec",
    "decode_samples",
    "format_summary",
    "measure_worker_speeds",
    "plan_actor_pools",
    "run_actor_pools",
    "scene_class_map",
    "summarise",
]

logger = logging.getLogger(__name__)

PredictMode = Literal["proportional", "equal", "single"]
PREDICT_MODES: tuple[str, ...] = ("proportional", "equal", "single")


# ----------------------------------------------------------------------------- the actor


@dataclass(frozen=True)
class PredictorSpec:
    """What every predictor actor needs (picklable): the ``build_model`` name and arguments, the
    ``checkpoint`` (a local path or a remote location every actor reads), the ``split`` of the
    ``source`` (its ``samples``, less ``exclude``), and ``decode``: a Ray Data source's
    ``map_batches`` of ``{"index"}`` to :func:`decode_samples` columns, run in Ray Data tasks
    (``None``: each actor opens the dataset and decodes its own samples)."""

    source: DataSource
    model_name: str
    model_kwargs: dict[str, Any]
    checkpoint: str | StorageLocation
    split: str
    samples: int
    exclude: tuple[str, ...] = ()
    decode: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None


class ModelPredictor:
    """Ray Data ``map_batches`` callable class: one model replica.

    Each call gets ``{"index": int64 array}`` and reads and decodes those samples itself (so
    loading runs on the heterogeneous workers, in parallel), or with ``spec.decode`` the decoded
    batch (the actor never opens the dataset); returns one row per sample. ``slowdown`` is the
    EMULATION factor; ``threads`` the actor's torch threads (its CPUs).
    """

    def __init__(
        self,
        spec: PredictorSpec,
        worker: str,
        slowdown: float = 1.0,
        device: str = "cpu",
        threads: int = 1,
    ) -> None:
        import torch

        from raytrain_hetero.worker.measure.clock import ComputeClock
        from raytrain_hetero.worker.measure.emulation import SlowdownEmulator
        from raytrain_hetero.workloads.data import open_datasets
        from raytrain_hetero.workloads.models import build_model

        torch.set_num_threads(max(1, int(threads)))
        self.spec, self.decode, self.workload = spec, spec.decode, None
        if spec.decode is None:  # a file source: this actor reads its samples
            self.workload = open_datasets(spec.source, (spec.split,), exclude=list(spec.exclude))
            dataset = self.workload.datasets[spec.split]
            self.decode = lambda batch: decode_samples(dataset, batch["index"], ids=True)
        self.device = torch.device(device)
        model = build_model(spec.model_name, **spec.model_kwargs)
        model.load_state_dict(load_checkpoint(spec.checkpoint)[0])
        self.model = model.to(self.device).eval()
        self.worker = worker
        self.slowdown = float(slowdown)
        self._emulator = SlowdownEmulator(ComputeClock(self.device))

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import torch

        started = time.time()
        self._emulator.mark()
        if self.workload is not None:
            batch = self.decode(batch)
        with torch.inference_mode():
            logits = self.model(torch.as_tensor(batch["image"]).to(self.device, non_blocking=True))
            probs = torch.softmax(logits.float(), dim=1)
            confidence, prediction = probs.max(dim=1)
        # EMULATION: stretch this actor's own compute (the clock synchronises a CUDA device).
        self._emulator.stretch(self.slowdown)
        ended = time.time()
        n = len(batch["index"])
        return {
            "index": np.asarray(batch["index"], dtype=np.int64),
            "sample_id": np.asarray(batch["sample_id"], dtype=str),
            "label": np.asarray(batch["label"], dtype=np.int64),
            "prediction": prediction.cpu().numpy().astype(np.int64),
            "confidence": confidence.cpu().numpy().astype(np.float32),
            "worker": np.asarray([self.worker] * n, dtype=str),
            "batch_size": np.full(n, n, dtype=np.int64),
            "batch_start": np.full(n, started, dtype=np.float64),
            "batch_end": np.full(n, ended, dtype=np.float64),
        }

    def measure(self, batch_size: int, repeats: int = 3, warmup: int = 1, seed: int = 0) -> float:
        """Samples/s of whole batches as this actor runs them, median of ``repeats`` (a file
        source: read + decode + forward; a Ray Data source: forward, decoded here untimed)."""
        rng = np.random.default_rng(seed)
        n = min(batch_size, self.spec.samples)
        times = []
        for r in range(warmup + repeats):
            batch = {"index": rng.integers(0, self.spec.samples, size=n)}
            if self.workload is None:
                batch = self.decode(batch)
            t0 = time.perf_counter()
            self(batch)
            if r >= warmup:
                times.append(time.perf_counter() - t0)
        return float(n / float(np.median(times)))


def decode_samples(dataset: Any, indices: Any, ids: bool = False) -> dict[str, np.ndarray]:
    """The tensors of ``dataset``'s samples at ``indices``, collated, as numpy columns; with
    ``ids`` also their ``index`` and ``sample_id`` (file name, pixel 'row_col', pair id or index)."""
    import torch
    from torch.utils.data import default_collate

    indices = np.asarray(indices, dtype=np.int64)
    getitems = getattr(dataset, "__getitems__", None)
    items = getitems(indices.tolist()) if getitems else [dataset[int(i)] for i in indices]
    out = {k: v.numpy() for k, v in default_collate(items).items() if isinstance(v, torch.Tensor)}
    if ids:
        out["index"] = indices
        out["sample_id"] = np.asarray([_sample_id(dataset, int(i)) for i in indices], dtype=str)
    return out


def _sample_id(dataset: Any, i: int) -> str:
    if hasattr(dataset, "samples"):  # torchgeo ImageFolder datasets
        return os.path.basename(dataset.samples[i][0])
    if hasattr(dataset, "ids"):  # multimodal pairs
        return str(dataset.ids[i])
    if hasattr(dataset, "centres"):  # hyperspectral patches
        row, col = dataset.centres[i].tolist()
        return f"{row}_{col}"
    return str(i)


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


def _predictor_kwargs(predictor: PredictorSpec, spec: WorkerSpec) -> dict[str, Any]:
    return {
        "spec": predictor,
        "worker": spec.name,
        "slowdown": spec.emulated_slowdown,
        "device": spec.resolved_device(),
        "threads": max(1, int(spec.resources.get("CPU", 1))),
    }


def measure_worker_speeds(
    predictor: PredictorSpec,
    workers: Sequence[WorkerSpec],
    batch_size: int,
    repeats: int = 3,
) -> list[float]:
    """Samples/s of one predictor actor of each worker group, probed one group at a time."""
    import ray

    speeds = []
    for spec in workers:
        actor_cls = ray.remote(ModelPredictor).options(**spec.remote_options())
        actor = actor_cls.remote(**_predictor_kwargs(predictor, spec))
        try:
            speed = ray.get(actor.measure.remote(batch_size, repeats=repeats), timeout=600)
        finally:
            ray.kill(actor)
        logger.info("worker group %s: %.1f samples/s per actor", spec.name, speed)
        speeds.append(speed)
    return speeds


def run_actor_pools(
    predictor: PredictorSpec,
    plans: Sequence[ActorPlan],
    predictions_dir: str | os.PathLike[str],
) -> float:
    """Predict with one Ray Data actor pool per plan and write the rows as Parquet.

    Pool ``i`` predicts the next ``plans[i].samples`` sample indices, decoded by its actors or,
    with ``predictor.decode``, by Ray Data tasks before them. ``predictions_dir`` is replaced.
    Returns the wall time of the run (actor start-up included).
    """
    import pandas as pd
    import ray.data

    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    parts = []
    start = 0
    for plan in plans:
        indices = np.arange(start, start + plan.samples, dtype=np.int64)
        start += plan.samples
        per_block = max(plan.batch_size, 1) * 4
        frames = [
            pd.DataFrame({"index": indices[i : i + per_block]})
            for i in range(0, len(indices), per_block)
        ]
        part = ray.data.from_pandas(frames)
        if predictor.decode is not None:
            # Decoded in Ray Data tasks. The streaming repartition (one batch per block) keeps
            # Ray Data from fusing the decode into the actors (a task map with the actors'
            # resources would be), which would decode there.
            part = part.map_batches(predictor.decode, batch_size=plan.batch_size).repartition(
                target_num_rows_per_block=plan.batch_size
            )
        part = part.map_batches(
            ModelPredictor,
            fn_constructor_kwargs=_predictor_kwargs(predictor, plan.spec),
            batch_size=plan.batch_size,
            compute=ray.data.ActorPoolStrategy(size=plan.count),
            batch_format="numpy",
            **plan.spec.remote_options(),
        )
        parts.append(part)
    dataset = parts[0].union(*parts[1:]) if len(parts) > 1 else parts[0]
    target = Path(predictions_dir)
    if target.exists():
        # Never delete a directory this call did not create (the caller replaces it).
        raise ConfigError(f"{target} exists. Fix: give a predictions directory that does not.")
    target.parent.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    dataset.write_parquet(str(target))
    return time.perf_counter() - began


def summarise(
    table: Any,
    plans: list[ActorPlan],
    wall: float,
    mode: str,
    split: str,
    checkpoint: Path | StorageLocation,
    total: int,
) -> dict[str, Any]:
    """Samples, wall time, samples/s, the plan and per-worker rows of a finished prediction.

    Raises:
        DataError: The predictions do not cover every sample exactly once.
    """
    if len(table) != total or table["index"].nunique() != total:
        raise DataError(
            f"prediction returned {len(table)} rows for {total} samples "
            f"({table['index'].nunique()} distinct)"
        )
    span = float(table["batch_end"].max() - table["batch_start"].min())
    labelled = table[table["label"] >= 0]
    accuracy = (
        float((labelled["prediction"] == labelled["label"]).mean())
        if len(labelled)
        else float("nan")
    )
    workers = []
    for name, rows in table.groupby("worker"):
        batches = rows.drop_duplicates(["batch_start", "batch_end", "batch_size"])
        busy = float((batches["batch_end"] - batches["batch_start"]).sum())
        workers.append(
            {
                "worker": name,
                "samples": len(rows),
                "batches": len(batches),
                "batch_size": int(batches["batch_size"].mode().iloc[0]),
                "busy_s": busy,
                "samples_per_busy_s": float(len(rows) / busy) if busy > 0 else float("nan"),
                "last_batch_end_s": float(rows["batch_end"].max() - table["batch_start"].min()),
            }
        )
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
        "labelled_samples": len(labelled),
        "plan": [
            {
                "worker": p.worker,
                "actors": p.count,
                "batch_size": p.batch_size,
                "samples": p.samples,
                "measured_samples_per_s": p.speed,
            }
            for p in plans
        ],
        "workers": workers,
    }


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as the lines ``raytrain-hetero predict`` prints."""
    lines = [
        (
            f"predict ({summary['mode']}): {summary['samples']} samples in {summary['wall_s']:.2f} s "
            f"= {summary['samples_per_s']:.1f} samples/s (incl. actor start-up); compute span "
            f"{summary['compute_span_s']:.2f} s = {summary['samples_per_s_compute_span']:.1f} samples/s"
        )
    ]
    for p in summary["plan"]:
        lines.append(
            f"  {p['worker']:<12} actors {p['actors']}  measured {p['measured_samples_per_s']:8.1f}/s  "
            f"batch {p['batch_size']:4d}  samples {p['samples']:6d}"
        )
    for w in summary["workers"]:
        lines.append(
            f"  {w['worker']:<12} done after {w['last_batch_end_s']:.2f} s "
            f"({w['batches']} batches, {w['samples_per_busy_s']:.1f} samples/busy s)"
        )
    if summary["labelled_samples"]:
        note = (
            " (every labelled pixel, training pixels included)"
            if summary["split"] == "scene"
            else ""
        )
        lines.append(
            f"accuracy on {summary['labelled_samples']} labelled samples{note}: "
            f"{summary['accuracy_on_labelled']:.4f}"
        )
    return "\n".join(lines)


def scene_class_map(workload: Any, table: Any) -> np.ndarray:
    """Predicted class map (1..K; every pixel predicted) of a hyperspectral scene."""
    scene = workload.scene
    dataset = next(iter(workload.datasets.values()))
    centres = dataset.centres.numpy()
    class_map = np.zeros(scene.shape, dtype=np.int64)
    order = table["index"].to_numpy()
    class_map[centres[order, 0], centres[order, 1]] = table["prediction"].to_numpy() + 1
    return class_map
