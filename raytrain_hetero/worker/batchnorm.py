"""BatchNorm with global-batch statistics across ranks holding uneven slices, on gloo or NCCL.

torch's ``SyncBatchNorm`` refuses CPU tensors, and plain per-rank BatchNorm normalises each
rank's slice by that slice's own statistics, which under uneven slices is not the one-device
computation. :class:`HeteroBatchNorm` sums per-channel ``(sum, sum of squares, count)``
(in float64) over the ranks so every rank normalises with the mean and biased variance of the
*global* batch and updates running statistics with the global unbiased variance, exactly as one
device would.

What it costs, per layer and training step: one exchange in forward (the statistics, packed
into one tensor) and one in backward (the two gradient sums, packed), each a single direct
all-to-all hop on gloo (:class:`_PendingSum`). The backward one overlaps the work that does not
depend on it. Exchanges that cannot matter are skipped on every rank alike: layers in eval mode
(running statistics; a frozen BatchNorm), and the backward exchange of a layer whose input
needs no gradient (a frozen stem or the network's input). ``BatchConfig.batchnorm="local"``
does without the layers altogether (per-slice statistics, inexact).

Gradients stay exact under the count-weighted gradient sync: rank r's gradient is later scaled
by w_r = n_r/N, so the backward of the statistics sum returns
``sum_j w_j * g_j / w_r`` (g_j: gradient arriving at the statistics on rank j). After the
weighting, each rank contributes its share of the true derivative through the statistics.

The layer reads nothing global: what it needs from the training step (this rank's weight w_r,
and what to do around each statistics exchange, e.g. account and emulate compute) is a
:class:`BatchNormBinding` passed in by :func:`convert_batchnorm`.

``BatchConfig.batchnorm="ghost"`` uses :class:`GhostBatchNorm` instead (converted by
:func:`convert_ghost_batchnorm`): contiguous groups of ``ghost_size`` samples normalised by
their own statistics, no exchange in the layers, slices planned in whole groups, running
statistics reduced once per step (:class:`GhostStatistics`). docs/concepts/ghost-batchnorm.md
has the design.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm, _LazyNormBase
from torch.nn.modules.instancenorm import _InstanceNorm

from raytrain_hetero.errors import HeteroError, ModelPreparationError

logger = logging.getLogger(__name__)


def _nothing() -> None:
    return None


def _no_weight() -> float | None:
    return None


@dataclass(frozen=True)
class BatchNormBinding:
    """What HeteroBatchNorm layers need from the training step, injected at conversion.

    Attributes:
        rank_weight: This rank's gradient weight w_r in the current step, or None outside a
            step (then 1/world, the weight of plain averaging).
        before_exchange: Called right before each statistics all-reduce (the rank's compute
            up to here is accounted, and stretched under EMULATION).
        after_exchange: Called right after it (the wait is not compute).
    """

    rank_weight: Callable[[], float | None] = _no_weight
    before_exchange: Callable[[], None] = _nothing
    after_exchange: Callable[[], None] = _nothing


UNBOUND = BatchNormBinding()


def _layout(input: torch.Tensor) -> tuple[int, list[int], list[int]]:
    """Channels, the dimensions statistics reduce over, and the per-channel broadcast shape."""
    channels = input.shape[1]
    return channels, [0, *list(range(2, input.dim()))], [1, channels] + [1] * (input.dim() - 2)


class _GlobalBatchNormFunction(torch.autograd.Function):
    """Normalisation by global-batch statistics with a hand-written backward.

    The local statistics and the gradients are computed with a few fused passes over the
    activation in its own dtype (sums accumulated by torch's cascade summation, the backward's
    two sums by torch's native BatchNorm backward kernel, per-channel results widened to float64
    before they cross ranks). The first version built the same computation from float64 copies
    of the activation through autograd: about 4x the cost of a native BatchNorm.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        input: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        layer: HeteroBatchNorm,
        rank_weight: float,
    ) -> torch.Tensor:
        channels, reduce_dims, shape = _layout(input)
        local_count = input.numel() // channels
        wide = torch.float64
        stats = torch.zeros(2 * channels + 1, dtype=wide, device=input.device)
        if local_count > 0:
            # Shift by the slice mean so the float32 sum of squares does not cancel.
            shift = input.mean(reduce_dims, keepdim=True)
            shifted = input - shift
            shifted_sum = shifted.sum(reduce_dims).to(wide)
            shifted_sq = shifted.mul_(shifted).sum(reduce_dims).to(wide)
            del shifted
            local_mean = shift.reshape(channels).to(wide) + shifted_sum / local_count
            local_m2 = (shifted_sq - shifted_sum * shifted_sum / local_count).clamp_min(0.0)
            stats[:channels] = local_mean * local_count
            stats[channels : 2 * channels] = local_m2 + local_count * local_mean * local_mean
            stats[-1] = float(local_count)
        stats = _PendingSum(stats, layer.process_group, layer.binding).wait()
        total = stats[-1]
        mean = stats[:channels] / total
        var = (stats[channels : 2 * channels] / total - mean * mean).clamp_min(0.0)
        if layer.training and layer.track_running_stats:
            layer._update_running_stats(mean, var, total)

        inv_std = torch.rsqrt(var + layer.eps)
        scale = inv_std if weight is None else inv_std * weight.detach().to(wide)
        offset = -mean * scale
        if bias is not None:
            offset = offset + bias.detach().to(wide)
        output = torch.addcmul(
            offset.to(input.dtype).reshape(shape), input, scale.to(input.dtype).reshape(shape)
        )
        ctx.save_for_backward(input, weight)
        ctx.mean = mean
        ctx.inv_std = inv_std
        ctx.total = total
        ctx.rank_weight = rank_weight
        ctx.group = layer.process_group
        ctx.binding = layer.binding
        return output

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[Any, ...]:
        input, weight = ctx.saved_tensors
        channels, _, shape = _layout(input)
        wide = torch.float64
        mean, inv_std, total = ctx.mean, ctx.inv_std, ctx.total

        grad = grad_output.contiguous()
        # sum(dy) and sum(dy * x_hat) in one fused pass of torch's native kernel, given the global
        # mean and inv_std (float32 sums for low precision; it divides by the count: not if empty).
        local_sum_dy = local_sum_dy_xhat = torch.zeros(channels, dtype=wide, device=input.device)
        if input.numel() > 0:
            acc = wide if input.dtype == wide else torch.float32
            # A unit weight, not None: CUDA's kernel reads the weight's device even when it
            # forms no input gradient ("tensor does not have a device"); the two sums ignore it.
            unit_weight = _unit(channels, acc, input.device)[1]
            _, dy_xhat, dy = torch.ops.aten.native_batch_norm_backward(
                grad,
                input,
                unit_weight,
                None,
                None,
                mean.to(acc),
                inv_std.to(acc),
                True,
                0.0,
                [False, True, True],
            )
            local_sum_dy, local_sum_dy_xhat = dy.to(wide), dy_xhat.to(wide)

        # Nothing upstream needs this layer's input gradient (a frozen stem, the network's
        # input): the exchange below exists only to form it, so it is skipped on every rank
        # alike (the same model everywhere: the decision is identical).
        pending = None
        if ctx.needs_input_grad[0]:
            # Rank r's gradients are scaled by w_r later, so the statistics' share of the input
            # gradient is sum_j w_j g_j / w_r (see the module docstring). Started now, awaited
            # after the parameter gradients, which do not depend on it.
            weighted = torch.cat([local_sum_dy, local_sum_dy_xhat]) * ctx.rank_weight
            pending = _PendingSum(weighted, ctx.group, ctx.binding)

        grad_weight = grad_bias = None
        if weight is not None and ctx.needs_input_grad[1]:
            grad_weight = local_sum_dy_xhat.to(weight.dtype)
        if ctx.needs_input_grad[2]:
            grad_bias = local_sum_dy.to(input.dtype)
        if pending is None:
            return None, grad_weight, grad_bias, None, None

        gain = inv_std if weight is None else inv_std * weight.detach().to(wide)
        reduced = pending.wait()
        if ctx.rank_weight > 0:  # a rank without samples has no input gradient to form
            reduced = reduced / ctx.rank_weight
        sum_dy, sum_dy_xhat = reduced[:channels], reduced[channels:]
        input_coef = -gain * inv_std * sum_dy_xhat / total
        # x - mean first, as torch's own backward does (exact near the mean in any dtype, where
        # x * coef - mean * coef cancels in float32); the offset takes what the narrowed mean lost.
        narrow_mean = mean.to(input.dtype)
        offset = -gain * sum_dy / total - input_coef * (mean - narrow_mean.to(wide))
        offset, coef, scale = (t.to(input.dtype).reshape(shape) for t in (offset, input_coef, gain))
        grad_input = (input - narrow_mean.reshape(shape)).mul_(coef).add_(offset)
        return grad_input.addcmul_(grad, scale), grad_weight, grad_bias, None, None


