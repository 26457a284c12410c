"""What GhostBatchNorm's kernel costs against torch's BatchNorm, and how precise it is.

Times forward + backward on one torch thread of three BatchNorm implementations on the
BatchNorm inputs of the benchmarks' SmallCNN (width 32, 13-band 64x64 chips: ``[n, 32, 32,
32]``, ``[n, 64, 16, 16]``, ``[n, 64, 8, 8]``) at hetero2's slices (global batch 192 split
3:1 in whole groups: 144 and 48 at g=16, 128 and 64 at g=32), and of whole SmallCNN
steps (forward + backward of the model and the loss) with each of them:

- ``native``: ``nn.BatchNorm2d`` (torch's fused CPU kernel; statistics over the whole slice);
- ``first``: the first GhostBatchNorm kernel and forward wrapper (issue 35's first version,
  copied below as they were: about 8 passes over the activation each way, an output that is a
  view; the running-statistics record is today's);
- ``ghost``: :class:`~raytrain_hetero.worker.sync.batchnorm.ghost.GhostBatchNorm` as it is now.

The contenders alternate call by call in rounds (their order rotating), so a loaded machine
slows all of them alike; the ratios are medians of per-round ratios, each round's time the
median of ``--iters`` calls. Then the precision check: float32 channels at mean 1000 and
standard deviation 1 (a gradient correlated with the input, as in the unit tests), each
contender's input gradient against the same contender in float64 (``native``: torch's
BatchNorm run on each group alone, the same normalisation).

Usage: ``python -m benchmarks.bn_ghost_kernel [--ghost-size 16] [--slices 144,48]
[--rounds 9] [--iters 5] [--model-rounds 5]``
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from raytrain_hetero.worker.sync.batchnorm.convert import convert_ghost_batchnorm
from raytrain_hetero.worker.sync.batchnorm.ghost import GhostBatchNorm, ghost_groups
from raytrain_hetero.worker.sync.batchnorm.kernels import accumulator_dtype as _accumulator
from raytrain_hetero.workloads import build_model

CONTENDERS = ("native", "first", "ghost")

#: The calling thread's CPU time (torch runs on it with one thread): waiting for a core on a
#: loaded machine does not count, as it would in wall time (--wall).
_clock = time.thread_time


class _FirstGhostNormFunction(torch.autograd.Function):
    """The first GhostBatchNorm kernel (main at c4a635b), kept to measure against."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any,
        input: torch.Tensor,
        weight: torch.Tensor | None,
        bias: torch.Tensor | None,
        eps: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        wide = torch.float64
        dims = [1, *range(3, input.dim())]
        count = input.numel() // (input.shape[0] * input.shape[2])
        shape = [1, 1, input.shape[2]] + [1] * (input.dim() - 3)
        acc = _accumulator(input)
        shift = input.mean(dims, keepdim=True)
        shifted = input - shift
        shifted_sum = shifted.sum(dims, keepdim=True, dtype=acc).to(wide)
        shifted_sq = shifted.mul_(shifted).sum(dims, keepdim=True, dtype=acc).to(wide)
        del shifted
        mean = shift.to(wide) + shifted_sum / count
        var = ((shifted_sq - shifted_sum * shifted_sum / count) / count).clamp_min(0.0)
        inv_std = torch.rsqrt(var + eps)
        gain = inv_std if weight is None else inv_std * weight.detach().to(wide).view(shape)
        narrow = mean.to(input.dtype)
        offset = -(mean - narrow.to(wide)) * gain
        if bias is not None:
            offset = offset + bias.detach().to(wide).view(shape)
        output = (input - narrow).mul_(gain.to(input.dtype)).add_(offset.to(input.dtype))
        ctx.save_for_backward(input, weight)
        ctx.stats = (mean, narrow, inv_std, gain, count)
        group_mean, group_var = mean.flatten(1), var.flatten(1)
        ctx.mark_non_differentiable(group_mean, group_var)
        return output, group_mean, group_var

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_output: torch.Tensor, *_: Any) -> tuple[Any, ...]:
        input, weight = ctx.saved_tensors
        mean, narrow, inv_std, gain, count = ctx.stats
        wide = torch.float64
        dims = [1, *range(3, input.dim())]
        centred = input - narrow
        acc = _accumulator(input)
        sum_dy = grad_output.sum(dims, keepdim=True, dtype=acc).to(wide)
        sum_dy_xmu = (centred * grad_output).sum(dims, keepdim=True, dtype=acc).to(wide)
        sum_dy_xhat = (sum_dy_xmu - (mean - narrow.to(wide)) * sum_dy) * inv_std
        grad_weight = grad_bias = None
        if weight is not None and ctx.needs_input_grad[1]:
            grad_weight = sum_dy_xhat.sum([0, *dims]).to(weight.dtype)
        if ctx.needs_input_grad[2]:
            grad_bias = sum_dy.sum([0, *dims]).to(input.dtype)
        grad_input = None
        if ctx.needs_input_grad[0]:
            coef = -gain * inv_std * sum_dy_xhat / count
            offset = -gain * sum_dy / count - coef * (mean - narrow.to(wide))
            grad_input = centred.mul_(coef.to(input.dtype)).add_(offset.to(input.dtype))
            grad_input.addcmul_(grad_output, gain.to(input.dtype))
        return grad_input, grad_weight, grad_bias, None


