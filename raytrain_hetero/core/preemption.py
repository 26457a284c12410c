"""The last step that fits before a preemption deadline (pure: stdlib only).

A spot node is taken back with notice: Ray drains it with a deadline. The group keeps training
on every worker until the last step whose end, plus one checkpoint, plus a safety margin, is
predicted to come before the deadline; it checkpoints there and continues without the node.
:func:`last_step_before_deadline` is that decision, from the clock and the measured step and
checkpoint times; the worker (:mod:`raytrain_hetero.worker.runtime.handoff`) agrees it on every rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from raytrain_hetero.errors import ConfigError

__all__ = ["HandoffDecision", "last_step_before_deadline"]


@dataclass(frozen=True)
class HandoffDecision:
    """Where the group checkpoints and hands off after a preemption notice.

    Attributes:
        last_step: Global step after whose update the group checkpoints and ends.
        fits: Whether ``last_step`` plus the checkpoint is predicted to end, with the margin
            to spare, before the deadline. False when even one step and a checkpoint do not
            fit (the notice is too short: the group then checkpoints at the next step, as
            early as it can, and hopes), never with an unknown deadline.
        done_in_s: Predicted seconds from the decision until that checkpoint is written.
        slack_s: Predicted seconds from that checkpoint's end to the deadline (the margin
            included; ``inf`` without a deadline). Below the margin when it does not fit.
    """

    last_step: int
    fits: bool
    done_in_s: float
    slack_s: float


def last_step_before_deadline(
    *,
    now_s: float,
    deadline_s: float | None,
    next_step: int,
    max_step: int,
    step_s: float,
    checkpoint_s: float,
    margin_s: float,
) -> HandoffDecision:
    """The last global step to train before checkpointing ahead of a preemption deadline.

    Steps ``next_step, next_step + 1, ...`` take ``step_s`` each, then one checkpoint takes
    ``checkpoint_s``; the decision is the largest ``last_step <= max_step`` with
    ``now_s + (last_step - next_step + 1) * step_s + checkpoint_s + margin_s <= deadline_s``.
    At least one step is always trained (``next_step``: the checkpoint is written by the loop
    after a step's update). Without a deadline (``None``) the group checkpoints at once.

    Args:
        now_s: Current time (the same clock as ``deadline_s``, e.g. UNIX seconds).
        deadline_s: When the node is taken back, or None if Ray reported no deadline.
        next_step: First global step not yet begun.
        max_step: Last global step the group may run before its checkpoint (e.g. the epoch's
            last, so no epoch-end work has to fit in too).
        step_s: Predicted wall time of one step (> 0).
        checkpoint_s: Predicted wall time of writing and committing one checkpoint (>= 0).
        margin_s: Seconds kept free before the deadline (>= 0).

    Raises:
        ConfigError: A time that is not finite or out of range, or ``max_step < next_step``.
    """
    if not (math.isfinite(step_s) and step_s > 0):
        raise ConfigError(f"step_s must be a positive finite number of seconds, got {step_s}.")
    for name, value in (("checkpoint_s", checkpoint_s), ("margin_s", margin_s)):
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(f"{name} must be finite and >= 0 seconds, got {value}.")
    if not math.isfinite(now_s) or (deadline_s is not None and not math.isfinite(deadline_s)):
        raise ConfigError(f"now_s ({now_s}) and deadline_s ({deadline_s}) must be finite.")
    if max_step < next_step:
        raise ConfigError(f"max_step ({max_step}) is before next_step ({next_step}).")
    if deadline_s is None:
        done = step_s + checkpoint_s
        return HandoffDecision(next_step, True, done, math.inf)
    budget = deadline_s - now_s - checkpoint_s - margin_s
    cap = max_step - next_step + 1
    steps = max(1, min(cap, math.floor(budget / step_s)))
    # Float rounding of budget / step_s may be one off either way: settle on the products.
    while steps > 1 and steps * step_s > budget:
        steps -= 1
    while steps < cap and (steps + 1) * step_s <= budget:
        steps += 1
    done = steps * step_s + checkpoint_s
    # Fits by the same comparison that chose ``steps`` (re-deriving it from the deadline
    # rounds differently, and a step chosen to fit could then be called too late).
    fits = steps * step_s <= budget
    return HandoffDecision(next_step + steps - 1, fits, done, deadline_s - now_s - done)