class _PendingSum:
    """A started exchange of per-channel statistics; :meth:`wait` returns their sum over ``group``.

    On gloo every rank sends its statistics (a few hundred float64 values) straight to every
    other rank (an all-to-all of copies) and sums what it receives in rank order. At these
    sizes the sequential hops are the whole cost, each a rendezvous that needs the peer
    scheduled: gloo's ring all-reduce takes 2(world-1) of them, a ring all-gather world-1,
    the direct exchange one (world-1 messages per rank, sent at once). Measured for 3 ranks
    on 2 shared cores, 129 values: all-reduce ~1.5 ms, all-gather ~1.1 ms, all-to-all
    ~0.4 ms (medians). Summing in rank order also gives bit-identical sums on every rank.
    NCCL keeps its all-reduce. The binding's hooks run around each blocking part: the launch and
    the wait are not compute; whatever the caller does between them is.
    """

    def __init__(self, tensor: torch.Tensor, group: Any, binding: BatchNormBinding) -> None:
        self._tensor = tensor
        self._binding = binding
        self._work: Any = None
        self._gathered: torch.Tensor | None = None
        if group is None or dist.get_world_size(group) == 1:
            return
        binding.before_exchange()
        try:
            if dist.get_backend(group) == dist.Backend.GLOO:
                staged = tensor.cpu() if tensor.is_cuda else tensor
                copies = staged.reshape(-1).repeat(dist.get_world_size(group))
                self._gathered = torch.empty_like(copies)
                self._work = dist.all_to_all_single(
                    self._gathered, copies, group=group, async_op=True
                )
            else:
                self._work = dist.all_reduce(tensor, group=group, async_op=True)
        finally:
            binding.after_exchange()

    def wait(self) -> torch.Tensor:
        """Block until every rank's contribution arrived; their sum, on the tensor's device."""
        if self._work is None:
            return self._tensor
        self._binding.before_exchange()
        try:
            self._work.wait()
        finally:
            self._binding.after_exchange()
        self._work = None
        if self._gathered is not None:
            summed = self._gathered.view(-1, self._tensor.numel()).sum(0)
            self._tensor.copy_(summed.view_as(self._tensor))
        return self._tensor


