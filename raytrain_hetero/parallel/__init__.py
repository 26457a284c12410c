"""Model parallelism on heterogeneous workers.

* Branch placement (:mod:`raytrain_hetero.parallel.branches`): the modality branches of a
  multimodal model on different ranks, the fusion head on one of them, activations and
  their gradients sent point to point, micro-batches pipelined; exact against one device.

Layer rule: ``parallel`` imports core, config, errors, atomic, worker, workloads and torch;
never driver, app, tune, inference, bench or sim; worker never imports parallel.
"""

from __future__ import annotations

from raytrain_hetero.core.branch_placement import (
    BranchPlacement,
    costs_from_speeds,
    place_branches,
)
from raytrain_hetero.parallel.branch_costs import (
    BranchCosts,
    measure_branch_costs,
    plan_branch_placement,
)
from raytrain_hetero.parallel.branches import (
    BranchPipeline,
    BranchStep,
    branch_model_of,
    data_parallel_bytes_per_step,
    micro_batch_sizes,
    predicted_branch_bytes_per_step,
)
from raytrain_hetero.parallel.p2p import Traffic

__all__ = [
    "BranchCosts",
    "BranchPipeline",
    "BranchPlacement",
    "BranchStep",
    "Traffic",
    "branch_model_of",
    "costs_from_speeds",
    "data_parallel_bytes_per_step",
    "measure_branch_costs",
    "micro_batch_sizes",
    "place_branches",
    "plan_branch_placement",
    "predicted_branch_bytes_per_step",
]
