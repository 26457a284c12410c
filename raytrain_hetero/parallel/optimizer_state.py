"""Optimizer state of a rank that holds a share of a model's parameters, as the full model's.

torch's optimizer ``state_dict`` keys each parameter's state by its index in the optimizer's
param groups. Data mode's optimizer is built over the whole model's ``parameters()``; a
branch-placed rank's optimizer holds only its share. These functions translate between the
two numberings through ``full_index`` (``id(parameter) -> index in the single-device model's
parameters()``), so a checkpoint's optimizer state is the single-device one in every mode.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import torch

from raytrain_hetero.worker.setup.identity import all_gather

__all__ = ["copy_to_cpu", "full_optimizer_state_of_share", "share_of_full_optimizer_state"]


def _local_full_indices(
    optimizer: torch.optim.Optimizer, full_index: Mapping[int, int]
) -> list[int]:
    """The full-model index of each of the optimizer's parameters, in its own order."""
    return [full_index[id(p)] for g in optimizer.param_groups for p in g["params"]]


def copy_to_cpu(value: Any) -> Any:
    """``value`` with every tensor (in nested dicts and lists) copied to the CPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: copy_to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [copy_to_cpu(v) for v in value]
    return value


def full_optimizer_state_of_share(
    optimizer: torch.optim.Optimizer, full_index: Mapping[int, int], group: Any
) -> dict[str, Any]:
    """The single-device optimizer's state_dict, gathered from every rank's share (collective).

    Param group ``k`` of the result holds the indices of group ``k`` of every rank (each rank
    builds its optimizer the same way over its share), with rank 0's hyperparameters.
    """
    local = optimizer.state_dict()
    indices = _local_full_indices(optimizer, full_index)
    state = {indices[i]: copy_to_cpu(v) for i, v in local["state"].items()}
    param_groups = [
        {**g, "params": [indices[i] for i in g["params"]]} for g in local["param_groups"]
    ]
    pieces = all_gather((state, param_groups), group)
    merged_state: dict[int, Any] = {}
    merged_groups: list[dict[str, Any]] = []
    for piece_state, piece_groups in pieces:
        merged_state.update(piece_state)
        for k, g in enumerate(piece_groups):
            if k == len(merged_groups):
                merged_groups.append({**g, "params": []})
            merged_groups[k]["params"] = sorted({*merged_groups[k]["params"], *g["params"]})
    return {"state": dict(sorted(merged_state.items())), "param_groups": merged_groups}


def share_of_full_optimizer_state(
    optimizer: torch.optim.Optimizer, full_index: Mapping[int, int], state: Mapping[str, Any]
) -> dict[str, Any]:
    """The part of a single-device optimizer state_dict that belongs to this rank's share,
    renumbered for its optimizer (not a collective)."""
    indices = _local_full_indices(optimizer, full_index)
    full_state = state["state"]
    local_state = {
        i: copy.deepcopy(full_state[full]) for i, full in enumerate(indices) if full in full_state
    }
    full_groups = list(state["param_groups"])
    local_groups = []
    position = 0
    for k, group in enumerate(optimizer.param_groups):
        count = len(group["params"])
        source = full_groups[k] if k < len(full_groups) else group
        hyper = {key: value for key, value in source.items() if key != "params"}
        local_groups.append({**hyper, "params": list(range(position, position + count))})
        position += count
    return {"state": local_state, "param_groups": local_groups}
