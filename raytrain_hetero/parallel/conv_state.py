"""State of a conv-split model: full checkpoints, re-splitting, and per-kernel cost probes.

Checkpoints (model and optimizer) hold the unsplit model, so they load into any split or the
plain model. :func:`resplit` moves kernels' weights and optimizer state between ranks, keeping
the Parameter objects (resizing ``.data``) so the optimizer's param groups stay valid.
:func:`probe_kernel_cost` times a layer's per-kernel cost. Every function touching a split
layer's parameters is a collective over its group (same arguments, same order).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from raytrain_hetero.core.allocation import CostModel, fit_cost_model
from raytrain_hetero.errors import ModelParallelError
from raytrain_hetero.parallel.conv_split import SplitConv2d, all_gather_blocks, split_layers
from raytrain_hetero.worker.measure.clock import ComputeClock
from raytrain_hetero.worker.measure.timing import ProbeTimer

__all__ = [
    "full_optimizer_state_dict",
    "full_state_dict",
    "gather_kernel_costs",
    "load_full_optimizer_state_dict",
    "load_full_state_dict",
    "probe_kernel_cost",
    "resplit",
]


def _split_params(model: nn.Module) -> list[tuple[str, SplitConv2d, nn.Parameter]]:
    """(state-dict key, layer, parameter) of every split parameter, in model order."""
    found = []
    for name, layer in split_layers(model):
        for attr in ("weight", "bias"):
            param = getattr(layer, attr)
            if param is not None:
                found.append((f"{name}.{attr}" if name else attr, layer, param))
    return found


def _gather(layer: SplitConv2d, block: torch.Tensor, sizes: Sequence[int] = ()) -> torch.Tensor:
    """The full tensor (all output channels along dim 0) from every rank's block, the blocks
    sized by ``sizes`` (default: the layer's current split)."""
    return all_gather_blocks(block.detach(), sizes or layer.kernels_per_rank, 0, layer.group)


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The unsplit model's state_dict: split layers' blocks gathered (a collective).

    Loadable into the plain model with ``load_state_dict``.
    """
    state = dict(model.state_dict())
    for key, layer, param in _split_params(model):
        state[key] = _gather(layer, param).clone()
    return state


def load_full_state_dict(
    model: nn.Module, state: Mapping[str, torch.Tensor], *, strict: bool = True
) -> None:
    """Load an unsplit state_dict into a split model: each rank takes its own block.

    Not a collective (every rank holds the full state).

    Raises:
        ModelParallelError: If a split layer's tensor in ``state`` has the wrong width.
    """
    local = dict(state)
    for key, layer, _ in _split_params(model):
        if key not in local:
            continue  # load_state_dict reports missing keys when strict
        full = local[key]
        if full.shape[0] != layer.out_channels:
            raise ModelParallelError(
                f"checkpoint tensor {key!r} has {full.shape[0]} output channels, the layer "
                f"{layer.out_channels}; the checkpoint is of a different model"
            )
        local[key] = full[layer.block]
    model.load_state_dict(local, strict=strict)


def _per_kernel_state(optimizer: torch.optim.Optimizer, param: nn.Parameter) -> list[str]:
    """Names of the optimizer state entries of ``param`` shaped like it (sorted: same order on
    every rank); scalars such as Adam's ``step`` are the same on every rank and stay."""
    state = optimizer.state.get(param, {})
    return sorted(
        k for k, v in state.items() if isinstance(v, torch.Tensor) and v.shape == param.shape
    )


def full_optimizer_state_dict(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state_dict as the plain model's optimizer would hold it (a collective).

    The split model keeps the plain model's parameter order, so parameter indices match.
    """
    state = optimizer.state_dict()
    # state_dict() shares each parameter's state dict with the live optimizer: copy them, so
    # writing the gathered tensors below leaves the optimizer's own (local) state untouched.
    state["state"] = {index: dict(entry) for index, entry in state["state"].items()}
    index_of = {
        id(p): i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])
    }
    for _, layer, param in _split_params(model):
        index = index_of.get(id(param))
        if index is None:
            continue
        for name in _per_kernel_state(optimizer, param):
            state["state"][index][name] = _gather(layer, optimizer.state[param][name]).clone()
    return state


def load_full_optimizer_state_dict(
    model: nn.Module, optimizer: torch.optim.Optimizer, state: Mapping[str, Any]
) -> None:
    """Load an unsplit optimizer state_dict into a split model's optimizer (each rank its block)."""
    local = copy.deepcopy(dict(state))
    index_of = {
        id(p): i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])
    }
    for _, layer, param in _split_params(model):
        entry = local["state"].get(index_of.get(id(param), -1))
        if not entry:
            continue
        for name, value in entry.items():
            if (
                isinstance(value, torch.Tensor)
                and value.dim() > 0
                and value.shape[0] == layer.out_channels
            ):
                entry[name] = value[layer.block].clone()
    optimizer.load_state_dict(local)


def _move_optimizer_entry(
    optimizer: torch.optim.Optimizer,
    param: nn.Parameter,
    moved: nn.Parameter,
    layer: SplitConv2d,
    old_sizes: Sequence[int],
) -> None:
    """Hand ``param``'s place in the optimizer to ``moved``, its per-kernel state re-sliced."""
    keys = _per_kernel_state(optimizer, param)
    entries = optimizer.state.pop(param, None)
    if entries is not None:
        for key in keys:
            entries[key] = _gather(layer, entries[key], old_sizes)[layer.block].clone()
        optimizer.state[moved] = entries
    for group in optimizer.param_groups:
        group["params"] = [moved if p is param else p for p in group["params"]]


