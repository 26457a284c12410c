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
from raytrain_hetero.tune.results import (
    add_allocation_history,
    finite,
    plot_allocations,
    plot_trials,
    trial_rows,
    write_allocation_log,
    write_trials_csv,
)
from raytrain_hetero.tune.search import grid_size, param_space, trial_scheduler
from raytrain_hetero.tune.trial import (
    EndTrainRunOnStop,
    abort_train_on_stop,
    plain_value,
    track_trial,
    trial_report_callback,
)

__all__ = [
    "check_auto_allocation",
    "format_best",
    "param_space",
    "run_trial",
    "run_tune",
    "trial_count",
    "trial_job",
]

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
    allocator: str | None = None,
) -> None:
    """Tune function trainable: train ``base_job`` (the job as JSON) with ``params`` (dotted
    job keys) merged over it, its Train run kept under ``storage_path`` (on any store); with
    ``tracking`` (the search's, resolved) the trial gets its own TensorBoard directory and an
    MLflow run nested under ``parent_run_id``. With ``allocator`` (the search's experiment
    name, ``tune.allocation: auto``) the trial trains on the workers the search's allocator
    gives it, and resumes on new ones when they change (:func:`_allocated_fits`).
    """
    from ray import tune

    from raytrain_hetero.app.job import build_trainer, classification_loop, run_config
    from raytrain_hetero.app.runs import RunIdentity

    job = trial_job(JobConfig.model_validate(base_job), params)
    context = tune.get_context()
    # The trial's own Train run: its FailureConfig restarts the worker group from the
    # trial's last checkpoint; a retried trial reuses the name and so resumes it too.
    run = RunIdentity(f"{context.get_experiment_name()}-{context.get_trial_id()}", storage_path)
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
    if allocator is not None:
        fits = _allocated_fits(job, run, allocator, context.get_trial_id())
        if tracker is None:
            fits(None)
            return
        with track_trial(tracker.open(), reports=job.train.epochs):
            fits(tracker)
        return
    trainer = build_trainer(
        job,
        classification_loop,
        run_config(job, run, callbacks=[trial_report_callback()]),
        fit_called_at=time.time(),
    )
    if tracker is None:
        trainer.fit()
        return
    with track_trial(tracker.open(), reports=job.train.epochs):
        result = trainer.fit(tracker=tracker)
        if result.error is not None:
            tracker.close(failed=True)


def _allocated_fits(job: JobConfig, run: Any, experiment: str, trial_id: str) -> Any:
    """The trial's fits under ``tune.allocation: auto`` as one call (taking the tracker):
    ask the allocator for workers (waiting while it has none to give), train on them pinned
    to their nodes, and when the loop ends a fit because the holding changed, resume the same
    Train run (so from its last checkpoint and data cursor) on the new workers. The loop
    sends the allocator its measured costs and start at each epoch end
    (:func:`~raytrain_hetero.tune.allocator.epoch_end_moves`); the release comes at the end.
    """
    import ray

    from raytrain_hetero.app.job import build_trainer, classification_loop, run_config
    from raytrain_hetero.tune.allocator import (
        allocated_worker_specs,
        allocator_actor_name,
        lookup_allocator,
        wait_for_holding,
    )
    from raytrain_hetero.tune.trial import set_active_allocation

    assert job.tune is None
    actor = lookup_allocator(experiment)
    types = {spec.name: spec for spec in job.workers}
    node = ray.get_runtime_context().get_node_id()
    poll_s = float(ray.get(actor.wait_poll_s.remote()))

    def fits(tracker: Any) -> None:
        set_active_allocation(actor, trial_id)
        done = 0  # epochs finished
        try:
            while True:
                holding = wait_for_holding(
                    actor,
                    trial_id,
                    global_batch=job.train.global_batch_size,
                    driver_node=node,
                    poll_s=poll_s,
                )
                specs = allocated_worker_specs(holding, types)
                segment = validate_config(
                    {**job.model_dump(mode="json"), "workers": [s.model_dump() for s in specs]},
                    source="trial config",
                    note=f" (trial {trial_id} on its allocated workers)",
                )
                allocation = {
                    "actor": allocator_actor_name(experiment),
                    "trial_id": trial_id,
                    "version": holding.version,
                    "worker_types": [w.worker_type for w in holding.workers],  # per rank
                    "resumed_epochs": done,
                }
                trainer = build_trainer(
                    segment,
                    classification_loop,
                    run_config(segment, run, callbacks=[trial_report_callback()]),
                    allocation=allocation,
                    fit_called_at=time.time(),  # the loop measures the fit's start
                )
                result = trainer.fit(tracker=tracker) if tracker is not None else trainer.fit()
                if result.error is not None:
                    if tracker is not None:
                        tracker.close(failed=True)
                    raise result.error
                done = int((result.metrics or {}).get("epoch", -1)) + 1
                if done >= job.train.epochs:
                    return
                logger.info("trial %s: workers changed after epoch %d; resuming", trial_id, done)
        finally:
            set_active_allocation(None, None)
            actor.release.remote(trial_id)

    return fits