class HeteroBatchNorm(_BatchNorm):
    """BatchNorm over the global batch, for any input rank (1d, 2d, 3d) and uneven slices.

    In evaluation mode, or when synchronisation is switched off (probing), it behaves exactly
    like the BatchNorm it replaced.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.process_group: Any = None
        self.binding: BatchNormBinding = UNBOUND
        self.sync_enabled = True

    def __getstate__(self) -> dict[str, Any]:
        # Copies (copy.deepcopy, swa_utils.AveragedModel's EMA, torch.save of the module) leave
        # the group and the step's hooks behind: a process group cannot be pickled, and a copy
        # run outside the step (or on one rank) must not rendezvous. The copy normalises like
        # the BatchNorm it replaced; convert_batchnorm binds it again.
        return {**self.__dict__, "process_group": None, "binding": UNBOUND}

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        use_batch_stats = self.training or not self.track_running_stats
        synced = use_batch_stats and self.sync_enabled and self.process_group is not None
        if not synced:
            return super().forward(input)

        return _GlobalBatchNormFunction.apply(
            input, self.weight, self.bias, self, self._rank_weight()
        )

    def _rank_weight(self) -> float:
        """This rank's gradient weight w_r in the current step (n_r/N, or 1/world)."""
        weight = self.binding.rank_weight()
        if weight is None:
            return 1.0 / dist.get_world_size(self.process_group)
        return float(weight)

    @torch.no_grad()
    def _update_running_stats(
        self, mean: torch.Tensor, var: torch.Tensor, count: torch.Tensor
    ) -> None:
        self.num_batches_tracked.add_(1)
        if self.momentum is None:
            factor = 1.0 / float(self.num_batches_tracked)
        else:
            factor = self.momentum
        # Stays a tensor: reading the count with .item() would synchronise a CUDA device.
        unbiased = var * (count / (count - 1.0).clamp_min(1.0))
        self.running_mean.mul_(1 - factor).add_(mean.to(self.running_mean.dtype), alpha=factor)
        self.running_var.mul_(1 - factor).add_(unbiased.to(self.running_var.dtype), alpha=factor)


