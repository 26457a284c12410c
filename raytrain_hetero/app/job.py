"""The main job: train a classifier from a :class:`~raytrain_hetero.app.config.JobConfig`.

:func:`run_job` takes the job resolved once (:mod:`~raytrain_hetero.app.resolved`: the outputs,
the dataset generated and checked, the model built and checked against it and the layout, before
any worker starts), runs :class:`~raytrain_hetero.driver.trainer.HeteroTrainer` with a live
progress view, and writes ``metrics.csv``, ``summary.json`` and ``throughput.png`` (and,
with ``tracking:``, TensorBoard and MLflow). Workers run
:func:`~raytrain_hetero.app.train_loop.classification_loop`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raytrain_hetero.app.config import JobConfig
from raytrain_hetero.app.progress import LAYOUT_HEADERS, ProgressView, with_layout
from raytrain_hetero.app.resolved import ResolvedJob, RunRequest, resolve_job
from raytrain_hetero.app.train_loop import classification_loop
from raytrain_hetero.core.records import StepRecord, nonfinite_steps_skipped, run_samples_per_s
from raytrain_hetero.core.records import summarize_workers as aggregate_workers
from raytrain_hetero.errors import ConfigError

if TYPE_CHECKING:
    from ray.train import RunConfig

    from raytrain_hetero.app.runs import RunIdentity
    from raytrain_hetero.core.group_decision import GroupDecision
    from raytrain_hetero.core.plan import Plan
    from raytrain_hetero.driver.trainer import HeteroTrainer

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------- driver side


def prepare_dataset(job: JobConfig) -> dict[str, int]:
    """The job's split sizes and band count (``{"train", "val", "bands"}``) after every check
    that can run before a worker starts (:func:`~raytrain_hetero.app.resolved.resolve_job`).

    Raises:
        DataError: Missing root, unreadable files, a band-count mismatch.
        ConfigError: Too few samples for the workers, or a model that cannot be built.
    """
    return resolve_job(job).sizes.as_dict()


def _config(job: JobConfig | ResolvedJob) -> JobConfig:
    """The job config of a job or of a resolved job."""
    return job.job if isinstance(job, ResolvedJob) else job


def init_ray(job: JobConfig | ResolvedJob) -> None:
    """Connect to ``job.ray.address`` or start a new embedded local Ray (see
    :func:`raytrain_hetero.driver.session.init_ray`). An embedded Ray without ``ray.num_cpus``
    gets the logical CPUs the job's workers declare when the machine has fewer (a warning says
    so), as ``HeteroTrainer.fit()`` sizes its own."""
    import ray as ray_module

    from raytrain_hetero.config import expand_worker_specs
    from raytrain_hetero.driver.placement_check import embedded_num_cpus
    from raytrain_hetero.driver.session import init_ray as connect

    config = _config(job)
    ray = config.ray
    num_cpus = ray.num_cpus
    if ray.address is None and num_cpus is None and not ray_module.is_initialized():
        num_cpus = embedded_num_cpus(
            expand_worker_specs(config.workers), datasets=config.data.source == "ray_data"
        )
    connect(address=ray.address, num_cpus=num_cpus, dashboard_host=ray.dashboard_host)


def build_trainer(
    job: JobConfig | ResolvedJob,
    train_loop: Callable[[dict[str, Any]], None],
    run_config: RunConfig,
    *,
    probe_only: bool = False,
    allocation: Mapping[str, Any] | None = None,
    fit_called_at: float | None = None,
) -> HeteroTrainer:
    """The job's HeteroTrainer, built from its sections (the library's config objects); the
    loop gets the whole job (``{"job": ...}``) and reads its YAML-only sections itself.
    ``job``: a resolved job (its batch and train split size as resolved), or a job config (a
    Tune trial's, which the search resolved once for all its trials).
    ``probe_only`` (``raytrain-hetero probe``): a fixed group, no live re-planning, no tracking.
    ``allocation``: a Tune trial's holding under ``tune.allocation: auto`` (the loop config's
    ``"allocation"``: the loop ends the fit at an epoch end when the holding changes).
    ``fit_called_at``: ``time.time()`` when the caller calls the fit (the loop then reports
    ``hetero/fit_start_s``, the fit's call to its first step: the start the user waits).
    A Ray Data source's pipeline lives in Ray: the job's Ray is started first for it.
    """
    from raytrain_hetero.config import ElasticConfig, ParallelConfig, TrackingConfig
    from raytrain_hetero.driver.trainer import HeteroTrainer

    resolved = job if isinstance(job, ResolvedJob) else None
    job = _config(job)
    batch = resolved.batch if resolved is not None else job.train.batch()
    scheduler, elastic, parallel = job.scheduler, job.elastic, job.parallel
    probe, tracking = job.probe, job.tracking
    if probe_only:
        tracking = TrackingConfig()  # a probe is no run to track
        scheduler = scheduler.model_copy(update={"live": False})
        # The probe says which workers admission would leave out; it never re-sizes.
        probe = probe.model_copy(
            update={"group": "all", "admission": None, "roles": None, "mode": "probe"}
        )
        elastic = ElasticConfig()
        # The probe times each rank's speed on the whole model (each rank's plan share).
        parallel = ParallelConfig()
    datasets = None
    if job.data.source == "ray_data":
        from raytrain_hetero.app.ray_data_source import train_pipeline

        init_ray(job)  # no-op if Ray is up
        rows = resolved.sizes.train if resolved is not None else None
        datasets = {"train": train_pipeline(job, rows)}
    return HeteroTrainer(
        train_loop,
        train_loop_config={
            "job": job.model_dump(mode="json"),
            **({"allocation": dict(allocation)} if allocation else {}),
            **({"fit_called_at": fit_called_at} if fit_called_at is not None else {}),
        },
        workers=job.workers,
        batch=batch,
        probe=probe,
        scheduler=scheduler,
        elastic=elastic,
        emulation=job.emulation,
        backend=job.backend,
        guard=job.guard,
        parallel=parallel,
        tracking=tracking,
        datasets=datasets,
        run_config=run_config,
    )


def run_config(
    job: JobConfig | ResolvedJob, run: RunIdentity, callbacks: list[Any] | None = None
) -> RunConfig:
    """The Ray Train RunConfig of a job's run: its name and storage, ``train.max_failures``
    restarts, and checkpoints kept by score as well as by age.

    Ray Train V2 keeps the ``num_to_keep`` best checkpoints by ``val_accuracy`` and never
    deletes the latest one: with one kept, the run holds at most two copies, the best model
    (what ``predict`` reads) and the latest state (what a resume reads).
    """
    from ray.train import CheckpointConfig, FailureConfig, RunConfig

    if isinstance(job, ResolvedJob):
        max_failures = job.max_failures
    else:
        max_failures = job.resolved_max_failures()
    return RunConfig(
        name=run.name,
        # A local directory, or the path on a remote store plus its filesystem.
        **run.storage_location.run_config_storage(),
        failure_config=FailureConfig(max_failures=max_failures),
        checkpoint_config=CheckpointConfig(
            num_to_keep=1,
            checkpoint_score_attribute="val_accuracy",
            checkpoint_score_order="max",
        ),
        callbacks=callbacks,
    )


def run_job(
    job: JobConfig | ResolvedJob,
    *,
    output_dir: Path | str | None = None,
    progress: bool = True,
    run_name: str | None = None,
    resume: bool = False,
    overwrite: bool = False,
    roles: GroupDecision | None = None,
) -> dict[str, Any]:
    """Run the job end to end and write its outputs; returns the summary dict.

    Args:
        job: The job, or the job resolved with its run's outputs
            (``resolve_job(job, outputs=RunRequest(...))``, what ``raytrain-hetero train``
            passes; its run then applies, and ``output_dir``, ``run_name``, ``resume`` and
            ``overwrite`` stay unset).
        output_dir: Where outputs go (default ``job.output_dir``): a local directory or a URI.
        progress: Show the progress bar and worker table.
        run_name: Ray Train run name (``None``: unique, ``<job name>-<time>-<random>``).
        resume: Continue the run ``run_name`` from its last checkpoint.
        overwrite: Write into a non-empty output directory (replacing the job's files).
        roles: The workers' roles decided before the run (``probe.roles: auto``), for
            summary.json; ``job`` holds its trainers only (a resolved job carries its own).

    Raises:
        ConfigError: A non-empty output directory without ``overwrite``/``resume``, or a run
            name clash (:func:`~raytrain_hetero.app.runs.resolve_run`); nothing is written then.
    """
    from raytrain_hetero.app.outputs import (
        format_worker_table,
        plot_worker_throughput,
        write_metrics_csv,
        write_summary,
    )
    from raytrain_hetero.app.tracking import JOB_ARTIFACTS, job_tracker
    from raytrain_hetero.storage import StagingDir

    request = RunRequest(output_dir, run_name, resume, overwrite)
    resolved = job if isinstance(job, ResolvedJob) else resolve_job(job, outputs=request)
    if resolved.run is None or (resolved is job and request != RunRequest()):
        raise ConfigError(
            "run_job: a resolved job brings its run's outputs. Fix: resolve it with "
            "resolve_job(job, outputs=RunRequest(output_dir, run_name, resume, overwrite)) "
            "and pass no output_dir, run_name, resume or overwrite here."
        )
    if roles is not None:
        resolved = dataclasses.replace(resolved, roles=roles)
    job, run, target = resolved.job, resolved.run.identity, resolved.run.outputs
    # Built before Ray starts (a Ray Data source's pipeline starts it): its checks come first.
    trainer = build_trainer(resolved, classification_loop, run_config(resolved, run))
    init_ray(resolved)
    # The fit's call as the loop measures its start from (hetero/fit_start_s): Ray is up.
    trainer.train_loop_config["fit_called_at"] = time.time()
    # Outputs are written to a local directory, then published (uploaded, for a URI).
    staging = StagingDir(target)
    out = staging.local
    out.mkdir(parents=True, exist_ok=True)
    header = LAYOUT_HEADERS.get(job.parallel.mode)
    folder = run.folder
    view = (
        ProgressView(
            resolved.steps_per_epoch * job.train.epochs,
            # The layout column reads checkpoints as they land: local run folders only.
            layout_dir=folder if header and isinstance(folder, Path) else None,
            layout_header=header,
        )
        if progress
        else None
    )
    tracker = job_tracker(job, out, run.name, resume=run.resuming)
    # The tracker's MLflow run ends FAILED if training or writing the outputs raises (a
    # failed fit included), FINISHED otherwise; never left RUNNING.
    with tracker if tracker is not None else contextlib.nullcontext():
        started = time.perf_counter()
        try:
            result = trainer.fit(progress=view, poll_interval_s=1.0, tracker=tracker)
        finally:
            if view is not None:
                view.close()
        wall = time.perf_counter() - started
        if result.error is not None:
            raise result.error
        records = sorted(trainer.step_records, key=lambda r: (r.step, r.rank))
        first_step = records[0].step if records else None
        if run.resuming:
            earlier = staging.fetch("metrics.csv")
            records = (_earlier_records(earlier, first_step) if earlier else []) + records
        final = dict(result.metrics or {})
        summary = build_summary(job, records, trainer.plans, final, wall, resolved.sizes.as_dict())
        # Which workers admission left out, with the predicted samples/s (None: admission all).
        summary["admission"] = trainer.admission
        summary["roles"] = resolved.roles.to_dict() if resolved.roles is not None else None
        summary["run"] = {
            "name": run.name,
            "folder": str(run.folder),
            "resumed": run.resuming,
            # The first step this submission ran (> 0 after a resume from a checkpoint).
            "first_step": first_step,
            "max_failures": resolved.max_failures,
        }
        write_metrics_csv(records, out / "metrics.csv")
        write_summary(summary, out / "summary.json")
        plot_worker_throughput(
            records, out / "throughput.png", title=f"{job.name}: per-worker throughput"
        )
        if tracker is not None:
            tracker.log_artifacts(out / name for name in JOB_ARTIFACTS)
    staging.publish()
    if progress:
        rows = summary["workers"]
        if header and summary["parallel"].get("layout"):
            rows = with_layout(rows, summary["parallel"]["layout"])
        print(format_worker_table(rows, header))
        print(f"outputs: {target}")
    print(f"final validation accuracy: {summary['final_val_accuracy']:.4f}")
    return summary


def _earlier_records(metrics_csv: Path, before_step: int | None) -> list[StepRecord]:
    """A resumed run's earlier steps, from the metrics.csv its last submission wrote (the
    steps before ``before_step``, where this submission took over), so the outputs keep
    covering the whole run."""
    from raytrain_hetero.app.outputs import read_metrics_csv

    if not metrics_csv.exists():
        return []
    try:
        rows = read_metrics_csv(metrics_csv)
        earlier = [StepRecord.from_dict(row) for row in rows]
    except (OSError, ValueError, TypeError) as exc:
        logger.warning("%s: earlier steps not kept (%s)", metrics_csv, exc)
        return []
    limit = before_step if before_step is not None else float("inf")
    return sorted((r for r in earlier if r.step < limit), key=lambda r: (r.step, r.rank))


def build_summary(
    job: JobConfig,
    records: list[StepRecord],
    plans: Sequence[Plan],
    final_metrics: dict[str, Any],
    wall_s: float,
    sizes: dict[str, int],
) -> dict[str, Any]:
    """Summary of a finished run (what ``summary.json`` holds)."""
    accuracy = final_metrics.get("val_accuracy")
    return {
        "name": job.name,
        "final_val_accuracy": float(accuracy) if accuracy is not None else float("nan"),
        "epochs": job.train.epochs,
        "steps": len({r.step for r in records}),
        "global_batch_size": job.train.global_batch_size,
        "samples_per_s": run_samples_per_s(records),
        "nonfinite_steps_skipped": nonfinite_steps_skipped(records),
        "wall_time_s": wall_s,
        "train_samples": sizes["train"],
        "val_samples": sizes["val"],
        "bands": sizes["bands"],
        "weighting": job.train.weighting,
        "workers": [summary.to_dict() for summary in aggregate_workers(records)],
        "plans": [plan.to_dict() for plan in plans],
        "emulated_slowdowns": {w.name: w.emulated_slowdown for w in job.expanded_workers()},
        "parallel": parallel_summary(job, final_metrics),
        # What rank 0 reported last through Ray Train (plan version, per-rank figures).
        "reported": {k: v for k, v in final_metrics.items() if k.startswith("hetero/")},
    }


def parallel_summary(job: JobConfig, final_metrics: Mapping[str, Any]) -> dict[str, Any]:
    """summary.json's ``parallel``: the mode, its groups, and from rank 0's last checkpointed
    report each rank's share of the model (``layout``; ``None`` in data mode), the live re-splits
    and what the ranks together sent per step (data mode: the gradient all-reduce's volume).
    """
    return {
        "mode": job.parallel.mode,
        "group_size": job.parallel.group_size,
        "micro_batches": job.parallel.micro_batches if job.parallel.mode == "branches" else None,
        "layers": list(job.parallel.layers),
        "groups": final_metrics.get("hetero/groups"),
        "layout": final_metrics.get("hetero/layout"),
        "resplits": final_metrics.get("hetero/resplits", 0),
        "bytes_per_step": final_metrics.get("hetero/bytes_per_step"),
    }
