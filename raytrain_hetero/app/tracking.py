"""The YAML job's side of experiment tracking (``tracking:``): which
:class:`~raytrain_hetero.driver.tracking.RunTracker` a job, a Tune search or a trial opens.

Defaults: TensorBoard under ``<output_dir>/tensorboard``, the MLflow experiment named after
the job, the resolved job as params; a search opens one parent MLflow run, each trial its own
run nested under it and its own TensorBoard directory ``<log_dir>/<search>/<trial run>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from raytrain_hetero.app.schema import JobConfig
from raytrain_hetero.config import TensorBoardConfig, TrackingConfig
from raytrain_hetero.driver.tracking import RunTracker

__all__ = [
    "JOB_ARTIFACTS",
    "SEARCH_ARTIFACTS",
    "job_tracker",
    "resolved_tracking",
    "search_tracker",
    "trial_tracker",
]

#: Output files of ``raytrain-hetero train`` logged as MLflow artifacts.
JOB_ARTIFACTS = ("throughput.png", "summary.json", "metrics.csv")
#: Output files of ``raytrain-hetero tune`` logged to the search's MLflow run.
SEARCH_ARTIFACTS = ("trials.png", "trials.csv", "tune_summary.json")

#: MLflow tag naming the Tune search a trial's run belongs to.
SEARCH_TAG = "raytrain_hetero.search"


def resolved_tracking(job: JobConfig, output_dir: Path) -> TrackingConfig:
    """``job.tracking`` with its TensorBoard directory made absolute (default
    ``<output_dir>/tensorboard``), so Tune trials, which run in their own working
    directories, write where the user looks."""
    tracking = job.tracking
    log_dir = Path(tracking.tensorboard.log_dir or Path(output_dir) / "tensorboard").resolve()
    return tracking.model_copy(
        update={"tensorboard": tracking.tensorboard.model_copy(update={"log_dir": log_dir})}
    )


def job_tracker(
    job: JobConfig, output_dir: Path, run_name: str, *, resume: bool = False
) -> RunTracker | None:
    """The (unopened) tracker of a ``train`` run, or None when ``tracking`` is off; a resumed
    run (``--resume``) continues its MLflow run and TensorBoard directory."""
    if not job.tracking.active:
        return None
    return _tracker(job, resolved_tracking(job, output_dir), run_name, resume=resume)


def search_tracker(job: JobConfig, output_dir: Path, experiment: str) -> RunTracker | None:
    """The parent MLflow run of a Tune search (no TensorBoard: the trials write theirs), or
    None when MLflow tracking is off."""
    if not job.tracking.mlflow.enabled:
        return None
    tracking = job.tracking.model_copy(update={"tensorboard": TensorBoardConfig()})
    return _tracker(job, tracking, experiment, tags={SEARCH_TAG: experiment})


def trial_tracker(
    job: JobConfig,
    tracking: dict[str, Any],
    *,
    experiment: str,
    run_name: str,
    parent_run_id: str | None,
) -> RunTracker | None:
    """The tracker of one Tune trial (``job``: its values merged in): its own TensorBoard
    directory and MLflow run, nested under the search's ``parent_run_id`` and tagged with the
    search; ``tracking`` is the search's :func:`resolved_tracking` as JSON.
    """
    config = TrackingConfig.model_validate(tracking)
    if not config.active:
        return None
    return _tracker(
        job,
        config,
        run_name,
        tensorboard_subdir=f"{experiment}/{run_name}",
        tags={SEARCH_TAG: experiment},
        parent_run_id=parent_run_id,
    )


def _tracker(job: JobConfig, tracking: TrackingConfig, run_name: str, **options: Any) -> RunTracker:
    """A tracker of ``job`` (its params the resolved job, its default experiment the job's
    name)."""
    return RunTracker(
        tracking,
        run_name=run_name,
        params=job.model_dump(mode="json"),
        default_experiment=job.name,
        **options,
    )