class _FirstGhostBatchNorm(GhostBatchNorm):
    """GhostBatchNorm with the first kernel and the first forward wrapper."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if not (self.training or not self.track_running_stats):
            return super(GhostBatchNorm, self).forward(input)
        count = input.shape[0]
        groups, last = ghost_groups(count, self.ghost_size)
        per_channel = input[0, 0].numel() if count else 0
        head = (groups - 1) * self.ghost_size if last != self.ghost_size else count
        pieces: list[tuple[torch.Tensor, int]] = []
        if head:
            pieces.append((input[:head], head // self.ghost_size))
        if head < count:
            pieces.append((input[head:], 1))
        outputs, means, variances = [], [], []
        for piece, piece_groups in pieces:
            grouped = piece.reshape(piece_groups, -1, *piece.shape[1:])
            out, mean, var = _FirstGhostNormFunction.apply(
                grouped, self.weight, self.bias, self.eps
            )
            outputs.append(out.reshape(piece.shape))
            means.append(mean)
            variances.append(var)
        if self.training and self.track_running_stats and self.sync_enabled:
            values = [piece.shape[0] // g * per_channel for piece, g in pieces]
            self._record(means, variances, values)
        return outputs[0] if len(outputs) == 1 else torch.cat(outputs)


def _layer(kind: str, channels: int, ghost_size: int) -> nn.Module:
    if kind == "native":
        return nn.BatchNorm2d(channels)
    if kind == "first":
        return _FirstGhostBatchNorm(channels, ghost_size)
    return GhostBatchNorm(channels, ghost_size)


def _model(kind: str, ghost_size: int, width: int) -> nn.Module:
    torch.manual_seed(0)
    model = build_model("small_cnn", in_channels=13, num_classes=10, width=width)
    if kind == "native":
        return model
    model = convert_ghost_batchnorm(model, ghost_size)
    if kind == "first":
        for name, child in list(model.features.named_children()):
            if isinstance(child, GhostBatchNorm):
                first = _FirstGhostBatchNorm(child.num_features, ghost_size)
                first.load_state_dict(child.state_dict())
                model.features.add_module(name, first)
    return model


def _alternate(
    calls: dict[str, Callable[[], None]], rounds: int, iters: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Median ms per call of each contender, and each one's median per-round ratio to native."""
    for call in calls.values():
        call()  # kernels set up, buffers allocated: not timed
    names = list(calls)
    per_round: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        times: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(iters):
            for name in order:
                started = _clock()
                calls[name]()
                times[name].append(_clock() - started)
        for name in names:
            per_round[name].append(1000 * statistics.median(times[name]))
    medians = {name: statistics.median(per_round[name]) for name in names}
    ratios = {
        name: statistics.median(a / b for a, b in zip(per_round[name], per_round["native"]))
        for name in names
    }
    return medians, ratios


def _layer_call(layer: nn.Module, x: torch.Tensor, dy: torch.Tensor) -> Callable[[], None]:
    def call() -> None:
        layer(x).backward(dy)
        x.grad = None
        layer.zero_grad(set_to_none=True)

    return call


