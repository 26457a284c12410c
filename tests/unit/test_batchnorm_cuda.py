"""HeteroBatchNorm and GhostBatchNorm on a CUDA device (skipped where none is visible).

CUDA's BatchNorm backward kernel reads its weight argument's device even when it forms no
input gradient; the CPU kernel does not, so the CPU suite cannot see a ``None`` weight there
("tensor does not have a device", met on a GPU rank among CPU ranks under gloo). Both layers
are compared with native BatchNorm on the same device, float64: outputs, input and parameter
gradients, running statistics.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from gloo_group import run_gloo_group

from raytrain_hetero.worker.sync.batchnorm.convert import convert_batchnorm
from raytrain_hetero.worker.sync.batchnorm.ghost import GhostBatchNorm

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CHANNELS = 3


def _native_and_input() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(12, CHANNELS, 5, 4, generator=gen, dtype=torch.float64) * 2 + 5
    dy = torch.randn(12, CHANNELS, 5, 4, generator=gen, dtype=torch.float64)
    layer = torch.nn.BatchNorm2d(CHANNELS).double()
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5, generator=gen)
        layer.bias.uniform_(-1.0, 1.0, generator=gen)
    return layer.cuda(), x.cuda(), dy.cuda()


def _exact_rank(rank: int, world_size: int) -> list[torch.Tensor]:
    native, x, dy = _native_and_input()
    converted = convert_batchnorm(torch.nn.Sequential(copy.deepcopy(native)), dist.group.WORLD)
    results = []
    for layer in (native, converted):
        inputs = x.clone().requires_grad_()
        (layer(inputs) * dy).sum().backward()
        module = layer if isinstance(layer, torch.nn.BatchNorm2d) else layer[0]
        results.append(
            torch.cat(
                [
                    inputs.grad.flatten(),
                    module.weight.grad,
                    module.bias.grad,
                    module.running_mean,
                    module.running_var,
                ]
            ).cpu()
        )
    return results


def test_exact_batchnorm_on_cuda_equals_native_batchnorm():
    """One CUDA rank of a gloo group: the exchange path, forward and backward."""
    ((native, converted),) = run_gloo_group(_exact_rank, 1).values()
    assert torch.allclose(converted, native, rtol=0, atol=1e-10)


def test_ghost_batchnorm_on_cuda_equals_native_batchnorm_per_group():
    """Groups of 4 over 12 samples, each normalised as native BatchNorm would alone."""
    native, x, dy = _native_and_input()
    ghost = GhostBatchNorm(CHANNELS, 4).double().cuda()
    with torch.no_grad():
        ghost.weight.copy_(native.weight)
        ghost.bias.copy_(native.bias)
    xs = x.clone().requires_grad_()
    (ghost(xs) * dy).sum().backward()
    xn = x.clone().requires_grad_()
    outs = [F.batch_norm(p, None, None, native.weight, native.bias, True) for p in xn.split(4)]
    (torch.cat(outs) * dy).sum().backward()
    assert torch.allclose(xs.grad, xn.grad, rtol=0, atol=1e-10)
    assert torch.allclose(ghost.weight.grad, native.weight.grad, rtol=0, atol=1e-10)
    assert torch.allclose(ghost.bias.grad, native.bias.grad, rtol=0, atol=1e-10)
