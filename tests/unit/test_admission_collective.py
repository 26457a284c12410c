"""The probe's gradient all-reduce timing on a real gloo group (no Ray): a rank with an
EMULATED slow link delays exactly the groups it belongs to."""

from __future__ import annotations

import torch
import torch.distributed as dist
from gloo_group import run_gloo_group

from raytrain_hetero.worker.measure.probe import time_gradient_allreduce

DELAY_S = 0.2


def _rank_main(rank: int, world_size: int) -> tuple[float, float]:
    model = torch.nn.Linear(64, 32)
    delay = DELAY_S if rank == 2 else 0.0
    fast_pair = dist.new_group(ranks=[0, 1])
    pair_s = 0.0
    if rank in (0, 1):
        pair_s = time_gradient_allreduce(model, group=fast_pair, collective_delay_s=delay)
    everyone_s = time_gradient_allreduce(model, collective_delay_s=delay)
    return pair_s, everyone_s


def test_a_slow_link_delays_only_the_groups_it_is_in():
    results = run_gloo_group(_rank_main, 3)
    everyone = {round(r[1], 9) for r in results.values()}
    assert len(everyone) == 1  # the members agree on one figure
    assert everyone.pop() >= DELAY_S
    assert results[0][0] == results[1][0] < DELAY_S / 2
