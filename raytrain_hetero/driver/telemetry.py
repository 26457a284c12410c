"""The driver's side of the run's telemetry: draining the scheduler actor while a run trains.

:class:`RecordCollector` drains the scheduler actor (:meth:`HeteroScheduler.drain
<raytrain_hetero.driver.scheduler.HeteroScheduler.drain>`) with a cursor, so the actor can drop
what the driver holds, and keeps every :class:`~raytrain_hetero.core.records.StepRecord` once
(by key: a record delivered twice, e.g. resent to a restarted actor, is kept once).
:meth:`RecordCollector.run_draining` trains on a worker thread and drains on the caller's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import ray

from raytrain_hetero.core.plan import Plan
from raytrain_hetero.core.policy import PendingReplan
from raytrain_hetero.core.records import StepRecord

logger = logging.getLogger(__name__)

#: Pause between the last drain's tries while Ray restarts the scheduler actor.
_RESTART_RETRY_S = 0.2

__all__ = ["FitProgress", "ProgressCallback", "RecordCollector"]

T = TypeVar("T")


@dataclass(frozen=True)
class FitProgress:
    """What one drain of the scheduler brought, as handed to a progress callback.

    Attributes:
        records: Step records new to the driver, in arrival order.
        plans: Every plan installed so far (history order).
        admission: The run's admission decision (``admission: auto``), or None.
        reports: Rank 0's epoch reports new to the driver (with a ``ReportForwarder``).
    """

    records: tuple[StepRecord, ...] = ()
    plans: tuple[Plan, ...] = ()
    admission: dict[str, Any] | None = None
    reports: tuple[dict[str, Any], ...] = ()


#: A progress callback of ``HeteroTrainer.fit``.
ProgressCallback = Callable[[FitProgress], None]


class RecordCollector:
    """Everything the driver learned from the run's scheduler actor: every step record and
    epoch report, each once, the plans (a restarted actor's merged in), the live re-plans and
    the admission decision. ``progress`` gets a :class:`FitProgress` after each drain that
    brought something; ``timeout_s`` bounds one drain."""

    def __init__(
        self, scheduler: Any, progress: ProgressCallback | None = None, timeout_s: float = 30.0
    ) -> None:
        self.scheduler = scheduler
        self.progress = progress
        self.timeout_s = timeout_s
        self.records: list[StepRecord] = []
        self.plans: list[Plan] = []
        self.decisions: list[PendingReplan] = []
        self.admission: dict[str, Any] | None = None
        self.reports: list[dict[str, Any]] = []
        self._keys: set[tuple[str, int, int]] = set()
        self._cursor = 0
        self._incarnation: str | None = None
        # The fit's draining thread and a stopping Tune trial (RunTracker.catch_up) may drain
        # at once; one at a time keeps the cursor and "new" exact.
        self._drain_lock = threading.RLock()

    def drain(self, *, wait_restart: bool = False) -> list[StepRecord]:
        """Drain the actor once; returns the records new to the driver (never raises;
        thread-safe). ``wait_restart``: if Ray is restarting the actor, wait for it (at most
        ``timeout_s``) instead of giving up (the run's last drain)."""
        with self._drain_lock:
            return self._drain(wait_restart=wait_restart)

    def _drain(self, *, wait_restart: bool = False) -> list[StepRecord]:
        deadline = time.monotonic() + self.timeout_s
        while True:
            try:
                drained = ray.get(
                    self.scheduler.drain.remote(self._cursor, self._incarnation),
                    timeout=self.timeout_s,
                )
                break
            except ray.exceptions.ActorUnavailableError as exc:
                # Ray is restarting the actor: the last drain waits for it (it holds the
                # workers' final pushes); a drain while training just tries again later.
                if not wait_restart or time.monotonic() >= deadline:
                    logger.warning("could not drain the scheduler: %s", exc)
                    return []
                time.sleep(_RESTART_RETRY_S)
            except Exception as exc:  # noqa: BLE001 - telemetry is best effort; training goes on
                logger.warning("could not drain the scheduler: %s", exc)
                return []
        if self._incarnation not in (None, drained.incarnation):
            logger.info("the scheduler actor was restarted; draining its new incarnation")
        self._cursor, self._incarnation = drained.cursor, drained.incarnation
        new = [r for r in drained.records if r.key not in self._keys]
        self._keys.update(r.key for r in new)
        self.records.extend(new)
        _merge(self.plans, drained.plans)
        _merge(self.decisions, drained.decisions)
        known = len(self.reports)
        _merge(self.reports, drained.reports)
        reports = self.reports[known:]
        admitted_now = drained.admission is not None and self.admission is None
        if drained.admission is not None:
            self.admission = drained.admission
        if self.progress is not None and (new or drained.plans or admitted_now or reports):
            try:
                self.progress(
                    FitProgress(tuple(new), tuple(self.plans), self.admission, tuple(reports))
                )
            except Exception:
                logger.exception("progress callback failed")
        return new

    def run_draining(self, fit: Callable[[], T], interval_s: float) -> T:
        """Run ``fit`` on a worker thread and drain every ``interval_s`` on this one; return
        what ``fit`` returned (re-raise what it raised).

        The progress callback thus runs on the calling thread (a callback may need the main
        thread, e.g. to add a node to a ``ray.cluster_utils.Cluster``). One last drain after
        ``fit`` returns collects the workers' final pushes.
        """
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["result"] = fit()
            except BaseException as exc:  # noqa: BLE001 - re-raised on the calling thread
                box["error"] = exc

        thread = threading.Thread(target=target, name="hetero-fit", daemon=True)
        thread.start()
        while thread.is_alive():
            thread.join(interval_s)
            self.drain()
        self.drain(wait_restart=True)
        if "error" in box:
            raise box["error"]
        return box["result"]


def _merge(into: list[Any], items: tuple[Any, ...]) -> None:
    for item in items:
        if item not in into:
            into.append(item)
