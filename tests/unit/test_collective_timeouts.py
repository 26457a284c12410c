"""collective_timeout_s reaches the BatchNorm statistics group (real 2-process gloo, no Ray)."""

from __future__ import annotations

import datetime
import os
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from raytrain_hetero.worker.ddp import wrap_model
from raytrain_hetero.worker.timing import ComputeClock, StepInfo, StepTiming

WORLD_TIMEOUT_S = 120  # only the BatchNorm group's own timeout can end the wait early
BN_TIMEOUT_S = 2


def _rank_main(rank: int, port: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group(
        "gloo", rank=rank, world_size=2, timeout=datetime.timedelta(seconds=WORLD_TIMEOUT_S)
    )
    timing = StepTiming(ComputeClock("cpu"), lambda step: 1.0)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    ddp = wrap_model(
        model, device="cpu", timing=timing, weighting="proportional",
        collective_timeout_s=BN_TIMEOUT_S,
    )  # fmt: skip
    if rank == 1:
        time.sleep(BN_TIMEOUT_S + 5)  # never joins the statistics exchange in time
        queue.put((rank, None))
        return
    timing.begin(StepInfo(0, 0, 0, (2, 2), rank, 0))
    started = time.perf_counter()
    try:
        ddp(torch.randn(2, 3))
        queue.put((rank, ("no error", time.perf_counter() - started)))
    except RuntimeError as exc:
        queue.put((rank, (str(exc).splitlines()[0], time.perf_counter() - started)))


def test_a_rank_missing_the_batchnorm_exchange_fails_the_group_within_the_timeout():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(r, port, queue)) for r in range(2)]
    for proc in procs:
        proc.start()
    results = dict(queue.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join(timeout=60)
    message, waited = results[0]
    assert "Timed out" in message, message
    assert BN_TIMEOUT_S - 0.5 <= waited < BN_TIMEOUT_S + 10, waited
