"""Worker loop of ``python -m benchmarks conv-split``: four contenders in one worker group.

Runs inside the Ray Train workers a :class:`~raytrain_hetero.driver.trainer.HeteroTrainer`
starts (one torch thread each; EMULATED speeds through the one
:class:`~raytrain_hetero.worker.measure.emulation.SlowdownEmulator`, on process CPU time). For each
batch size, four contenders start from the same weights and train on the same batches for
the same number of steps, in alternating order (A B C D, then D C B A, ...):

* ``alone``: the fastest worker computes the whole model on the whole batch; the others wait.
* ``equal``: conv1 and conv2 split by output channels in equal blocks over every worker.
* ``proportional``: the same, blocks sized by each worker's probed per-kernel cost.
* ``data``: data parallelism with proportional slices: each worker its slice of the batch
  (raytrain_hetero's makespan allocation fed by each worker's probed per-sample cost), loss
  weighted by slice / batch, one gradient all-reduce (SUM): the update one device makes.

A step is timed from a barrier (all workers start together) to the end of the optimizer step
on the slowest worker (MAX over workers); the conv layers' share is timed on each worker as
the conv forward (to the head's input) plus the conv backward (from the gradient reaching the
head's input to the end of backward), MAX over workers.

Traffic: the bytes each collective moves are counted from the tensor shapes (a ring model
for all-reduce: ``2 (R - 1) / R`` of the buffer per rank; the gather broadcasts the rank's
block, at its own size, to each other rank). The bandwidth sweep adds an EMULATED link: after each
collective the worker sleeps ``delay x bytes it sent``, through the split layers'
:class:`~raytrain_hetero.parallel.conv_split.CollectiveHooks` and, for data parallelism,
around the gradient all-reduce.
"""

from __future__ import annotations

import copy
import json
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from benchmarks.mp_data import cifar_like
from benchmarks.mp_probe import probed_slices
from raytrain_hetero.core.kernel_split import split_kernels
from raytrain_hetero.parallel.conv_split import CollectiveHooks, split_conv_layers
from raytrain_hetero.parallel.conv_state import gather_kernel_costs, probe_kernel_cost
from raytrain_hetero.worker.measure.clock import ComputeClock
from raytrain_hetero.worker.measure.emulation import SlowdownEmulator
from raytrain_hetero.worker.runtime.registry import get_runtime
from raytrain_hetero.workloads.models import MarquesCNN, build_model

__all__ = ["conv_split_bench_loop"]

CONTENDER_NAMES = ("alone", "equal", "proportional", "data")
_ELEMENT_BYTES = 4  # float32


class _Worker:
    """This worker's identity, emulation and clock (injected into every contender)."""

    def __init__(self, factor: float) -> None:
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        self.factor = factor
        factors: list[Any] = [None] * self.world
        dist.all_gather_object(factors, factor)
        self.factors = [float(f) for f in factors]
        self.fastest = min(range(self.world), key=lambda r: (self.factors[r], r))
        self.emulator = SlowdownEmulator(ComputeClock("cpu"))

    def point(self) -> float:
        """Stretch this worker's compute since the last mark (EMULATION); the wall time."""
        self.emulator.stretch(self.factor)
        return time.perf_counter()


class _LayerLink:
    """Counts one split layer's collective bytes and EMULATES a slow link after each one."""

    def __init__(self, layer: nn.Module, worker: _Worker) -> None:
        self.layer = layer
        self.worker = worker
        self.delay_s_per_byte = 0.0
        self.bytes_sent = 0
        self.phase = "forward"
        self.input_shape: tuple[int, ...] = ()
        layer.register_forward_pre_hook(self._before_forward)
        layer.hooks = CollectiveHooks(before=self.before, after=self.after)

    def _before_forward(self, module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
        self.input_shape = tuple(args[0].shape)
        self.phase = "forward"

    def gather_bytes(self) -> int:
        """Bytes this rank sends in the forward gather (its exact block to R - 1 ranks)."""
        sent, _ = self.layer.gather_bytes(self.input_shape, _ELEMENT_BYTES)
        return sent

    def reduce_bytes(self) -> int:
        """Bytes this rank sends in the backward input-gradient all-reduce (ring model)."""
        ranks = len(self.layer.kernels_per_rank)
        elements = 1
        for size in self.input_shape:
            elements *= size
        return int(2 * (ranks - 1) / ranks * elements * _ELEMENT_BYTES)

    def before(self) -> None:
        self.worker.emulator.stretch(self.worker.factor)

    def after(self) -> None:
        nbytes = self.gather_bytes() if self.phase == "forward" else self.reduce_bytes()
        self.phase = "backward"
        self.bytes_sent += nbytes
        if self.delay_s_per_byte > 0:
            time.sleep(self.delay_s_per_byte * nbytes)
        self.worker.emulator.mark()  # the wait is not compute


@dataclass
class _Contender:
    name: str
    model: MarquesCNN
    optimizer: torch.optim.Optimizer
    kernels: dict[str, list[int]] = field(default_factory=dict)
    slices: list[int] = field(default_factory=list)
    links: list[_LayerLink] = field(default_factory=list)
    delay_s_per_byte: float = 0.0
    steps_done: int = 0
    step_s: list[float] = field(default_factory=list)
    conv_s: list[float] = field(default_factory=list)
    bytes_per_step: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)

    def set_delay(self, delay: float) -> None:
        self.delay_s_per_byte = delay
        for link in self.links:
            link.delay_s_per_byte = delay


