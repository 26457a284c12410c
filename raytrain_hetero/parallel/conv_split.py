"""Speed-proportional conv split: chosen ``nn.Conv2d`` layers computed across a group of ranks.

After Marques, Falcão and Alexandre (Applied AI 2018): rank r owns a contiguous block of
``k_r`` output channels of each split layer, sized from per-kernel costs
(:func:`~raytrain_hetero.core.kernel_split.split_kernels`). Forward: every rank computes its
block on the whole batch and the uneven blocks are gathered (:func:`all_gather_blocks`).
Backward: weight gradients stay local; the input gradient, of which each rank holds only the
part through its own kernels, is all-reduced over the group.

Bytes per split layer and step, per rank (batch N, output ``C x H x W``, e bytes per element):
forward ``(C - k_r) * N * H * W * e`` received, own block sent to the ``R - 1`` others;
backward input-gradient all-reduce ``N * C_in * H_in * W_in * e`` (x ``2 (R - 1) / R`` ring).

Unsplit layers run replicated and stay identical without an all-reduce
(:func:`check_replicas_identical`). Checkpoints hold the full model
(:mod:`raytrain_hetero.parallel.conv_state`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.kernel_split import channel_offsets, split_kernels
from raytrain_hetero.errors import ModelParallelError

logger = logging.getLogger(__name__)

__all__ = [
    "CollectiveHooks",
    "SplitConv2d",
    "all_gather_blocks",
    "check_replicas_identical",
    "check_splittable",
    "split_conv_layers",
    "split_layers",
]


def _nothing() -> None:
    return None


@dataclass(frozen=True)
class CollectiveHooks:
    """What a split layer calls around each of its collectives (injected, like BatchNorm's):
    ``before`` accounts (and under EMULATION stretches) the compute so far, ``after`` restarts
    the accounting (:meth:`raytrain_hetero.worker.measure.timing.StepTiming.before_collective`)."""

    before: Callable[[], None] = _nothing
    after: Callable[[], None] = _nothing


NO_HOOKS = CollectiveHooks()


def all_gather_blocks(
    local: torch.Tensor,
    sizes: Sequence[int],
    dim: int,
    group: dist.ProcessGroup | None,
    hooks: CollectiveHooks = NO_HOOKS,
) -> torch.Tensor:
    """Concatenate each rank's block of uneven size along ``dim`` on every rank.

    Each block moves at its own size: one broadcast per rank, straight into its slice of a
    preallocated output. gloo's ``all_gather`` wants equal shapes, and padding to the widest
    block made an uneven split move more bytes than an equal one; on 2 gloo processes the
    broadcasts also beat an uneven ``all_to_all_single``. ``sizes`` is every rank's block size
    in group-rank order; ``hooks`` run once around all the broadcasts.

    Raises:
        ModelParallelError: If ``local`` is not this rank's size along ``dim``.
    """
    rank = dist.get_rank(group)
    block = local.movedim(dim, 0)
    if block.shape[0] != sizes[rank]:
        raise ModelParallelError(
            f"rank {rank}'s block has {block.shape[0]} entries along dim {dim} but the split "
            f"gives it {sizes[rank]}; every rank must pass the same sizes"
        )
    full = block.new_empty((sum(sizes), *block.shape[1:]))
    hooks.before()
    start = 0
    for source, size in enumerate(sizes):
        part = full.narrow(0, start, size)
        if source == rank:
            part.copy_(block)
        src = source if group is None else dist.get_global_rank(group, source)
        dist.broadcast(part, src=src, group=group)
        start += size
    hooks.after()
    return full.movedim(0, dim)


class _SumInputGradient(torch.autograd.Function):
    """Identity forward; backward all-reduces (SUM) the input gradient over the group.

    Each rank's convolution back-propagates only through its own kernels, so its input
    gradient is one term of the sum over kernel blocks that the single-device layer computes.
    """

    @staticmethod
    def forward(
        ctx: Any, inputs: torch.Tensor, group: dist.ProcessGroup | None, hooks: CollectiveHooks
    ) -> torch.Tensor:
        ctx.group = group
        ctx.hooks = hooks
        return inputs.view_as(inputs)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        total = grad.contiguous().clone()  # the all-reduce writes in place
        ctx.hooks.before()
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=ctx.group)
        ctx.hooks.after()
        return total, None, None


class _GatherChannels(torch.autograd.Function):
    """Forward all-gathers the channel blocks; backward keeps this rank's block of the grad.

    The gradient of the gathered output is the same on every rank (every rank computes the
    same loss from the same activations), so no communication is needed backward here.
    """

    @staticmethod
    def forward(
        ctx: Any,
        block: torch.Tensor,
        sizes: tuple[int, ...],
        rank: int,
        group: dist.ProcessGroup | None,
        hooks: CollectiveHooks,
    ) -> torch.Tensor:
        ctx.start = sum(sizes[:rank])
        ctx.size = sizes[rank]
        return all_gather_blocks(block, sizes, 1, group, hooks).contiguous()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None]:
        own = grad.narrow(1, ctx.start, ctx.size).contiguous()
        return own, None, None, None, None


def check_splittable(name: str, module: nn.Module | None, ranks: int) -> nn.Conv2d:
    """The Conv2d at ``name``, or a ModelParallelError saying why it cannot be split."""
    if module is None:
        raise ModelParallelError(
            f"layer {name!r} not found in the model; name a Conv2d as model.named_modules() "
            "lists it (e.g. 'features.0')"
        )
    if isinstance(module, SplitConv2d):
        raise ModelParallelError(f"layer {name!r} is already split; split each layer once")
    if not isinstance(module, nn.Conv2d):
        raise ModelParallelError(
            f"layer {name!r} is a {type(module).__name__}, not an nn.Conv2d; only Conv2d layers "
            "can be split by kernels"
        )
    if module.groups != 1:
        raise ModelParallelError(
            f"layer {name!r} is a grouped or depthwise convolution (groups={module.groups}); "
            "its kernels read disjoint input channels and cannot be split by output channel "
            "here; leave it replicated"
        )
    if module.out_channels < ranks:
        raise ModelParallelError(
            f"layer {name!r} has {module.out_channels} kernels but the split group has {ranks} "
            "ranks; every rank needs at least one kernel: use fewer ranks or leave it replicated"
        )
    return module


class SplitConv2d(nn.Module):
    """An ``nn.Conv2d`` whose output channels are split in contiguous blocks over a group.

    Parameters keep the plain layer's names (``weight``, ``bias``), holding this rank's block,
    so the split model's parameter order is the plain model's.

    Args:
        conv: The layer to split (identical on every rank); its weights are sliced, not kept.
        kernels_per_rank: Output channels of each rank of ``group``, >= 1 each.
        rank: This process's rank within ``group``.
        group: Process group of the split (None = the default group).
        hooks: Called around every collective (emulation and timing).

    Raises:
        ModelParallelError: If the layer cannot be split this way.
    """

    def __init__(
        self,
        conv: nn.Conv2d,
        kernels_per_rank: Sequence[int],
        *,
        rank: int,
        group: dist.ProcessGroup | None = None,
        hooks: CollectiveHooks = NO_HOOKS,
    ) -> None:
        super().__init__()
        check_splittable("<given>", conv, len(kernels_per_rank))
        sizes = tuple(int(k) for k in kernels_per_rank)
        offsets = channel_offsets(sizes)
        if offsets[-1] != conv.out_channels:
            raise ModelParallelError(
                f"kernels_per_rank {list(sizes)} sum to {offsets[-1]} but the layer has "
                f"{conv.out_channels} output channels"
            )
        if not 0 <= rank < len(sizes):
            raise ModelParallelError(f"rank {rank} is outside the split group of {len(sizes)}")
        self.in_channels = conv.in_channels
        self.out_channels = conv.out_channels
        self.kernel_size = conv.kernel_size
        self.stride = conv.stride
        self.padding = conv.padding
        self.dilation = conv.dilation
        self.padding_mode = conv.padding_mode
        self._reversed_padding_repeated_twice = list(conv._reversed_padding_repeated_twice)
        self.rank = rank
        self.group = group
        self.hooks = hooks
        self.kernels_per_rank = sizes
        block = slice(offsets[rank], offsets[rank + 1])
        self.weight = nn.Parameter(conv.weight.detach()[block].clone())
        self.bias = None if conv.bias is None else nn.Parameter(conv.bias.detach()[block].clone())

    @property
    def block(self) -> slice:
        """This rank's output channels in the full layer."""
        offsets = channel_offsets(self.kernels_per_rank)
        return slice(offsets[self.rank], offsets[self.rank + 1])

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, kernels_per_rank={self.kernels_per_rank}, rank={self.rank}"
        )

    def output_size(self, height: int, width: int) -> tuple[int, int]:
        """Output height and width for an input of ``height x width`` (nn.Conv2d's formula)."""
        sizes = []
        for i, extent in enumerate((height, width)):
            reach = self.dilation[i] * (self.kernel_size[i] - 1) + 1
            sizes.append((extent + 2 * self.padding[i] - reach) // self.stride[i] + 1)
        return sizes[0], sizes[1]

    def gather_bytes(self, input_shape: Sequence[int], element_bytes: int) -> tuple[int, int]:
        """Bytes (sent, received) by this rank in one forward gather of an input's output.

        This rank sends its ``k_r`` channels to each of the ``R - 1`` others and receives the
        other ``C - k_r`` (``input_shape``: the layer input's ``(N, C_in, H, W)``).
        """
        batch, _, height, width = input_shape
        out_h, out_w = self.output_size(height, width)
        channel = batch * out_h * out_w * element_bytes
        own = self.kernels_per_rank[self.rank]
        ranks = len(self.kernels_per_rank)
        return (ranks - 1) * own * channel, (self.out_channels - own) * channel

    def _local_conv(self, inputs: torch.Tensor) -> torch.Tensor:
        # Same arithmetic as nn.Conv2d._conv_forward, on this rank's kernels only.
        if self.padding_mode != "zeros":
            padded = F.pad(inputs, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return F.conv2d(padded, self.weight, self.bias, self.stride, 0, self.dilation)
        return F.conv2d(inputs, self.weight, self.bias, self.stride, self.padding, self.dilation)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """The full layer's output (all channels) on every rank."""
        if inputs.requires_grad:
            inputs = _SumInputGradient.apply(inputs, self.group, self.hooks)
        block = self._local_conv(inputs)
        return _GatherChannels.apply(
            block, self.kernels_per_rank, self.rank, self.group, self.hooks
        )


def split_layers(model: nn.Module) -> list[tuple[str, SplitConv2d]]:
    """Every split layer of ``model`` with its name, in ``named_modules`` order."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, SplitConv2d)]


def _replicated_tensors(model: nn.Module) -> list[torch.Tensor]:
    split_ids = {id(t) for _, layer in split_layers(model) for t in layer.parameters()}
    tensors = [p.detach() for p in model.parameters() if id(p) not in split_ids]
    tensors += [b.detach() for b in model.buffers() if b.is_floating_point()]
    return tensors


def check_replicas_identical(
    model: nn.Module,
    group: dist.ProcessGroup | None = None,
    *,
    tolerance: float = 0.0,
) -> float:
    """Largest difference between ranks of any replicated parameter or float buffer.

    Unsplit layers see the same batch and gathered activations on every rank, so their
    gradients agree without an all-reduce and identical replicas stay identical; this catches
    what would break that (different initial weights, unsynchronised dropout seeds). Split
    layers' own blocks are skipped. A collective over ``group``.

    Raises:
        ModelParallelError: If the difference exceeds ``tolerance``.
    """
    tensors = _replicated_tensors(model)
    if not tensors:
        return 0.0
    flat = torch.cat([t.reshape(-1).to(torch.float64) for t in tensors])
    # One all-reduce of [x, -x] gives both the max and (negated) min of every element.
    both = torch.cat([flat, -flat])
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
    spread = float((both[: flat.numel()] + both[flat.numel() :]).max()) if flat.numel() else 0.0
    if spread > tolerance:
        raise ModelParallelError(
            f"replicated (not split) parameters differ between ranks by up to {spread:.3g} "
            f"(tolerance {tolerance:.3g}); build the model from the same seed on every rank and "
            "keep rank-dependent randomness (dropout) seeded identically"
        )
    return spread


def split_conv_layers(
    model: nn.Module,
    layers: Sequence[str],
    group: dist.ProcessGroup | None = None,
    *,
    kernels_per_rank: Mapping[str, Sequence[int]] | None = None,
    costs: Mapping[str, Sequence[CostModel]] | None = None,
    hooks: CollectiveHooks = NO_HOOKS,
    check: bool = True,
) -> dict[str, tuple[int, ...]]:
    """Replace the named Conv2d layers of ``model`` in place by :class:`SplitConv2d`.

    Each layer's split is ``kernels_per_rank[name]``, else the makespan-optimal split for
    ``costs[name]`` (one per-kernel cost model per rank), else an equal split. With ``check``
    (a collective) the whole model is first verified identical on every rank.

    Returns:
        The split of each layer, by name.

    Raises:
        ModelParallelError: If a layer is missing, not a Conv2d, grouped, narrower than the
            group, named twice, or the model differs between ranks.
    """
    ranks = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if "" in layers:
        raise ModelParallelError("an empty layer name names the whole model; name a sub-layer")
    if len(set(layers)) != len(layers):
        raise ModelParallelError(f"layers {list(layers)} name a layer twice; name each once")
    modules = dict(model.named_modules())
    convs = {name: check_splittable(name, modules.get(name), ranks) for name in layers}
    if check:
        check_replicas_identical(model, group)  # before splitting: the convs are checked too
    splits: dict[str, tuple[int, ...]] = {}
    for name, conv in convs.items():
        if kernels_per_rank is not None and name in kernels_per_rank:
            sizes = tuple(int(k) for k in kernels_per_rank[name])
        elif costs is not None and name in costs:
            models = costs[name]
            sizes = split_kernels(
                conv.out_channels, [m.beta for m in models], [m.alpha for m in models]
            )
        else:
            sizes = split_kernels(conv.out_channels, [1.0] * ranks)
        if len(sizes) != ranks:
            raise ModelParallelError(
                f"layer {name!r}: split {list(sizes)} has {len(sizes)} entries but the group "
                f"has {ranks} ranks"
            )
        split = SplitConv2d(conv, sizes, rank=rank, group=group, hooks=hooks)
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, split)
        splits[name] = sizes
        logger.info(
            "split %s (%d kernels) over %d ranks: %s", name, conv.out_channels, ranks, sizes
        )
    return splits
