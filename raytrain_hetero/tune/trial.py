"""The Tune trial side of a HeteroTrainer: what a trial reports to Tune, and its clean stop.

Train V2 pattern (Ray 2.60 refuses a trainer passed to ``Tuner``): a trial is a function
trainable, wrapped with :func:`abort_train_on_stop`, that builds a HeteroTrainer whose
``RunConfig`` carries :func:`trial_report_callback` and calls ``fit()``. When Tune stops a
trial (ASHA), the trial first aborts its Train run through the Train controller, which removes
the run's placement group at once; otherwise the freed workers would depend on Ray Train's
cleaner actor, which needs the dashboard's state API and an unambiguous cluster address.

The trial ends its run in two places, whichever comes first: :class:`EndTrainRunOnStop`, a
driver-side Tune callback that has the trial do it (and waits) before Tune stops its actor,
and the trial actor's ``cleanup`` (stops that skip the callback). Why both: when a search
ends, Tune kills a stopping trial's actor 10 s after the stop (fixed in Ray 2.60); under load
the wind-down (the tracker's catch-up, the abort, MLflow's close) takes longer, and a killed
trial leaves its placement group (it belongs to the job) and its MLflow run ``RUNNING``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import ray
from ray.tune import Callback
from ray.tune.integration.ray_train import TuneReportCallback

from raytrain_hetero.core.records import (
    StepRecord,
    run_samples_per_s,
    summarize_workers,
)
from raytrain_hetero.driver._ray_compat import (
    abort_train_controller,
    mark_trainable_mixins,
    run_backend_config,
    tune_trial_actor,
)
from raytrain_hetero.errors import ConfigError

__all__ = [
    "ControllerMailbox",
    "EndTrainRunOnStop",
    "HeteroTuneReportCallback",
    "abort_active_train_run",
    "abort_train_on_stop",
    "catch_up_active_tracker",
    "end_active_train_run",
    "plain_value",
    "release_active_allocation",
    "set_active_allocation",
    "throughput_metrics",
    "track_trial",
    "trial_report_callback",
]

logger = logging.getLogger(__name__)


def plain_value(value: Any) -> Any:
    """numpy scalars (Tune samples with numpy) as plain Python values."""
    return value.item() if hasattr(value, "item") and not isinstance(value, (list, dict)) else value


def throughput_metrics(records: Iterable[StepRecord]) -> dict[str, Any]:
    """The run's samples/s and each worker's ``rank``, ``slice``, ``weight``, ``samples_per_s``
    and ``device`` over ``records`` (the one aggregation of :mod:`raytrain_hetero.core.records`),
    as ``{"samples_per_s": float, "workers": {name: {...}}}``; a worker seen at several ranks
    (elastic restarts) is shown at its latest.
    """
    records = list(records)
    latest: dict[str, Any] = {}
    for summary in summarize_workers(records):
        known = latest.get(summary.worker)
        if known is None or summary.last_step > known.last_step:
            latest[summary.worker] = summary
    workers = {
        name: {
            "rank": w.rank,
            "slice": w.slice,
            "weight": w.weight,
            "samples_per_s": w.samples_per_s,
            "device": w.device,
        }
        for name, w in latest.items()
    }
    return {"samples_per_s": run_samples_per_s(records), "workers": workers}


class HeteroTuneReportCallback(TuneReportCallback):
    """``TuneReportCallback`` that adds throughput and per-worker slices to every report.

    Runs in the Ray Train controller: on each report it reads the latest step records from the
    run's scheduler actor and adds ``samples_per_s`` and ``workers/<name>/...`` to rank 0's
    metrics before they go to Tune. Build it inside the Tune trial (it connects to the trial's
    session). ``controller_mailbox``: a :class:`ControllerMailbox` that gets the Train
    controller's handle, so the trial can abort the run when Tune stops it early.
    """

    def __init__(self, controller_mailbox: Any = None) -> None:
        super().__init__()
        self._controller_mailbox = controller_mailbox
        self._controller_announced = False

    def after_report(
        self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any
    ) -> None:
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
        from raytrain_hetero.driver.scheduler import lookup_scheduler

        setup = getattr(run_backend_config(run_context), "setup", None)
        scheduler = lookup_scheduler(setup.run_id) if setup is not None else None
        if scheduler is None:
            return {}
        records = ray.get(scheduler.recent_records.remote(), timeout=30)
        return throughput_metrics(records) if records else {}


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


def trial_report_callback() -> HeteroTuneReportCallback:
    """The report callback for the Train run of the current Tune trial (call inside it; put it in
    the ``RunConfig.callbacks``), with this trial's :class:`ControllerMailbox`.
    """
    global _ACTIVE_MAILBOX
    _ACTIVE_MAILBOX = ControllerMailbox.remote()
    return HeteroTuneReportCallback(_ACTIVE_MAILBOX)


class _AbortTrainOnStop:
    """Mixin for Tune's function trainable (``mark_trainable_mixins``): when Tune stops the
    trial (ASHA, time budget), abort its Train run first (why: the module docstring).
    """

    def end_train_run(self, reports: int) -> None:
        """End this trial's Train run now (:class:`EndTrainRunOnStop` calls it from the
        driver); ``reports``: the reports Tune has of this trial."""
        end_active_train_run(reports)

    def cleanup(self) -> None:
        try:
            end_active_train_run(int(getattr(self, "training_iteration", 0) or 0))
        finally:
            super().cleanup()  # type: ignore[misc]


class EndTrainRunOnStop(Callback):
    """Tune callback (driver side): when a trial ends, early (ASHA) or not, have its trial
    process end its Train run, and wait for it, before Tune stops the trial's actor.

    Tune calls ``on_trial_complete`` in its own loop before it schedules the stop, so the
    wind-down is bounded by ``timeout_s`` here, not by the 10 s Tune allows a stopping trial
    when the search ends (the module docstring). The trainable must carry
    :func:`abort_train_on_stop`; other trials are left alone. Put it in
    ``tune.RunConfig(callbacks=[...])`` of a search over HeteroTrainer trials.

    Args:
        timeout_s: The longest wait for one trial's wind-down; past it Tune goes on (the
            trial's own ``cleanup`` still tries, within Tune's limit).
    """

    def __init__(self, timeout_s: float = 180.0) -> None:
        if not (isinstance(timeout_s, int | float) and 0 < timeout_s < float("inf")):
            raise ConfigError(
                f"EndTrainRunOnStop(timeout_s={timeout_s!r}): the longest wait for a stopped "
                "trial's wind-down must be a finite number of seconds > 0. Fix: pass e.g. "
                "timeout_s=180."
            )
        self._timeout_s = float(timeout_s)

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        actor = tune_trial_actor(trial)
        if actor is None or not hasattr(actor, "end_train_run"):
            return
        reports = int((trial.last_result or {}).get("training_iteration", 0) or 0)
        try:
            ray.get(actor.end_train_run.remote(reports), timeout=self._timeout_s)
        except Exception as exc:  # noqa: BLE001 - the search goes on; cleanup tries again
            logger.warning("trial %s could not end its Train run: %s", trial, exc)


def abort_train_on_stop(trainable: Callable[..., Any]) -> Callable[..., Any]:
    """Make Tune abort ``trainable``'s Train run before it stops the trial, so the run's
    placement group is freed at once; returns ``trainable``. Apply it at module level to a
    function trainable importable by module path (the mixin travels as an attribute).
    """
    mark_trainable_mixins(trainable, _AbortTrainOnStop)
    return trainable


#: This trial process's mailbox (set by :func:`trial_report_callback`, read when Tune stops
#: the trial).
_ACTIVE_MAILBOX: Any = None


#: This trial process's allocator and trial id under ``tune.allocation: auto`` (set by
#: :func:`set_active_allocation`, released when Tune stops the trial).
_ACTIVE_ALLOCATION: tuple[Any, str] | None = None


def set_active_allocation(allocator: Any, trial_id: str | None) -> None:
    """Remember (or forget, with None) this trial's allocator actor, so that a stop by Tune
    gives its workers back at once."""
    global _ACTIVE_ALLOCATION
    _ACTIVE_ALLOCATION = (allocator, trial_id) if allocator is not None and trial_id else None


def release_active_allocation() -> bool:
    """Give this trial's workers back to its allocator (Tune stopped it); True if it had one."""
    active = _ACTIVE_ALLOCATION
    if active is None:
        return False
    allocator, trial_id = active
    try:
        ray.get(allocator.release.remote(trial_id, "stopped by the trial scheduler"), timeout=10)
    except Exception as exc:  # noqa: BLE001 - best effort while the trial stops
        logger.warning("could not release the stopped trial's workers: %s", exc)
        return False
    set_active_allocation(None, None)
    return True


