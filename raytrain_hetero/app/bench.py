"""``raytrain-hetero bench --config JOB.yaml``: stock Ray Train vs raytrain_hetero on your job.

Both contenders train the same job in one Ray session on the same cluster, alternating (B A,
A B, ...; the first fit of a session runs slow, so it falls on raytrain_hetero): ``stock`` is
``TorchTrainer`` with plain DDP and an equal ``B / N`` per worker
(:mod:`raytrain_hetero.app.bench_stock`), ``raytrain_hetero`` the job as ``train`` runs it,
without tracking or outputs. The same rules for both: **start-up** from ``fit()`` to the first
step; **samples/s** over training steps only (validation excluded); **wall** the whole
``fit()``; **final accuracy** after the last epoch. Medians over repeats, each over stock's;
only ``bench.json`` is written. The project's scenario suite is ``python -m benchmarks``.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from raytrain_hetero.app.config import JobConfig
from raytrain_hetero.app.resolved import ResolvedJob
from raytrain_hetero.core.records import StepRecord
from raytrain_hetero.errors import ConfigError

__all__ = ["CONTENDERS", "FitFigures", "format_bench_table", "run_bench", "training_rate"]

#: The contenders, in the order of the table.
CONTENDERS = ("stock", "raytrain_hetero")

#: What the command compares, for the message refusing anything else.
SUPPORTED = (
    "bench compares data-parallel classification jobs (model.name with parallel.mode: "
    "data), the jobs stock Ray Train's TorchTrainer + DDP can also run"
)


@dataclass(frozen=True)
class FitFigures:
    """What one fit of one contender measured (see the module docstring): seconds to the first
    step, training samples/s, wall seconds, rank 0's final validation accuracy and its steps.
    """

    contender: str
    repeat: int
    startup_s: float
    samples_per_s: float
    wall_s: float
    final_accuracy: float
    steps: int


def check_comparable(job: JobConfig) -> None:
    """Refuse a job that stock Ray Train cannot run as a plain DDP classification job.

    Raises:
        ConfigError: A Lightning task (``model.task``) or a model-parallel ``parallel.mode``.
    """
    if job.model.task is not None:
        raise ConfigError(
            f"{SUPPORTED}; model.task ({job.model.task}) is a Lightning task. Fix: bench a "
            "model.name job (e.g. small_cnn, resnet18) on the same data."
        )
    if job.parallel.mode != "data":
        raise ConfigError(
            f"{SUPPORTED}; parallel.mode is {job.parallel.mode}, which stock DDP has no "
            "counterpart for. Fix: --set parallel.mode=data (the model-parallel comparison "
            "is the repository's `python -m benchmarks conv-split` / `branches`)."
        )


def training_rate(spans: Iterable[tuple[Any, float, float, int]]) -> float:
    """Samples/s over training steps: ``(epoch key, start, end, samples)`` per step; each
    epoch counts from its first step's start to its last step's end. NaN if no time."""
    bounds: dict[Any, list[float]] = defaultdict(lambda: [math.inf, -math.inf, 0.0])
    for key, start, end, samples in spans:
        bound = bounds[key]
        bound[0], bound[1] = min(bound[0], start), max(bound[1], end)
        bound[2] += samples
    seconds = sum(end - start for start, end, _ in bounds.values())
    samples = sum(n for _, _, n in bounds.values())
    return samples / seconds if seconds > 0 else float("nan")


def hetero_spans(records: Sequence[StepRecord]) -> list[tuple[Any, float, float, int]]:
    """Rank 0's step spans of a raytrain_hetero fit, each with the samples of all ranks."""
    samples: dict[tuple[str, int], int] = defaultdict(int)
    for r in records:
        samples[(r.group, r.step)] += r.slice
    return [
        ((r.group, r.epoch), r.time - r.wall_s, r.time, samples[(r.group, r.step)])
        for r in records
        if r.rank == 0
    ]


