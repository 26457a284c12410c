"""A worker's client of the run's scheduler actor: step records out, plans and injections in.

It only looks the actor up by name (the driver owns its lifecycle). Nothing it does waits on
the actor on the step's path: a sender thread pushes the records in batches (a failed batch is
put back and resent at the next flush, safe because the actor de-duplicates by
``StepRecord.key``; the buffer stays bounded, newest kept) and, when rank 0 asks ahead
(:meth:`SchedulerClient.ask`), polls the actor; the plan-sync step then takes the answer that
has arrived (:meth:`SchedulerClient.answer`). A restarted actor no longer knows the group: the
poll says so and the client registers it again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import ray

from raytrain_hetero.core.plan import Plan
from raytrain_hetero.core.policy import PendingReplan
from raytrain_hetero.core.records import StepRecord
from raytrain_hetero.errors import HeteroError

if TYPE_CHECKING:
    from raytrain_hetero.config import SlowdownInjection

logger = logging.getLogger(__name__)

__all__ = ["PollAnswer", "SchedulerClient"]

POLL_TIMEOUT_S = 10.0
FLUSH_WAIT_S = 30.0
#: Pause between a waiting flush's pushes to an actor Ray is restarting.
RESTART_RETRY_S = 0.2


@dataclass(frozen=True)
class PollAnswer:
    """The scheduler's answer to rank 0's poll (broadcast to every rank as is).

    Attributes:
        known_group: Whether the scheduler knows the polling group (False after a restart
            of the actor: the client registers the group again).
        pending: A live re-plan decided from the caller's plan or a newer one, or None.
        injections: EMULATION: every slowdown injected so far.
    """

    known_group: bool
    pending: PendingReplan | None = None
    injections: tuple[SlowdownInjection, ...] = ()


class SchedulerClient:
    """Pushes step records to, and polls, the scheduler actor named ``name``.

    Args:
        max_buffer: Most records kept while the actor is unreachable (oldest dropped).
        lookup: ``(name, namespace) -> handle``; raises ValueError when absent.
    """

    def __init__(
        self,
        name: str,
        namespace: str | None,
        *,
        group_id: str,
        world_size: int,
        max_buffer: int = 10_000,
        lookup: Callable[..., Any] | None = None,
    ) -> None:
        self.name = name
        self.namespace = namespace
        self.group_id = group_id
        self.world_size = world_size
        self.max_buffer = max_buffer
        self._lookup = lookup or ray.get_actor
        self._actor: Any = None
        # Shared with the sender thread, under ``_cond``: records not yet handed over, those
        # handed over (``_outbox``), rank 0's poll request and the newest answer.
        self._cond = threading.Condition()
        self._buffer: list[StepRecord] = []
        self._outbox: list[StepRecord] = []
        self._request: tuple[Plan | None, tuple[Plan, ...]] | None = None
        self._answer: PollAnswer | None = None
        self._sending = False
        self._sender: threading.Thread | None = None
        # The last push failed because Ray is restarting the actor: a waiting flush retries.
        self._restarting = False

    @property
    def buffered(self) -> int:
        """Records not delivered yet (waiting, or being pushed)."""
        with self._cond:
            return len(self._buffer) + len(self._outbox)

    def add(self, record: StepRecord) -> None:
        """Queue a finished step's record for the next push."""
        with self._cond:
            self._buffer.append(record)
            self._trim()

    def flush(self, *, wait: bool = False) -> None:
        """Hand the queued records to the sender thread as one batch (returns at once); with
        ``wait``, until it has pushed them (delivered, or put back after a failure) or
        ``FLUSH_WAIT_S`` passed. A waiting flush whose push failed because Ray is restarting
        the actor pushes again until the restarted actor takes the records (a run's last
        flush: the records would otherwise leave with the worker)."""
        with self._cond:
            self._hand_over()
            if not wait:
                return
            deadline = time.monotonic() + FLUSH_WAIT_S
            while True:
                while (self._outbox or self._sending) and time.monotonic() < deadline:
                    self._cond.wait(timeout=deadline - time.monotonic())
                left = deadline - time.monotonic()
                if not (self._buffer and self._restarting) or left <= 0:
                    return
                self._cond.wait(timeout=min(RESTART_RETRY_S, left))
                self._hand_over()

    def _hand_over(self) -> None:
        """Move the buffer to the sender's outbox and wake the sender (under ``_cond``)."""
        if self._buffer:
            self._outbox.extend(self._buffer)
            self._buffer.clear()
            self._start_sender()
            self._cond.notify_all()

    def ask(self, plan: Plan | None, history: Sequence[Plan] = ()) -> None:
        """Rank 0, ahead of a plan-sync step: poll the actor on the sender thread, after the
        records handed over so far (returns at once; :meth:`answer` takes the reply)."""
        with self._cond:
            self._request = (plan, tuple(history))
            self._start_sender()
            self._cond.notify_all()

    def answer(self) -> PollAnswer | None:
        """The newest reply to :meth:`ask` not taken yet, or None (none has arrived: the
        actor is slow or unreachable; the group goes on with its current plan)."""
        with self._cond:
            answer, self._answer = self._answer, None
            return answer

    def _start_sender(self) -> None:
        if self._sender is None or not self._sender.is_alive():
            self._sender = threading.Thread(
                target=self._send_loop, name="hetero-scheduler-client", daemon=True
            )
            self._sender.start()

    def _send_loop(self) -> None:
        """The sender thread: push handed-over records, then answer a poll request."""
        while True:
            with self._cond:
                while not self._outbox and self._request is None:
                    self._cond.wait()
                batch, self._outbox = self._outbox, []
                request, self._request = self._request, None
                self._sending = True
            try:
                if batch:
                    self._push(batch)
                if request is not None:
                    answer = self.poll(*request)
                    if answer is not None:
                        with self._cond:
                            self._answer = answer
            except Exception:
                logger.exception("scheduler client: push or poll failed")
            finally:
                with self._cond:
                    self._sending = False
                    self._cond.notify_all()

    def _push(self, batch: list[StepRecord]) -> None:
        """Deliver ``batch`` (waits on the sender thread); on failure it goes back to the
        front of the buffer, resent at the next flush."""
        actor = self._handle()
        try:
            if actor is None:
                raise HeteroError(f"scheduler actor {self.name} not found")
            ray.get(actor.record_steps.remote(batch), timeout=FLUSH_WAIT_S)
            self._restarting = False
            return
        except Exception as exc:  # noqa: BLE001 - resent later; the actor de-duplicates
            self._restarting = isinstance(exc, ray.exceptions.ActorUnavailableError)
            if actor is not None:
                logger.warning("step records not delivered (%s); will resend", type(exc).__name__)
            self._actor = None
        with self._cond:
            self._buffer[:0] = batch
            self._trim()

    def poll(self, plan: Plan | None, history: Sequence[Plan] = ()) -> PollAnswer | None:
        """The scheduler's answer for this group (rank 0 only), or None if unreachable.

        Re-registers the group when the actor does not know it (it was restarted), with
        ``history``, the run's plans so far, so the restarted actor's history stays whole.
        """
        version = plan.version if plan is not None else 0
        actor = self._handle()
        if actor is None:
            return None
        try:
            answer: PollAnswer = ray.get(
                actor.poll.remote(self.group_id, version), timeout=POLL_TIMEOUT_S
            )
            if not answer.known_group:
                # Waited for: the driver's last drain must find the history put back.
                ray.get(
                    actor.register_group.remote(
                        self.group_id, self.world_size, plan, tuple(history)
                    ),
                    timeout=POLL_TIMEOUT_S,
                )
            return answer
        except Exception as exc:  # noqa: BLE001 - training goes on with the current plan
            logger.warning("scheduler unreachable (%s); continuing on plan v%s", exc, version)
            self._actor = None
            return None

    def record_plan(self, plan: Plan, history: Sequence[Plan] = ()) -> None:
        """Tell the scheduler a plan was installed (fire and forget), with ``history``, the
        run's plans so far (a restarted actor may hear of this plan before the next poll)."""
        actor = self._handle()
        if actor is None:
            return
        try:
            actor.record_plan.remote(plan, self.group_id, tuple(history))
        except Exception as exc:  # noqa: BLE001
            logger.warning("plan v%d not recorded by the scheduler (%s)", plan.version, exc)
            self._actor = None

    def admission(self) -> dict[str, Any] | str | None:
        """The run's admission decision if one was recorded, None if not, or
        ``"unreachable"`` when the actor cannot be asked."""
        actor = self._handle()
        if actor is None:
            return "unreachable"
        try:
            return ray.get(actor.admission.remote(), timeout=POLL_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - the caller decides what unreachable means
            logger.warning("scheduler unreachable for admission (%s)", exc)
            self._actor = None
            return "unreachable"

    def record_admission(self, decision: dict[str, Any]) -> None:
        """Record the run's admission decision and wait until the actor has it (one with a
        ``retake`` reason replaces the one recorded).

        The elastic controller reads it there, so it must be stored before the group waits
        to be re-sized.
        """
        actor = self._handle()
        if actor is None:
            raise HeteroError("admission decision not recorded: the scheduler is unreachable")
        ray.get(actor.record_admission.remote(decision), timeout=POLL_TIMEOUT_S)

    def _trim(self) -> None:
        if len(self._buffer) > self.max_buffer:
            del self._buffer[: len(self._buffer) - self.max_buffer]

    def _handle(self) -> Any:
        if self._actor is None:
            try:
                self._actor = self._lookup(self.name, namespace=self.namespace)
            except ValueError:
                logger.warning("scheduler actor %s not found; records stay buffered", self.name)
                return None
        return self._actor