#: This trial process's open experiment tracker and the reports that complete its trial
#: (set by :func:`track_trial`).
_ACTIVE_TRACKER: Any = None
_ACTIVE_REPORTS: int | None = None


@contextlib.contextmanager
def track_trial(tracker: Any, *, reports: int | None = None) -> Iterator[Any]:
    """Make ``tracker`` (an open :class:`~raytrain_hetero.driver.tracking.RunTracker`) this
    trial's: closed at the end of the block (``FAILED`` on an exception), or ``KILLED`` when
    Tune stops the trial before its last report (ASHA; see :func:`abort_train_on_stop`).

    Args:
        tracker: The open tracker.
        reports: Reports of a complete trial (its epochs). Tune stops a trial whose last
            report it has as well (ASHA at ``max_t``), while its run winds down: that trial
            closes ``FINISHED``. None: every stop counts as early.
    """
    global _ACTIVE_TRACKER, _ACTIVE_REPORTS
    _ACTIVE_TRACKER, _ACTIVE_REPORTS = tracker, reports
    try:
        yield tracker
    except BaseException:
        tracker.close(failed=True)
        raise
    else:
        tracker.close()
    finally:
        _ACTIVE_TRACKER, _ACTIVE_REPORTS = None, None


def catch_up_active_tracker() -> None:
    """Bring this trial's open tracker what its run reported but has not delivered yet."""
    tracker = _ACTIVE_TRACKER
    if tracker is not None:
        tracker.catch_up()


