"""DistributedDataParallel with count-weighted gradient synchronisation.

Each rank back-propagates the *mean* loss over its n_i samples; the communication hook scales
its bucket by w_i = n_i / N (N known on every rank from the carving) and sums, giving exactly
the whole batch's mean gradient. ``weighting="uniform"`` scales by 1/world_size (the seed
papers' biased baseline). With a :class:`~raytrain_hetero.worker.sync.guard.StepGuard` the hook
also checks each bucket and appends the non-finite indicator to the last bucket's all-reduce.
Under ghost BatchNorm the last bucket also launches the step's one all-reduce of the running
statistics (:class:`~raytrain_hetero.worker.sync.batchnorm.ghost.GhostStatistics`), right behind it.
"""

from __future__ import annotations

import inspect
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from raytrain_hetero.errors import HeteroError
from raytrain_hetero.worker.measure.emulation import emulate_collective_delay
from raytrain_hetero.worker.measure.timing import StepTiming
from raytrain_hetero.worker.sync.batchnorm.binding import BatchNormBinding
from raytrain_hetero.worker.sync.batchnorm.convert import convert_batchnorm, convert_ghost_batchnorm
from raytrain_hetero.worker.sync.batchnorm.ghost import GhostStatistics
from raytrain_hetero.worker.sync.guard import StepGuard

logger = logging.getLogger(__name__)

#: DDP's switch for the per-forward buffer broadcast: ``forward_sync_buffers`` in the pinned
#: torch, ``broadcast_buffers`` in the torch of prebuilt GPU images (2.11 and earlier).
_NO_FORWARD_BUFFER_SYNC = (
    "forward_sync_buffers"
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
    else "broadcast_buffers"
)


@dataclass
class WeightedSyncState:
    """State of the communication hook of one rank.

    Attributes:
        timing: The worker's step timing (the step in progress, compute accounting).
        weighting: "proportional" or "uniform".
        process_group: Group the gradients are reduced over.
        guard: The step guard whose indicator rides on the last bucket (None: no guard).
        collective_delay_s: EMULATION: seconds slept before each bucket's all-reduce.
        ghost: The model's ghost BatchNorm running statistics, reduced and applied with the
            last bucket (None: no ghost BatchNorm).
    """

    timing: StepTiming
    weighting: str
    process_group: Any
    guard: StepGuard | None = None
    collective_delay_s: float = 0.0
    ghost: GhostStatistics | None = None


