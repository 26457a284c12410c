"""A worker's client of the run's scheduler actor: step records out, plans and injections in.

It only looks the actor up by name (the driver owns its lifecycle). Records are pushed in
batches; a failed batch is put back and resent at the next flush, safe because the actor
de-duplicates by ``StepRecord.key``, and the buffer stays bounded (newest kept). A restarted
actor no longer knows the group: ``poll`` says so and the client registers it again.
"""

from __future__ import annotations

import logging
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
        self._buffer: list[StepRecord] = []
        self._in_flight: list[tuple[Any, list[StepRecord]]] = []

    @property
    def buffered(self) -> int:
        """Records waiting to be pushed."""
        return len(self._buffer)

    def add(self, record: StepRecord) -> None:
        """Queue a finished step's record for the next push."""
        self._buffer.append(record)
        self._trim()

    def flush(self, *, wait: bool = False) -> None:
        """Push the queued records as one batch; with ``wait``, until delivered or timed out."""
        self._collect(timeout=FLUSH_WAIT_S if wait else 0.0)
        if self._buffer:
            actor = self._handle()
            if actor is not None:
                batch = list(self._buffer)
                try:
                    self._in_flight.append((actor.record_steps.remote(batch), batch))
                    self._buffer.clear()
                except Exception as exc:  # noqa: BLE001 - training must not stop for the scheduler
                    logger.warning("step records not pushed (%s); will resend", exc)
                    self._actor = None
        if wait:
            self._collect(timeout=FLUSH_WAIT_S)

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
        """Record the run's admission decision and wait until the actor has it.

        The elastic controller reads it there, so it must be stored before the group waits
        to be re-sized.
        """
        actor = self._handle()
        if actor is None:
            raise HeteroError("admission decision not recorded: the scheduler is unreachable")
        ray.get(actor.record_admission.remote(decision), timeout=POLL_TIMEOUT_S)

    def _collect(self, timeout: float) -> None:
        """Settle finished pushes; a failed batch goes back to the front of the buffer."""
        if not self._in_flight:
            return
        refs = [ref for ref, _ in self._in_flight]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
        done = set(ready)
        still: list[tuple[Any, list[StepRecord]]] = []
        for ref, batch in self._in_flight:
            if ref not in done:
                still.append((ref, batch))
                continue
            try:
                ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - resent later; the actor de-duplicates
                logger.warning("step records not delivered (%s); will resend", type(exc).__name__)
                self._actor = None
                self._buffer[:0] = batch
        self._in_flight = still
        self._trim()

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
