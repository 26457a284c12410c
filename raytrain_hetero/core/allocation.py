"""Carving a global batch into per-worker slices from measured compute costs.

Every worker is an affine step-time model ``t_i(b) = alpha_i + beta_i * b``
(:func:`fit_cost_model`). :func:`allocate` chooses integer slices with ``sum(b_i) == total``
and ``min_slice <= b_i <= cap_i`` minimising the makespan ``max_i t_i(b_i)``, the wall time
of one synchronous step; :func:`proportional_slices` is the naive split by fixed shares (the
seed papers' baseline). Pure: standard library and numpy only.

Whole groups (``quantum``, ghost BatchNorm's group size g): both split ``total // g``
groups instead of samples, with caps floored to whole groups, ``min_slice`` raised to whole
groups (at least one) and each worker's cost per group ``g * beta``; a remainder of
``total % g`` samples (only the short last step of an epoch has one) goes to the last
worker, whose cap leaves room for it. The quantised optimum loses at most
``g * max_i beta_i`` of makespan against the unquantised integer optimum under the same
(whole-group) caps and minimum (:func:`allocate`).
"""

from __future__ import annotations

import heapq
import logging
import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from raytrain_hetero.errors import AllocationError

logger = logging.getLogger(__name__)

__all__ = [
    "CostModel",
    "GroupedRequest",
    "allocate",
    "fit_cost_model",
    "grouped_request",
    "largest_remainder",
    "makespan",
    "proportional_slices",
]

# Smallest per-sample cost fit_cost_model returns, as a fraction of the mean observed
# seconds-per-sample. Only keeps beta strictly positive; it is scale-free so that it means
# the same for a microsecond GPU step and a minute-long CPU step.
_MIN_BETA_FRACTION = 1e-9

# The vectorised top-up looks at most this many extra units per worker before falling back
# to an explicit heap. Normal inputs need 1 or 2; more only happens with degenerate floats.
_MAX_TOP_UP_WINDOW = 64

# Bisection on a float level stops when the interval cannot shrink; this is a safety bound.
_MAX_BISECTION_STEPS = 200


@dataclass(frozen=True)
class CostModel:
    """Affine per-step compute cost of one worker: t(b) = alpha + beta * b seconds.

    Attributes:
        alpha: Fixed seconds per step, independent of the batch (kernel launches, optimizer
            step, Python overhead). Finite and >= 0.
        beta: Seconds per sample. Finite and > 0.

    Raises:
        AllocationError: If alpha or beta is out of range.
    """

    alpha: float
    beta: float

    def __post_init__(self) -> None:
        alpha = float(self.alpha)
        beta = float(self.beta)
        if not (math.isfinite(alpha) and alpha >= 0.0):
            raise AllocationError(
                f"CostModel.alpha must be a finite number of seconds >= 0, got {self.alpha!r}"
            )
        if not (math.isfinite(beta) and beta > 0.0):
            raise AllocationError(
                "CostModel.beta must be a finite number of seconds per sample > 0, "
                f"got {self.beta!r}"
            )
        # Store plain floats so equality, hashing and pickling do not depend on numpy scalars.
        object.__setattr__(self, "alpha", alpha)
        object.__setattr__(self, "beta", beta)

    def time(self, batch: float) -> float:
        """Predicted seconds for one step on ``batch`` samples."""
        return self.alpha + self.beta * batch

    @property
    def samples_per_second(self) -> float:
        """Throughput at large batch, where the fixed cost is amortised away: 1 / beta."""
        return 1.0 / self.beta


