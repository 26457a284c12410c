"""Per-rank gradient weights from the number of samples each rank processed in a step.

With uneven slices, rank i computes the mean gradient ``g_i`` over its ``n_i`` samples.
Weighting by ``w_i = n_i / N`` (``N = sum_i n_i``) makes ``sum_i w_i * g_i`` exactly the
mean gradient over all N samples, i.e. the update one device would make on the same global
batch. Uniform weights ``1 / world_size`` (the earlier HDP code) bias the update toward
ranks with small slices whenever the counts differ; they are kept only as a baseline.

Pure: standard library only.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Sequence
from typing import Literal

from raytrain_hetero.errors import ConfigError

logger = logging.getLogger(__name__)

__all__ = ["WEIGHTINGS", "Weighting", "gradient_scale", "proportional_weights", "uniform_weights"]

Weighting = Literal["proportional", "uniform"]
WEIGHTINGS: tuple[str, ...] = ("proportional", "uniform")


def _count(value: object, name: str) -> int:
    """A non-negative integer sample count, or ConfigError naming the argument."""
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a non-negative integer sample count, got {value!r}")
    try:
        count = operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise ConfigError(
            f"{name} must be a non-negative integer sample count, got {value!r}"
        ) from None
    if count < 0:
        raise ConfigError(f"{name} must be a non-negative integer sample count, got {count}")
    return count


def _validated_counts(counts: Sequence[int]) -> tuple[int, ...]:
    if len(counts) == 0:
        raise ConfigError("counts is empty: give one sample count per rank")
    validated = tuple(_count(c, f"counts[{i}]") for i, c in enumerate(counts))
    if sum(validated) == 0:
        raise ConfigError(
            f"counts sum to zero ({list(validated)}): no rank processed a sample this step"
        )
    return validated


def proportional_weights(counts: Sequence[int]) -> tuple[float, ...]:
    """Weights ``w_i = n_i / sum(n)``.

    Exactness: ``sum_i w_i * mean_grad_i`` equals the mean gradient over the union of all
    ranks' samples (a rank with ``n_i = 0`` gets weight 0).

    Raises:
        ConfigError: If counts is empty, has a negative or non-integer entry, or sums to 0.
    """
    validated = _validated_counts(counts)
    total = sum(validated)
    return tuple(c / total for c in validated)


def uniform_weights(counts: Sequence[int]) -> tuple[float, ...]:
    """Weights ``1 / world_size`` for every rank, whatever it processed.

    The seed papers' earlier HDP baseline (SUM allreduce, then divide by world_size). It is
    biased toward ranks with small slices whenever the counts differ; use it only for
    comparisons. ``counts`` are validated as for :func:`proportional_weights`.

    Raises:
        ConfigError: As :func:`proportional_weights`.
    """
    validated = _validated_counts(counts)
    return tuple(1.0 / len(validated) for _ in validated)


def gradient_scale(
    rank_count: int,
    global_count: int,
    world_size: int,
    weighting: Weighting,
) -> float:
    """Factor a rank applies to its local mean gradient before a SUM allreduce.

    ``rank_count / global_count`` for ``"proportional"`` (exact mean over the global batch),
    ``1 / world_size`` for ``"uniform"`` (the biased baseline).

    Raises:
        ConfigError: If weighting is not a known name, or a count or the world size is invalid.
    """
    if weighting not in WEIGHTINGS:
        raise ConfigError(
            f"weighting must be one of {list(WEIGHTINGS)}, got {weighting!r}; use 'proportional' "
            "for the exact global-batch mean gradient"
        )
    rank_count = _count(rank_count, "rank_count")
    global_count = _count(global_count, "global_count")
    if isinstance(world_size, bool):
        raise ConfigError(f"world_size must be an integer >= 1, got {world_size!r}")
    try:
        world_size = operator.index(world_size)
    except TypeError:
        raise ConfigError(f"world_size must be an integer >= 1, got {world_size!r}") from None
    if world_size < 1:
        raise ConfigError(f"world_size must be an integer >= 1, got {world_size}")
    if global_count < 1:
        raise ConfigError(
            f"global_count must be >= 1, got {global_count}: no rank processed a sample this step"
        )
    if rank_count > global_count:
        raise ConfigError(
            f"rank_count {rank_count} exceeds global_count {global_count}; global_count must be "
            "the sum of every rank's count for the same step"
        )
    if weighting == "proportional":
        return rank_count / global_count
    return 1.0 / world_size
