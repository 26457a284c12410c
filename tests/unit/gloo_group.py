"""One real gloo process group of new processes on 127.0.0.1, for unit tests (no Ray).

A test passes a module-level ``target(rank, world_size, *args)``; each new process joins
the group, runs it with one torch thread and sends its return value back as ``torch.save``
bytes (tensors shared through a multiprocessing queue vanish once the sending process exits).
A rank that raises fails the calling test with that rank's traceback. Test files import this
module by its bare name (pytest puts tests/unit on ``sys.path``; the children inherit it).

The ranks are fresh processes forked from a fork server (``multiprocessing``'s
"forkserver") that imported torch, the library and the heavy test dependencies once per
session: a spawned rank spent 2-7 s of CPU importing them, on a 2-core machine, for every
rank of every group. Forked from a server that runs nothing else, a rank starts clean (no
threads, no state of an earlier test) exactly as a spawned one did.
"""

from __future__ import annotations

import datetime
import io
import os
import queue as queue_module
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

FAILURE_GRACE_S = 10.0  # after a rank fails, how long to wait for the others' reports

#: Imported once by the fork server (a module missing here is skipped; the child imports it).
PRELOAD = [
    "torch",
    "torch.distributed",
    "numpy",
    "raytrain_hetero",
    "raytrain_hetero.parallel",
    "raytrain_hetero.worker.api",
    "lightning",
    "torchgeo",
]


def _context():
    """The fork-server context, its server (started on first use) preloading :data:`PRELOAD`."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # no effect once the server runs: same list anyway
    return ctx


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _rank_main(
    target: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    args: tuple,
    init_timeout_s: float | None,
    results,
    environ: dict[str, str],
) -> None:
    """One rank: join the group, run ``target``, send back its value or traceback."""
    try:
        # The caller's environment now (the fork server's is the one it started with).
        os.environ.clear()
        os.environ.update(environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        timeout = {}
        if init_timeout_s is not None:
            timeout["timeout"] = datetime.timedelta(seconds=init_timeout_s)
        dist.init_process_group("gloo", rank=rank, world_size=world_size, **timeout)
        try:
            torch.set_num_threads(1)
            value = target(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
        blob = io.BytesIO()
        torch.save(value, blob)
        results.put((rank, None, blob.getvalue()))
    except BaseException:  # noqa: BLE001 - sent to the test process, which fails with it
        results.put((rank, traceback.format_exc(), b""))
        sys.exit(1)


def run_gloo_group(
    target: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout_s: float = 120.0,
    init_timeout_s: float | None = None,
) -> dict[int, Any]:
    """Run ``target(rank, world_size, *args)`` on ``world_size`` new processes forming one
    gloo group; return each rank's return value by rank.

    ``target`` must be a module-level function (it is pickled into the new processes), and
    its return value must survive ``torch.save``/``torch.load``. A rank's exception fails the
    calling test with that rank's traceback; so does a group that has not answered within
    ``timeout_s`` seconds (all ranks together). ``init_timeout_s`` is the group's own
    collective timeout (torch's default when None). Every process is joined (killed if it
    outlives a failure) and must exit 0.
    """
    ctx = _context()
    results = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(
            target=_rank_main,
            args=(target, rank, world_size, port, args, init_timeout_s, results, dict(os.environ)),
        )
        for rank in range(world_size)
    ]
    for proc in procs:
        proc.start()
    values: dict[int, Any] = {}
    failures: dict[int, str] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(values) + len(failures) < world_size:
            try:
                rank, error, blob = results.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue_module.Empty:
                break
            if error is None:
                values[rank] = torch.load(io.BytesIO(blob), weights_only=False)
                continue
            if not failures:  # the other ranks' reports (their own failures) come soon after
                deadline = min(deadline, time.monotonic() + FAILURE_GRACE_S)
            failures[rank] = error
    finally:
        for proc in procs:
            proc.join(timeout=5 if failures or len(values) < world_size else 60)
            if proc.is_alive():
                proc.kill()
                proc.join()
    if failures:
        pytest.fail(
            "\n".join(f"rank {rank} failed:\n{failures[rank]}" for rank in sorted(failures)),
            pytrace=False,
        )
    if len(values) < world_size:
        silent = sorted(set(range(world_size)) - set(values))
        pytest.fail(f"rank(s) {silent} sent nothing within {timeout_s:g} s", pytrace=False)
    exit_codes = [proc.exitcode for proc in procs]
    assert exit_codes == [0] * world_size, f"exit codes by rank: {exit_codes}"
    return values


def tiny_conv_net() -> torch.nn.Module:
    """Two small convs (6 and 7 kernels) and a linear head, float64, seeded: the composed
    layouts' model (uneven kernel blocks fit on 2-way splits)."""
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 6, 3, padding=1),
        nn.Tanh(),
        nn.Conv2d(6, 7, 3, padding=1),
        nn.Tanh(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(7, 3),
    ).double()
