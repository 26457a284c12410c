"""The data-parallel contender's slices in the model-parallel benches (one probe for both)."""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from raytrain_hetero.core.allocation import CostModel, allocate, fit_cost_model
from raytrain_hetero.worker.measure.clock import ComputeClock
from raytrain_hetero.worker.measure.timing import ProbeTimer

__all__ = ["probed_slices"]

PROBE_SIZES = (4, 16)


def probed_slices(
    model: nn.Module, x: torch.Tensor, batch: int, factor: float, repeats: int = 3
) -> list[int]:
    """Slices of ``batch`` from every rank's probed per-sample cost; a collective.

    Each rank times forward + backward of a copy of ``model`` at two batch sizes with the
    library's :class:`~raytrain_hetero.worker.measure.timing.ProbeTimer` (fastest of ``repeats``; its
    compute stretched by ``factor``, EMULATION, without sleeping), fits the affine cost model,
    and raytrain_hetero's allocation carves the batch from all ranks' models.
    """
    probe = copy.deepcopy(model)
    timer = ProbeTimer(ComputeClock(x.device), slowdown=factor)
    calls = [lambda size=size: probe(x[:size]).sum().backward() for size in PROBE_SIZES]
    timings = timer.run(calls, repeats=repeats, warmup=0)
    mine = fit_cost_model(PROBE_SIZES, [timing.best for timing in timings])
    rows: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(rows, (mine.alpha, mine.beta))
    return list(allocate(batch, [CostModel(alpha=float(a), beta=float(b)) for a, b in rows]))