def _step_call(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> Callable[[], None]:
    def call() -> None:
        F.cross_entropy(model(x), y).backward()
        model.zero_grad(set_to_none=True)

    return call


def _print_row(label: str, medians: dict[str, float], ratios: dict[str, float]) -> None:
    times = "  ".join(f"{medians[name]:7.2f}" for name in CONTENDERS)
    print(
        f"{label:28s} {times}   {ratios['first']:5.2f}x  {ratios['ghost']:5.2f}x"
        f"   {ratios['ghost'] / ratios['first']:5.2f}"
    )


def _header(what: str) -> None:
    names = "  ".join(f"{name:>7s}" for name in CONTENDERS)
    print(f"{what:28s} {names}   first/n  ghost/n   ghost/first")


def _precision(ghost_size: int) -> dict[str, tuple[float, float]]:
    """Each contender's input-gradient error in float32 against itself in float64, at channel
    mean 1000 and standard deviation 1: (max |error| / max |gradient|, relative norm error)."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(48, 16, 8, 8, generator=gen, dtype=torch.float64) + 1000.0
    noise = torch.randn(48, 16, 8, 8, generator=gen, dtype=torch.float64)
    grad = (noise + 2.0 * (x - 1000.0)).float().double()
    x = x.float().double()

    def input_grad(kind: str, dtype: torch.dtype) -> torch.Tensor:
        inputs = x.to(dtype).detach().clone().requires_grad_()
        if kind == "native":  # torch's BatchNorm on each group alone
            layer = nn.BatchNorm2d(16).to(dtype)
            out = torch.cat([layer(part) for part in inputs.split(ghost_size)])
        else:
            out = _layer(kind, 16, ghost_size).to(dtype)(inputs)
        out.backward(grad.to(dtype))
        assert inputs.grad is not None
        return inputs.grad.double()

    errors = {}
    for kind in CONTENDERS:
        want, got = input_grad(kind, torch.float64), input_grad(kind, torch.float32)
        errors[kind] = (
            float((got - want).abs().max() / want.abs().max()),
            float((got - want).norm() / want.norm()),
        )
    return errors


def main(argv: list[str] | None = None) -> None:
    """Print the kernels' and the SmallCNN steps' times and ratios, then the precision."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--slices", default=None, help="default: hetero2's 3:1 split of 192 in whole groups"
    )
    parser.add_argument("--ghost-size", type=int, default=16)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--model-rounds", type=int, default=5, help="0: no SmallCNN steps")
    parser.add_argument("--wall", action="store_true", help="time wall clock, not CPU time")
    args = parser.parse_args(argv)
    global _clock
    if args.wall:
        _clock = time.perf_counter
    torch.set_num_threads(1)
    g, w = args.ghost_size, args.width
    if args.slices is None:  # hetero2: global batch 192, speeds 3:1, slices in whole groups
        fast = max(1, min(192 // g - 1, round(144 / g))) * g
        slices = [fast, 192 - fast]
    else:
        slices = [int(s) for s in args.slices.split(",")]
    shapes = [(w, 32), (2 * w, 16), (2 * w, 8)]  # SmallCNN's BatchNorm inputs at 64x64 chips
    print(
        f"torch {torch.__version__}, 1 thread; ghost_size {g}; "
        f"{'wall' if args.wall else 'thread CPU'} ms per forward + backward "
        f"(median of per-round medians), ratios to native (median of per-round ratios)"
    )
    _header("BatchNorm layer [n, C, H, W]")
    gen = torch.Generator().manual_seed(0)
    for n in slices:
        for channels, side in shapes:
            x = torch.randn(n, channels, side, side, generator=gen).requires_grad_()
            dy = torch.randn(n, channels, side, side, generator=gen)
            calls = {kind: _layer_call(_layer(kind, channels, g), x, dy) for kind in CONTENDERS}
            medians, ratios = _alternate(calls, args.rounds, args.iters)
            _print_row(f"[{n}, {channels}, {side}, {side}]", medians, ratios)
    if args.model_rounds > 0:
        _header(f"SmallCNN w{w} step, slice n")
        for n in slices:
            x = torch.randn(n, 13, 64, 64, generator=gen)
            y = torch.randint(0, 10, (n,), generator=gen)
            calls = {kind: _step_call(_model(kind, g, w), x, y) for kind in CONTENDERS}
            medians, ratios = _alternate(calls, args.model_rounds, max(1, args.iters // 2))
            _print_row(f"n={n}", medians, ratios)
    print("input gradient, float32 vs float64, channels at mean 1000, std 1 [48, 16, 8, 8]:")
    for kind, (worst, norm) in _precision(g).items():
        print(f"  {kind:7s} max |error| / max |grad| {worst:.1e}   relative norm error {norm:.1e}")


if __name__ == "__main__":
    main()