def fit_cost_model(batch_sizes: Sequence[float], seconds: Sequence[float]) -> CostModel:
    """Least-squares affine fit t = alpha + beta * b to probe timings.

    The unconstrained least-squares line is adjusted so that the result is a valid
    :class:`CostModel`:

    * If the timings do not increase with the batch size (fitted slope <= 0, which noise or a
      probe range dominated by fixed overhead can produce), the per-sample cost cannot be
      identified; the fit falls back to a constant-speed model ``alpha = 0``,
      ``beta = mean(t / b)``, i.e. the speed actually observed at the probed sizes. This is
      the seed papers' model and, unlike a near-zero slope, never extrapolates a worker
      into being arbitrarily fast at larger batches. A warning is logged.
    * Otherwise, if the fitted intercept is negative, alpha is clamped to 0 and beta is
      refitted by least squares through the origin.
    * beta is finally floored at ``1e-9 * mean(t / b)`` so it stays strictly positive; alpha
      is then refitted for that slope (and clamped at 0).

    ``batch_sizes`` needs >= 2 distinct values (a repeated size weighs more); ``seconds`` has
    one timing per entry.

    Raises:
        AllocationError: If the lengths differ, fewer than two distinct batch sizes were
            probed, or any size or time is non-finite or <= 0.
    """
    if len(batch_sizes) != len(seconds):
        raise AllocationError(
            f"fit_cost_model needs one timing per batch size: got {len(batch_sizes)} batch "
            f"sizes and {len(seconds)} timings"
        )
    sizes = np.asarray(batch_sizes, dtype=np.float64).reshape(-1)
    times = np.asarray(seconds, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(sizes)) or np.any(sizes <= 0):
        raise AllocationError(
            f"probe batch sizes must be finite and > 0, got {list(map(float, sizes))}"
        )
    if not np.all(np.isfinite(times)) or np.any(times <= 0):
        raise AllocationError(
            "probe timings must be finite and > 0 seconds (a zero or NaN time means the probe "
            f"did not measure anything), got {list(map(float, times))}"
        )
    distinct = np.unique(sizes)
    if distinct.size < 2:
        raise AllocationError(
            "fit_cost_model needs timings at >= 2 distinct batch sizes to separate the fixed "
            f"cost from the per-sample cost, got sizes {list(map(float, distinct))}; probe at "
            "a second batch size"
        )

    mean_seconds_per_sample = float(np.mean(times / sizes))
    size_mean = float(sizes.mean())
    time_mean = float(times.mean())
    centred = sizes - size_mean
    beta = float(np.dot(centred, times - time_mean) / np.dot(centred, centred))
    alpha = time_mean - beta * size_mean

    if beta <= 0.0:
        logger.warning(
            "probe timings do not increase with batch size (sizes=%s, seconds=%s); falling back "
            "to a constant-speed model at the observed %.3g s/sample",
            sizes.tolist(),
            times.tolist(),
            mean_seconds_per_sample,
        )
        return CostModel(alpha=0.0, beta=mean_seconds_per_sample)
    if alpha < 0.0:
        alpha = 0.0
        beta = float(np.dot(sizes, times) / np.dot(sizes, sizes))
    min_beta = _MIN_BETA_FRACTION * mean_seconds_per_sample
    if beta < min_beta:
        beta = min_beta
        alpha = max(0.0, time_mean - beta * size_mean)
    return CostModel(alpha=alpha, beta=beta)


def _index(value: object, name: str) -> int:
    """``operator.index`` with an AllocationError naming the argument (bools rejected)."""
    if isinstance(value, bool):
        raise AllocationError(f"{name} must be an integer, got {value!r}")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise AllocationError(f"{name} must be an integer, got {value!r}") from None


def _check_min_slice_and_caps(
    min_slice: int, caps: Sequence[int | None] | None, n_workers: int
) -> None:
    """Refuse an empty minimum slice and a cap list of the wrong length, naming the fix."""
    if min_slice < 1:
        raise AllocationError(
            f"min_slice must be >= 1, got {min_slice}: a worker with an empty slice deadlocks "
            "DDP or produces a NaN mean loss"
        )
    if caps is not None and len(caps) != n_workers:
        raise AllocationError(
            f"caps has {len(caps)} entries but there are {n_workers} workers; give one cap "
            "(or None) per worker"
        )