def close_active_tracker(reports: int = 0) -> None:
    """Close this trial's open tracker, if there is one, when Tune stops the trial: as
    stopped (``KILLED``), or as finished if Tune already had ``reports`` >= the trial's
    complete count (:func:`track_trial`); forgets it, so a later stop finds none."""
    global _ACTIVE_TRACKER
    tracker, _ACTIVE_TRACKER = _ACTIVE_TRACKER, None
    if tracker is not None:
        complete = _ACTIVE_REPORTS is not None and reports >= _ACTIVE_REPORTS
        try:
            tracker.close(stopped=not complete)
        except Exception as exc:  # noqa: BLE001 - best effort while the trial stops
            logger.warning("could not close the stopped trial's tracker: %s", exc)


def end_active_train_run(reports: int) -> None:
    """Wind down this trial process's Train run as Tune stops the trial: what the run reported
    into the tracker, the run aborted, its workers given back (``tune.allocation: auto``), the
    tracker closed. Each part is done once: a second call finds nothing left to do.

    Args:
        reports: The reports Tune has of this trial: with all of them (ASHA stops at
            ``max_t`` too) the trial's tracker closes as finished, not stopped.
    """
    # The report Tune acted on may not be in the tracker yet: take it while the run's
    # scheduler still lives (the abort ends it).
    catch_up_active_tracker()
    abort_active_train_run()
    release_active_allocation()
    close_active_tracker(reports=reports)


def abort_active_train_run(timeout_s: float = 60.0) -> bool:
    """Abort the Train run of this trial process, if one is running; True if aborted."""
    global _ACTIVE_MAILBOX
    mailbox, _ACTIVE_MAILBOX = _ACTIVE_MAILBOX, None
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
        abort_train_controller(controller, timeout_s)
    except Exception as exc:  # noqa: BLE001 - best effort; Ray's cleaner remains
        logger.warning("could not abort the trial's Train run: %s", exc)
        return False
    logger.info("aborted the stopped trial's Train run")
    return True
