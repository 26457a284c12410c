"""Experiment tracking on the driver: TensorBoard event files and an MLflow run per training run.

A :class:`RunTracker` (a progress callback of
:meth:`HeteroTrainer.fit <raytrain_hetero.driver.trainer.HeteroTrainer.fit>`) is fed what the
driver already drains from the scheduler actor: step records, plans, and rank 0's epoch
reports, which :class:`ReportForwarder` (a Ray Train ``UserCallback``) hands to the same actor.
It writes per step ``train/loss`` (the global batch's), ``train/samples_per_s`` and per-rank
slice, weight and samples/s; each report's numeric keys at its step; ``plan/version`` and text
events for plans and worker groups; MLflow params (:func:`flatten_params`) and artifacts.
Tracking never stops training: a sink that fails is logged and skipped.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import ray
from ray.train import UserCallback

from raytrain_hetero.config.tracking import TrackingConfig
from raytrain_hetero.core.plan import Plan
from raytrain_hetero.core.records import StepRecord
from raytrain_hetero.driver.telemetry import FitProgress, ProgressCallback
from raytrain_hetero.errors import ConfigError

__all__ = ["ReportForwarder", "RunTracker", "fan_out", "flatten_params"]

logger = logging.getLogger(__name__)

#: MLflow's limits (mlflow.utils.validation): params per batch, metrics per batch, value length.
_PARAMS_PER_BATCH = 100
_METRICS_PER_BATCH = 1000
_MAX_PARAM_VALUE = 6000

#: MLflow tag holding the Ray run name (a resumed run finds its MLflow run by it).
RUN_TAG = "raytrain_hetero.run"

#: Report keys not logged per epoch (per-rank figures: the per-step scalars carry them).
_SKIPPED_REPORT_PREFIXES = ("hetero/rank",)


def flatten_params(values: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """A nested configuration as flat ``dotted.key -> text`` params (MLflow's params).

    Mappings nest (``train.lr``), lists of mappings are indexed (``workers.0.name``), other
    lists and scalars become JSON text (``[1, 2]``, ``0.05``, ``null``); values longer than
    MLflow's limit are cut with a trailing ``...``.
    """
    out: dict[str, str] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten_params(value, f"{name}."))
        elif isinstance(value, Sequence) and not isinstance(value, str) and _all_mappings(value):
            for index, item in enumerate(value):
                out.update(flatten_params(item, f"{name}.{index}."))
        else:
            text = _param_text(value)
            cut = _MAX_PARAM_VALUE - 3
            out[name] = text if len(text) <= _MAX_PARAM_VALUE else text[:cut] + "..."
    return out


def _all_mappings(items: Sequence[Any]) -> bool:
    return bool(items) and all(isinstance(item, Mapping) for item in items)


def _param_text(value: Any) -> str:
    if isinstance(value, Path):
        return str(value)
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)


def fan_out(*callbacks: ProgressCallback | None) -> ProgressCallback:
    """One progress callback calling each given one in turn (``None`` entries skipped)."""
    active = [c for c in callbacks if c is not None]

    def call(update: FitProgress) -> None:
        for callback in active:
            callback(update)

    return call


class ReportForwarder(UserCallback):
    """Ray Train callback (runs in the Train controller): hands rank 0's report of every
    ``ray.train.report`` to the run's scheduler actor, whose drain brings it to the driver's
    :class:`RunTracker` with the step records.

    Args:
        run_id: The HeteroTrainer run whose scheduler actor takes the reports.
    """

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id

    def after_report(
        self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any
    ) -> None:
        from raytrain_hetero.driver.scheduler import lookup_scheduler

        if not metrics:
            return
        scheduler = lookup_scheduler(self.run_id)
        if scheduler is None:
            return
        try:
            # Waited for, so the driver's last drain after fit() sees the last epoch.
            ray.get(scheduler.record_report.remote(dict(metrics[0])), timeout=10)
        except Exception as exc:  # noqa: BLE001 - tracking must not fail the run
            logger.warning("epoch report not forwarded to the tracker: %s", exc)


class RunTracker:
    """The TensorBoard run directory and MLflow run of one training run.

    Open it (:meth:`open`, or ``with``) before ``fit``, pass it to ``fit(tracker=...)``,
    then log the run's files with :meth:`log_artifacts` and :meth:`close` it.

    Args:
        config: Which sinks, where.
        run_name: The run's name (TensorBoard sub-directory; MLflow run name unless
            ``config.mlflow.run_name``).
        params: The resolved configuration (nested; logged flattened as MLflow params).
        default_log_dir: TensorBoard parent directory when ``config.tensorboard.log_dir``
            is unset.
        default_experiment: MLflow experiment when ``config.mlflow.experiment_name`` is unset.
        tensorboard_subdir: The run's directory under the log dir (default ``run_name``; a
            Tune trial: ``<search>/<trial>``).
        tags: MLflow run tags.
        parent_run_id: MLflow run this one is nested under (a Tune search's run).
        resume: Continue the newest MLflow run of ``run_name`` (a Ray run resumed from its
            checkpoint) instead of starting a new one; TensorBoard appends to the same
            directory either way.
    """

    def __init__(
        self,
        config: TrackingConfig,
        *,
        run_name: str,
        params: Mapping[str, Any],
        default_log_dir: Path = Path("tensorboard"),
        default_experiment: str | None = None,
        tensorboard_subdir: str | None = None,
        tags: Mapping[str, str] | None = None,
        parent_run_id: str | None = None,
        resume: bool = False,
    ) -> None:
        config.check_installed()
        self.resume = resume
        self.config = config
        self.run_name = run_name
        self.params = flatten_params(params)
        log_dir = config.tensorboard.log_dir or default_log_dir
        self.tensorboard_dir: Path | None = (
            Path(log_dir, tensorboard_subdir or run_name).resolve()
            if config.tensorboard.enabled
            else None
        )
        self.experiment_name = config.mlflow.experiment_name or default_experiment or run_name
        self.tags = dict(tags or {})
        self.parent_run_id = parent_run_id
        self.mlflow_run_id: str | None = None
        self._writer: Any = None
        self._client: Any = None
        self._pending: dict[tuple[str, int], list[StepRecord]] = {}
        self._plan_versions: set[int] = set()
        self._groups: set[str] = set()
        self._plans: list[dict[str, Any]] = []
        self._metrics: list[Any] = []
        # Tune may close a stopped trial's tracker while the trial's fit thread feeds it.
        self._lock = threading.Lock()
        self._source: Callable[[], object] | None = None

    def attach_source(self, drain: Callable[[], object] | None) -> None:
        """The call that brings the run's undelivered updates to this tracker (the fit's
        :meth:`RecordCollector.drain <raytrain_hetero.driver.telemetry.RecordCollector.drain>`;
        ``HeteroTrainer.fit`` attaches it while it runs), or None to detach."""
        self._source = drain

    def catch_up(self) -> None:
        """Take what the run has reported but not yet delivered (one drain of its scheduler).

        Tune stops a trial as soon as it has the report it acts on (ASHA at ``max_t``), which
        can be before the fit's next drain brings that report here; the trial calls this before
        it aborts the run and closes the tracker, so the last epoch is logged too.
        """
        source = self._source
        if source is not None:
            try:
                source()
            except Exception as exc:  # noqa: BLE001 - tracking never stops training
                logger.warning("could not take the run's last updates: %s", exc)

    def open(self) -> RunTracker:
        """Create the event-file writer and the MLflow run (with its params); returns self.

        Raises:
            ConfigError: The MLflow tracking URI or experiment cannot be used.
        """
        if self.tensorboard_dir is not None and self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard_dir.mkdir(parents=True, exist_ok=True)
            self._writer = SummaryWriter(log_dir=str(self.tensorboard_dir), flush_secs=10)
        if self.config.mlflow.enabled and self._client is None:
            self._open_mlflow()
        return self

    def _open_mlflow(self) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Param

        mlflow_config = self.config.mlflow
        try:
            client = MlflowClient(tracking_uri=mlflow_config.tracking_uri)
            experiment = client.get_experiment_by_name(self.experiment_name)
            experiment_id = (
                experiment.experiment_id
                if experiment is not None
                else client.create_experiment(
                    self.experiment_name, artifact_location=mlflow_config.artifact_location
                )
            )
            run = self._earlier_run(client, experiment_id) if self.resume else None
            if run is not None:
                client.update_run(run.info.run_id, status="RUNNING")
            else:
                tags = {**self.tags, RUN_TAG: self.run_name}
                if self.parent_run_id is not None:
                    tags["mlflow.parentRunId"] = self.parent_run_id
                run = client.create_run(
                    experiment_id, run_name=mlflow_config.run_name or self.run_name, tags=tags
                )
        except Exception as exc:  # stores fail with many types; each means this
            raise ConfigError(
                f"tracking.mlflow: cannot start a run at tracking_uri="
                f"{mlflow_config.tracking_uri!r}, experiment {self.experiment_name!r}: {exc}. "
                "Fix: point tracking.mlflow.tracking_uri at a reachable MLflow server or a "
                "database (sqlite:////abs/path/mlflow.db; MLflow 3 refuses file: stores "
                "unless MLFLOW_ALLOW_FILE_STORE=true)."
            ) from exc
        self._client = client
        self.mlflow_run_id = run.info.run_id
        logged = dict(run.data.params)
        changed = sorted(k for k, v in self.params.items() if logged.get(k, v) != v)
        if changed:  # MLflow params are immutable: a resumed run keeps its first values
            logger.warning("MLflow run %s keeps its earlier params %s", run.info.run_id, changed)
        fresh = {k: v for k, v in self.params.items() if k not in logged}
        items = [Param(k, v) for k, v in sorted(fresh.items())]
        for start in range(0, len(items), _PARAMS_PER_BATCH):
            client.log_batch(self.mlflow_run_id, params=items[start : start + _PARAMS_PER_BATCH])

    def _earlier_run(self, client: Any, experiment_id: str) -> Any:
        """The newest MLflow run of this Ray run (tag ``raytrain_hetero.run``), or None."""
        runs = client.search_runs(
            [experiment_id],
            filter_string=f"tags.`{RUN_TAG}` = '{self.run_name}'",
            order_by=["attributes.start_time DESC"],
            max_results=1,
        )
        return runs[0] if runs else None

    def __enter__(self) -> RunTracker:
        try:
            return self.open()
        except BaseException:
            self.close(failed=True)  # an MLflow store that failed: close the event files
            raise

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
        self.close(failed=kind is not None)

    def close(self, *, failed: bool = False, stopped: bool = False) -> None:
        """Write what is pending (a step some rank never finished included), ``plans.json``,
        and end the MLflow run: ``FAILED`` if ``failed``, ``KILLED`` if ``stopped`` (a Tune
        trial stopped early), else ``FINISHED``. Closing again does nothing."""
        with self._lock:
            self._close("FAILED" if failed else "KILLED" if stopped else "FINISHED")

    def _close(self, status: str) -> None:
        for key in sorted(self._pending, key=lambda k: k[1]):
            self._emit_step(self._pending[key])
        self._pending.clear()
        self._flush_metrics()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if self._client is not None and self.mlflow_run_id is not None:
            self._sink(
                "MLflow", self._client.log_dict, self.mlflow_run_id, self._plans, "plans.json"
            )
            self._sink("MLflow", self._client.set_terminated, self.mlflow_run_id, status)
            self._client = None

    def __call__(self, update: FitProgress) -> None:
        """A progress update of ``HeteroTrainer.fit``: new step records, all plans and new
        epoch reports of rank 0."""
        with self._lock:
            self._feed(update)

    def _feed(self, update: FitProgress) -> None:
        for plan in update.plans:
            if plan.version not in self._plan_versions:
                self._plan_versions.add(plan.version)
                self._plans.append(plan.to_dict())  # plans.json, at close
                self._emit_plan(plan)
        for record in update.records:
            self._take(record)
        for report in update.reports:
            self._emit_report(report)
        self._flush_metrics()

    def log_artifacts(self, paths: Iterable[Path], artifact_path: str | None = None) -> None:
        """Upload files (plots, ``summary.json``, ``metrics.csv``) to the MLflow run."""
        if self._client is None or self.mlflow_run_id is None:
            return
        for path in paths:
            if Path(path).is_file():
                self._sink(
                    "MLflow",
                    self._client.log_artifact,
                    self.mlflow_run_id,
                    str(path),
                    artifact_path,
                )

    def _take(self, record: StepRecord) -> None:
        if record.group not in self._groups:
            self._groups.add(record.group)
            self._text(
                "workers", f"worker group {record.group}: {record.world_size} rank(s)", record.step
            )
        key = (record.group, record.step)
        ranks = self._pending.setdefault(key, [])
        ranks.append(record)
        if len(ranks) >= record.world_size:
            self._emit_step(self._pending.pop(key))

    def _emit_step(self, records: list[StepRecord]) -> None:
        step = records[0].step
        weighted = [(r.slice, r.loss) for r in records if math.isfinite(r.loss)]
        samples = sum(n for n, _ in weighted)
        if samples > 0:
            self._scalar("train/loss", sum(n * loss for n, loss in weighted) / samples, step)
        rates = [r.global_samples_per_s for r in records if math.isfinite(r.global_samples_per_s)]
        if rates:
            self._scalar("train/samples_per_s", max(rates), step)
        for record in sorted(records, key=lambda r: r.rank):
            prefix = f"worker/rank{record.rank}"
            self._scalar(f"{prefix}/slice", record.slice, step)
            self._scalar(f"{prefix}/weight", record.weight, step)
            if record.has_speed:
                self._scalar(f"{prefix}/samples_per_s", record.samples_per_s, step)

    def _emit_plan(self, plan: Plan) -> None:
        step = plan.effective_step
        self._scalar("plan/version", plan.version, step)
        self._text(
            "plans",
            f"plan v{plan.version} from step {step}: slices {list(plan.slices)} ({plan.reason})",
            step,
        )

    def _emit_report(self, report: Mapping[str, Any]) -> None:
        step = int(report.get("hetero/global_step", 0))
        for key, value in sorted(report.items()):
            if key.startswith(_SKIPPED_REPORT_PREFIXES) or isinstance(value, bool):
                continue
            if isinstance(value, int | float) and math.isfinite(value):
                self._scalar(key, value, step)

    def _scalar(self, tag: str, value: float, step: int) -> None:
        if self._writer is not None:
            self._sink("TensorBoard", self._writer.add_scalar, tag, float(value), step)
        if self._client is not None:
            from mlflow.entities import Metric

            self._metrics.append(Metric(tag, float(value), int(time.time() * 1000), step))

    def _text(self, tag: str, text: str, step: int) -> None:
        if self._writer is not None:
            self._sink("TensorBoard", self._writer.add_text, tag, text, step)

    def _flush_metrics(self) -> None:
        if self._writer is not None:
            self._sink("TensorBoard", self._writer.flush)
        metrics, self._metrics = self._metrics, []
        if self._client is None:
            return
        for start in range(0, len(metrics), _METRICS_PER_BATCH):
            self._sink(
                "MLflow",
                self._client.log_batch,
                self.mlflow_run_id,
                metrics=metrics[start : start + _METRICS_PER_BATCH],
            )

    def _sink(self, name: str, call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        try:
            call(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - tracking never stops training
            logger.warning("%s tracking failed (%s); training goes on", name, exc)
