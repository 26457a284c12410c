"""One worker group's preemption measurements and agreed hand-off (:class:`PreemptionWatch`).

The state the hand-off (:mod:`raytrain_hetero.worker.runtime.handoff`) reads and writes: recent
step wall times, the measured cost of a checkpoint step, and the decision rank 0 broadcast.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from raytrain_hetero.core.preemption import HandoffDecision
from raytrain_hetero.core.records import StepRecord

__all__ = ["STEP_WINDOW", "PreemptionWatch"]

#: Recent step wall times kept for the step-time estimate (their maximum is used).
STEP_WINDOW = 20


@dataclass
class PreemptionWatch:
    """One worker group's measurements and agreed hand-off (one writer: the hand-off, :mod:`~raytrain_hetero.worker.runtime.handoff`).

    Attributes:
        step_walls: Wall times of recent steps without a checkpoint.
        checkpoint_s: Longest measured cost of a checkpoint step beyond a plain step.
        decision: The agreed hand-off, once a notice came.
        reported_at: Global step in progress when this rank last called ``report``, and
            whether it passed a checkpoint and how long the call took.
        given_up: The loop wrote no checkpoint at the agreed step: Ray Train's default from
            then on.
        read_at: ``time.monotonic()`` of rank 0's last decision to read the notice (a plan
            sync reads it at most every ``NOTICE_EVERY_S`` until a hand-off is agreed).
    """

    step_walls: deque[float] = field(default_factory=lambda: deque(maxlen=STEP_WINDOW))
    checkpoint_s: float | None = None
    decision: HandoffDecision | None = None
    reported_at: tuple[int, bool, float] | None = None
    given_up: bool = False
    read_at: float | None = None

    def step_estimate(self, fallback: float) -> float:
        """Predicted wall time of one step: the 90th percentile of the recent ones (or
        ``fallback``). The decision is renewed at every plan-sync step, so an estimate only
        has to hold for the steps up to the next one."""
        if not self.step_walls:
            return fallback
        walls = sorted(self.step_walls)
        return walls[(len(walls) - 1) * 9 // 10]

    def note_step(self, record: StepRecord) -> None:
        """Fold one ended step into the estimates (a checkpoint step into ``checkpoint_s``)."""
        reported = self.reported_at
        if reported is not None and reported[0] == record.step and reported[1]:
            plain = sorted(self.step_walls)[len(self.step_walls) // 2] if self.step_walls else 0
            cost = max(record.wall_s - plain, reported[2])
            self.checkpoint_s = max(self.checkpoint_s or 0.0, cost)
        elif record.wall_s > 0:
            self.step_walls.append(record.wall_s)
