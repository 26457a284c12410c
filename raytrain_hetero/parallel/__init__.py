"""Model parallelism on heterogeneous workers (see docs/how-to/model-parallelism.md).

* Conv split (``conv_split``, ``conv_state``): :class:`SplitConv2d`, :func:`split_conv_layers`,
  full checkpoints of a split model, :func:`resplit`, :func:`probe_kernel_cost`.
* Branch placement (``branch_model``, ``branches``, ``branch_costs``, ``p2p``): a multimodal
  model's branches (:class:`DeclaresBranches`) on different ranks, the head on one of them,
  micro-batches pipelined point to point; exact against one device.
* Training through ``HeteroTrainer`` (``training``, ``strategies``, ``layout``,
  ``optimizer_state``): :func:`prepare_model_parallel` -> :class:`ParallelModel`, R
  data-parallel replicas x G-way groups.

Names are imported lazily so ``import raytrain_hetero.parallel`` loads no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_CONV_SPLIT = "raytrain_hetero.parallel.conv_split"
_CONV_STATE = "raytrain_hetero.parallel.conv_state"
_BRANCHES = "raytrain_hetero.parallel.branches"
_BRANCH_COSTS = "raytrain_hetero.parallel.branch_costs"

_LAZY = {
    "CollectiveHooks": _CONV_SPLIT,
    "SplitConv2d": _CONV_SPLIT,
    "check_replicas_identical": _CONV_SPLIT,
    "split_conv_layers": _CONV_SPLIT,
    "split_layers": _CONV_SPLIT,
    "full_optimizer_state_dict": _CONV_STATE,
    "full_state_dict": _CONV_STATE,
    "gather_kernel_costs": _CONV_STATE,
    "load_full_optimizer_state_dict": _CONV_STATE,
    "load_full_state_dict": _CONV_STATE,
    "probe_kernel_cost": _CONV_STATE,
    "resplit": _CONV_STATE,
    "BranchPlacement": "raytrain_hetero.core.branch_placement",
    "costs_from_speeds": "raytrain_hetero.core.branch_placement",
    "place_branches": "raytrain_hetero.core.branch_placement",
    "BranchCosts": _BRANCH_COSTS,
    "measure_branch_costs": _BRANCH_COSTS,
    "plan_branch_placement": _BRANCH_COSTS,
    "BranchModel": "raytrain_hetero.parallel.branch_model",
    "DeclaresBranches": "raytrain_hetero.parallel.branch_model",
    "branch_model_of": "raytrain_hetero.parallel.branch_model",
    "BranchPipeline": _BRANCHES,
    "BranchStep": _BRANCHES,
    "data_parallel_bytes_per_step": _BRANCHES,
    "micro_batch_sizes": _BRANCHES,
    "predicted_branch_bytes_per_step": _BRANCHES,
    "Traffic": "raytrain_hetero.parallel.p2p",
    "ParallelGroups": "raytrain_hetero.parallel.layout",
    "ParallelLayout": "raytrain_hetero.parallel.layout",
    "RankLayout": "raytrain_hetero.parallel.layout",
    "ParallelModel": "raytrain_hetero.parallel.training",
    "ParallelStep": "raytrain_hetero.parallel.training",
    "prepare_model_parallel": "raytrain_hetero.parallel.training",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
