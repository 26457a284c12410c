"""Evaluation and prediction sharded by speed over all ranks, aggregated exactly.

Each evaluation step splits the next ``batch_size`` items across the ranks by the current
plan with the training carving's own math (unshuffled, ragged tail included): every item
once, at least one per rank, the same number of steps on every rank (so per-step collectives
such as Lightning's ``sync_dist`` are safe). Aggregation counts rather than averaging
averages: :func:`sum_across_ranks` all-reduces sums; torchmetrics' ``sync_on_compute`` gathers
its states itself, exact for uneven shards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, Sampler

from raytrain_hetero.core.carving import EpochCarver
from raytrain_hetero.core.plan import Plan
from raytrain_hetero.worker.measure.clock import ComputeClock
from raytrain_hetero.worker.measure.emulation import SlowdownEmulator

__all__ = ["EvaluationLoader", "ShardBatchSampler", "evaluation_shares", "sum_across_ranks"]


def evaluation_shares(plan: Plan | None, world_size: int) -> tuple[float, ...]:
    """Each rank's share of evaluation work: the plan's shares (or its split of a full
    global batch), equal shares before the first plan or for a plan over other ranks."""
    if plan is None or plan.world_size != world_size:
        return (1.0,) * world_size
    return plan.shares if plan.shares is not None else tuple(float(s) for s in plan.slices)


class ShardBatchSampler(Sampler[list[Any]]):
    """Yields this rank's slice of every evaluation step, steps split by speed.

    ``source`` is a length ``n`` (positions ``0..n-1``) or a sampler whose items are taken in
    order; ``shares`` (one per rank) is read at the start of every iteration.

    Raises:
        ConfigError: Fewer items than ranks (a rank would have nothing to evaluate).
    """

    def __init__(
        self,
        source: int | Sampler[Any],
        *,
        batch_size: int,
        rank: int,
        shares: Callable[[], Sequence[float]],
    ) -> None:
        self.source = source
        self.rank = rank
        self.shares = shares
        world = len(shares())
        size = source if isinstance(source, int) else len(source)  # type: ignore[arg-type]
        self.carver = EpochCarver(size, max(batch_size, world), shuffle=False, min_step_size=world)

    def __len__(self) -> int:
        return self.carver.steps_per_epoch

    def __iter__(self) -> Iterator[list[Any]]:
        source = self.source
        items = range(source) if isinstance(source, int) else list(source)  # type: ignore[call-overload]
        plan = Plan.from_shares(self.carver.global_batch_size, self.shares(), reason="evaluation")
        for step in range(len(self)):
            lo, hi = self.carver.rank_positions(step, plan, self.rank)
            yield [items[i] for i in range(lo, hi)]


class EvaluationLoader(DataLoader):
    """A ``DataLoader`` over this rank's :class:`ShardBatchSampler` that, under EMULATION,
    stretches the consumer's compute on each batch (what runs between two batches) by the
    worker's slowdown factor through the one :class:`SlowdownEmulator`, as in training steps.
    ``source``, ``batch_size``, ``rank`` and ``shares`` are :class:`ShardBatchSampler`'s.
    """

    def __init__(
        self,
        dataset: Dataset,
        *,
        source: int | Sampler[Any],
        batch_size: int,
        rank: int,
        shares: Callable[[], Sequence[float]],
        clock: ComputeClock,
        slowdown: Callable[[], float],
        **kwargs: Any,
    ) -> None:
        shards = ShardBatchSampler(source, batch_size=batch_size, rank=rank, shares=shares)
        super().__init__(dataset, batch_sampler=shards, **kwargs)
        self._clock = clock
        self._slowdown = slowdown

    def __iter__(self) -> Any:
        batches = super().__iter__()
        factor = self._slowdown()
        return batches if factor <= 1.0 else self._stretched(batches, factor)

    def _stretched(self, batches: Iterator[Any], factor: float) -> Iterator[Any]:
        # A prefetching consumer (Lightning) asks for batch k+1 before computing on batch k:
        # every interval is still stretched once, except the compute after the last request.
        emulator = SlowdownEmulator(self._clock)
        for batch in batches:
            emulator.mark()
            yield batch
            emulator.stretch(factor)


def sum_across_ranks(*values: float) -> tuple[float, ...]:
    """Sums of ``values`` over all ranks (one all-reduce); the values themselves without a
    process group. Integers stay exact below 2**53."""
    if not (dist.is_available() and dist.is_initialized()):
        return tuple(values)
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    sums = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(sums)
    return tuple(int(s) if isinstance(v, int) else float(s) for v, s in zip(values, sums.tolist()))