def _slice_bounds(
    total: int, n_workers: int, caps: Sequence[int | None] | None, min_slice: int
) -> tuple[int, int, np.ndarray]:
    """Validate a slicing request and return (total, min_slice, upper bound per worker).

    The upper bound of an uncapped worker is what is left after every other worker got
    ``min_slice``, so all bounds are finite.
    """
    total = _index(total, "total (the global batch)")
    min_slice = _index(min_slice, "min_slice")
    if n_workers == 0:
        raise AllocationError(
            "no workers to allocate to (empty cost/share list); start at least one worker"
        )
    _check_min_slice_and_caps(min_slice, caps, n_workers)
    minimum_total = n_workers * min_slice
    if total < minimum_total:
        raise AllocationError(
            f"global batch {total} cannot give {n_workers} workers at least min_slice={min_slice} "
            f"samples each (needs >= {minimum_total}); raise the global batch, use fewer "
            "workers, or lower min_slice"
        )
    largest = total - (n_workers - 1) * min_slice
    upper = np.full(n_workers, largest, dtype=np.int64)
    if caps is not None:
        all_capped = True
        for i, cap in enumerate(caps):
            if cap is None:
                all_capped = False
                continue
            cap = _index(cap, f"caps[{i}]")
            if cap < min_slice:
                raise AllocationError(
                    f"caps[{i}]={cap} is below min_slice={min_slice}; raise max_batch for "
                    f"worker {i} or lower min_slice"
                )
            upper[i] = min(cap, largest)
        if all_capped:
            capacity = int(sum(_index(c, "cap") for c in caps))
            if total > capacity:
                raise AllocationError(
                    f"global batch {total} exceeds the sum of per-worker caps {capacity}; "
                    "lower the global batch, add workers, or raise max_batch"
                )
    return total, min_slice, upper


def cost_arrays(costs: Sequence[CostModel]) -> tuple[np.ndarray, np.ndarray]:
    """The ``alpha`` and ``beta`` of ``costs`` as float64 columns."""
    n = len(costs)
    alpha = np.fromiter((c.alpha for c in costs), dtype=np.float64, count=n)
    beta = np.fromiter((c.beta for c in costs), dtype=np.float64, count=n)
    return alpha, beta


def largest_remainder(
    exact: Sequence[float] | np.ndarray,
    total: int,
    *,
    upper: Sequence[float] | np.ndarray | None = None,
) -> tuple[int, ...]:
    """Round non-negative reals summing to ``total`` to integers summing to ``total``.

    Every entry gets ``floor(exact_i)``; the leftover units go one each to the largest
    fractional parts, ties to the lower index. Entries already at ``upper`` take no unit.
    The one rounding of the package (slices, inference pool shares).
    """
    values = np.asarray(exact, dtype=np.float64).reshape(-1)
    rounded = np.floor(values).astype(np.int64)
    leftover = int(total) - int(rounded.sum())
    if leftover > 0:
        remainder = values - rounded
        if upper is not None:
            remainder[rounded >= np.asarray(upper)] = -1.0  # at the cap: cannot take another unit
        # Stable sort on the negated remainder: largest first, ties to the lower index.
        order = np.argsort(-remainder, kind="stable")[:leftover]
        rounded[order] += 1
    elif leftover < 0:  # pragma: no cover - float sums are far more accurate than one unit
        raise AssertionError(f"largest-remainder rounding overshot by {-leftover}")
    return tuple(int(b) for b in rounded)