def convert_batchnorm(
    module: nn.Module, process_group: Any, binding: BatchNormBinding = UNBOUND
) -> nn.Module:
    """Replace every BatchNorm layer of ``module`` by a :class:`HeteroBatchNorm` (in place).

    Parameters and running statistics are carried over. Layers whose training statistics
    depend on how the batch is split and that cannot be made exact are refused by name.

    Args:
        module: The model.
        process_group: Group over which statistics are reduced.
        binding: What the layers need from the training step (default: weights 1/world,
            nothing around the exchanges).

    Returns:
        The module, or its replacement if it is itself a BatchNorm layer.

    Raises:
        ModelPreparationError: For lazy BatchNorm layers and InstanceNorm layers that track
            running statistics (both named in the message).
    """
    return _convert(module, process_group, binding, "model")


def _convert(
    module: nn.Module, process_group: Any, binding: BatchNormBinding, path: str
) -> nn.Module:
    _refuse_unconvertible(module, path)
    if isinstance(module, GhostBatchNorm):
        raise ModelPreparationError(
            f"Layer '{path}' is already a GhostBatchNorm: convert the model's plain BatchNorm "
            "layers once, to one mode (batch.batchnorm)."
        )
    if isinstance(module, _BatchNorm) and not isinstance(module, HeteroBatchNorm):
        converted = _carry_over(module, HeteroBatchNorm(module.num_features, **_arguments(module)))
        assert isinstance(converted, HeteroBatchNorm)
        converted.process_group = process_group
        converted.binding = binding
        return converted
    if isinstance(module, HeteroBatchNorm):
        module.process_group = process_group
        module.binding = binding
        return module
    for name, child in module.named_children():
        replaced = _convert(child, process_group, binding, f"{path}.{name}")
        if replaced is not child:
            module.add_module(name, replaced)
    return module


def set_batchnorm_sync(module: nn.Module, enabled: bool) -> None:
    """Switch global-statistics synchronisation of every HeteroBatchNorm on or off, and the
    running-statistics accumulation of every GhostBatchNorm (off: probes, whose forwards are
    not steps)."""
    for layer in module.modules():
        if isinstance(layer, (HeteroBatchNorm, GhostBatchNorm)):
            layer.sync_enabled = enabled


