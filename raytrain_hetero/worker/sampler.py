"""Torch batch sampler and loader over :mod:`raytrain_hetero.core.carving`.

:class:`CarvingBatchSampler` yields, for one epoch from a start step, this rank's index list
of every global step under the plan that governs that step. :class:`HeteroDataLoader` wraps a
torch ``DataLoader`` built on it: each iteration is one epoch (resuming mid-epoch after a
restart), and as it hands out the batch of step s it publishes the step's per-rank counts to
the worker context, which the gradient hook and BatchNorm use for their weights. The counts are
recomputed from the same pure carving rather than taken from the sampler, so prefetching by
DataLoader workers cannot make them disagree.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Iterator

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from raytrain_hetero.worker.context import StepInfo, WorkerContext
from raytrain_hetero.core.carving import Cursor, EpochCarver
from raytrain_hetero.core.plan import PlanSchedule
from raytrain_hetero.core.weighting import gradient_scale
from raytrain_hetero.worker.probe import ComputeClock, restart_accounting

logger = logging.getLogger(__name__)

_FORBIDDEN_LOADER_ARGS = ("batch_size", "shuffle", "sampler", "batch_sampler", "drop_last")


class CarvingBatchSampler(Sampler[list[int]]):
    """Yields this rank's dataset indices for each step of one epoch.

    Args:
        carver: The run's epoch carver.
        schedule: Plans of the worker group (read lazily, step by step).
        rank: This rank.
    """

    def __init__(self, carver: EpochCarver, schedule: PlanSchedule, rank: int) -> None:
        self.carver = carver
        self.schedule = schedule
        self.rank = rank
        self.epoch = 0
        self.start_step = 0

    def set_position(self, epoch: int, start_step: int) -> None:
        """Make the next iteration cover ``epoch`` from ``start_step`` to its end."""
        self.epoch = epoch
        self.start_step = start_step

    def __iter__(self) -> Iterator[list[int]]:
        permutation = self.carver.permutation(self.epoch)
        for k in range(self.start_step, self.carver.steps_per_epoch):
            global_step = self.epoch * self.carver.steps_per_epoch + k
            plan = self.schedule.plan_for(global_step)
            self.schedule.mark_carved(global_step)
            yield self.carver.rank_indices(
                self.epoch, k, plan, self.rank, permutation
            ).tolist()

    def __len__(self) -> int:
        return self.carver.steps_per_epoch - self.start_step


def move_to_device(batch: Any, device: torch.device, non_blocking: bool = False) -> Any:
    """Recursively move the tensors of a collated batch to ``device``, keeping its structure."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=non_blocking)
    if isinstance(batch, dict):
        return {k: move_to_device(v, device, non_blocking) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(move_to_device(v, device, non_blocking) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to_device(v, device, non_blocking) for v in batch)
    return batch


class HeteroDataLoader:
    """One epoch per iteration of this rank's slices of every global batch.

    Use ``for epoch in range(loader.epoch, num_epochs): for batch in loader: ...``; after a
    restart ``loader.epoch`` and the first iteration resume exactly at the checkpointed step.

    Args:
        dataset: Map-style dataset; items pass through the collate function unchanged.
        context: This worker's context (carver, schedule and cursor must be set).
        ensure_plan: Called before each epoch; makes sure a plan exists (probing if needed).
        on_step_end: Called with the finished step's record (measurements).
        move_to_device: Move each batch to the worker's device.
        dataloader_kwargs: Other ``torch.utils.data.DataLoader`` arguments.
    """

    def __init__(
        self,
        dataset: Dataset,
        context: WorkerContext,
        *,
        ensure_plan: Callable[[], None],
        on_step_end: Callable[[dict[str, Any]], None],
        move_to_device: bool = True,
        **dataloader_kwargs: Any,
    ) -> None:
        bad = [k for k in _FORBIDDEN_LOADER_ARGS if k in dataloader_kwargs]
        if bad:
            from raytrain_hetero.errors import ConfigError

            raise ConfigError(
                f"prepare_data_loader got {', '.join(bad)}: raytrain_hetero carves every global "
                "batch itself. Set global_batch_size on HeteroTrainer and drop these arguments."
            )
        if context.carver is None or context.cursor is None:
            raise RuntimeError("HeteroDataLoader needs the context's carver and cursor set.")
        self.dataset = dataset
        self.context = context
        self._ensure_plan = ensure_plan
        self._on_step_end = on_step_end
        self._move = move_to_device
        self._device = torch.device(context.device)
        self._clock = ComputeClock(self._device)
        self.batch_sampler = CarvingBatchSampler(context.carver, context.schedule, context.rank)
        self.loader = DataLoader(dataset, batch_sampler=self.batch_sampler, **dataloader_kwargs)
        self._non_blocking = bool(dataloader_kwargs.get("pin_memory", False))
        self._load_s = 0.0
        self._load_wall_s = 0.0

    @property
    def epoch(self) -> int:
        """Epoch the next iteration covers."""
        return self.context.cursor.epoch

    @property
    def steps_per_epoch(self) -> int:
        """Global steps in a whole epoch."""
        return self.context.carver.steps_per_epoch

    def __len__(self) -> int:
        return self.steps_per_epoch - self.context.cursor.step_in_epoch

    def ensure_plan(self) -> None:
        """Probe and agree the first plan now (a collective), instead of at the first epoch."""
        self._ensure_plan()

    def __iter__(self) -> Iterator[Any]:
        ctx = self.context
        carver = ctx.carver
        self._ensure_plan()
        epoch, start = ctx.cursor.epoch, ctx.cursor.step_in_epoch
        self.batch_sampler.set_position(epoch, start)
        steps = carver.steps_per_epoch
        step = start
        batches = iter(self.loader)
        try:
            while True:
                load_started = self._clock.now()
                load_wall_started = time.perf_counter()
                try:
                    batch = next(batches)
                except StopIteration:
                    break
                if self._move:
                    batch = move_to_device(batch, self._device, self._non_blocking)
                load_s = self._clock.now() - load_started
                self._load_wall_s = time.perf_counter() - load_wall_started
                self._begin_step(epoch, step, load_s)
                ctx.cursor = (
                    Cursor(epoch, step + 1) if step + 1 < steps else Cursor(epoch + 1, 0)
                )
                self._restart_compute_clock()
                yield batch
                self._end_step()
                step += 1
        finally:
            ctx.current_step = None

    def _begin_step(self, epoch: int, step_in_epoch: int, load_s: float) -> None:
        ctx = self.context
        global_step = epoch * ctx.carver.steps_per_epoch + step_in_epoch
        plan = ctx.schedule.plan_for(global_step)
        ctx.schedule.mark_carved(global_step)
        ctx.current_step = StepInfo(
            global_step=global_step,
            epoch=epoch,
            step_in_epoch=step_in_epoch,
            counts=ctx.carver.step_counts(step_in_epoch, plan),
            rank=ctx.rank,
            plan_version=plan.version,
        )
        ctx.step_metrics = {}
        ctx.step_wall_start = time.perf_counter()
        self._load_s = load_s

    def _restart_compute_clock(self) -> None:
        # Started after the batch is on the device: loading is accounted separately.
        restart_accounting(self.context, self._clock)

    def _end_step(self) -> None:
        ctx = self.context
        step = ctx.current_step
        if step is None:
            return
        wall = time.perf_counter() - ctx.step_wall_start
        compute = ctx.compute_s
        # Reading/decoding in this process is on the step's critical path too.
        busy = compute + self._load_s
        record = {
            "step": step.global_step,
            "epoch": step.epoch,
            "rank": ctx.rank,
            "worker": ctx.spec.name,
            "device": ctx.device,
            "slice": step.local_count,
            "weight": gradient_scale(
                step.local_count, step.global_count, len(step.counts), ctx.setup.weighting
            ),
            "compute_s": compute,
            "load_s": self._load_s,
            "busy_s": ctx.busy_s + self._load_wall_s,
            "samples_per_s": step.local_count / busy if busy > 0 else float("nan"),
            "loss": ctx.step_metrics.get("loss", float("nan")),
            "global_samples_per_s": step.global_count / wall if wall > 0 else float("nan"),
            "plan_version": step.plan_version,
            "group": ctx.group_id,
            "world_size": ctx.world_size,
            "wall_s": wall,
            "time": time.time(),
        }
        ctx.current_step = None
        self._on_step_end(record)
