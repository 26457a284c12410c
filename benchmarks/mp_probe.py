"""The data-parallel contender's slices in the model-parallel benches (one probe for both)."""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from raytrain_hetero.core.allocation import CostModel, allocate, fit_cost_model
from raytrain_hetero.worker.emulation import SlowdownEmulator

__all__ = ["proportional_slices"]

PROBE_SIZES = (4, 16)


def proportional_slices(
    model: nn.Module,
    x: torch.Tensor,
    batch: int,
    emulator: SlowdownEmulator,
    factor: float,
    repeats: int = 3,
) -> list[int]:
    """Slices of ``batch`` from every rank's probed per-sample cost; a collective.

    Each rank times forward + backward of a copy of ``model`` at two batch sizes (best of
    ``repeats``; its compute stretched by ``factor``, EMULATION, without sleeping), fits the
    affine cost model and raytrain_hetero's allocation carves the batch from all ranks' models.
    """
    probe = copy.deepcopy(model)
    seconds = []
    for size in PROBE_SIZES:
        best = float("inf")
        for _ in range(repeats):
            emulator.mark()
            probe(x[:size]).sum().backward()
            best = min(best, emulator.stretch(factor, sleep=False))
        seconds.append(best)
    mine = fit_cost_model(PROBE_SIZES, seconds)
    rows: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(rows, (mine.alpha, mine.beta))
    return list(allocate(batch, [CostModel(alpha=float(a), beta=float(b)) for a, b in rows]))
