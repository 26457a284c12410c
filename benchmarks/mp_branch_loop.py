"""Worker loop of ``python -m benchmarks branches``: branch placement vs data parallelism.

Runs inside the Ray Train workers of a :class:`~raytrain_hetero.driver.trainer.HeteroTrainer`
(one torch thread each, EMULATED speeds). Both contenders start from the same two-branch
S1+S2 fusion model (:class:`~raytrain_hetero.workloads.models.TwoBranchFusionCNN`) and train
the same epochs over the same generated batches, alternating epoch by epoch (A B, B A, ...):

* ``branches``: :class:`~raytrain_hetero.parallel.branches.BranchPipeline` over every worker
  of the group, placed by :func:`~raytrain_hetero.parallel.branch_costs.plan_branch_placement`
  from measured branch costs (2 workers: one branch each, the head on one of them; 3 workers:
  one branch each on two, the fusion head alone on the third).
* ``data``: data parallelism with proportional slices (raytrain_hetero's makespan allocation
  fed by every worker's probed per-sample cost), loss weighted by slice / batch, one gradient
  all-reduce (SUM). Its BatchNorm layers use per-slice statistics (as stock DDP does).

Figures: step time (barrier to the slowest worker's end, MAX), bytes per step (branch
placement: the pipeline's measured send counters summed over workers, beside
:func:`~raytrain_hetero.parallel.branches.predicted_branch_bytes_per_step`; data parallelism:
the ring all-reduce formula :func:`~raytrain_hetero.parallel.branches.data_parallel_bytes_per_step`),
validation accuracy after the equal epochs and inference seconds per sample.

EMULATION of the branch pipeline: the pipeline has no collective hooks, so this loop stretches
each worker's compute right where the pipeline synchronises: after every branch forward (before
its chunk is sent), after the head forward and after the head backward (before gradients are
sent back), and at the end of the step.
"""

from __future__ import annotations

import copy
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from benchmarks.mp_data import multimodal_like
from benchmarks.mp_probe import probed_slices
from raytrain_hetero.core.allocation import CostModel, allocate
from raytrain_hetero.parallel.branch_costs import plan_branch_placement
from raytrain_hetero.parallel.branches import (
    BranchPipeline,
    data_parallel_bytes_per_step,
    predicted_branch_bytes_per_step,
)
from raytrain_hetero.worker.measure.clock import ComputeClock
from raytrain_hetero.worker.measure.emulation import SlowdownEmulator
from raytrain_hetero.worker.runtime.registry import get_runtime
from raytrain_hetero.workloads.models import TwoBranchFusionCNN

__all__ = ["branches_bench_loop"]

_S1, _S2, _CLASSES = 2, 10, 7


class _Clock:
    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.emulator = SlowdownEmulator(ComputeClock("cpu"))

    def stretch(self, *_: Any) -> None:
        self.emulator.stretch(self.factor)


def _max_over_workers(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t[0])


