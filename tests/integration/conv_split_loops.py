"""Conv-split train loop run on Ray workers by test_conv_split.py (importable by reference).

Every rank of the split group reads the SAME carved global batch (the group is one
data-parallel replica: the carving's step bounds, not a per-rank slice), computes its share of
each split layer's kernels, and the replicated layers stay identical without any all-reduce.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from raytrain_hetero.core.carving import EpochCarver
from raytrain_hetero.core.kernel_split import proposed_resplit
from raytrain_hetero.parallel.conv_split import (
    CollectiveHooks,
    check_replicas_identical,
    split_conv_layers,
)
from raytrain_hetero.parallel.conv_state import (
    full_state_dict,
    gather_kernel_costs,
    probe_kernel_cost,
    resplit,
)
from raytrain_hetero.worker.measure.clock import ComputeClock
from raytrain_hetero.worker.measure.emulation import SlowdownEmulator
from raytrain_hetero.worker.runtime.registry import get_runtime

SPLIT_LAYERS = ("conv1", "conv2")


class SmallCnn(torch.nn.Module):
    """conv 3->16, BatchNorm, conv 16->48, pooling, linear head: small Marques-style CNN.

    Large enough (tens of MFLOP per conv) that probe timings stand above timer noise."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(16)
        self.conv2 = torch.nn.Conv2d(16, 48, 3, padding=1)
        self.head = torch.nn.Linear(48, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.relu(self.conv2(x))
        return self.head(F.adaptive_avg_pool2d(x, 1).flatten(1))


def build_model(dtype: torch.dtype) -> SmallCnn:
    torch.manual_seed(0)
    return SmallCnn().to(dtype)


def make_images(size: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(size, 3, 32, 32, generator=g, dtype=torch.float64).to(dtype)
    y = torch.randint(0, 4, (size,), generator=g)
    return x, y


def train_one_device(
    model: torch.nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    carver: EpochCarver,
    epochs: int,
    *,
    lr: float,
    momentum: float,
) -> dict[str, torch.Tensor]:
    """The reference: one device trained on the same carved global batches, epoch by epoch."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    for epoch in range(epochs):
        permutation = torch.from_numpy(carver.permutation(epoch))
        for k in range(carver.steps_per_epoch):
            lo, hi = carver.step_bounds(k)
            ids = permutation[lo:hi]
            loss = F.cross_entropy(model(x[ids]), y[ids])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return dict(model.state_dict())


def _probe_costs(model: torch.nn.Module, batch: int, slowdown: float) -> dict:
    """Every rank's per-kernel cost model of each split layer (EMULATION applied)."""
    shapes = {"conv1": (batch, 3, 32, 32), "conv2": (batch, 16, 16, 16)}
    probes = {}
    for name in SPLIT_LAYERS:
        layer = getattr(model, name)
        plain = torch.nn.Conv2d(
            layer.in_channels, layer.out_channels, layer.kernel_size, padding=layer.padding
        ).to(layer.weight.dtype)
        cost = probe_kernel_cost(plain, shapes[name], slowdown=slowdown, repeats=5)
        probes[name] = gather_kernel_costs(cost)
    return probes


def conv_split_loop(config: dict) -> None:
    """Probe, split by measured per-kernel cost, train on whole batches, re-probe at each
    epoch start and re-split when it pays (hysteresis); rank 0 saves results."""
    torch.set_num_threads(1)
    dtype = getattr(torch, config["dtype"])
    runtime = get_runtime()
    x, y = make_images(config["size"], dtype)
    model = build_model(dtype)
    carver = EpochCarver(config["size"], config["batch"], seed=0, min_step_size=1)
    step = 0

    # Per-kernel costs of each layer on this worker (EMULATION through the one emulator).
    costs = _probe_costs(model, config["batch"], runtime.slowdowns.factor_at(step))
    # The split layers stretch this rank's compute before each collective, as a slower
    # device would reach it later.
    emulator = SlowdownEmulator(ComputeClock("cpu"))

    def before_collective() -> None:
        emulator.stretch(runtime.slowdowns.factor_at(step))

    def after_collective() -> None:
        emulator.mark()

    hooks = CollectiveHooks(before=before_collective, after=after_collective)
    splits = split_conv_layers(model, list(SPLIT_LAYERS), costs=costs, hooks=hooks)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    spreads = []
    resplits = []
    for epoch in range(config["epochs"]):
        if epoch > 0:  # live re-split: fresh measurements, the scheduler's hysteresis
            fresh = _probe_costs(model, config["batch"], runtime.slowdowns.factor_at(step))
            moves = {}
            for name, layer_costs in fresh.items():
                proposal = proposed_resplit(
                    getattr(model, name).kernels_per_rank,
                    [c.beta for c in layer_costs],
                    fixed_costs=[c.alpha for c in layer_costs],
                    min_gain=config["min_gain"],
                )
                if proposal is not None:
                    moves[name] = proposal
            resplit(model, optimizer, moves)
            resplits.append({"step": step, **{k: list(v) for k, v in moves.items()}})
        permutation = torch.from_numpy(carver.permutation(epoch))
        for k in range(carver.steps_per_epoch):
            lo, hi = carver.step_bounds(k)
            ids = permutation[lo:hi]  # the whole global batch, the same on every rank
            emulator.mark()
            loss = F.cross_entropy(model(x[ids]), y[ids])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            spreads.append(check_replicas_identical(model))
            step += 1
    state = full_state_dict(model)
    if dist.get_rank() == 0:
        out = Path(config["out"])
        torch.save(state, out / "model.pt")
        summary = {
            "splits": {k: list(v) for k, v in splits.items()},
            "betas": {k: [c.beta for c in v] for k, v in costs.items()},
            "full_layer_s": {k: [c.time(48) for c in v] for k, v in costs.items()},
            "spreads": spreads,
            "resplits": resplits,
        }
        (out / "summary.json").write_text(json.dumps(summary))