def check_auto_allocation(job: JobConfig) -> None:
    """What ``tune.allocation: auto`` cannot run, as one clear error.

    Raises:
        ConfigError: A setting that assumes a fixed worker list, or a loop that cannot move.
    """
    problems = []
    if job.model.task is not None:
        problems.append(
            "model.task (a Lightning loop) cannot move between worker sets; use the "
            "classification loop (no model.task) or tune.allocation: fixed"
        )
    if job.parallel.mode != "data":
        problems.append(
            f"parallel.mode {job.parallel.mode!r} needs a fixed group; use parallel.mode: data "
            "or tune.allocation: fixed"
        )
    if job.train.fixed_shares is not None:
        problems.append(
            "train.fixed_shares names one share per listed worker, but a trial's workers "
            "change; remove it (slices follow measured speed) or use tune.allocation: fixed"
        )
    if job.probe.group != "all" or job.elastic.min_workers is not None:
        problems.append(
            "probe.group: train/auto and elastic.min_workers resize a trial's group themselves; "
            "the allocator does that under tune.allocation: auto: remove them"
        )
    if job.emulation.slowdowns:
        problems.append(
            "emulation.slowdowns name workers, but a trial's workers are named by the "
            "allocator; use emulated_slowdown on the worker types instead"
        )
    if problems:
        raise ConfigError(
            f"tune.allocation: auto cannot run this job: {problems[0]}."
            + (f" ({len(problems) - 1} more: {'; '.join(problems[1:])})" if problems[1:] else "")
        )


