"""Whether to take the group decision again, from what the chosen group measures.

The decision (:func:`raytrain_hetero.core.group_decision.decide_group`) predicts the chosen
group's samples/s; :func:`check_retake` compares it with what that group then measures and
says when to re-price the workers and decide again. A standing-by worker is a candidate of
every decision, so a re-take is how it comes back.

Pure: standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from raytrain_hetero.core.group_decision import GroupDecision

__all__ = ["RetakeCheck", "check_retake"]


@dataclass(frozen=True)
class RetakeCheck:
    """Whether to decide again, from what the chosen group measures.

    Attributes:
        retake: Decide again (re-price first: standing-by workers are candidates again).
        ratio: Measured over predicted samples/s of the chosen group (nan: nothing measured).
        error: ``ratio - 1``, for :func:`~raytrain_hetero.core.group_price.prediction_noise`'s
            ``past_errors``.
        reason: One line with the numbers.
    """

    retake: bool
    ratio: float
    error: float
    reason: str


def check_retake(
    decision: GroupDecision,
    measured_samples_per_s: float,
    *,
    measured_steps: int,
    min_steps: int = 10,
    workers_changed: bool = False,
    standby_recheck_steps: int | None = None,
) -> RetakeCheck:
    """Whether the decision should be taken again (pure; the caller re-prices and decides).

    Re-take when the workers changed (joined, left, restarted elsewhere); else, once
    ``min_steps`` steps of the chosen group are measured: when it runs below its prediction
    by more than the decision's margin (its prices were wrong: re-measured, a standing-by
    worker may now come back), or above it by more than the margin while some worker does
    not train (the left-out workers may have been over-priced), or, with
    ``standby_recheck_steps``, every that many steps while a worker stands by. Under mode
    ``all`` only a change of workers re-takes (nothing else could change a verdict).
    """
    measured = float(measured_samples_per_s)
    predicted = decision.chosen.samples_per_s
    ratio = measured / predicted if predicted > 0 and math.isfinite(measured) else math.nan
    error = ratio - 1
    if workers_changed:
        return RetakeCheck(True, ratio, error, "the workers changed: decide again")
    if decision.mode == "all":
        return RetakeCheck(False, ratio, error, "mode all: every worker trains")
    if measured_steps < min_steps or not math.isfinite(ratio):
        return RetakeCheck(
            False, ratio, error, f"{measured_steps} of {min_steps} steps measured: too few"
        )
    m = decision.margin
    head = (
        f"the group runs at {measured:.1f} samples/s, {ratio:.2f}x its prediction of "
        f"{predicted:.1f} (margin {m:.1%})"
    )
    left_out = len(decision.chosen.trainers) < len(decision.workers)
    if ratio * (1 + m) < 1:
        return RetakeCheck(True, ratio, error, f"{head}: below it, re-price and decide again")
    if ratio > 1 + m and left_out:
        return RetakeCheck(
            True, ratio, error, f"{head}: above it with workers left out, decide again"
        )
    if (
        standby_recheck_steps is not None
        and decision.standing_by
        and measured_steps >= standby_recheck_steps
    ):
        return RetakeCheck(
            True,
            ratio,
            error,
            f"{head}; standing-by workers are re-priced every {standby_recheck_steps} steps",
        )
    return RetakeCheck(False, ratio, error, f"{head}: within it, keep the decision")
