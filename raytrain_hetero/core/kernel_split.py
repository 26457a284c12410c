"""How many output channels (kernels) of a split conv layer each rank owns.

A speed-proportional conv split gives rank r a contiguous block of ``k_r`` output channels of
a layer; every rank computes its block for the whole batch, so the layer's step time on rank
r is ``fixed_r + cost_r * k_r`` and the layer waits for the slowest rank. That is exactly the
makespan problem of the data-parallel slices with kernels in place of samples, so the split
is :func:`~raytrain_hetero.core.allocation.allocate` fed per-kernel costs, with at least one
kernel per rank (a rank with no kernel would still have to join every collective).

Pure: standard library and numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from itertools import accumulate

from raytrain_hetero.core.allocation import CostModel, allocate, makespan
from raytrain_hetero.errors import AllocationError, ModelParallelError

__all__ = [
    "channel_offsets",
    "kernel_cost_models",
    "proposed_resplit",
    "split_kernels",
]


def kernel_cost_models(
    kernel_costs: Sequence[float], fixed_costs: Sequence[float] | None = None
) -> tuple[CostModel, ...]:
    """Cost models ``t_r(k) = fixed_r + cost_r * k`` of one layer, one per rank (seconds per
    kernel for the whole batch; ``fixed_costs`` None: 0 each).

    Raises:
        ModelParallelError: If a cost is not finite and positive or the lengths differ.
    """
    fixed = [0.0] * len(kernel_costs) if fixed_costs is None else list(fixed_costs)
    if len(fixed) != len(kernel_costs):
        raise ModelParallelError(
            f"got {len(kernel_costs)} per-kernel costs but {len(fixed)} fixed costs; give "
            "one of each per rank"
        )
    try:
        return tuple(CostModel(alpha=a, beta=b) for a, b in zip(fixed, kernel_costs, strict=True))
    except AllocationError as error:
        raise ModelParallelError(
            f"invalid per-kernel costs {list(kernel_costs)} (fixed {fixed}): {error}; probe "
            "the layer again"
        ) from None


def split_kernels(
    kernels: int,
    kernel_costs: Sequence[float],
    fixed_costs: Sequence[float] | None = None,
) -> tuple[int, ...]:
    """Kernels per rank minimising the layer's makespan, at least one each, summing to
    ``kernels``; a faster rank never owns fewer kernels than a slower one.

    Raises:
        ModelParallelError: If there are fewer kernels than ranks, or no rank, or a cost is
            invalid.
    """
    ranks = len(kernel_costs)
    if ranks == 0:
        raise ModelParallelError("no ranks to split kernels over; give one cost per rank")
    if isinstance(kernels, bool) or not isinstance(kernels, int) or kernels < ranks:
        raise ModelParallelError(
            f"cannot split {kernels!r} kernels over {ranks} ranks: every rank needs at least "
            "one kernel; split a wider layer or use fewer ranks in the split group"
        )
    costs = kernel_cost_models(kernel_costs, fixed_costs)
    return allocate(kernels, costs, min_slice=1)


def channel_offsets(kernels_per_rank: Sequence[int]) -> tuple[int, ...]:
    """Start channel of each rank's block, plus the total as the last entry.

    Raises:
        ModelParallelError: If a count is below 1.
    """
    if not kernels_per_rank or any(int(k) < 1 for k in kernels_per_rank):
        raise ModelParallelError(
            f"every rank must own at least one kernel, got {list(kernels_per_rank)}"
        )
    return (0, *accumulate(int(k) for k in kernels_per_rank))


def proposed_resplit(
    current: Sequence[int],
    kernel_costs: Sequence[float],
    *,
    min_gain: float,
    fixed_costs: Sequence[float] | None = None,
) -> tuple[int, ...] | None:
    """The better split when it pays off by more than ``min_gain``, else None (hysteresis).

    ``min_gain`` is the relative predicted makespan improvement required (0.1: 10 %), the
    threshold the data-parallel scheduler applies before re-planning.

    Raises:
        ModelParallelError: If ``current`` and the costs disagree in length, or a value is
            invalid.
    """
    if len(current) != len(kernel_costs):
        raise ModelParallelError(
            f"current split has {len(current)} ranks but {len(kernel_costs)} costs were given"
        )
    if not (math.isfinite(min_gain) and min_gain >= 0.0):
        raise ModelParallelError(f"min_gain must be finite and >= 0, got {min_gain!r}")
    channel_offsets(current)  # validates: every rank owns >= 1 kernel
    proposed = split_kernels(sum(int(k) for k in current), kernel_costs, fixed_costs)
    if tuple(int(k) for k in current) == proposed:
        return None
    costs = kernel_cost_models(kernel_costs, fixed_costs)
    now = makespan(current, costs)
    after = makespan(proposed, costs)
    if now <= 0.0 or (now - after) / now <= min_gain:
        return None
    return proposed
