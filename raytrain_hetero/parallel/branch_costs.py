"""Measuring what each branch and the head cost on each rank, and placing them from that.

Every rank, still holding the whole model, times each branch's (and the head's) forward +
backward with the one :class:`~raytrain_hetero.worker.measure.timing.ProbeTimer` (EMULATION factor
applied); the ranks exchange their rows and each solves the same placement problem
(:func:`~raytrain_hetero.core.branch_placement.place_branches`), so they agree without a
broadcast.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from raytrain_hetero.core.branch_placement import BranchPlacement, place_branches
from raytrain_hetero.errors import ModelParallelError
from raytrain_hetero.parallel.branch_model import BranchModel, branch_model_of
from raytrain_hetero.worker.measure.clock import ComputeClock
from raytrain_hetero.worker.measure.timing import ProbeTimer
from raytrain_hetero.worker.setup.identity import all_gather

__all__ = ["BranchCosts", "measure_branch_costs", "plan_branch_placement"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BranchCosts:
    """Seconds of forward + backward on one rank: ``(name, seconds)`` per branch in fusion
    order, and the head's."""

    branches: tuple[tuple[str, float], ...]
    head: float


def measure_branch_costs(
    model: nn.Module | BranchModel,
    example_input: torch.Tensor,
    *,
    repeats: int = 3,
    slowdown: float = 1.0,
    device: torch.device | str = "cpu",
) -> BranchCosts:
    """Time each branch and the head of ``model`` on this rank (best of ``repeats``).

    Measuring does not change training: gradients are cleared, BatchNorm running statistics
    and the CPU RNG state restored. ``example_input`` is a batch like the training ones (its
    size matters); readings are multiplied by the EMULATION ``slowdown``.

    Raises:
        ModelParallelError: No declared branches, or a slowdown that is not > 0.
    """
    if not slowdown > 0:
        raise ModelParallelError(f"slowdown must be > 0, got {slowdown}")
    declared = branch_model_of(model)
    timer = ProbeTimer(ComputeClock(device), slowdown=slowdown)
    saved = {k: v.clone() for k, v in declared.model.state_dict().items()}
    parts = declared.split_inputs(example_input)
    modules = [module for _, module in declared.branches]
    # Forked RNG: dropout during the measurement must not shift the training run's draws.
    with torch.random.fork_rng(devices=[]):
        with torch.no_grad():
            fused = torch.cat([m(p) for m, p in zip(modules, parts, strict=True)], dim=1)
        calls = [lambda m=m, p=p: m(p).sum().backward() for m, p in zip(modules, parts)]
        calls.append(lambda: declared.head(fused).sum().backward())
        timings = timer.run(calls, repeats=repeats)
    declared.model.load_state_dict(saved)
    declared.model.zero_grad(set_to_none=True)
    seconds = [max(t.best, 1e-9) for t in timings]
    return BranchCosts(tuple(zip(declared.branch_names, seconds[:-1])), seconds[-1])


def plan_branch_placement(
    model: nn.Module | BranchModel,
    example_input: torch.Tensor,
    *,
    group: Any = None,
    repeats: int = 3,
    slowdown: float = 1.0,
    device: torch.device | str = "cpu",
) -> BranchPlacement:
    """Measure on every rank, exchange the costs, and place branches and head (collective).

    Every rank of ``group`` calls it with the same model and example batch; all get the same
    placement (with its predicted ``stage_times``).
    """
    mine = measure_branch_costs(
        model, example_input, repeats=repeats, slowdown=slowdown, device=device
    )
    rows = all_gather(mine, group)
    names = tuple(name for name, _ in mine.branches)
    placement = place_branches(
        names,
        [[cost for _, cost in row.branches] for row in rows],
        [row.head for row in rows],
    )
    logger.info(
        "branch placement from measured costs %s: %s, head on rank %d, stage times %s",
        [row.branches for row in rows],
        placement.branch_ranks,
        placement.head_rank,
        placement.stage_times,
    )
    return placement