def _optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


def _probe_batch(batch: int) -> int:
    # Per-kernel cost is linear in the batch: a small probe batch gives the same proportions.
    return min(batch, 32)


def _kernel_splits(base: MarquesCNN, batch: int, worker: _Worker) -> dict[str, list[int]]:
    """Speed-proportional kernels per rank of each split layer, from every rank's probe."""
    shapes = {
        "conv1": (_probe_batch(batch), base.conv1.in_channels, 32, 32),
        "conv2": (_probe_batch(batch), base.conv2.in_channels, 16, 16),
    }
    splits = {}
    for name in MarquesCNN.SPLIT_LAYERS:
        layer = getattr(base, name)
        cost = probe_kernel_cost(layer, shapes[name], slowdown=worker.factor, repeats=2)
        costs = gather_kernel_costs(cost)
        splits[name] = list(
            split_kernels(layer.out_channels, [c.beta for c in costs], [c.alpha for c in costs])
        )
    return splits


def _build(
    name: str,
    base: MarquesCNN,
    worker: _Worker,
    lr: float,
    kernels: dict[str, list[int]] | None = None,
    slices: list[int] | None = None,
) -> _Contender:
    model = copy.deepcopy(base)
    contender = _Contender(name=name, model=model, optimizer=_optimizer(model, lr))
    if kernels is not None:
        split_conv_layers(model, list(MarquesCNN.SPLIT_LAYERS), kernels_per_rank=kernels)
        contender.optimizer = _optimizer(model, lr)
        contender.kernels = {k: list(v) for k, v in kernels.items()}
        contender.links = [_LayerLink(getattr(model, n), worker) for n in MarquesCNN.SPLIT_LAYERS]
    if slices is not None:
        contender.slices = list(slices)
    return contender


def _grad_allreduce(contender: _Contender, worker: _Worker) -> int:
    """Sum the (already weighted) gradients over the workers; returns bytes this rank sent."""
    params = [p for p in contender.model.parameters() if p.grad is not None]
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    nbytes = int(2 * (worker.world - 1) / worker.world * flat.numel() * _ELEMENT_BYTES)
    worker.emulator.stretch(worker.factor)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    if contender.delay_s_per_byte > 0:
        time.sleep(contender.delay_s_per_byte * nbytes)
    worker.emulator.mark()
    offset = 0
    for p in params:
        count = p.grad.numel()
        p.grad.copy_(flat[offset : offset + count].view_as(p.grad))
        offset += count
    return nbytes


def _step(
    contender: _Contender, x: torch.Tensor, y: torch.Tensor, worker: _Worker, record: bool
) -> None:
    """One timed training step of ``contender`` on the global batch ``x, y`` (collective)."""
    for link in contender.links:
        link.bytes_sent = 0
    dist.barrier()
    worker.emulator.mark()
    t0 = time.perf_counter()
    step_s = conv_s = 0.0
    sent = 0
    loss_value = 0.0
    computes = contender.name != "alone" or worker.rank == worker.fastest
    if computes:
        weight = 1.0
        inputs, targets = x, y
        if contender.slices:
            start = sum(contender.slices[: worker.rank])
            size = contender.slices[worker.rank]
            inputs, targets = x[start : start + size], y[start : start + size]
            weight = size / x.shape[0]
        feats = contender.model.features(inputs)
        t1 = worker.point()
        marks: dict[str, float] = {}

        def grad_reached_head_input(grad: torch.Tensor) -> None:
            marks["t2"] = worker.point()

        feats.register_hook(grad_reached_head_input)
        loss = F.cross_entropy(contender.model.head(feats), targets) * weight
        contender.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        t3 = worker.point()
        if contender.slices:
            sent += _grad_allreduce(contender, worker)
        contender.optimizer.step()
        t4 = worker.point()
        step_s, conv_s = t4 - t0, (t1 - t0) + (t3 - marks["t2"])
        loss_value = float(loss.detach()) / weight
        sent += sum(link.bytes_sent for link in contender.links)
    figures = torch.tensor([step_s, conv_s], dtype=torch.float64)
    dist.all_reduce(figures, op=dist.ReduceOp.MAX)
    traffic = torch.tensor([sent], dtype=torch.int64)
    dist.all_reduce(traffic, op=dist.ReduceOp.SUM)
    contender.steps_done += 1
    if record:
        contender.step_s.append(float(figures[0]))
        contender.conv_s.append(float(figures[1]))
        contender.bytes_per_step.append(int(traffic[0]))
        contender.losses.append(loss_value)


