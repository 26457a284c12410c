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
:class:`~raytrain_hetero.worker.sync.batchnorm.binding.BatchNormBinding` passed in by
:func:`~raytrain_hetero.worker.sync.batchnorm.convert.convert_batchnorm`. The ghost mode is
:mod:`raytrain_hetero.worker.sync.batchnorm.ghost`.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.modules.batchnorm import _BatchNorm

from raytrain_hetero.worker.sync.batchnorm.binding import UNBOUND, BatchNormBinding
from raytrain_hetero.worker.sync.batchnorm.kernels import unit_rows

logger = logging.getLogger(__name__)

__all__ = ["HeteroBatchNorm"]


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
            unit_weight = unit_rows(channels, acc, input.device)[1]
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