def resplit(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None,
    new_kernels_per_rank: Mapping[str, Sequence[int]],
) -> None:
    """Move kernels between ranks: weights and per-kernel optimizer state (a collective).

    Call between steps (gradients are dropped); each changed layer's blocks are gathered in
    full and re-sliced. The layer gets NEW Parameter objects and the optimizer's groups and
    state move to them: resizing ``.data`` is not enough, as autograd caches a leaf's shape in
    its gradient accumulator, which outlives the re-split while any older graph (a ``loss``)
    is referenced. Parameter-shaped state (momentum, Adam moments) is re-sliced; scalars
    (Adam ``step``) stay. Anything else holding the old Parameters (EMA, DDP) must be rebuilt.
    Layers not named in ``new_kernels_per_rank`` keep their split.

    Raises:
        ModelParallelError: If a name is not a split layer or a split is invalid.
    """
    layers = dict(split_layers(model))
    for name in new_kernels_per_rank:
        if name not in layers:
            raise ModelParallelError(
                f"{name!r} is not a split layer of the model; split layers: {sorted(layers)}"
            )
    for name, layer in layers.items():
        if name not in new_kernels_per_rank:
            continue
        sizes = tuple(int(k) for k in new_kernels_per_rank[name])
        if (
            len(sizes) != len(layer.kernels_per_rank)
            or min(sizes) < 1
            or sum(sizes) != layer.out_channels
        ):
            raise ModelParallelError(
                f"new split {list(sizes)} of {name!r} must give each of the "
                f"{len(layer.kernels_per_rank)} ranks >= 1 kernel and sum to "
                f"{layer.out_channels}"
            )
        if sizes == layer.kernels_per_rank:
            continue
        old = layer.kernels_per_rank
        layer.kernels_per_rank = sizes
        for attr in ("weight", "bias"):
            param = getattr(layer, attr)
            if param is None:
                continue
            moved = nn.Parameter(
                _gather(layer, param.detach(), old)[layer.block].clone(),
                requires_grad=param.requires_grad,
            )
            if optimizer is not None:
                _move_optimizer_entry(optimizer, param, moved, layer, old)
            setattr(layer, attr, moved)


def probe_kernel_cost(
    conv: nn.Conv2d,
    input_shape: Sequence[int],
    *,
    device: torch.device | str = "cpu",
    slowdown: float = 1.0,
    kernel_counts: Sequence[int] | None = None,
    warmup: int = 1,
    repeats: int = 3,
) -> CostModel:
    """This worker's cost of ``conv`` per kernel, fitted as ``t(k) = alpha + beta * k``.

    Times forward + backward of a copy with ``k`` output channels on a random whole batch of
    ``input_shape`` for each ``k`` of ``kernel_counts`` (default: a quarter and all of the
    kernels), fastest interleaved round kept, on the one
    :class:`~raytrain_hetero.worker.measure.timing.ProbeTimer`. Not a collective; ``conv`` untouched.

    Raises:
        ModelParallelError: If the layer is not a Conv2d or a count is invalid.
    """
    if not isinstance(conv, nn.Conv2d) or isinstance(conv, SplitConv2d):
        raise ModelParallelError(f"probe_kernel_cost needs a plain nn.Conv2d, got {type(conv)}")
    counts = sorted(set(kernel_counts or (max(1, conv.out_channels // 4), conv.out_channels)))
    if len(counts) < 2 or counts[0] < 1:
        raise ModelParallelError(
            f"kernel_counts must hold >= 2 distinct counts >= 1, got {kernel_counts}"
        )
    device = torch.device(device)
    dtype = conv.weight.dtype
    timer = ProbeTimer(ComputeClock(device), slowdown=slowdown)
    inputs = torch.randn(*input_shape, device=device, dtype=dtype, requires_grad=True)
    trials = [
        nn.Conv2d(
            conv.in_channels,
            count,
            conv.kernel_size,
            stride=conv.stride,
            padding=conv.padding,
            dilation=conv.dilation,
            bias=conv.bias is not None,
            padding_mode=conv.padding_mode,
        ).to(device=device, dtype=dtype)
        for count in counts
    ]

    def drop_grads() -> None:
        inputs.grad = None
        for trial in trials:
            trial.zero_grad(set_to_none=True)

    # The fastest round per count: interference from co-located processes (caches, memory
    # bandwidth) only ever adds time.
    timings = timer.run(
        [lambda t=trial: t(inputs).sum().backward() for trial in trials],
        repeats=max(1, repeats),
        warmup=warmup,
        cleanup=drop_grads,
    )
    seconds = [t.best for t in timings]
    return fit_cost_model(counts, [max(s, 1e-9) for s in seconds])


def gather_kernel_costs(
    cost: CostModel, group: dist.ProcessGroup | None = None
) -> tuple[CostModel, ...]:
    """Every rank's per-kernel cost model of a layer, in group-rank order (a collective)."""
    mine = torch.tensor([cost.alpha, cost.beta], dtype=torch.float64)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, mine, group=group)
    return tuple(CostModel(alpha=float(t[0]), beta=float(t[1])) for t in every)