def _fit(resolved: ResolvedJob, contender: str, repeat: int, storage: Any) -> FitFigures:
    """One fit of ``contender`` on the resolved job; its figures."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from raytrain_hetero.app.bench_stock import STEPS_KEY, stock_loop
    from raytrain_hetero.app.job import build_trainer
    from raytrain_hetero.app.runs import unique_run_name
    from raytrain_hetero.app.train_loop import classification_loop
    from raytrain_hetero.driver.backend import common_resources

    job = resolved.job
    run_config = RunConfig(
        name=unique_run_name(f"{job.name}-bench-{contender.replace('_', '-')}"),
        failure_config=FailureConfig(max_failures=resolved.max_failures),
        **storage.run_config_storage(),
    )
    specs = job.expanded_workers()
    trainer: Any
    if contender == "stock":
        gpus = all(s.resolved_device() == "cuda" for s in specs)
        common = common_resources([dict(s.resources) for s in specs])
        trainer = TorchTrainer(
            stock_loop,
            train_loop_config={"job": job.model_dump(mode="json")},
            scaling_config=ScalingConfig(
                num_workers=len(specs),
                use_gpu=gpus,
                resources_per_worker={k: v for k, v in common.items() if gpus or k != "GPU"},
            ),
            run_config=run_config,
        )
    else:
        trainer = build_trainer(resolved, classification_loop, run_config)
    started = time.time()
    result = trainer.fit()
    wall = time.time() - started
    if result.error is not None:
        raise result.error
    metrics = dict(result.metrics or {})
    if contender == "stock":
        spans = [tuple(s) for s in metrics.get(STEPS_KEY, [])]
    else:
        spans = hetero_spans(trainer.step_records)
    accuracy = metrics.get("val_accuracy")
    return FitFigures(
        contender=contender,
        repeat=repeat,
        startup_s=min((s[1] for s in spans), default=math.nan) - started,
        samples_per_s=training_rate(spans),
        wall_s=wall,
        final_accuracy=float(accuracy) if accuracy is not None else math.nan,
        steps=len(spans),
    )


def summarize(fits: Sequence[FitFigures]) -> dict[str, dict[str, float]]:
    """Per contender: medians over its fits, and each over stock's (accuracy: points)."""
    keys = ("startup_s", "samples_per_s", "wall_s", "final_accuracy")
    rows: dict[str, dict[str, float]] = {}
    for name in CONTENDERS:
        mine = [asdict(f) for f in fits if f.contender == name]
        rows[name] = {k: statistics.median(f[k] for f in mine) for k in keys}
        rows[name]["repeats"] = len(mine)
    stock = rows["stock"]
    for row in rows.values():
        for key in ("startup_s", "samples_per_s", "wall_s"):
            ok = stock[key] > 0 and math.isfinite(stock[key])
            row[f"{key}_vs_stock"] = row[key] / stock[key] if ok else math.nan
        row["accuracy_vs_stock_pt"] = 100.0 * (row["final_accuracy"] - stock["final_accuracy"])
    return rows


def format_bench_table(summary: dict[str, dict[str, float]]) -> str:
    """The printed table: one row per contender, each figure beside its ratio to stock."""
    header = (
        f"{'contender':<16} {'start-up s':>10} {'x stock':>7} {'samples/s':>10} {'x stock':>7} "
        f"{'wall s':>8} {'x stock':>7} {'final acc':>9} {'vs stock':>9}"
    )
    lines = [header, "-" * len(header)]
    for name, r in summary.items():
        lines.append(
            f"{name:<16} {r['startup_s']:>10.1f} {r['startup_s_vs_stock']:>7.2f} "
            f"{r['samples_per_s']:>10.1f} {r['samples_per_s_vs_stock']:>7.2f} "
            f"{r['wall_s']:>8.1f} {r['wall_s_vs_stock']:>7.2f} {r['final_accuracy']:>9.4f} "
            f"{r['accuracy_vs_stock_pt']:>+7.1f}pt"
        )
    lines.append(
        "x stock: this contender's figure / stock's (samples/s above 1, start-up and wall "
        "below 1 are better); samples/s counts training steps only; medians over repeats"
    )
    return "\n".join(lines)


def run_bench(
    job: JobConfig,
    *,
    output_dir: Path | str | None = None,
    repeats: int = 1,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Run both contenders ``repeats`` times on the job; print the table; write bench.json.

    Raises:
        ConfigError: A job the command cannot compare, ``repeats < 1``, or an output
            directory already holding a bench.json (without ``overwrite``).
    """
    from raytrain_hetero.app.job import init_ray
    from raytrain_hetero.app.resolved import resolve_job
    from raytrain_hetero.atomic import atomic_write_text
    from raytrain_hetero.config import TrackingConfig
    from raytrain_hetero.storage import StagingDir

    check_comparable(job)
    if repeats < 1:
        raise ConfigError(f"--repeats is {repeats}; it must be at least 1.")
    target = job.ray.location(output_dir or f"{job.output_dir}/bench")
    if "bench.json" in target.list_names() and not overwrite:
        raise ConfigError(
            f"{target} already holds a bench.json. Fix: choose a new --output or pass "
            "--overwrite to replace it."
        )
    job = job.model_copy(update={"tracking": TrackingConfig()})  # a comparison, not a run
    resolved = resolve_job(job)
    init_ray(resolved)
    scratch = None if job.ray.storage_path else Path(tempfile.mkdtemp(prefix="rh-bench-"))
    storage = job.ray.location(job.ray.storage_path or scratch)
    fits: list[FitFigures] = []
    try:
        for repeat in range(repeats):
            order = CONTENDERS[::-1] if repeat % 2 == 0 else CONTENDERS
            for contender in order:
                fits.append(_fit(resolved, contender, repeat, storage))
                f = fits[-1]
                print(
                    f"{contender} fit {repeat}: start-up {f.startup_s:.1f} s, "
                    f"{f.samples_per_s:.1f} samples/s, wall {f.wall_s:.1f} s, "
                    f"final accuracy {f.final_accuracy:.4f}",
                    flush=True,
                )
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    summary = summarize(fits)
    print()
    print(format_bench_table(summary))
    result = {
        "job": job.name,
        "workers": [s.name for s in job.expanded_workers()],
        "global_batch_size": job.train.global_batch_size,
        "stock_batch_per_worker": max(1, job.train.global_batch_size // job.total_workers),
        "epochs": job.train.epochs,
        "train_samples": resolved.sizes.train,
        "repeats": repeats,
        "fits": [asdict(f) for f in fits],
        "summary": summary,
    }
    staging = StagingDir(target)
    atomic_write_text(staging.local / "bench.json", json.dumps(result, indent=2) + "\n")
    staging.publish()
    print(f"wrote {target}/bench.json")
    return result
