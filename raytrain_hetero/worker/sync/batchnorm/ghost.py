"""Ghost BatchNorm: contiguous groups of ``ghost_size`` samples normalised by their own statistics.

``BatchConfig.batchnorm="ghost"``: no exchange in the layers, slices planned in whole groups,
running statistics reduced once per step (:class:`GhostStatistics`, one all-reduce beside the
gradients'). docs/concepts/ghost-batchnorm.md has the design.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.modules.batchnorm import _BatchNorm

from raytrain_hetero.errors import HeteroError, ModelPreparationError
from raytrain_hetero.worker.sync.batchnorm.kernels import (
    accumulator_dtype,
    affine_rows,
    row_sums,
)

__all__ = ["GhostBatchNorm", "GhostStatistics", "ghost_groups"]


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
    kernels run with one "channel" per row (:func:`row_sums`, :func:`affine_rows`); rows are
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
        shift = grouped.sum(-1, dtype=accumulator_dtype(input)).sum(1, dtype=wide).div_(count)
        narrow = shift.to(input.dtype)
        centred = grouped - narrow.view(groups, 1, channels, 1)
        # delta: the group mean's remainder, mean - narrow (small against the spread)
        delta, mean_square = row_sums(centred, centred).div_(count).unbind()
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
        return affine_rows(centred, gain, offset.neg_(), torch.Size(flat)), mean, var

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor | None, *_: Any) -> tuple[Any, ...]:
        if grad_output is None:  # the output was not used
            return None, None, None, None
        centred, weight = ctx.saved_tensors
        delta, inv_std, gain, count, input_shape = ctx.stats
        grad = grad_output.contiguous().view(centred.shape)
        sum_dy, sum_dy_centred = row_sums(grad, centred).unbind()
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
        grad_input = affine_rows(centred, coef, offset, centred.shape).addcmul_(grad, scale)
        return grad_input.view(input_shape), grad_weight, grad_bias, None


class GhostStatistics:
    """The running statistics of a model's GhostBatchNorm layers, updated once per step.

    During a step every bound layer adds, per channel, the sum of its groups' means and of
    their unbiased variances, and the number of groups, to a float64 accumulator (over every
    forward of the step: micro-batches included). :meth:`take` lays all layers' accumulators
    out as one flat float64 vector (a fixed order: the same on every rank); summed over the
    ranks (one all-reduce per step, see :func:`raytrain_hetero.worker.sync.ddp.wrap_model`), it
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
