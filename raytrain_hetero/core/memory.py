"""Memory caps: how many samples one forward+backward pass of a worker may hold.

A worker's peak memory in one training pass is modelled as affine in the batch size,
``peak(b) = fixed + per_sample * b`` bytes (fitted by :func:`fit_memory_model` from peaks
measured at >= 2 batch sizes). Given a budget in bytes, :func:`memory_cap` is the largest
batch whose modelled peak fits. A slice above the cap either is capped by the allocation
(``memory_cap_mode="slice"``) or runs in micro-batches of at most the cap with count-weighted
gradient accumulation (``"accumulate"``); :func:`micro_batch_sizes` is that split.

Pure: standard library only, no side effects.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from raytrain_hetero.errors import AllocationError

#: A cap at or above this many samples is no cap (floats stop counting samples exactly here).
_UNBOUNDED = 2**53

__all__ = ["MemoryModel", "fit_memory_model", "memory_cap", "micro_batch_sizes"]


@dataclass(frozen=True)
class MemoryModel:
    """Peak bytes of one forward+backward pass: ``fixed_bytes + per_sample_bytes * b``.

    Attributes:
        fixed_bytes: Bytes independent of the batch (gradients, workspaces); >= 0.
        per_sample_bytes: Bytes per sample (activations kept for backward); >= 0.
    """

    fixed_bytes: float
    per_sample_bytes: float

    def __post_init__(self) -> None:
        for name in ("fixed_bytes", "per_sample_bytes"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise AllocationError(f"MemoryModel.{name} must be finite and >= 0, got {value}.")

    def peak(self, batch_size: int) -> float:
        """Modelled peak bytes of a pass over ``batch_size`` samples."""
        return self.fixed_bytes + self.per_sample_bytes * batch_size


def fit_memory_model(batch_sizes: Sequence[int], peak_bytes: Sequence[float]) -> MemoryModel:
    """Affine fit of measured peaks that covers every measurement, non-negative coefficients.

    The slope is the least-squares slope; the intercept is the smallest that keeps every
    measured peak on or under the line (for two sizes, the least-squares line itself), since
    a cap derived from an under-predicting model would let a pass exceed its budget. A
    non-positive slope (noise) becomes a pure fixed cost at the largest peak; a negative
    intercept becomes a pure per-sample cost through the largest peak per sample. Either
    way the model never predicts less than the worst measurement at the sizes it saw.

    Raises:
        AllocationError: Fewer than 2 distinct sizes, mismatched lengths, or a negative or
            non-finite measurement.
    """
    if len(batch_sizes) != len(peak_bytes):
        raise AllocationError(
            f"{len(batch_sizes)} batch sizes but {len(peak_bytes)} peak measurements."
        )
    if len(set(batch_sizes)) < 2:
        raise AllocationError(f"A memory fit needs >= 2 distinct sizes, got {list(batch_sizes)}.")
    if any(not math.isfinite(p) or p < 0 for p in peak_bytes) or min(batch_sizes) < 1:
        raise AllocationError(f"Invalid memory measurements {list(zip(batch_sizes, peak_bytes))}.")
    n = len(batch_sizes)
    mean_b = sum(batch_sizes) / n
    mean_p = sum(peak_bytes) / n
    var_b = sum((b - mean_b) ** 2 for b in batch_sizes)
    slope = sum((b - mean_b) * (p - mean_p) for b, p in zip(batch_sizes, peak_bytes)) / var_b
    intercept = max(p - slope * b for b, p in zip(batch_sizes, peak_bytes))
    if slope <= 0:
        return MemoryModel(fixed_bytes=max(peak_bytes), per_sample_bytes=0.0)
    if intercept < 0:
        return MemoryModel(
            fixed_bytes=0.0,
            per_sample_bytes=max(p / b for b, p in zip(batch_sizes, peak_bytes)),
        )
    return MemoryModel(fixed_bytes=intercept, per_sample_bytes=slope)


def memory_cap(fixed_bytes: float, per_sample_bytes: float, budget_bytes: float) -> int | None:
    """The largest batch whose modelled peak ``fixed + per_sample * b`` fits the budget.

    0 when not even one sample fits; ``None`` when no batch size a step could hold reaches
    the budget (the peak does not grow, or grows too little).

    Raises:
        AllocationError: A negative or non-finite input.
    """
    model = MemoryModel(fixed_bytes, per_sample_bytes)  # validates
    if not math.isfinite(budget_bytes):
        raise AllocationError(f"The memory budget must be finite, got {budget_bytes}.")
    room = budget_bytes - model.fixed_bytes
    if room < 0:
        return 0
    if model.per_sample_bytes == 0:
        return None
    # Bisection on integers: float division alone can land one off the true floor.
    ratio = room / model.per_sample_bytes
    fits, too_big = 0, math.floor(ratio) + 2 if ratio < _UNBOUNDED else _UNBOUNDED
    if model.peak(too_big) <= budget_bytes:
        too_big = _UNBOUNDED
        if model.peak(too_big) <= budget_bytes:
            return None  # beyond any batch a step could hold
    while too_big - fits > 1:
        middle = (fits + too_big) // 2
        if model.peak(middle) <= budget_bytes:
            fits = middle
        else:
            too_big = middle
    return fits


def micro_batch_sizes(slice_size: int, cap: int | None, quantum: int = 1) -> tuple[int, ...]:
    """Split a slice into the fewest micro-batches of at most ``cap``, sizes differing by <= 1.

    Larger parts come first. ``cap=None`` or a slice within the cap is one part. With
    ``quantum`` g > 1 (ghost BatchNorm) the parts are whole groups: the slice's
    ``slice_size // g`` groups are split under a cap of ``cap // g`` groups, and a remainder
    of fewer than g samples (the last rank's, in an epoch's short last step) joins the last
    part, whose last group it belongs to (that part may exceed the cap by those samples).

    Raises:
        AllocationError: ``slice_size < 1`` or ``cap < 1``, or (with ``quantum``) a cap or
            slice under one group.
    """
    if slice_size < 1:
        raise AllocationError(f"A slice to split must hold >= 1 sample, got {slice_size}.")
    if cap is None or slice_size <= cap:
        return (slice_size,)
    if quantum > 1:
        groups, remainder = divmod(slice_size, quantum)
        if cap < quantum or groups < 1:
            raise AllocationError(
                f"A micro-batch cap of {cap} samples (slice {slice_size}) holds no whole ghost "
                f"group of {quantum}: raise the cap (max_micro_batch) or lower ghost_size."
            )
        grouped = [p * quantum for p in micro_batch_sizes(groups, cap // quantum)]
        grouped[-1] += remainder
        return tuple(grouped)
    if cap < 1:
        raise AllocationError(f"A micro-batch cap must be >= 1 sample, got {cap}.")
    parts = -(-slice_size // cap)
    base, extra = divmod(slice_size, parts)
    return tuple(base + 1 if i < extra else base for i in range(parts))
