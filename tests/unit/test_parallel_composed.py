"""A composed layout on real gloo: 2 data-parallel replicas x 2-way conv split on 4 ranks.

Split groups {0, 1} and {2, 3} each compute one replica's carved slice of the global batch
(uneven: 6 and 4 of 10 samples); the ranks holding the same kernel block in the two replicas
({0, 2} and {1, 3}) all-reduce their gradients weighted by the replica's share n/N, the
data-parallel weighting. The result equals one device on the whole batch.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from gloo_group import run_gloo_group, tiny_conv_net
from torch import nn

from raytrain_hetero.core.weighting import proportional_weights
from raytrain_hetero.parallel.conv_split import split_conv_layers
from raytrain_hetero.parallel.conv_state import full_state_dict

WORLD = 4
SPLIT_GROUPS = ((0, 1), (2, 3))
REPLICA_GROUPS = ((0, 2), (1, 3))  # same kernel block, different replicas
REPLICA_SLICES = (6, 4)
KERNELS = {"conv1": (2, 4), "conv2": (5, 2)}
STEPS = 3


def _batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    return torch.randn(10, 3, 6, 6, generator=gen, dtype=torch.float64), torch.randint(
        0, 3, (10,), generator=gen
    )


def _rank_main(rank: int, world_size: int) -> dict:
    # Every rank creates every group, in the same order (torch.distributed's rule).
    split_groups = [dist.new_group(list(g)) for g in SPLIT_GROUPS]
    replica_groups = [dist.new_group(list(g)) for g in REPLICA_GROUPS]
    replica = rank // 2
    split_group, replica_group = split_groups[replica], replica_groups[rank % 2]
    weights = proportional_weights(REPLICA_SLICES)
    start = sum(REPLICA_SLICES[:replica])
    part = slice(start, start + REPLICA_SLICES[replica])

    reference = tiny_conv_net()
    model = copy.deepcopy(reference)
    model_names = {"conv1": "0", "conv2": "2"}
    split_conv_layers(
        model,
        list(model_names.values()),
        split_group,
        kernels_per_rank={model_names[k]: v for k, v in KERNELS.items()},
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.2, momentum=0.9)
    for step in range(STEPS):
        x, y = _batch(step)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x[part]), y[part]).backward()
        for param in model.parameters():  # data-parallel sync across replicas
            param.grad.mul_(weights[replica])
            dist.all_reduce(param.grad, group=replica_group)
        opt.step()
        opt_ref.zero_grad()
        nn.functional.cross_entropy(reference(x), y).backward()
        opt_ref.step()
    got = full_state_dict(model)
    want = reference.state_dict()
    diff = max(float((got[k] - want[k]).abs().max()) for k in want)
    return {"diff": diff, "local": tuple(model[2].weight.shape)}


def test_two_replicas_of_a_two_way_split_equal_one_device():
    results = run_gloo_group(_rank_main, WORLD)
    for rank in range(WORLD):
        figures = results[rank]
        assert figures["local"] == (KERNELS["conv2"][rank % 2], 6, 3, 3)
        assert figures["diff"] <= 1e-10, (rank, figures)