def ghost_groups(count: int, ghost_size: int) -> tuple[int, int]:
    """How ``count`` samples form ghost groups: ``(groups, size of the last group)``.

    Contiguous groups of ``ghost_size`` from the first sample; a remainder of fewer than
    ``ghost_size`` samples joins the last group (which then holds up to ``2 * ghost_size - 1``),
    and fewer than ``ghost_size`` samples form one group. The same rule cuts a global step and
    each slice of it: a slice holding whole groups (the remainder only on the last rank, which
    the carving guarantees) is grouped exactly as the global step is.
    """
    groups = max(count // ghost_size, 1)
    return groups, count - (groups - 1) * ghost_size


def _accumulator(input: torch.Tensor) -> torch.dtype:
    """The dtype sums over a group accumulate in: float64 for float64, else float32 (a float16
    sum of ~1e5 squares would overflow)."""
    return torch.float64 if input.dtype == torch.float64 else torch.float32


class _GhostNormFunction(torch.autograd.Function):
    """Equal contiguous groups normalised by their own statistics, in one vectorised pass.

    ``input`` is the view ``[groups, size, C, *S]`` of a batch; statistics reduce over
    ``(size, *S)`` per (group, channel). The output has the batch's shape ``[groups * size, C,
    *S]`` and is no view (``ReLU(inplace=True)`` on a view of it would cost a copy in backward).

    Few passes over the activation, each a vectorised kernel. Forward: the rows' sums (a first
    mean), ``centred = x - shift`` (``shift``: that mean in the input's dtype), the rows' sums
    and sums of squares of ``centred`` (one fused pass), and the output as one per-row affine
    map of ``centred``. Backward: the rows' sums of ``dy`` and ``dy * centred`` (one fused
    pass) and the input gradient in two. The fused passes are torch's own CPU BatchNorm
    kernels run with one "channel" per row (:func:`_row_sums`, :func:`_affine`); rows are
    summed over each group's samples in float64. ``centred`` is saved in place of the input,
    so backward does not form ``x - mean`` again. What the narrowed shift lost against the
    float64 mean (``mean - shift``, per group and channel) is carried in float64 in the
    offsets, both ways.

    So a float32 channel far from zero keeps its precision: values are subtracted before they
    are scaled and all sums run over centred values (at channel mean 1000 and spread 1 the
    float32 input gradient errs ~1e-7 relative to float64; torch's native kernel, which scales
    ``x`` first, ~4e-5). ``python -m
    benchmarks.bn_ghost_kernel`` times it against torch's BatchNorm and against the first
    version, which formed the same quantities in about 8 passes each way.
    """

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        input: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        wide = torch.float64
        groups, size, channels = input.shape[:3]
        grouped = input.contiguous().view(groups, size, channels, -1)
        count = size * grouped.shape[-1]
        shift = grouped.sum(-1, dtype=_accumulator(input)).sum(1, dtype=wide).div_(count)
        narrow = shift.to(input.dtype)
        centred = grouped - narrow.view(groups, 1, channels, 1)
        # delta: the group mean's remainder, mean - narrow (small against the spread)
        delta, mean_square = _row_sums(centred, centred).div_(count).unbind()
        var = torch.addcmul(mean_square, delta, delta, value=-1).clamp_min_(0.0)
        mean = narrow.to(wide).add_(delta)
        inv_std = var.add(eps).rsqrt_()
        gain = inv_std if weight is None else inv_std * weight.detach().to(wide)
        offset = delta * gain if bias is None else torch.addcmul(-bias.detach(), delta, gain)
        ctx.save_for_backward(centred, weight)
        ctx.stats = (delta, inv_std, gain, count, input.shape)
        ctx.mark_non_differentiable(mean, var)
        ctx.set_materialize_grads(False)
        flat = (groups * size, *input.shape[2:])  # what the caller reshapes it to: no view
        return _affine(centred, gain, offset.neg_(), torch.Size(flat)), mean, var

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor | None, *_: Any) -> tuple[Any, ...]:
        if grad_output is None:  # the output was not used
            return None, None, None, None
        centred, weight = ctx.saved_tensors
        delta, inv_std, gain, count, input_shape = ctx.stats
        grad = grad_output.contiguous().view(centred.shape)
        sum_dy, sum_dy_centred = _row_sums(grad, centred).unbind()
        sum_dy_xhat = torch.addcmul(sum_dy_centred, delta, sum_dy, value=-1).mul_(inv_std)
        grad_weight = grad_bias = None
        if weight is not None and ctx.needs_input_grad[1]:
            grad_weight = sum_dy_xhat.sum(0).to(weight.dtype)
        if ctx.needs_input_grad[2]:
            grad_bias = sum_dy.sum(0).to(centred.dtype)
        if not ctx.needs_input_grad[0]:
            return None, grad_weight, grad_bias, None
        # dx = gain * dy + coef * (centred - delta) - gain * sum_dy / count
        coef = (gain * inv_std).mul_(sum_dy_xhat).div_(-count)
        offset = torch.addcmul(coef * delta, gain, sum_dy, value=1.0 / count).neg_()
        groups, _, channels, _ = centred.shape
        scale = gain.to(centred.dtype).view(groups, 1, channels, 1)
        grad_input = _affine(centred, coef, offset, centred.shape).addcmul_(grad, scale)
        return grad_input.view(input_shape), grad_weight, grad_bias, None


#: The dtypes torch's CPU BatchNorm kernels serve in :func:`_row_sums` and :func:`_affine`.
_NATIVE = (torch.float32, torch.float64)


