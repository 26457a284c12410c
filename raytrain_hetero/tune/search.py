"""Hyperparameter search over heterogeneous runs with Ray Tune (``raytrain-hetero tune``).

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

import csv
import io
import json
import logging
import math
import statistics
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import ray
from ray.tune.integration.ray_train import TuneReportCallback

from raytrain_hetero.app.config import (
    JobConfig,
    SearchDistribution,
    dotted_to_nested,
    merge_overrides,
    validate_config,
)
from raytrain_hetero.errors import ConfigError, HeteroError

__all__ = [
    "HeteroTuneReportCallback",
    "concurrent_capacity",
    "param_space",
    "plot_trials",
    "run_trial",
    "run_tune",
    "throughput_metrics",
    "trial_job",
    "write_trials_csv",
]

logger = logging.getLogger(__name__)

#: Columns every row of ``trials.csv`` starts with (then ``config/...`` and ``workers/...``).
TRIAL_COLUMNS: tuple[str, ...] = (
    "trial_id",
    "status",
    "epochs",
    "val_accuracy",
    "best_val_accuracy",
    "samples_per_s",
    "slices",
    "error",
)


# ----------------------------------------------------------------------------- search space


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


def _plain(value: Any) -> Any:
    """numpy scalars (Tune samples with numpy) as plain Python values."""
    return value.item() if hasattr(value, "item") and not isinstance(value, (list, dict)) else value


def trial_job(base: JobConfig, params: Mapping[str, Any]) -> JobConfig:
    """The job one trial runs: ``params`` (dotted keys) merged over ``base``, ``tune`` dropped.

    Raises:
        ConfigError: The merged job is invalid (names the trial's values).
    """
    values = {key: _plain(value) for key, value in params.items()}
    merged = merge_overrides(base.model_dump(mode="json", exclude={"tune"}), dotted_to_nested(values))
    shown = ", ".join(f"{k}={v!r}" for k, v in values.items())
    return validate_config(merged, source="trial config", note=f" (trial values: {shown})")


# ----------------------------------------------------------------------------- trial side


_THROUGHPUT_FIELDS = (
    "step", "rank", "worker", "device", "slice", "weight", "wall_s", "samples_per_s",
    "plan_version",
)


def throughput_metrics(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Samples/s of the whole run and per worker over ``records`` (one per rank per step).

    Returns:
        ``{"samples_per_s": float, "workers": {name: {"slice", "weight", "samples_per_s",
        "device"}}}``; the global rate is the samples of every step over the sum of each
        step's slowest wall time, a worker's rate the median of its per-step rates, its
        slice and weight those of its most recent full step.
    """
    per_step: dict[int, dict[str, float]] = {}
    by_worker: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for record in records:
        step = per_step.setdefault(int(record["step"]), {"samples": 0.0, "wall": 0.0})
        step["samples"] += float(record["slice"])
        step["wall"] = max(step["wall"], float(record.get("wall_s") or 0.0))
        by_worker[str(record["worker"])].append(record)
    wall = sum(s["wall"] for s in per_step.values())
    samples = sum(s["samples"] for s in per_step.values())
    workers: dict[str, dict[str, Any]] = {}
    for name, recs in by_worker.items():
        recs = sorted(recs, key=lambda r: int(r["step"]))
        rates = [float(r["samples_per_s"]) for r in recs if math.isfinite(float(r["samples_per_s"]))]
        # The epoch's last step may be short; the largest recent slice is the plan's slice.
        latest_plan = recs[-1].get("plan_version")
        current = [r for r in recs if r.get("plan_version") == latest_plan] or recs
        full = max(current, key=lambda r: int(r["slice"]))
        workers[name] = {
            "rank": int(full["rank"]),
            "slice": int(full["slice"]),
            "weight": float(full["weight"]),
            "samples_per_s": statistics.median(rates) if rates else float("nan"),
            "device": str(full.get("device", "")),
        }
    return {"samples_per_s": samples / wall if wall > 0 else float("nan"), "workers": workers}


class HeteroTuneReportCallback(TuneReportCallback):
    """``TuneReportCallback`` that adds throughput and per-worker slices to every report.

    Runs in the Ray Train controller. On each report it reads the step records the workers
    pushed since the previous report from the run's scheduler actor and adds
    ``samples_per_s`` (the run's, over all steps so far) and ``workers/<name>/{rank, slice,
    weight, samples_per_s}`` to rank 0's metrics before they go to Tune. Build it inside the Tune
    trial (it connects to the trial's session on construction).

    Args:
        controller_mailbox: A :class:`ControllerMailbox` actor; the callback puts the Train
            controller's handle there on the first report, so the trial can abort the run
            (releasing its placement group) when Tune stops the trial early.
    """

    def __init__(self, controller_mailbox: Any = None) -> None:
        super().__init__()
        self._records_seen = 0
        # (step, rank) -> the fields throughput_metrics needs; a re-run step overwrites.
        self._records: dict[tuple[int, int], dict[str, Any]] = {}
        self._controller_mailbox = controller_mailbox
        self._controller_announced = False

    def after_report(self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any) -> None:
        if self._controller_mailbox is not None and not self._controller_announced:
            # Lets the trial abort this run cleanly if Tune stops the trial (ASHA).
            self._controller_mailbox.put.remote(ray.get_runtime_context().current_actor)
            self._controller_announced = True
        enriched = [dict(m) for m in metrics]
        if enriched:
            try:
                enriched[0].update(self._throughput(run_context))
            except Exception as exc:  # noqa: BLE001 - metrics must still reach Tune
                logger.warning("no throughput for this report: %s", exc)
        super().after_report(run_context=run_context, metrics=enriched, checkpoint=checkpoint)

    def _throughput(self, run_context: Any) -> dict[str, Any]:
        from raytrain_hetero.driver.scheduler import SCHEDULER_NAMESPACE, scheduler_actor_name

        setup = getattr(run_context.backend_config, "setup", None)
        if setup is None:
            return {}
        scheduler = ray.get_actor(scheduler_actor_name(setup.run_id), namespace=SCHEDULER_NAMESPACE)
        snapshot = ray.get(scheduler.snapshot.remote(self._records_seen), timeout=30)
        self._records_seen += len(snapshot["records"])
        for record in snapshot["records"]:
            key = (int(record["step"]), int(record["rank"]))
            self._records[key] = {k: record.get(k) for k in _THROUGHPUT_FIELDS}
        if not self._records:
            return {}
        # Over every step so far: workers flush on their own schedule, so one report's new
        # records may hold some ranks' steps and not others'.
        return throughput_metrics(list(self._records.values()))


@ray.remote(num_cpus=0)
class ControllerMailbox:
    """Holds one actor handle: the Train controller of the trial that owns this actor."""

    def __init__(self) -> None:
        self._controller: Any = None

    def put(self, controller: Any) -> None:
        """Store the controller's handle."""
        self._controller = controller

    def get(self) -> Any:
        """The stored controller handle, or ``None``."""
        return self._controller


def run_trial(params: dict[str, Any], *, base_job: dict[str, Any], storage_path: str) -> None:
    """Tune function trainable: train ``base_job`` with ``params`` merged over it.

    Args:
        params: This trial's sampled values (dotted job keys).
        base_job: The job as JSON-able dict (``JobConfig.model_dump(mode="json")``).
        storage_path: Where Ray Train keeps this trial's run (checkpoints).
    """
    from ray import tune
    from ray.train import CheckpointConfig, RunConfig

    from raytrain_hetero.app.job import build_trainer, classification_loop

    job = trial_job(JobConfig.model_validate(base_job), params)
    context = tune.get_context()
    global _ACTIVE_MAILBOX
    _ACTIVE_MAILBOX = ControllerMailbox.remote()
    trainer = build_trainer(
        job,
        classification_loop,
        RunConfig(
            name=f"{context.get_experiment_name()}-{context.get_trial_id()}",
            storage_path=storage_path,
            checkpoint_config=CheckpointConfig(num_to_keep=1),
            callbacks=[HeteroTuneReportCallback(_ACTIVE_MAILBOX)],
        ),
    )
    trainer.fit()


class _AbortTrainOnStop:
    """Mixin for Tune's function trainable (via ``__mixins__``): when Tune stops the trial
    (ASHA, time budget), abort the trial's Train run first.

    Tune ends a stopped trial's actor, and with it the Train controller; a controller that
    dies this way leaves its placement group to Ray Train's cleaner actor, which needs the
    dashboard's state API and an unambiguous cluster address. Aborting through the
    controller removes the placement group at once, so the next trial gets the workers.
    """

    def cleanup(self) -> None:
        try:
            abort_active_train_run()
        finally:
            super().cleanup()  # type: ignore[misc]


run_trial.__mixins__ = (_AbortTrainOnStop,)  # type: ignore[attr-defined]

#: This trial process's mailbox (set by :func:`run_trial`, read when Tune stops the trial).
_ACTIVE_MAILBOX: Any = None


def abort_active_train_run(timeout_s: float = 60.0) -> bool:
    """Abort the Train run of this trial process, if one is running; True if aborted."""
    mailbox = _ACTIVE_MAILBOX
    if mailbox is None:
        return False
    try:
        controller = ray.get(mailbox.get.remote(), timeout=10)
    except Exception as exc:  # noqa: BLE001 - the mailbox died with a finished run
        logger.debug("no controller to abort: %s", exc)
        return False
    if controller is None:
        return False
    try:
        ray.get(controller.abort.remote(), timeout=timeout_s)
    except ray.exceptions.RayActorError:
        pass  # abort() ends the controller actor: this is the expected outcome
    except Exception as exc:  # noqa: BLE001 - best effort; Ray's cleaner remains
        logger.warning("could not abort the trial's Train run: %s", exc)
        return False
    logger.info("aborted the stopped trial's Train run")
    return True


# ----------------------------------------------------------------------------- resources


def _label_matches(labels: Mapping[str, str], selector: Mapping[str, str] | None) -> bool:
    """Whether a node with ``labels`` satisfies a Ray label selector (``v``, ``!v``,
    ``in(a,b)``, ``!in(a,b)``)."""
    for key, expr in (selector or {}).items():
        expr = expr.strip()
        negate = expr.startswith("!")
        body = expr[1:] if negate else expr
        if body.startswith("in(") and body.endswith(")"):
            allowed = {v.strip() for v in body[3:-1].split(",")}
        else:
            allowed = {body}
        present = labels.get(key)
        hit = present in allowed
        if hit == negate:
            return False
    return True


def _fits(need: Mapping[str, float], have: Mapping[str, float]) -> bool:
    return all(have.get(k, 0.0) + 1e-9 >= v for k, v in need.items() if v > 0)


def _take(need: Mapping[str, float], have: dict[str, float]) -> None:
    for k, v in need.items():
        have[k] = have.get(k, 0.0) - v


def concurrent_capacity(
    nodes: Sequence[Mapping[str, Any]], job: JobConfig, trial_cpus: float, limit: int
) -> int:
    """How many trials of ``job`` the nodes hold at once, each with its whole worker group.

    Packs, trial after trial, each worker (all of its resources, on one node matching its
    label selector, largest first) and the trial's driver (``trial_cpus`` CPUs, anywhere)
    onto the nodes' total resources, first fit.

    Args:
        nodes: Nodes as ``{"resources": {...}, "labels": {...}}``.
        job: The job every trial runs.
        trial_cpus: CPUs each trial's driver reserves.
        limit: Stop counting here (the number of trials).

    Returns:
        The number of trials that fit (0 if not even one does).
    """
    free = [dict(n.get("resources") or {}) for n in nodes]
    labels = [dict(n.get("labels") or {}) for n in nodes]
    workers = sorted(job.expanded_workers(), key=lambda s: -sum(s.resources.values()))
    for count in range(limit):
        trial_free = [dict(f) for f in free]
        for spec in workers:
            for i, have in enumerate(trial_free):
                if _label_matches(labels[i], spec.label_selector) and _fits(spec.resources, have):
                    _take(spec.resources, have)
                    break
            else:
                return count
        driver = {"CPU": trial_cpus}
        for have in trial_free:
            if _fits(driver, have):
                _take(driver, have)
                break
        else:
            return count
        free = trial_free
    return limit


def _cluster_nodes() -> list[dict[str, Any]]:
    return [
        {"resources": dict(n.get("Resources") or {}), "labels": dict(n.get("Labels") or {})}
        for n in ray.nodes()
        if n.get("Alive")
    ]


# ----------------------------------------------------------------------------- driver side


def _trial_count(job: JobConfig) -> int:
    space = job.tune.search_space if job.tune else {}
    grid = math.prod(len(d.grid) for d in space.values() if d.grid is not None)
    return job.tune.num_samples * grid if job.tune else 0


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


def decide_concurrency(job: JobConfig, nodes: Sequence[Mapping[str, Any]], *, local: bool) -> int:
    """Trials to run at once: ``tune.max_concurrent_trials``, else as many as fit.

    Raises:
        ConfigError: On an embedded local Ray (``local``) that cannot hold even one trial.
    """
    cfg = job.tune
    assert cfg is not None
    trials = _trial_count(job)
    fit = concurrent_capacity(nodes, job, cfg.trial_cpus, limit=max(trials, 1))
    if fit == 0:
        per_trial_cpu = sum(s.resources.get("CPU", 0.0) for s in job.expanded_workers())
        message = (
            f"not even one trial fits this Ray cluster: a trial needs its workers "
            f"({', '.join(f'{s.name}: {dict(s.resources)}' for s in job.expanded_workers())}) "
            f"plus {cfg.trial_cpus:g} CPU for its driver"
        )
        if local:
            raise ConfigError(
                f"{message}. Fix: raise ray.num_cpus to >= {per_trial_cpu + cfg.trial_cpus:g}, "
                "or use fewer/smaller workers."
            )
        logger.warning("%s; trials will wait for the autoscaler to add nodes", message)
        return cfg.max_concurrent_trials or 1
    if cfg.max_concurrent_trials is None:
        return min(fit, trials)
    if cfg.max_concurrent_trials > fit:
        logger.warning(
            "tune.max_concurrent_trials=%d but the cluster holds %d trial(s) at once: the "
            "others wait for workers (on an autoscaling cluster, for new nodes)",
            cfg.max_concurrent_trials,
            fit,
        )
    return cfg.max_concurrent_trials


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

    from raytrain_hetero.app.job import init_ray, prepare_dataset

    if job.tune is None:
        raise ConfigError(
            "the config has no tune: section. Fix: add tune: with at least search_space: "
            "(see examples/configs/eurosat_tune.yaml)."
        )
    cfg = job.tune
    out = Path(output_dir or job.output_dir).resolve()
    prepare_dataset(job)
    init_ray(job)
    out.mkdir(parents=True, exist_ok=True)
    storage = Path(job.ray.storage_path or (out / "ray_results")).resolve()
    concurrency = decide_concurrency(job, _cluster_nodes(), local=job.ray.address is None)
    experiment = f"{job.name}-tune-{time.strftime('%Y%m%d-%H%M%S')}"
    logger.info("tune %s: %d trial(s), %d at once", experiment, _trial_count(job), concurrency)
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
    _write_json(summary, out / "tune_summary.json")
    return summary


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def trial_rows(grid: Any, job: JobConfig) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """Flatten a Tune ``ResultGrid`` into table rows and per-trial metric histories."""
    assert job.tune is not None
    keys = list(job.tune.search_space)
    rows: list[dict[str, Any]] = []
    histories: dict[str, list[dict[str, Any]]] = {}
    for result in grid:
        metrics = dict(result.metrics or {})
        trial_id = str(metrics.get("trial_id") or Path(str(result.path)).name)
        frame = result.metrics_dataframe
        history = frame.to_dict("records") if frame is not None else []
        histories[trial_id] = history
        accuracies = [h.get("val_accuracy") for h in history if _finite(h.get("val_accuracy"))]
        workers = _workers_from_metrics(metrics)
        epochs = int(metrics.get("training_iteration") or 0)
        status = "error" if result.error else (
            "stopped early" if epochs < job.train.epochs else "completed"
        )
        row: dict[str, Any] = {
            "trial_id": trial_id,
            "status": status,
            "epochs": epochs,
            "val_accuracy": metrics.get("val_accuracy"),
            "best_val_accuracy": max(accuracies) if accuracies else None,
            "samples_per_s": metrics.get("samples_per_s"),
            "slices": " ".join(f"{n}:{w['slice']}" for n, w in workers.items()),  # rank order
            "error": _first_line(result.error) if result.error else "",
        }
        config = dict(result.config or {})
        for key in keys:
            row[f"config/{key}"] = _plain(config.get(key))
        for name, w in workers.items():
            row[f"workers/{name}/slice"] = w["slice"]
            row[f"workers/{name}/samples_per_s"] = w["samples_per_s"]
        row["_workers"] = workers
        rows.append(row)
    rows.sort(key=lambda r: r["trial_id"])
    return rows, histories


def _workers_from_metrics(metrics: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    nested = metrics.get("workers")
    workers: dict[str, dict[str, Any]] = defaultdict(dict)
    if isinstance(nested, Mapping):
        workers.update({str(k): dict(v) for k, v in nested.items()})
    else:
        for key, value in metrics.items():
            parts = key.split("/")
            if len(parts) == 3 and parts[0] == "workers":
                workers[parts[1]][parts[2]] = value
    return dict(sorted(workers.items(), key=lambda item: (item[1].get("rank", 0), item[0])))


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def _write_json(data: Mapping[str, Any], path: Path) -> Path:
    from raytrain_hetero.app.outputs import _atomic_write

    text = json.dumps(data, indent=2, default=str, allow_nan=True)
    return _atomic_write(path, lambda fh: fh.write(text), binary=False)


def write_trials_csv(rows: Iterable[Mapping[str, Any]], path: str | Path) -> Path:
    """Write one row per trial: :data:`TRIAL_COLUMNS`, then ``config/...``, ``workers/...``."""
    from raytrain_hetero.app.outputs import _atomic_write

    rows = list(rows)
    extra: list[str] = []
    for row in rows:
        for key in row:
            if key not in TRIAL_COLUMNS and not key.startswith("_") and key not in extra:
                extra.append(key)
    columns = list(TRIAL_COLUMNS) + sorted(extra, key=lambda k: (not k.startswith("config/"), k))

    def write(fh: IO[str]) -> None:
        writer = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore", lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if row.get(k) is None else row[k] for k in columns})

    return _atomic_write(path, write, binary=False)


def plot_trials(
    histories: Mapping[str, Sequence[Mapping[str, Any]]],
    rows: Sequence[Mapping[str, Any]],
    path: str | Path,
    *,
    metric: str = "val_accuracy",
    title: str = "Trials",
) -> Path:
    """Left: ``metric`` per epoch of every trial (early-stopped trials end early).
    Right: each trial's per-worker samples/s, stacked, with the run's samples/s marked."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    from raytrain_hetero.app.outputs import _atomic_write

    fig = Figure(figsize=(12, 5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax_metric, ax_tp = fig.subplots(1, 2)
    fig.suptitle(title)
    for trial_id, history in sorted(histories.items()):
        points = [
            (int(h["training_iteration"]), float(h[metric]))
            for h in history
            if _finite(h.get(metric)) and h.get("training_iteration") is not None
        ]
        if points:
            xs, ys = zip(*points)
            ax_metric.plot(xs, ys, marker="o", lw=1.2, label=trial_id)
    ax_metric.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_metric.set_xlabel("epoch")
    ax_metric.set_ylabel(metric)
    ax_metric.grid(alpha=0.3)
    if histories:
        ax_metric.legend(fontsize=8)
    names = sorted({n for r in rows for n in r.get("_workers", {})})
    bottoms = [0.0] * len(rows)
    xs = list(range(len(rows)))
    for name in names:
        heights = [
            float(r["_workers"][name]["samples_per_s"])
            if name in r.get("_workers", {}) and _finite(r["_workers"][name]["samples_per_s"])
            else 0.0
            for r in rows
        ]
        ax_tp.bar(xs, heights, bottom=bottoms, label=name)
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    totals = [float(r["samples_per_s"]) if _finite(r.get("samples_per_s")) else math.nan for r in rows]
    ax_tp.plot(xs, totals, "k_", markersize=30, mew=2, label="run samples/s")
    ax_tp.set_xticks(xs, [str(r["trial_id"]) for r in rows], rotation=30, ha="right", fontsize=8)
    # Per worker: samples over its own busy time; the run: samples over each step's wall time.
    ax_tp.set_ylabel("samples / s (per worker, stacked)")
    ax_tp.grid(alpha=0.3, axis="y")
    if names:
        ax_tp.legend(fontsize=8)

    def write(fh: IO[bytes]) -> None:
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        fh.write(buf.getvalue())

    return _atomic_write(path, write, binary=True)


def format_best(summary: Mapping[str, Any]) -> str:
    """Human-readable lines about the best trial (what ``raytrain-hetero tune`` prints)."""
    from raytrain_hetero.app.outputs import format_worker_table

    best = summary["best"]
    config = ", ".join(f"{k}={v}" for k, v in best["config"].items())
    lines = [
        f"best trial {best['trial_id']}: {summary['metric']}={best[summary['metric']]:.4f} "
        f"after {best['epochs']} epoch(s), samples/s={float(best['samples_per_s'] or 'nan'):.1f}",
        f"best config: {config}",
    ]
    rows = [
        {"rank": w.get("rank"), "worker": name, "device": w.get("device"),
         "samples_per_s": w.get("samples_per_s"), "slice": w.get("slice"), "weight": w.get("weight")}
        for name, w in sorted(best["workers"].items(), key=lambda item: item[1].get("rank", 0))
    ]
    if rows:
        lines.append(format_worker_table(rows))
    return "\n".join(lines)
