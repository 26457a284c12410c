"""collective_timeout_s reaches the BatchNorm statistics group (real 2-process gloo, no Ray)."""

from __future__ import annotations

import time

import torch
from gloo_group import run_gloo_group

from raytrain_hetero.worker.measure.clock import ComputeClock
from raytrain_hetero.worker.measure.timing import StepInfo, StepTiming
from raytrain_hetero.worker.sync.ddp import wrap_model

WORLD_TIMEOUT_S = 120  # only the BatchNorm group's own timeout can end the wait early
BN_TIMEOUT_S = 2


def _rank_main(rank: int, world_size: int) -> tuple[str, float] | None:
    timing = StepTiming(ComputeClock("cpu"), lambda step: 1.0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    ddp = wrap_model(
        model, device="cpu", timing=timing, weighting="proportional",
        collective_timeout_s=BN_TIMEOUT_S,
    )  # fmt: skip
    if rank == 1:
        time.sleep(BN_TIMEOUT_S + 5)  # never joins the statistics exchange in time
        return None
    timing.begin(StepInfo(0, 0, 0, (2, 2), rank, 0))
    started = time.perf_counter()
    try:
        ddp(torch.randn(2, 3))
        return "no error", time.perf_counter() - started
    except RuntimeError as exc:  # the expected outcome: rank 0 reports the timeout
        return str(exc).splitlines()[0], time.perf_counter() - started


def test_a_rank_missing_the_batchnorm_exchange_fails_the_group_within_the_timeout():
    results = run_gloo_group(_rank_main, 2, init_timeout_s=WORLD_TIMEOUT_S)
    message, waited = results[0]
    assert "Timed out" in message, message
    assert BN_TIMEOUT_S - 0.5 <= waited < BN_TIMEOUT_S + 10, waited