def _auto_capacity(job: JobConfig) -> tuple[int, int]:
    """Under ``allocation: auto``: trials at once (every trial needs one worker at least)
    and the most workers one trial may hold (``tune.allocator.max_workers_per_trial``, else
    the worker slots now; a trial's step boundaries are fixed for it, see
    ``BatchConfig.step_workers``).

    Raises:
        ConfigError: No alive node holds any worker type, or the global batch is smaller
            than the most workers times ``train.min_slice``.
    """
    from raytrain_hetero.core.trial_allocation import cluster_slots
    from raytrain_hetero.tune.allocator import live_cluster_nodes, worker_types

    cfg = job.tune
    assert cfg is not None
    slots, findings = cluster_slots(live_cluster_nodes(), worker_types(job.workers))
    if not slots:
        raise ConfigError(
            "tune.allocation: auto: no node of this Ray cluster holds any worker type "
            f"({'; '.join(findings)}). Fix: match the workers' resources and label_selector "
            "to the nodes (ray.num_cpus for an embedded Ray)."
        )
    for finding in findings:
        logger.info("tune.allocation: auto: %s", finding)
    limit = cfg.max_concurrent_trials or len(slots)
    cap = cfg.allocator.max_workers_per_trial or len(slots)
    if job.train.global_batch_size < cap * job.train.min_slice:
        raise ConfigError(
            f"tune.allocation: auto: a trial may hold {cap} workers, but train.global_batch_size "
            f"{job.train.global_batch_size} < {cap} x train.min_slice {job.train.min_slice}. "
            "Fix: set tune.allocator.max_workers_per_trial lower or raise the global batch."
        )
    return max(1, min(limit, len(slots), trial_count(job))), cap


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
    scheduler: Any = None,
) -> dict[str, Any]:
    """Run the search of ``job.tune`` and write ``trials.csv``, ``trials.png`` and
    ``tune_summary.json`` (under ``auto`` also ``allocation_log.json``); returns the summary.

    ``scheduler``: a Tune trial scheduler instead of the one ``job.tune.scheduler`` names
    (e.g. :class:`~raytrain_hetero.tune.search.PromotionReplay`, a recorded search's stops
    replayed); the allocator still plans for ``job.tune.scheduler``'s.

    Raises:
        ConfigError: ``job.tune`` is missing, one trial cannot fit an embedded local Ray, or
            the output directory is not empty and ``overwrite`` is not set.
        HeteroError: Every trial failed (the first error is included).
    """
    from ray import tune
    from ray.tune.search.basic_variant import BasicVariantGenerator

    from raytrain_hetero.app.job import init_ray
    from raytrain_hetero.app.outputs import write_summary
    from raytrain_hetero.app.resolved import resolve_job
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
    auto = cfg.allocation == "auto"
    if auto:
        check_auto_allocation(job)
    resolved = resolve_job(job)  # the search's job checked once; each trial varies it
    init_ray(job)
    # Outputs are written to a local directory, then published (uploaded, for a URI).
    staging = StagingDir(target)
    out = staging.local
    out.mkdir(parents=True, exist_ok=True)
    storage = job.ray.storage(target)
    base_job = job.model_dump(mode="json")
    allocator = None
    experiment = unique_run_name(f"{job.name}-tune")
    if auto:
        concurrency, cap = _auto_capacity(job)
        # Every trial carves its steps for the most workers it may hold: exact on any.
        base_job["train"]["step_workers"] = cap
        allocator = _start_allocator(job, experiment, cap=cap, samples=resolved.sizes.train)
    else:
        concurrency = _concurrency(job, cluster_nodes())
    logger.info("tune %s: %d trial(s), %d at once", experiment, trial_count(job), concurrency)
    search_run = search_tracker(job, out, experiment)
    trainable = tune.with_resources(
        tune.with_parameters(
            run_trial,
            base_job=base_job,
            storage_path=storage,
            tracking=resolved_tracking(job, out).model_dump(mode="json"),
            parent_run_id=search_run.open().mlflow_run_id if search_run is not None else None,
            allocator=experiment if auto else None,
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
            scheduler=scheduler
            or trial_scheduler(
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
            callbacks=_search_callbacks(allocator, verbose),
        ),
    )
    started, started_at = time.perf_counter(), time.time()
    # The search's MLflow run ends FAILED if the search or its outputs fail, never RUNNING.
    with search_run if search_run is not None else contextlib.nullcontext():
        try:
            grid = tuner.fit()
            events, fit_starts, log = _allocation_history(allocator)
        finally:
            if allocator is not None:
                import ray

                ray.kill(allocator, no_restart=True)
        wall = time.perf_counter() - started
        rows, histories = trial_rows(
            grid, search_keys=list(cfg.search_space), epochs=job.train.epochs
        )
        if events is not None:
            add_allocation_history(rows, events, fit_starts)
            write_allocation_log(out / "allocation_log.json", events=events, **log)
            plot_allocations(events, out / "allocations.png", title=f"{job.name}: allocation")
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
                "allocation": cfg.allocation,
                "trials": len(rows),
                "failed_trials": sum(1 for r in rows if r["error"]),
                "wall_time_s": wall,
                "started_at": started_at,  # unix seconds, when wall_time_s began
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


def _start_allocator(job: JobConfig, experiment: str, *, cap: int, samples: int) -> Any:
    from raytrain_hetero.tune.allocator import start_allocator, worker_types

    cfg = job.tune
    assert cfg is not None
    return start_allocator(
        experiment,
        types=worker_types(job.workers),
        max_epochs=job.train.epochs,
        samples_per_epoch=samples,
        asha=(cfg.grace_period, cfg.reduction_factor) if cfg.scheduler == "asha" else None,
        config=cfg.allocator.model_copy(update={"max_workers_per_trial": cap}),
        driver_cpus=cfg.trial_cpus,
        expected_trials=trial_count(job),
    )


def _search_callbacks(allocator: Any, verbose: int) -> list[Any]:
    """The search's Tune callbacks: a stopped trial ends its Train run before Tune stops it
    (:class:`~raytrain_hetero.tune.trial.EndTrainRunOnStop`); under ``auto`` with output, the
    live view of each running trial's allocation as it changes
    (:class:`~raytrain_hetero.tune.progress.AllocationProgress`)."""
    callbacks: list[Any] = [EndTrainRunOnStop()]
    if allocator is None or verbose <= 0:
        return callbacks
    import functools

    from raytrain_hetero.tune.progress import AllocationProgress, fetch_holdings

    return [*callbacks, AllocationProgress(functools.partial(fetch_holdings, allocator))]


def _allocation_history(allocator: Any) -> tuple[Any, Any, dict[str, Any]]:
    """The allocator's history, per-trial fit starts and the rest of its log (decisions,
    measured prices, its start in unix seconds); None, None, {} under ``fixed``."""
    if allocator is None:
        return None, None, {}
    import ray

    events, starts, decisions, prices, wall_start = ray.get(
        [
            allocator.history.remote(),
            allocator.fit_starts.remote(),
            allocator.decisions.remote(),
            allocator.prices.remote(),
            allocator.wall_start.remote(),
        ],
        timeout=60,
    )
    log = {"decisions": decisions, "fit_starts": starts, "prices": prices}
    return events, starts, {**log, "wall_start": wall_start}


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