@functools.lru_cache(maxsize=32)
def _unit(rows: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeros and ones of ``rows`` values: the unit statistics the kernels below run with (only
    read, so one pair per shape serves every call)."""
    return (
        torch.zeros(rows, dtype=dtype, device=device),
        torch.ones(rows, dtype=dtype, device=device),
    )


def _row_sums(values: torch.Tensor, centred: torch.Tensor) -> torch.Tensor:
    """``[2, groups, C]``: ``sum(values)``, ``sum(values * centred)`` per group and channel.

    Both ``[groups, size, C, S]``. Per row (sample and channel) in one fused pass of torch's
    BatchNorm backward kernel (its bias and weight gradients for mean 0 and inverse standard
    deviation 1), then over each group's samples in float64; other dtypes sum in float32.
    """
    groups, size, channels, _ = centred.shape
    if centred.dtype in _NATIVE:
        rows = groups * size * channels
        zeros, ones = _unit(rows, centred.dtype, centred.device)
        _, dot, total = torch.ops.aten.native_batch_norm_backward(
            values.view(1, rows, -1),
            centred.view(1, rows, -1),
            ones,  # not None: CUDA's kernel reads the weight's device (see HeteroBatchNorm)
            None,
            None,
            zeros,
            ones,
            True,
            0.0,
            [False, True, True],
        )
        per_row = torch.stack((total, dot))
    else:
        acc = _accumulator(centred)
        total = values.sum(-1, dtype=acc)
        per_row = torch.stack((total, (values.to(acc) * centred.to(acc)).sum(-1)))
    return per_row.view(2, groups, size, channels).sum(2, dtype=torch.float64)


def _affine(
    centred: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, shape: torch.Size
) -> torch.Tensor:
    """``centred * scale + offset`` with ``scale`` and ``offset`` per group and channel
    (``[groups, C]``, float64), in ``centred``'s dtype: a new tensor of those values, of
    ``shape`` (not a view: the caller's in-place ops, such as ``ReLU(inplace=True)``, then
    need no copy of it in backward).

    One vectorised pass: torch's BatchNorm inference kernel with one channel per row (mean 0,
    variance 1, eps 0: exactly ``x * weight + bias``); ``addcmul`` for other dtypes.
    """
    groups, size, channels, _ = centred.shape
    dtype = centred.dtype
    both = torch.stack((scale, offset)).to(dtype)
    output = centred.new_empty(shape)
    if dtype not in _NATIVE:
        weight, bias = both.view(2, groups, 1, channels, 1).unbind()
        torch.addcmul(bias, centred, weight, out=output.view(centred.shape))
        return output
    rows = groups * size * channels
    weight, bias = both.unsqueeze(2).expand(2, groups, size, channels).reshape(2, rows).unbind()
    zeros, ones = _unit(rows, dtype, centred.device)
    torch.ops.aten.native_batch_norm.out(
        centred.view(1, rows, -1),
        weight,
        bias,
        zeros,
        ones,
        False,
        0.0,
        0.0,
        out=output.view(1, rows, -1),
        save_mean=centred.new_empty(0),
        save_invstd=centred.new_empty(0),
    )
    return output


class GhostStatistics:
    """The running statistics of a model's GhostBatchNorm layers, updated once per step.

    During a step every bound layer adds, per channel, the sum of its groups' means and of
    their unbiased variances, and the number of groups, to a float64 accumulator (over every
    forward of the step: micro-batches included). :meth:`take` lays all layers' accumulators
    out as one flat float64 vector (a fixed order: the same on every rank); summed over the
    ranks (one all-reduce per step, see :func:`raytrain_hetero.worker.ddp.wrap_model`), it
    holds the sums over every group of the global batch, whatever the split, and
    :meth:`apply` updates every layer alike::

        running = (1 - momentum) * running + momentum * (sum of group statistics / groups)

    (``momentum=None``: the cumulative average, ``num_batches_tracked`` counting steps).
    """

    def __init__(self) -> None:
        self.layers: list[GhostBatchNorm] = []

    def register(self, layer: GhostBatchNorm) -> None:
        """Add ``layer`` (conversion order, identical on every rank)."""
        if layer.track_running_stats and all(existing is not layer for existing in self.layers):
            self.layers.append(layer)

    def take(self) -> torch.Tensor | None:
        """Every layer's step sums as one float64 vector, the accumulators emptied (None: no
        layer tracks running statistics)."""
        if not self.layers:
            return None
        parts = [layer._take_sums() for layer in self.layers]
        device = parts[0].device
        return torch.cat([part.to(device) for part in parts])

    @torch.no_grad()
    def apply(self, summed: torch.Tensor) -> None:
        """Update every layer's running statistics from the summed vector of :meth:`take`."""
        offset = 0
        for layer in self.layers:
            width = 2 * layer.num_features + 1
            layer._apply_sums(summed[offset : offset + width])
            offset += width
        if offset != summed.numel():
            raise HeteroError(
                f"GhostBatchNorm statistics of {summed.numel()} values do not match the "
                f"model's layers ({offset}): every rank must run the same model."
            )

    def reduce_and_apply(self, process_group: Any) -> None:
        """Sum :meth:`take` over ``process_group`` in one all-reduce and :meth:`apply` it
        (for loops without the count-weighted DDP hook, which does this itself)."""
        vector = self.take()
        if vector is None:
            return
        if process_group is not None and dist.get_world_size(process_group) > 1:
            staged = (
                vector.cpu() if dist.get_backend(process_group) == dist.Backend.GLOO else vector
            )
            dist.all_reduce(staged, group=process_group)
            vector = staged.to(vector.device)
        self.apply(vector)


