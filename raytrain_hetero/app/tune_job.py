"""Hyperparameter search over a YAML job with Ray Tune (``raytrain-hetero tune``).

The library side is :mod:`raytrain_hetero.tune`; here, what knows the job: :func:`trial_job`
(a trial's values merged over the job), :func:`run_trial` (the Tune function trainable) and
:func:`run_tune`, which writes ``trials.csv``, ``trials.png`` and ``tune_summary.json``
(with ``tracking:``, one MLflow run per trial nested under the search's).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from raytrain_hetero.app.config import (
    JobConfig,
    dotted_to_nested,
    merge_overrides,
    validate_config,
)
from raytrain_hetero.app.outputs import format_worker_table
from raytrain_hetero.errors import ConfigError, HeteroError
from raytrain_hetero.storage import StagingDir, StorageLocation
from raytrain_hetero.tune.capacity import cluster_nodes, decide_concurrency
from raytrain_hetero.tune.results import finite, plot_trials, trial_rows, write_trials_csv
from raytrain_hetero.tune.search import grid_size, param_space, trial_scheduler
from raytrain_hetero.tune.trial import (
    abort_train_on_stop,
    plain_value,
    track_trial,
    trial_report_callback,
)

__all__ = ["format_best", "param_space", "run_trial", "run_tune", "trial_count", "trial_job"]

logger = logging.getLogger(__name__)


def trial_job(base: JobConfig, params: Mapping[str, Any]) -> JobConfig:
    """The job one trial runs: ``params`` (dotted keys) merged over ``base``, ``tune`` dropped.

    Raises:
        ConfigError: The merged job is invalid (names the trial's values).
    """
    values = {key: plain_value(value) for key, value in params.items()}
    merged = merge_overrides(
        base.model_dump(mode="json", exclude={"tune"}), dotted_to_nested(values)
    )
    shown = ", ".join(f"{k}={v!r}" for k, v in values.items())
    return validate_config(merged, source="trial config", note=f" (trial values: {shown})")


def trial_count(job: JobConfig) -> int:
    """Trials the search runs: samples times the grid's size."""
    if job.tune is None:
        return 0
    return job.tune.num_samples * grid_size(job.tune.search_space)


@abort_train_on_stop
def run_trial(
    params: dict[str, Any],
    *,
    base_job: dict[str, Any],
    storage_path: StorageLocation,
    tracking: dict[str, Any] | None = None,
    parent_run_id: str | None = None,
) -> None:
    """Tune function trainable: train ``base_job`` (the job as JSON) with ``params`` (dotted
    job keys) merged over it, its Train run kept under ``storage_path`` (on any store); with
    ``tracking`` (the search's, resolved) the trial gets its own TensorBoard directory and an
    MLflow run nested under ``parent_run_id``.
    """
    from ray import tune

    from raytrain_hetero.app.job import build_trainer, classification_loop, run_config
    from raytrain_hetero.app.runs import RunIdentity

    job = trial_job(JobConfig.model_validate(base_job), params)
    context = tune.get_context()
    # The trial's own Train run: its FailureConfig restarts the worker group from the
    # trial's last checkpoint; a retried trial reuses the name and so resumes it too.
    run = RunIdentity(f"{context.get_experiment_name()}-{context.get_trial_id()}", storage_path)
    trainer = build_trainer(
        job, classification_loop, run_config(job, run, callbacks=[trial_report_callback()])
    )
    tracker = None
    if tracking is not None:
        from raytrain_hetero.app.tracking import trial_tracker

        tracker = trial_tracker(
            job,
            tracking,
            experiment=context.get_experiment_name(),
            run_name=run.name,
            parent_run_id=parent_run_id,
        )
    if tracker is None:
        trainer.fit()
        return
    with track_trial(tracker.open(), reports=job.train.epochs):
        result = trainer.fit(tracker=tracker)
        if result.error is not None:
            tracker.close(failed=True)


def _concurrency(job: JobConfig, nodes: list[dict[str, Any]]) -> int:
    cfg = job.tune
    assert cfg is not None
    return decide_concurrency(
        job.expanded_workers(),
        nodes,
        trial_cpus=cfg.trial_cpus,
        trials=trial_count(job),
        max_concurrent_trials=cfg.max_concurrent_trials,
        local=job.ray.address is None,
    )


def run_tune(
    job: JobConfig,
    *,
    output_dir: Path | str | None = None,
    verbose: int = 1,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Run the search of ``job.tune`` and write ``trials.csv``, ``trials.png`` and
    ``tune_summary.json``; returns the summary.

    Raises:
        ConfigError: ``job.tune`` is missing, one trial cannot fit an embedded local Ray, or
            the output directory is not empty and ``overwrite`` is not set.
        HeteroError: Every trial failed (the first error is included).
    """
    from ray import tune
    from ray.tune.search.basic_variant import BasicVariantGenerator

    from raytrain_hetero.app.job import init_ray, prepare_dataset
    from raytrain_hetero.app.outputs import write_summary
    from raytrain_hetero.app.runs import check_output_dir, unique_run_name
    from raytrain_hetero.app.tracking import SEARCH_ARTIFACTS, resolved_tracking, search_tracker

    if job.tune is None:
        raise ConfigError(
            "the config has no tune: section. Fix: add tune: with at least search_space: "
            "(see examples/configs/eurosat_tune.yaml)."
        )
    cfg = job.tune
    target = job.ray.location(output_dir or job.output_dir)
    check_output_dir(target, overwrite=overwrite, resume=False)
    prepare_dataset(job)
    init_ray(job)
    # Outputs are written to a local directory, then published (uploaded, for a URI).
    staging = StagingDir(target)
    out = staging.local
    out.mkdir(parents=True, exist_ok=True)
    storage = job.ray.storage(target)
    concurrency = _concurrency(job, cluster_nodes())
    experiment = unique_run_name(f"{job.name}-tune")
    logger.info("tune %s: %d trial(s), %d at once", experiment, trial_count(job), concurrency)
    search_run = search_tracker(job, out, experiment)
    trainable = tune.with_resources(
        tune.with_parameters(
            run_trial,
            base_job=job.model_dump(mode="json"),
            storage_path=storage,
            tracking=resolved_tracking(job, out).model_dump(mode="json"),
            parent_run_id=search_run.open().mlflow_run_id if search_run is not None else None,
        ),
        {"cpu": cfg.trial_cpus},
    )
    # Tune ignores TuneConfig.max_concurrent_trials with a generator; it goes here instead.
    search_alg = BasicVariantGenerator(random_state=cfg.seed, max_concurrent=concurrency)
    tuner = tune.Tuner(
        trainable,
        param_space=param_space(cfg.search_space),
        tune_config=tune.TuneConfig(
            metric=cfg.metric,
            mode=cfg.mode,
            scheduler=trial_scheduler(
                cfg.scheduler,
                max_epochs=job.train.epochs,
                grace_period=cfg.grace_period,
                reduction_factor=cfg.reduction_factor,
            ),
            search_alg=search_alg,
            num_samples=cfg.num_samples,
        ),
        run_config=tune.RunConfig(
            name=experiment,
            **storage.run_config_storage(),
            verbose=verbose,
            # A trial whose driver dies is retried (its Train run resumes by name).
            failure_config=tune.FailureConfig(max_failures=job.resolved_max_failures()),
        ),
    )
    started = time.perf_counter()
    # The search's MLflow run ends FAILED if the search or its outputs fail, never RUNNING.
    with search_run if search_run is not None else contextlib.nullcontext():
        grid = tuner.fit()
        wall = time.perf_counter() - started
        rows, histories = trial_rows(
            grid, search_keys=list(cfg.search_space), epochs=job.train.epochs
        )
        write_trials_csv(rows, out / "trials.csv")
        plot_trials(
            histories,
            rows,
            out / "trials.png",
            metric=cfg.metric,
            title=f"{job.name}: {len(rows)} trial(s), {cfg.scheduler}",
        )
        ok = [r for r in rows if not r["error"] and finite(r.get(cfg.metric))]
        if ok:
            best = (max if cfg.mode == "max" else min)(ok, key=lambda r: float(r[cfg.metric]))
            summary = {
                "experiment": experiment,
                "metric": cfg.metric,
                "mode": cfg.mode,
                "scheduler": cfg.scheduler,
                "max_concurrent_trials": concurrency,
                "trials": len(rows),
                "failed_trials": sum(1 for r in rows if r["error"]),
                "wall_time_s": wall,
                "best": {
                    "trial_id": best["trial_id"],
                    cfg.metric: float(best[cfg.metric]),
                    "val_accuracy": best["val_accuracy"],
                    "samples_per_s": best["samples_per_s"],
                    "epochs": best["epochs"],
                    "config": {
                        k.removeprefix("config/"): v
                        for k, v in best.items()
                        if k.startswith("config/")
                    },
                    "workers": best["_workers"],
                },
                "storage": str(storage.join(experiment)),
            }
            # NaN (a trial without throughput) is not JSON: written as null, with a warning.
            write_summary(summary, out / "tune_summary.json")
        if search_run is not None:
            search_run.log_artifacts(out / name for name in SEARCH_ARTIFACTS)
        staging.publish()  # also without a result: trials.csv / trials.png say what went wrong
        if not ok:
            first = next((r["error"] for r in rows if r["error"]), "no trial reported the metric")
            raise HeteroError(f"no trial finished with {cfg.metric}: {first}")
    return summary


def format_best(summary: Mapping[str, Any]) -> str:
    """Human-readable lines about the best trial (what ``raytrain-hetero tune`` prints)."""
    best = summary["best"]
    config = ", ".join(f"{k}={v}" for k, v in best["config"].items())
    lines = [
        (
            f"best trial {best['trial_id']}: {summary['metric']}={best[summary['metric']]:.4f} "
            f"after {best['epochs']} epoch(s), "
            f"samples/s={float(best['samples_per_s'] or 'nan'):.1f}"
        ),
        f"best config: {config}",
    ]
    workers = sorted(best["workers"].items(), key=lambda item: item[1].get("rank", 0))
    rows = [{**w, "worker": name} for name, w in workers]
    if rows:
        lines.append(format_worker_table(rows))
    return "\n".join(lines)
