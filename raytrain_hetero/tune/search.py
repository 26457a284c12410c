"""Hyperparameter search over heterogeneous runs with Ray Tune (``raytrain-hetero tune``).

The pieces: :mod:`~raytrain_hetero.tune.trial` (the function trainable and its report
callback), :mod:`~raytrain_hetero.tune.capacity` (how many trials run at once) and
:mod:`~raytrain_hetero.tune.results` (rows, plot, printed best). This module runs the search.

Train V2 pattern (Ray 2.60 refuses a trainer passed to ``Tuner``): every trial is a
*function trainable*, :func:`run_trial`, that merges its sampled values over the job, builds a
:class:`~raytrain_hetero.driver.trainer.HeteroTrainer` whose ``RunConfig`` carries
:class:`HeteroTuneReportCallback`, and calls ``fit()``. The callback forwards rank 0's
per-epoch report (``val_accuracy``) to Tune and adds what this package measures: the run's
samples/s so far and each worker's slice, weight and samples/s (from the run's scheduler
actor), so ASHA, the result table and the plot see them.

Early stopping: when Tune stops a trial (ASHA), the trial first aborts its Train run through
the controller (:func:`abort_active_train_run`), which removes the run's placement group at
once; otherwise the freed workers would depend on Ray Train's cleaner actor, which needs the
dashboard's state API and an unambiguous cluster address.

Resources: Tune reserves only each trial's *driver* (``tune.trial_cpus``); the trial's worker
group reserves its workers through Ray Train's own placement group, which Ray grants all at
once or not at all, so concurrent trials never each hold part of a worker group. Unless
``tune.max_concurrent_trials`` says otherwise, :func:`concurrent_capacity` packs whole trials
(driver + every worker, honouring label selectors) onto the cluster's nodes and runs as many
at once as fit, so no trial waits on another's workers.

Outputs of :func:`run_tune` (in the output directory): ``trials.csv`` (one row per trial),
``trials.png`` (metric per epoch and per-worker throughput of every trial) and
``tune_summary.json`` (the best trial and its config).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from raytrain_hetero.app.config import JobConfig, SearchDistribution
from raytrain_hetero.errors import ConfigError, HeteroError
from raytrain_hetero.tune.capacity import (
    cluster_nodes,
    concurrent_capacity,
    decide_concurrency,
    trial_count,
)
from raytrain_hetero.tune.results import (
    TRIAL_COLUMNS,
    _finite,
    format_best,
    plot_trials,
    trial_rows,
    write_trials_csv,
)
from raytrain_hetero.tune.trial import (
    HeteroTuneReportCallback,
    run_trial,
    throughput_metrics,
    trial_job,
)

__all__ = [
    "TRIAL_COLUMNS",
    "HeteroTuneReportCallback",
    "concurrent_capacity",
    "decide_concurrency",
    "format_best",
    "param_space",
    "plot_trials",
    "run_trial",
    "run_tune",
    "throughput_metrics",
    "trial_job",
    "trial_rows",
    "write_trials_csv",
]

logger = logging.getLogger(__name__)


def param_space(space: Mapping[str, SearchDistribution]) -> dict[str, Any]:
    """Ray Tune domains for a validated search space (keys stay dotted, e.g. ``train.lr``)."""
    from ray import tune

    domains: dict[str, Any] = {}
    for key, dist in space.items():
        if dist.choice is not None:
            domains[key] = tune.choice(list(dist.choice))
        elif dist.grid is not None:
            domains[key] = tune.grid_search(list(dist.grid))
        elif dist.uniform is not None:
            domains[key] = tune.uniform(*dist.uniform)
        elif dist.loguniform is not None:
            domains[key] = tune.loguniform(*dist.loguniform)
        elif dist.randint is not None:
            low, high = dist.randint
            domains[key] = tune.randint(low, high + 1)  # Tune's upper bound is exclusive
    return domains



def _scheduler(job: JobConfig) -> Any:
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    cfg = job.tune
    assert cfg is not None
    if cfg.scheduler == "fifo":
        return FIFOScheduler()
    return ASHAScheduler(
        time_attr="training_iteration",
        max_t=job.train.epochs,
        grace_period=min(cfg.grace_period, job.train.epochs),
        reduction_factor=cfg.reduction_factor,
    )



def run_tune(
    job: JobConfig,
    *,
    output_dir: Path | None = None,
    verbose: int = 1,
) -> dict[str, Any]:
    """Run the search of ``job.tune`` and write ``trials.csv``, ``trials.png`` and
    ``tune_summary.json``; returns the summary.

    Raises:
        ConfigError: ``job.tune`` is missing, or one trial cannot fit an embedded local Ray.
        HeteroError: Every trial failed (the first error is included).
    """
    from ray import tune
    from ray.tune.search.basic_variant import BasicVariantGenerator

    from raytrain_hetero.app.job import prepare_dataset
    from raytrain_hetero.app.outputs import write_summary
    from raytrain_hetero.driver.session import init_ray

    if job.tune is None:
        raise ConfigError(
            "the config has no tune: section. Fix: add tune: with at least search_space: "
            "(see examples/configs/eurosat_tune.yaml)."
        )
    cfg = job.tune
    out = Path(output_dir or job.output_dir).resolve()
    prepare_dataset(job)
    init_ray(
        address=job.ray.address,
        num_cpus=job.ray.num_cpus,
        dashboard_host=job.ray.dashboard_host,
    )
    out.mkdir(parents=True, exist_ok=True)
    storage = Path(job.ray.storage_path or (out / "ray_results")).resolve()
    concurrency = decide_concurrency(job, cluster_nodes(), local=job.ray.address is None)
    experiment = f"{job.name}-tune-{time.strftime('%Y%m%d-%H%M%S')}"
    logger.info("tune %s: %d trial(s), %d at once", experiment, trial_count(job), concurrency)
    trainable = tune.with_resources(
        tune.with_parameters(
            run_trial, base_job=job.model_dump(mode="json"), storage_path=str(storage)
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
            scheduler=_scheduler(job),
            search_alg=search_alg,
            num_samples=cfg.num_samples,
        ),
        run_config=tune.RunConfig(name=experiment, storage_path=str(storage), verbose=verbose),
    )
    started = time.perf_counter()
    grid = tuner.fit()
    wall = time.perf_counter() - started
    rows, histories = trial_rows(grid, job)
    write_trials_csv(rows, out / "trials.csv")
    plot_trials(histories, rows, out / "trials.png", metric=cfg.metric,
                title=f"{job.name}: {len(rows)} trial(s), {cfg.scheduler}")
    ok = [r for r in rows if not r["error"] and _finite(r.get(cfg.metric))]
    if not ok:
        first = next((r["error"] for r in rows if r["error"]), "no trial reported the metric")
        raise HeteroError(f"no trial finished with {cfg.metric}: {first}")
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
            "config": {k.removeprefix("config/"): v for k, v in best.items() if k.startswith("config/")},
            "workers": best["_workers"],
        },
        "storage": str(storage / experiment),
    }
    # NaN (a trial without throughput) is not JSON: written as null, with a warning.
    write_summary(summary, out / "tune_summary.json")
    return summary