class GhostBatchNorm(_BatchNorm):
    """Ghost BatchNorm (Hoffer et al. 2017): contiguous groups of ``ghost_size`` samples, each
    normalised by its own statistics; no exchange between ranks in forward or backward.

    Groups follow :func:`ghost_groups` over the batch the layer sees; every group is
    normalised in one vectorised pass (:class:`_GhostNormFunction`; a merged last group in a
    second one). With slices in whole groups, each group's output and gradient do not depend
    on which rank holds it, so the count-weighted update equals one device running this layer
    over the global batch. Running statistics: bound to a :class:`GhostStatistics`, the layer
    accumulates the step's group statistics, which the step's single all-reduce turns into one
    update per step on every rank; unbound (one device, or a copy), every training forward is
    one step and updates them at once. Evaluation uses the running statistics, as BatchNorm
    does.

    Args:
        num_features: Channels.
        ghost_size: Samples per group (>= 2).
        **kwargs: ``eps``, ``momentum``, ``affine``, ``track_running_stats`` as for BatchNorm.
    """

    def __init__(self, num_features: int, ghost_size: int, **kwargs: Any) -> None:
        super().__init__(num_features, **kwargs)
        if isinstance(ghost_size, bool) or not isinstance(ghost_size, int) or ghost_size < 2:
            raise ModelPreparationError(
                f"ghost_size must be an integer >= 2 samples per group, got {ghost_size!r}."
            )
        self.ghost_size = ghost_size
        self.statistics: GhostStatistics | None = None
        self.sync_enabled = True
        self._sums: torch.Tensor | None = None

    def __getstate__(self) -> dict[str, Any]:
        # A copy (deepcopy, an EMA model, torch.save) is unbound: it never holds back statistics
        # for a step it does not take part in; each of its training forwards is one step.
        return {**self.__dict__, "statistics": None, "_sums": None}

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, ghost_size={self.ghost_size}"

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if not (self.training or not self.track_running_stats):
            return super().forward(input)  # running statistics, as BatchNorm
        count = input.shape[0]
        groups, last = ghost_groups(count, self.ghost_size)
        per_channel = math.prod(input.shape[2:])
        if count == 0 or last * per_channel < 2:
            raise ValueError(
                f"GhostBatchNorm needs more than 1 value per channel in each group; got "
                f"{count} samples of {per_channel} values per channel (ghost_size "
                f"{self.ghost_size})."
            )
        pieces: list[tuple[torch.Tensor, int]] = [(input, groups)]  # whole groups: one piece
        if last != self.ghost_size:
            head = (groups - 1) * self.ghost_size
            pieces = [(input[:head], groups - 1)] if head else []
            pieces.append((input[head:], 1))  # the merged (or only) group
        outputs, means, variances = [], [], []
        for piece, piece_groups in pieces:
            grouped = piece.reshape(piece_groups, -1, *piece.shape[1:])
            out, mean, var = _GhostNormFunction.apply(grouped, self.weight, self.bias, self.eps)
            outputs.append(out)  # piece's shape already, and not a view
            means.append(mean)
            variances.append(var)
        if self.training and self.track_running_stats and self.sync_enabled:
            values = [piece.shape[0] // g * per_channel for piece, g in pieces]
            self._record(means, variances, values)
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)

    @torch.no_grad()
    def _record(
        self, means: list[torch.Tensor], variances: list[torch.Tensor], values: list[int]
    ) -> None:
        """Add this forward's group statistics to the step's sums (or apply them, unbound)."""
        groups = sum(mean.shape[0] for mean in means)
        rows = [torch.cat((m, v * (n / (n - 1))), 1) for m, v, n in zip(means, variances, values)]
        summed = (rows[0] if len(rows) == 1 else torch.cat(rows)).sum(0)
        sums = torch.cat((summed, summed.new_full((1,), groups)))
        if self.statistics is None:
            self._apply_sums(sums)
        elif self._sums is None:
            self._sums = sums
        else:
            self._sums += sums

    def _take_sums(self) -> torch.Tensor:
        sums = self._sums
        self._sums = None
        if sums is None:
            return torch.zeros(
                2 * self.num_features + 1, dtype=torch.float64, device=self.running_mean.device
            )
        return sums

    @torch.no_grad()
    def _apply_sums(self, sums: torch.Tensor) -> None:
        """One running-statistics update from summed group statistics (none if no group)."""
        channels = self.num_features
        groups = float(sums[-1])
        if groups <= 0:
            return
        self.num_batches_tracked.add_(1)
        factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else self.momentum
        mean = (sums[:channels] / groups).to(self.running_mean.device, self.running_mean.dtype)
        var = (sums[channels : 2 * channels] / groups).to(
            self.running_var.device, self.running_var.dtype
        )
        self.running_mean.mul_(1 - factor).add_(mean, alpha=factor)
        self.running_var.mul_(1 - factor).add_(var, alpha=factor)


