"""Validation wall time per epoch on uneven workers: sharded by speed vs the ideal split.

Spawns ``len(--slowdowns)`` ranks of a real gloo group on 127.0.0.1 (one torch thread each,
no Ray), each with the worker runtime a HeteroTrainer worker has (EMULATION: rank r's compute
is stretched by ``slowdowns[r]``, in evaluation as in training) and a plan of shares
proportional to the speeds ``1/slowdown``. It times, alternating in rounds (A B B A), the
job's per-epoch validation of a SmallCNN on EuroSAT-shaped samples:

* ``rank 0 alone``: what the job did before: the fastest rank validates the whole set while
  the others wait (its wall time T1 is also the reference);
* ``sharded by speed``: the job's validation now (``prepare_eval_data_loader`` on every rank,
  ``correct_counts``, ``sum_across_ranks``), timed from a barrier to the summed counts.

The ideal speed-proportional split takes T1 / sum(speeds) (every rank busy for the same
time, each sample evaluated once). Prints the median of each and its ratio to the ideal.

Usage: ``python -m benchmarks.eval_split [--slowdowns 1 2 4] [--samples 2048] [--rounds 2]``
(run it under the machine's Ray/process-group lock).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, TensorDataset

BANDS, SIZE, CLASSES, BATCH = 13, 64, 10, 256


def _validate(model: torch.nn.Module, loader: object) -> tuple[int, int]:
    from raytrain_hetero.workloads.evaluation import correct_counts

    return correct_counts(model, loader, "cpu")  # type: ignore[arg-type]


def _rank(
    rank: int, slowdowns: list[float], port: int, samples: int, rounds: int, queue: object
) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    world = len(slowdowns)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    import raytrain_hetero as rh
    from raytrain_hetero.config import BatchConfig, WorkerSpec
    from raytrain_hetero.worker.runtime.registry import WorkerRuntime, install_runtime
    from raytrain_hetero.worker.setup.identity import HeteroSetup, RankIdentity
    from raytrain_hetero.workloads import build_model

    specs = tuple(WorkerSpec(name=f"w{i}", emulated_slowdown=k) for i, k in enumerate(slowdowns))
    setup = HeteroSetup(
        run_id="eval-split", specs=specs, batch=BatchConfig(global_batch_size=BATCH)
    )
    identity = RankIdentity(setup=setup, slot=rank, rank=rank, world_size=world)
    install_runtime(WorkerRuntime.start(identity))
    rh.update_plan(shares=[1.0 / k for k in slowdowns], reason="speeds")
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.randn(samples, BANDS, SIZE, SIZE, generator=g),
        torch.randint(0, CLASSES, (samples,), generator=g),
    )
    torch.manual_seed(0)
    model = build_model("small_cnn", in_channels=BANDS, num_classes=CLASSES)

    def alone() -> None:
        if rank == 0:
            _validate(model, DataLoader(data, batch_size=BATCH))
        dist.barrier()  # the others wait, as in report()

    def sharded() -> None:
        shard = rh.prepare_eval_data_loader(data, batch_size=BATCH)
        rh.sum_across_ranks(*_validate(model, shard))

    contenders = {"rank 0 alone": alone, "sharded by speed": sharded}
    times: dict[str, list[float]] = {name: [] for name in contenders}
    sharded()  # warm-up (allocator, first-call costs)
    for round_ in range(rounds):
        order = list(contenders) if round_ % 2 == 0 else list(reversed(contenders))
        for name in order + order[::-1]:
            dist.barrier()
            start = time.perf_counter()
            contenders[name]()
            times[name].append(time.perf_counter() - start)
    if rank == 0:
        queue.put({name: statistics.median(t) for name, t in times.items()})  # type: ignore[attr-defined]
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    """Print the validation wall times beside the ideal speed-proportional split."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slowdowns", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    parser.add_argument("--samples", type=int, default=2048)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    queue = mp.get_context("spawn").Queue()
    mp.start_processes(
        _rank,
        args=(args.slowdowns, port, args.samples, args.rounds, queue),
        nprocs=len(args.slowdowns),
        start_method="spawn",
    )
    medians = queue.get()
    speeds = [1.0 / k for k in args.slowdowns]
    ideal = medians["rank 0 alone"] / (sum(speeds) / max(speeds))
    print(
        f"validation of {args.samples} samples (SmallCNN, {BANDS}x{SIZE}x{SIZE}), "
        f"{len(speeds)} gloo ranks of speeds {', '.join(f'{s:g}' for s in speeds)} "
        f"(EMULATION), median of {2 * args.rounds} runs each"
    )
    print(f"{'contender':<22}{'wall s':>10}{'vs ideal split':>16}")
    print(f"{'ideal split':<22}{ideal:>10.3f}{1.0:>16.2f}")
    for name, wall in medians.items():
        print(f"{name:<22}{wall:>10.3f}{wall / ideal:>16.2f}")


if __name__ == "__main__":
    main()
