"""What one exact-BatchNorm statistics exchange costs, by collective, on a real gloo group.

Spawns ``--world`` processes (one torch thread each) on 127.0.0.1 and times, alternating in
rounds, the ways of summing one float64 tensor of per-channel statistics over the ranks:
gloo's all-reduce (what HeteroBatchNorm used before), an all-gather + local sum, and the direct
all-to-all + local sum it uses now. Sizes are SmallCNN width 32's (2C+1 = 65 and 129 values
in forward, 2C in backward). Prints the median microseconds per exchange over the rounds.

Usage: ``python -m benchmarks.bn_exchange [--world 3] [--rounds 5] [--iters 200]``
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

SIZES = (65, 129)


def _exchanges(world: int, size: int) -> dict[str, object]:
    tensor = torch.ones(size, dtype=torch.float64)
    gathered = torch.empty(world * size, dtype=torch.float64)
    copies = tensor.repeat(world)
    return {
        "all_reduce": lambda: dist.all_reduce(tensor),
        "all_gather + sum": lambda: (
            dist.all_gather_into_tensor(gathered, tensor),
            gathered.view(world, size).sum(0),
        ),
        "all_to_all + sum": lambda: (
            dist.all_to_all_single(gathered, copies),
            gathered.view(world, size).sum(0),
        ),
    }


def _rank(rank: int, world: int, port: int, rounds: int, iters: int, queue: object) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for size in SIZES:
            for name, run in _exchanges(world, size).items():
                for _ in range(iters // 10):  # warm-up
                    run()  # type: ignore[operator]
                dist.barrier()
                start = time.perf_counter()
                for _ in range(iters):
                    run()  # type: ignore[operator]
                per = (time.perf_counter() - start) / iters * 1e6
                times.setdefault((name, size), []).append(per)
    if rank == 0:
        queue.put({k: statistics.median(v) for k, v in times.items()})  # type: ignore[attr-defined]
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    """Print the median cost per statistics exchange, by collective and size."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=200)
    args = parser.parse_args(argv)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    mp.start_processes(
        _rank,
        args=(args.world, port, args.rounds, args.iters, queue),
        nprocs=args.world,
        start_method="spawn",
    )
    medians = queue.get()
    print(f"gloo, {args.world} ranks, 1 torch thread each; median of {args.rounds} rounds")
    print(f"{'exchange':<18}" + "".join(f"{f'{s} values (us)':>18}" for s in SIZES))
    for name in _exchanges(args.world, 1):
        print(f"{name:<18}" + "".join(f"{medians[(name, s)]:>18.0f}" for s in SIZES))


if __name__ == "__main__":
    main()