def proportional_slices(
    total: int,
    shares: Sequence[float],
    *,
    caps: Sequence[int | None] | None = None,
    min_slice: int = 1,
    quantum: int = 1,
) -> tuple[int, ...]:
    """Split ``total`` in proportion to ``shares``: the naive, speed-proportional split.

    The continuous split is ``x_i = clip(lam * share_i, min_slice, cap_i)`` with ``lam``
    chosen so that ``sum(x_i) == total``: workers that hit their cap keep the cap and the
    overflow is spread over the others in proportion to their shares (and workers whose
    share is below ``min_slice`` are raised to it), rounded by :func:`largest_remainder`.

    ``quantum`` > 1 splits whole groups of that many samples (:func:`grouped_request`).

    Raises:
        AllocationError: If a share is invalid or no slicing satisfies min_slice and caps.
    """
    if quantum != 1:
        if len(shares) == 0:
            raise AllocationError(
                "no workers to allocate to (empty cost/share list); start at least one worker"
            )
        request = grouped_request(total, len(shares), caps, min_slice, quantum)
        groups = proportional_slices(
            request.groups, shares, caps=request.caps, min_slice=request.min_groups
        )
        return request.samples(groups)
    total, min_slice, upper = _slice_bounds(total, len(shares), caps, min_slice)
    share = np.asarray(shares, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(share)) or np.any(share <= 0):
        raise AllocationError(
            f"shares must be finite and > 0 (one per worker), got {share.tolist()}"
        )
    lower = float(min_slice)

    def filled(scale: float) -> np.ndarray:
        return np.clip(scale * share, lower, upper)

    # filled(0) is all min_slice (<= total); at scale_high every worker is at its bound (>= total).
    scale_low, scale_high = 0.0, float(np.max(upper / share))
    for _ in range(_MAX_BISECTION_STEPS):
        mid = 0.5 * (scale_low + scale_high)
        if not scale_low < mid < scale_high:
            break
        if filled(mid).sum() <= total:
            scale_low = mid
        else:
            scale_high = mid

    result = largest_remainder(filled(scale_low), total, upper=upper)
    logger.debug("proportional_slices(total=%d) -> %s", total, result)
    return result


@dataclass(frozen=True)
class GroupedRequest:
    """A slicing request restated in whole groups of ``quantum`` samples.

    Attributes:
        groups: Groups to hand out (``total // quantum``).
        remainder: Samples left over (``total % quantum``), added to the last worker.
        caps: Per-worker caps in groups (None: no cap).
        min_groups: Smallest slice in groups (>= 1).
        quantum: Samples per group.
    """

    groups: int
    remainder: int
    caps: tuple[int | None, ...] | None
    min_groups: int
    quantum: int

    def samples(self, groups: Sequence[int]) -> tuple[int, ...]:
        """Slices in samples from slices in groups (the remainder to the last worker)."""
        out = [int(g) * self.quantum for g in groups]
        out[-1] += self.remainder
        return tuple(out)