def _refuse_unconvertible(module: nn.Module, path: str) -> None:
    """The layers no conversion can make split-invariant, refused by name."""
    if isinstance(module, _LazyNormBase) and module.has_uninitialized_params():
        raise ModelPreparationError(
            f"Layer '{path}' ({type(module).__name__}) is lazy and not yet initialised: run one "
            "forward pass (or use an explicit BatchNorm) before prepare_model."
        )
    if isinstance(module, _InstanceNorm) and module.track_running_stats:
        raise ModelPreparationError(
            f"Layer '{path}' ({type(module).__name__}) tracks running statistics averaged over "
            "per-rank batches, which uneven slices make inexact: set track_running_stats=False."
        )


def _carry_over(source: _BatchNorm, converted: _BatchNorm) -> _BatchNorm:
    """Give ``converted`` the parameters, running statistics and mode of ``source``."""
    if source.affine:
        with torch.no_grad():
            converted.weight = source.weight
            converted.bias = source.bias
    if source.track_running_stats:
        converted.running_mean = source.running_mean
        converted.running_var = source.running_var
        converted.num_batches_tracked = source.num_batches_tracked
    converted.train(source.training)
    return converted


def _arguments(module: _BatchNorm) -> dict[str, Any]:
    return {
        "eps": module.eps,
        "momentum": module.momentum,
        "affine": module.affine,
        "track_running_stats": module.track_running_stats,
    }


def convert_ghost_batchnorm(
    module: nn.Module, ghost_size: int, statistics: GhostStatistics | None = None
) -> nn.Module:
    """Replace every BatchNorm layer of ``module`` by a :class:`GhostBatchNorm` (in place).

    Parameters and running statistics are carried over; the refusals are
    :func:`convert_batchnorm`'s (lazy layers, InstanceNorm tracking running statistics), and
    a model already converted to exact :class:`HeteroBatchNorm` is refused too.

    Args:
        module: The model.
        ghost_size: Samples per group.
        statistics: The accumulator of the step's running statistics (None: every training
            forward updates them at once, the one-device rule).

    Returns:
        The module, or its replacement if it is itself a BatchNorm layer.

    Raises:
        ModelPreparationError: For the refused layers (named in the message).
    """
    return _convert_ghost(module, ghost_size, statistics, "model")


def _convert_ghost(
    module: nn.Module, ghost_size: int, statistics: GhostStatistics | None, path: str
) -> nn.Module:
    _refuse_unconvertible(module, path)
    if isinstance(module, HeteroBatchNorm):
        raise ModelPreparationError(
            f"Layer '{path}' is already an exact HeteroBatchNorm: convert the model's plain "
            "BatchNorm layers once, to one mode (batch.batchnorm)."
        )
    if isinstance(module, GhostBatchNorm):
        if module.ghost_size != ghost_size:
            raise ModelPreparationError(
                f"Layer '{path}' is a GhostBatchNorm of ghost_size {module.ghost_size}, but "
                f"the run's ghost_size is {ghost_size}: use one group size."
            )
        module.statistics = statistics
        if statistics is not None:
            statistics.register(module)
        return module
    if isinstance(module, _BatchNorm):
        converted = _carry_over(
            module, GhostBatchNorm(module.num_features, ghost_size, **_arguments(module))
        )
        assert isinstance(converted, GhostBatchNorm)
        converted.statistics = statistics
        if statistics is not None:
            statistics.register(converted)
        return converted
    for name, child in module.named_children():
        replaced = _convert_ghost(child, ghost_size, statistics, f"{path}.{name}")
        if replaced is not child:
            module.add_module(name, replaced)
    return module
