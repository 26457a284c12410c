"""Whether to take the group decision again, from what the chosen group measures.

The decision (:func:`raytrain_hetero.core.group_decision.decide_group`) predicts the chosen
group's samples/s; :func:`check_retake` compares it with what that group then measures and
says when to re-price the workers and decide again. A standing-by worker is a candidate of
every decision, so a re-take is how it comes back.

:func:`reprice_from_steps` re-prices from the chosen group's own training steps: each
worker's cost model scaled to what its steps measured, and the exchange the group showed
(its step period, :func:`group_step_s`, beyond its slowest worker's busy time). The chosen group's rate is
then what it measured, not a prediction: the miss is corrected, not carried as noise (fed
in as ``past_errors`` instead, it would widen the margin and keep the same group).

Pure: standard library only.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.group_decision import GroupDecision
from raytrain_hetero.errors import AllocationError

__all__ = [
    "RepricedGroup",
    "RetakeCheck",
    "RetakeOutcome",
    "check_retake",
    "group_step_s",
    "reprice_from_steps",
    "settle_retake",
]


@dataclass(frozen=True)
class RepricedGroup:
    """Prices re-fitted from a group's own training steps.

    Attributes:
        costs: Per worker, its cost model scaled so that it predicts the median of its
            measured busy times at the slices it had (the shape ``alpha : beta`` kept).
        exchange_s: The exposed exchange the group showed: the median of the given step
            times minus the slowest worker's median busy time, at least 0.
        step_s: The median of the given step times.
    """

    costs: tuple[CostModel, ...]
    exchange_s: float
    step_s: float


def group_step_s(walls_per_worker: Sequence[Sequence[float]]) -> float:
    """The group's step period from each worker's own step wall times (pure).

    Per worker the median of its walls, then the largest of those. Workers step in lockstep,
    so a worker that waits on a slower one shows the wait in its own walls at every step;
    the slowest worker's typical wall is the group's period. A stall on one worker between
    steps (the loop's own evaluation or logging on rank 0, every few steps) shows as a long
    wall there and, at the next step, as a wait on the others: one step's largest wall would
    count it in most steps and charge it to the exchange, which a smaller group pays as well.
    Each worker's median leaves it out.

    Raises:
        AllocationError: No worker has a finite positive wall time.
    """
    medians = []
    for walls in walls_per_worker:
        valid = [float(w) for w in walls if math.isfinite(float(w)) and float(w) > 0]
        if valid:
            medians.append(statistics.median(valid))
    if not medians:
        raise AllocationError("group_step_s needs at least one measured step time")
    return max(medians)


def reprice_from_steps(
    costs: Sequence[CostModel],
    slices: Sequence[Sequence[int]],
    busy_s: Sequence[Sequence[float]],
    step_s: Sequence[float],
    *,
    compute_s: Sequence[Sequence[float]] | None = None,
) -> RepricedGroup:
    """Re-price a group from its training steps (see the module).

    Args:
        costs: Per worker, the cost model the decision used.
        slices: Per worker, its slice at each measured step.
        busy_s: Per worker, its busy (loader-bound) seconds at the same steps.
        step_s: The group's step periods (one per step, or :func:`group_step_s`'s one).
        compute_s: Per worker, its compute seconds at the same steps, for a group whose
            ranks synchronise in forward (exact BatchNorm): its busy part is then the
            slowest loading plus the slowest compute
            (:func:`~raytrain_hetero.core.group_price.synchronised_makespan`), and only the
            rest of the period is exchange. ``None``: the slowest busy time.

    Raises:
        AllocationError: Lengths differ, or nothing valid was measured.
    """
    if not (len(costs) == len(slices) == len(busy_s)):
        raise AllocationError(
            f"reprice_from_steps needs one entry per worker: {len(costs)} cost models, "
            f"{len(slices)} slice lists, {len(busy_s)} busy lists"
        )
    walls = [float(w) for w in step_s if math.isfinite(float(w)) and float(w) > 0]
    if not walls:
        raise AllocationError("reprice_from_steps needs at least one measured step time")
    scaled: list[CostModel] = []
    busiest = 0.0
    for cost, sizes, busy in zip(costs, slices, busy_s):
        pairs = [
            (int(b), float(t))
            for b, t in zip(sizes, busy)
            if int(b) > 0 and math.isfinite(float(t)) and float(t) > 0
        ]
        if not pairs:
            scaled.append(cost)
            continue
        factor = statistics.median(t / cost.time(b) for b, t in pairs)
        scaled.append(CostModel(cost.alpha * factor, cost.beta * factor))
        busiest = max(busiest, statistics.median(t for _, t in pairs))
    if compute_s is not None:
        busiest = max(busiest, _synchronised_busy(slices, busy_s, compute_s))
    step = statistics.median(walls)
    return RepricedGroup(tuple(scaled), max(0.0, step - busiest), step)


def _synchronised_busy(
    slices: Sequence[Sequence[int]],
    busy_s: Sequence[Sequence[float]],
    compute_s: Sequence[Sequence[float]],
) -> float:
    """The slowest median loading plus the slowest median compute (0 if nothing valid)."""
    loading = compute = 0.0
    for sizes, busy, comp in zip(slices, busy_s, compute_s):
        pairs = [
            (float(b), float(c))
            for n, b, c in zip(sizes, busy, comp)
            if int(n) > 0 and math.isfinite(float(b)) and math.isfinite(float(c)) and float(c) > 0
        ]
        if pairs:
            loading = max(loading, statistics.median(max(0.0, b - c) for b, c in pairs))
            compute = max(compute, statistics.median(c for _, c in pairs))
    return loading + compute


@dataclass(frozen=True)
class RetakeCheck:
    """Whether to decide again, from what the chosen group measures.

    Attributes:
        retake: Decide again (re-price first: standing-by workers are candidates again).
        ratio: Measured over predicted samples/s of the chosen group (nan: nothing measured).
        error: ``ratio - 1``, for :func:`~raytrain_hetero.core.group_price.prediction_noise`'s
            ``past_errors``.
        reason: One line with the numbers.
        reprice: Re-price from the measured steps and decide again: always with
            ``retake``, and also when the group ran within its margin, acting then only if
            a verdict changes (:func:`settle_retake`). The decision's margin came from a
            short window's noise; the group's own steps price it with far less.
    """

    retake: bool
    ratio: float
    error: float
    reason: str
    reprice: bool = False


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
        return RetakeCheck(True, ratio, error, "the workers changed: decide again", reprice=True)
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
        return RetakeCheck(
            True, ratio, error, f"{head}: below it, re-price and decide again", reprice=True
        )
    if ratio > 1 + m and left_out:
        return RetakeCheck(
            True,
            ratio,
            error,
            f"{head}: above it with workers left out, decide again",
            reprice=True,
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
            reprice=True,
        )
    return RetakeCheck(
        False,
        ratio,
        error,
        f"{head}: within it, re-price from the steps and keep the decision unless it changes",
        reprice=True,
    )


@dataclass(frozen=True)
class RetakeOutcome:
    """What a re-priced decision does (:func:`settle_retake`).

    Attributes:
        act: Record the new decision (and restart the group if it leaves workers out).
        reason: One line: why it acts, or why the decision stands.
    """

    act: bool
    reason: str


def _verdicts(decision: GroupDecision) -> tuple[str, ...]:
    return tuple(w.verdict for w in decision.workers)


def settle_retake(check: RetakeCheck, before: GroupDecision, after: GroupDecision) -> RetakeOutcome:
    """Whether the decision re-priced from the group's steps replaces the one it was checked
    against (pure).

    A check that asked for a re-take acts whatever the new verdicts. A re-pricing within the
    margin (``check.reprice`` alone) acts only when some worker's verdict changes: the new
    decision then stands on the steps' own noise (its margin), which the new verdict
    already cleared; an unchanged decision is kept as recorded (no restart, no new line).
    """
    if check.retake:
        return RetakeOutcome(True, check.reason)
    if not check.reprice:  # too few steps, or mode all: nothing was re-priced
        return RetakeOutcome(False, check.reason)
    if _verdicts(after) == _verdicts(before):
        return RetakeOutcome(False, f"{check.reason}: the re-priced decision agrees")
    return RetakeOutcome(
        True,
        f"{check.reason}: re-priced from the group's steps, the decision changes "
        f"(trainers {list(before.trainers)} -> {list(after.trainers)}, "
        f"{after.chosen.samples_per_s:.1f} samples/s predicted, margin {after.margin:.1%})",
    )