def _alternate(
    contenders: list[_Contender],
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    rounds: int,
    worker: _Worker,
) -> None:
    """A B C D, D C B A, ...: each contender runs the same batches, one warm-up step first."""
    per_round = len(batches) // rounds
    for c in contenders:  # warm-up (uncounted): allocations, kernel choice
        _step(c, *batches[0], worker, record=False)
        c.steps_done = 0
    for r in range(rounds):
        order = contenders if r % 2 == 0 else list(reversed(contenders))
        for c in order:
            for k in range(per_round):
                _step(c, *batches[r * per_round + k], worker, record=True)


def _summary(c: _Contender) -> dict[str, Any]:
    return {
        "contender": c.name,
        "kernels": c.kernels,
        "slices": c.slices,
        "delay_ms_per_mb": round(c.delay_s_per_byte * 1e9, 6),
        "step_s": statistics.median(c.step_s),
        "conv_s": statistics.median(c.conv_s),
        "step_s_all": c.step_s,
        "conv_s_all": c.conv_s,
        "bytes_per_step": int(statistics.median(c.bytes_per_step)),
        "losses": c.losses,
    }


def _batches(
    x: torch.Tensor, y: torch.Tensor, batch: int, count: int, seed: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    order = torch.cat([torch.randperm(x.shape[0], generator=g) for _ in range(count)])
    return [
        (x[order[i * batch : (i + 1) * batch]], y[order[i * batch : (i + 1) * batch]])
        for i in range(count)
    ]


def conv_split_bench_loop(config: dict[str, Any]) -> None:
    """Measure every contender at every batch size, then the bandwidth sweep; rank 0 writes
    ``conv_split.json`` into ``config["out"]``."""
    torch.set_num_threads(1)
    runtime = get_runtime()
    worker = _Worker(float(runtime.slowdowns.factor_at(-1)))
    seed = int(config.get("seed", 0))
    torch.manual_seed(seed)
    base = build_model("marques_cnn", in_channels=3, num_classes=10, width=int(config["width"]))
    assert isinstance(base, MarquesCNN)
    x, y = cifar_like(int(config["samples"]), seed)
    steps, rounds, lr = int(config["steps"]), int(config["rounds"]), float(config["lr"])
    measured = []
    for batch in config["batches"]:
        batches = _batches(x, y, int(batch), steps * rounds, seed + int(batch))
        kernels = _kernel_splits(base, int(batch), worker)
        equal = {
            n: list(split_kernels(getattr(base, n).out_channels, [1.0] * worker.world))
            for n in MarquesCNN.SPLIT_LAYERS
        }
        slices = probed_slices(base, x, int(batch), worker.factor)
        contenders = [
            _build("alone", base, worker, lr),
            _build("equal", base, worker, lr, kernels=equal),
            _build("proportional", base, worker, lr, kernels=kernels),
            _build("data", base, worker, lr, slices=slices),
        ]
        contenders = [c for c in contenders if c.name in config["contenders"]]
        _alternate(contenders, batches, rounds, worker)
        measured.append({"batch": int(batch), "contenders": [_summary(c) for c in contenders]})
    sweep = []
    sweep_batch = config.get("sweep_batch")
    if sweep_batch and config.get("delays_ms_per_mb"):
        batch = int(sweep_batch)
        batches = _batches(x, y, batch, steps * rounds, seed + 7 * batch)
        kernels = _kernel_splits(base, batch, worker)
        slices = probed_slices(base, x, batch, worker.factor)
        for delay in config["delays_ms_per_mb"]:
            pair = [
                _build("proportional", base, worker, lr, kernels=kernels),
                _build("data", base, worker, lr, slices=slices),
            ]
            for c in pair:
                c.set_delay(float(delay) * 1e-9)  # ms per MB -> s per byte
            _alternate(pair, batches, rounds, worker)
            sweep.append({"batch": batch, "contenders": [_summary(c) for c in pair]})
    if worker.rank == 0:
        out = Path(config["out"])
        out.mkdir(parents=True, exist_ok=True)
        (out / "conv_split.json").write_text(
            json.dumps(
                {
                    "factors": worker.factors,
                    "fastest": worker.fastest,
                    "width": int(config["width"]),
                    "measured": measured,
                    "sweep": sweep,
                }
            )
        )