def _sum_over_workers(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return float(t[0])


def _hook_emulation(pipe: BranchPipeline, clock: _Clock) -> None:
    for _, module in pipe.declared.branches:
        module.register_forward_hook(clock.stretch)
    pipe.declared.head.register_forward_hook(clock.stretch)
    pipe.declared.head.register_full_backward_hook(clock.stretch)


def branches_bench_loop(config: dict[str, Any]) -> None:
    """Train both contenders for ``epochs`` epochs; rank 0 writes ``branches.json``."""
    torch.set_num_threads(1)
    runtime = get_runtime()
    rank, world = dist.get_rank(), dist.get_world_size()
    factor = float(runtime.slowdowns.factor_at(-1))
    clock = _Clock(factor)
    seed, batch, width = int(config.get("seed", 0)), int(config["batch"]), int(config["width"])
    x, y = multimodal_like(int(config["train_samples"]), seed)
    vx, vy = multimodal_like(int(config["val_samples"]), seed + 1)
    torch.manual_seed(seed)
    base = TwoBranchFusionCNN(_S1, _S2, _CLASSES, width)
    dp_bytes = data_parallel_bytes_per_step(base, world)
    placement = plan_branch_placement(copy.deepcopy(base), x[:batch], slowdown=factor)
    predicted = predicted_branch_bytes_per_step(
        copy.deepcopy(base), placement, x[:batch], int(config["micro_batches"])
    )
    pipe = BranchPipeline(
        copy.deepcopy(base), placement, rank=rank, micro_batches=int(config["micro_batches"])
    )
    _hook_emulation(pipe, clock)
    lr = float(config["lr"])
    pipe_opt = torch.optim.SGD(pipe.parameters(), lr=lr, momentum=0.9)
    dp_model = copy.deepcopy(base)
    dp_opt = torch.optim.SGD(dp_model.parameters(), lr=lr, momentum=0.9)
    slices = probed_slices(base, x, batch, clock.factor)
    start, size = sum(slices[:rank]), slices[rank]
    figures: dict[str, dict[str, list[float]]] = {
        "branches": {"step_s": [], "bytes": []},
        "data": {"step_s": [], "bytes": []},
    }

    def branch_step(xb: torch.Tensor, yb: torch.Tensor) -> tuple[float, float]:
        step = pipe.train_step(xb, yb, F.cross_entropy, pipe_opt)
        clock.stretch()
        return time.perf_counter(), float(step.bytes_sent)

    def data_step(xb: torch.Tensor, yb: torch.Tensor) -> tuple[float, float]:
        loss = F.cross_entropy(dp_model(xb[start : start + size]), yb[start : start + size])
        dp_opt.zero_grad(set_to_none=True)
        (loss * (size / xb.shape[0])).backward()
        grads = [p.grad for p in dp_model.parameters() if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        clock.stretch()
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        clock.emulator.mark()
        offset = 0
        for g in grads:
            g.copy_(flat[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
        dp_opt.step()
        clock.stretch()
        return time.perf_counter(), dp_bytes / world  # this rank's share of the ring

    runs = {"branches": branch_step, "data": data_step}
    pipe.train()
    dp_model.train()
    steps = x.shape[0] // batch
    for epoch in range(int(config["epochs"])):
        order = ["branches", "data"] if epoch % 2 == 0 else ["data", "branches"]
        perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed + epoch))
        for name in order:
            for k in range(steps):
                ids = perm[k * batch : (k + 1) * batch]
                dist.barrier()
                clock.emulator.mark()
                t0 = time.perf_counter()
                end, sent = runs[name](x[ids], y[ids])
                step_s = _max_over_workers(end - t0)
                total = _sum_over_workers(sent)
                if epoch > 0 or k > 0:  # the first step of each contender warms up
                    figures[name]["step_s"].append(step_s)
                    figures[name]["bytes"].append(total)

    # Validation accuracy and inference time per sample, the whole validation set in batches.
    pipe.eval()
    dp_model.eval()
    results: dict[str, Any] = {}
    for name in ("branches", "data"):
        correct, seconds = 0.0, 0.0
        with torch.no_grad():
            for lo in range(0, vx.shape[0], batch):
                xb, yb = vx[lo : lo + batch], vy[lo : lo + batch]
                dist.barrier()
                clock.emulator.mark()
                t0 = time.perf_counter()
                if name == "branches":
                    out = pipe.predict(xb)
                    clock.stretch()
                    hits = float((out.argmax(1) == yb).sum()) if out is not None else 0.0
                else:
                    part = allocate(xb.shape[0], [CostModel(0.0, 1.0 / s) for s in slices])
                    a = sum(part[:rank])
                    out = dp_model(xb[a : a + part[rank]])
                    clock.stretch()
                    hits = float((out.argmax(1) == yb[a : a + part[rank]]).sum())
                seconds += _max_over_workers(time.perf_counter() - t0)
                correct += _sum_over_workers(hits)
        results[name] = {
            "step_s": statistics.median(figures[name]["step_s"]),
            "samples_per_s": batch / statistics.median(figures[name]["step_s"]),
            "bytes_per_step": statistics.median(figures[name]["bytes"]),
            "val_accuracy": correct / vx.shape[0],
            "inference_s_per_sample": seconds / vx.shape[0],
        }
    results["branches"]["predicted_bytes_per_step"] = predicted
    results["data"]["predicted_bytes_per_step"] = dp_bytes
    if rank == 0:
        out_dir = Path(config["out"])
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "branches.json").write_text(
            json.dumps(
                {
                    "world": world,
                    "factors": _gathered(factor),
                    "placement": {
                        "branch_ranks": [list(p) for p in placement.branch_ranks],
                        "head_rank": placement.head_rank,
                        "stage_times": list(placement.stage_times),
                    },
                    "data_slices": slices,
                    "contenders": results,
                }
            )
        )
    else:
        _gathered(factor)


def _gathered(value: float) -> list[float]:
    rows: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(rows, value)
    return [float(v) for v in rows]