def weighted_allreduce_hook(
    state: WeightedSyncState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: scale by the rank's weight, SUM all-reduce, no division."""
    step = state.timing.current
    if step is None:
        raise HeteroError(
            "Gradients were synchronised outside a step of the prepared data loader: iterate "
            "the loader returned by prepare_data_loader and call backward once per batch."
        )
    state.timing.before_collective()
    emulate_collective_delay(state.collective_delay_s)
    tensor = bucket.buffer()
    tensor.mul_(step.weight(state.weighting))
    guard = state.guard
    flags = None
    if guard is not None:
        guard.check_bucket(step.global_step, tensor)
        if bucket.is_last():  # DDP launches buckets in order: every other one was checked
            flags = guard.indicator(step.global_step, tensor)
    payload = tensor if flags is None else torch.cat([tensor, flags])
    group = state.process_group
    if payload.is_cuda and dist.get_backend(group) == dist.Backend.GLOO:
        # Mixed CPU/GPU groups run gloo; stage through host memory.
        payload = payload.cpu()
    size = tensor.numel()

    def unpack(f: torch.futures.Future) -> torch.Tensor:
        reduced = f.value()[0]
        if flags is not None and guard is not None:
            guard.receive(step.global_step, reduced[size:])
            reduced = reduced[:size]
        if reduced.data_ptr() != tensor.data_ptr():
            tensor.copy_(reduced, non_blocking=False)
        return tensor

    fut = dist.all_reduce(payload, group=group, async_op=True).get_future()
    ghost = state.ghost
    statistics = ghost.take() if ghost is not None and bucket.is_last() else None
    if ghost is None or statistics is None:
        return fut.then(unpack)
    # The step's running statistics: one float64 all-reduce behind the last bucket (every rank
    # launches it at the same point), applied on every rank once both have arrived.
    device = statistics.device
    if dist.get_backend(group) == dist.Backend.GLOO:
        statistics = statistics.cpu()
    stats_fut = dist.all_reduce(statistics, group=group, async_op=True).get_future()

    def unpack_both(f: torch.futures.Future) -> torch.Tensor:
        bucket_fut, stats_done = f.value()
        ghost.apply(stats_done.value()[0].to(device))
        return unpack(bucket_fut)

    return torch.futures.collect_all([fut, stats_fut]).then(unpack_both)


# DDP checks the hook's annotations as objects; postponed (string) annotations fail that check.
weighted_allreduce_hook.__annotations__ = {
    "state": WeightedSyncState,
    "bucket": dist.GradBucket,
    "return": torch.futures.Future[torch.Tensor],
}


def batchnorm_binding(
    timing: StepTiming, weighting: str, *, device_async: bool = False
) -> BatchNormBinding:
    """What HeteroBatchNorm layers need from ``timing``: weights and exchange accounting.

    Closures, not bound methods: a deep copy of the model then shares them instead of
    copying the worker's timing.

    Args:
        timing: The worker's step timing.
        weighting: The run's gradient weighting.
        device_async: The exchanges run on the device's stream (NCCL): a CUDA rank then skips
            their accounting, which would synchronise the device at every layer. On gloo a
            CUDA rank stages statistics through host memory, which synchronises anyway, and
            its wait for slower ranks must not count as its own work: a GPU rank mixed with
            CPU ranks otherwise measures the slowest rank's forward as its own.
    """

    def rank_weight() -> float | None:
        step = timing.current
        return None if step is None else step.weight(weighting)

    def before_exchange() -> None:
        timing.before_collective(optional=device_async)

    def after_exchange() -> None:
        timing.after_collective(optional=device_async)

    return BatchNormBinding(rank_weight, before_exchange, after_exchange)


def wrap_model(
    model: torch.nn.Module,
    *,
    device: torch.device | str,
    timing: StepTiming,
    weighting: str,
    sync_batchnorm: bool = True,
    ghost_size: int | None = None,
    ddp_kwargs: dict[str, Any] | None = None,
    collective_timeout_s: float | None = None,
    guard: StepGuard | None = None,
    collective_delay_s: float = 0.0,
) -> DistributedDataParallel:
    """Move ``model`` to the worker's device and wrap it in DDP with the weighted hook.

    ``sync_batchnorm`` replaces BatchNorm layers by global-statistics HeteroBatchNorm (off:
    per-slice statistics, inexact under uneven slices). ``collective_timeout_s`` is passed to
    the statistics group explicitly, as ``new_group`` otherwise takes torch's 30-minute
    default; ``collective_delay_s`` (EMULATION of a slow link) is slept before each all-reduce.
    ``ghost_size`` (instead of ``sync_batchnorm``) converts BatchNorm layers to
    GhostBatchNorm: no exchange in the layers; their running statistics ride behind the last
    gradient bucket, one all-reduce per step.
    """
    if not dist.is_initialized():
        raise HeteroError(
            "torch.distributed is not initialised: prepare_model must run inside a "
            "HeteroTrainer worker."
        )
    device = torch.device(device)
    ghost = None
    if ghost_size is not None:
        ghost = GhostStatistics()
        model = convert_ghost_batchnorm(model, ghost_size, ghost)
        if not ghost.layers:
            ghost = None  # no layer tracks running statistics: nothing to reduce
    elif sync_batchnorm:
        # A dedicated group keeps statistics collectives from interleaving with DDP buckets.
        timeout = None if collective_timeout_s is None else timedelta(seconds=collective_timeout_s)
        bn_group = dist.new_group(backend=dist.get_backend(), timeout=timeout)
        binding = batchnorm_binding(
            timing, weighting, device_async=dist.get_backend(bn_group) == dist.Backend.NCCL
        )
        model = convert_batchnorm(model, bn_group, binding)
    else:
        logger.warning(
            "sync_batchnorm=False: BatchNorm uses per-slice statistics, so updates are not the "
            "one-device updates under uneven slices."
        )
    model = model.to(device)
    # Buffers start equal (synced at init) and HeteroBatchNorm keeps them equal: no per-forward sync.
    kwargs: dict[str, Any] = {_NO_FORWARD_BUFFER_SYNC: False}
    if device.type == "cuda":
        kwargs["device_ids"] = [device.index if device.index is not None else 0]
    kwargs.update(ddp_kwargs or {})
    ddp_model = DistributedDataParallel(model, **kwargs)
    state = WeightedSyncState(
        timing=timing,
        weighting=weighting,
        process_group=dist.group.WORLD,
        guard=guard,
        collective_delay_s=collective_delay_s,
        ghost=ghost,
    )
    ddp_model.register_comm_hook(state, weighted_allreduce_hook)
    return ddp_model