def grouped_request(
    total: int,
    n_workers: int,
    caps: Sequence[int | None] | None,
    min_slice: int,
    quantum: int,
) -> GroupedRequest:
    """Restate ``total`` samples over ``n_workers`` in whole groups of ``quantum``.

    Raises:
        AllocationError: ``quantum < 1``, or the groups cannot give every worker its smallest
            slice within its cap (the message in samples and groups).
    """
    total = _index(total, "total (the global batch)")
    quantum = _index(quantum, "quantum (samples per group)")
    min_slice = _index(min_slice, "min_slice")
    if quantum < 1:
        raise AllocationError(f"quantum must be >= 1 sample per group, got {quantum}")
    _check_min_slice_and_caps(min_slice, caps, n_workers)
    groups, remainder = divmod(total, quantum)
    min_groups = -(-min_slice // quantum)
    if n_workers and groups < n_workers * min_groups:
        raise AllocationError(
            f"a step of {total} samples holds {groups} whole groups of {quantum}, fewer than "
            f"{n_workers} workers x {min_groups} group(s) each (min_slice {min_slice}); raise "
            "the global batch, use fewer workers, or a smaller group size"
        )
    grouped_caps: tuple[int | None, ...] | None = None
    if caps is not None:
        floored: list[int | None] = []
        for i, cap in enumerate(caps):
            if cap is None:
                floored.append(None)
                continue
            room = _index(cap, f"caps[{i}]") - (remainder if i == n_workers - 1 else 0)
            if room // quantum < min_groups:
                raise AllocationError(
                    f"caps[{i}]={cap} holds fewer than {min_groups} whole group(s) of "
                    f"{quantum} samples (min_slice {min_slice}); raise max_batch for worker "
                    f"{i} or lower the group size"
                )
            floored.append(room // quantum)
        grouped_caps = tuple(floored)
    return GroupedRequest(groups, remainder, grouped_caps, min_groups, quantum)


def _units_below(
    level: float, alpha: np.ndarray, beta: np.ndarray, lower: int, upper: np.ndarray
) -> np.ndarray:
    """Per worker: min_slice plus the number of further units whose step time is < level.

    Computed with the same float arithmetic as :meth:`CostModel.time`, so that the result is
    exactly a prefix of the order in which the greedy would hand out units.
    """
    with np.errstate(invalid="ignore", over="ignore"):
        counts: np.ndarray = np.ceil((level - alpha) / beta) - 1.0
    counts = np.clip(counts, lower, upper).astype(np.int64)
    # The division can be off by one unit near integers; correct it against t(b) directly.
    while True:
        too_many = (counts > lower) & (alpha + beta * counts >= level)
        if not too_many.any():
            break
        counts -= too_many
    while True:
        too_few = (counts < upper) & (alpha + beta * (counts + 1) < level)
        if not too_few.any():
            break
        counts += too_few
    return counts


def _top_up_with_heap(
    slices: np.ndarray, remaining: int, alpha: np.ndarray, beta: np.ndarray, upper: np.ndarray
) -> None:
    """Exact greedy fallback: give ``remaining`` units one at a time, in place."""
    heap = [
        (alpha[i] + beta[i] * (slices[i] + 1), i)
        for i in range(slices.size)
        if slices[i] < upper[i]
    ]
    heapq.heapify(heap)
    for _ in range(remaining):
        _, i = heapq.heappop(heap)
        slices[i] += 1
        if slices[i] < upper[i]:
            heapq.heappush(heap, (alpha[i] + beta[i] * (slices[i] + 1), i))


def _top_up(
    slices: np.ndarray, remaining: int, alpha: np.ndarray, beta: np.ndarray, upper: np.ndarray
) -> None:
    """Give ``remaining`` more units, each to the worker whose time after +1 is smallest.

    Vectorised form of the heap greedy: because each worker's next-unit times increase with
    the unit, the greedy picks exactly the ``remaining`` smallest (time, worker, unit) keys.
    Look at a window of the next ``window`` units per worker; the selection is exact unless
    some worker used its whole window while it could still grow, in which case widen it.
    """
    window = 1
    while remaining > 0:
        if window > _MAX_TOP_UP_WINDOW:
            _top_up_with_heap(slices, remaining, alpha, beta, upper)
            return
        steps = np.arange(1, window + 1, dtype=np.int64)
        next_sizes = slices[:, None] + steps[None, :]
        next_times = alpha[:, None] + beta[:, None] * next_sizes
        next_times[next_sizes > upper[:, None]] = np.inf
        # Row-major flattening + stable sort = order by (time, worker, unit).
        chosen = np.argsort(next_times, axis=None, kind="stable")[:remaining]
        gained = np.bincount(chosen // window, minlength=slices.size)
        saturated = (gained == window) & (slices + window < upper)
        if saturated.any() or not np.isfinite(next_times.ravel()[chosen]).all():
            window *= 2
            continue
        slices += gained
        return


def allocate(
    total: int,
    costs: Sequence[CostModel],
    *,
    caps: Sequence[int | None] | None = None,
    min_slice: int = 1,
    quantum: int = 1,
) -> tuple[int, ...]:
    """Integer slices that minimise the step makespan ``max_i costs[i].time(b_i)``.

    Subject to ``sum(b_i) == total`` and ``min_slice <= b_i <= cap_i``. The optimum of this
    integer problem is what a greedy reaches that starts every worker at ``min_slice`` and
    hands out the remaining units one at a time to the worker whose time after +1 is
    smallest (ties to the lowest index): the step time is the largest handed-out unit time,
    and the greedy hands out the smallest ones. Done literally that is O(total log n); here
    the greedy is fast-forwarded by water-filling: bisection on the level T of the count
    ``sum_i clip(#{b : alpha_i + beta_i * b < T}, min_slice, cap_i)`` finds the highest
    level at which that count is still <= total, every worker gets all its units below T at
    once, and the few units left (exact ties at the level) go through a vectorised greedy.
    The result is identical to the one-at-a-time greedy, including tie-breaking, so equal
    cost models get slices that differ by at most one (extra units to the lower ranks) and a
    faster worker never gets a smaller slice. 10,000 workers take a few milliseconds.

    ``quantum`` g > 1 hands out whole groups (:func:`grouped_request`): the same greedy over
    groups of cost ``g * beta_i`` each. Bound: let T* be the unquantised optimum with caps
    floored to whole groups and ``min_slice`` raised to whole groups. Rounding each of its
    slices down to whole groups leaves k < (number of slices not whole) groups to place;
    one more group on k of those slices (each has room: its floored cap is a whole number
    of groups above it) is a feasible grouped plan within ``T* + g * beta_i`` on every
    worker, and the greedy is optimal over groups, so its makespan is at most
    ``T* + g * max_i beta_i`` (a short step's remainder aside).

    Raises:
        AllocationError: If costs is empty, caps has the wrong length, min_slice < 1,
            ``total < len(costs) * min_slice``, or ``total > sum(caps)``; with ``quantum``,
            if the whole groups cannot give every worker its smallest slice.
    """
    if quantum != 1:
        if not costs:
            raise AllocationError(
                "no workers to allocate to (empty cost/share list); start at least one worker"
            )
        request = grouped_request(total, len(costs), caps, min_slice, quantum)
        per_group = [CostModel(c.alpha, c.beta * request.quantum) for c in costs]
        groups = allocate(
            request.groups, per_group, caps=request.caps, min_slice=request.min_groups
        )
        return request.samples(groups)
    total, min_slice, upper = _slice_bounds(total, len(costs), caps, min_slice)
    alpha, beta = cost_arrays(costs)

    # Bisection on the level L of "units whose time is < L" (an integer step function of L):
    # count(level_low) <= total <= count(level_high) throughout. At the end the level sits
    # just below the time of the last unit the greedy hands out, so only exact ties are left.
    level_low = float(np.min(alpha + beta * min_slice))
    level_high = float(np.nextafter(np.max(alpha + beta * upper), np.inf))

    def units_below(level: float) -> int:
        with np.errstate(invalid="ignore", over="ignore"):
            below = np.ceil((level - alpha) / beta) - 1.0
        return int(np.clip(below, min_slice, upper).sum())

    for _ in range(_MAX_BISECTION_STEPS):
        mid = 0.5 * (level_low + level_high)
        if not level_low < mid < level_high:
            break
        count = units_below(mid)
        if count <= total:
            level_low = mid
            if count == total:
                break
        else:
            level_high = mid

    slices = _units_below(level_low, alpha, beta, min_slice, upper)
    excess = int(slices.sum()) - total
    # Float rounding at the level can admit a few units too many; drop the latest ones (largest
    # (time, worker) key) so that what is kept is still a prefix of the greedy order.
    while excess > 0:
        last_times = np.where(slices > min_slice, alpha + beta * slices, -np.inf)
        worst = int(np.flatnonzero(last_times == last_times.max())[-1])
        slices[worst] -= 1
        excess -= 1
    _top_up(slices, total - int(slices.sum()), alpha, beta, upper)

    result = tuple(int(b) for b in slices)
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "allocate(total=%d, workers=%d) -> makespan %.6g s",
            total,
            len(result),
            makespan(result, costs),
        )
    return result


def makespan(slices: Sequence[int], costs: Sequence[CostModel]) -> float:
    """Predicted step time ``max_i costs[i].time(b_i)`` over workers with ``b_i > 0``.

    Workers with an empty slice do not compute and do not count. Returns 0.0 if every slice
    is empty.

    Raises:
        AllocationError: If the lengths differ or a slice is negative.
    """
    if len(slices) != len(costs):
        raise AllocationError(
            f"makespan needs one slice per cost model: got {len(slices)} slices and "
            f"{len(costs)} cost models"
        )
    sizes = np.fromiter((_index(b, "slice") for b in slices), dtype=np.int64, count=len(slices))
    if np.any(sizes < 0):
        raise AllocationError(f"slices must be >= 0, got {sizes.tolist()}")
    busy = sizes > 0
    if not busy.any():
        return 0.0
    alpha, beta = cost_arrays(costs)
    return float(np.max((alpha + beta * sizes)[busy]))
