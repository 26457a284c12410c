"""What exact BatchNorm's statistics cost a rank in compute, apart from synchronisation.

Times forward + backward of SmallCNN on one process (one torch thread, a one-rank gloo group,
so HeteroBatchNorm computes its global statistics in float64 and its re-weighted backward but
exchanges nothing) against the same model with torch's BatchNorm, alternating in rounds, at
the slices of the hetero2 plan and at a small slice. The difference is the statistics'
compute; the rest of exact BatchNorm's price on a multi-rank step is the exchanges'
synchronisation (``python -m benchmarks.bn_exchange`` times one exchange).

Usage: ``python -m benchmarks.bn_price [--slices 143,49,24,8] [--rounds 5] [--iters 20]``
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

from raytrain_hetero.worker.sync.batchnorm.convert import convert_batchnorm
from raytrain_hetero.workloads import build_model


def _step_ms(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, iters: int) -> float:
    times = []
    for _ in range(iters + 1):
        started = time.perf_counter()
        F.cross_entropy(model(x), y).backward()
        model.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - started)
    return 1000 * statistics.median(times[1:])  # the first call sets kernels up: not timed


def main(argv: list[str] | None = None) -> None:
    """Print median ms per forward + backward, torch BatchNorm vs exact, by slice."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slices", default="143,49,24,8")
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        plain = build_model("small_cnn", in_channels=13, num_classes=10, width=args.width)
        exact = build_model("small_cnn", in_channels=13, num_classes=10, width=args.width)
        exact.load_state_dict(plain.state_dict())
        exact = convert_batchnorm(exact, dist.group.WORLD)
        layers = sum(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in exact.modules())
        print(
            f"SmallCNN width {args.width}, {layers} BatchNorm layers, 1 torch thread; median ms "
            f"per forward + backward over {args.rounds} alternating rounds of {args.iters}"
        )
        print(f"{'slice':>6}{'torch BN':>12}{'exact BN':>12}{'extra':>10}{'extra %':>10}")
        for n in (int(s) for s in args.slices.split(",")):
            x = torch.randn(n, 13, 64, 64)
            y = torch.randint(0, 10, (n,))
            rounds: dict[str, list[float]] = {"plain": [], "exact": []}
            for k in range(args.rounds):
                order = ("plain", "exact") if k % 2 == 0 else ("exact", "plain")
                for name in order:
                    model = plain if name == "plain" else exact
                    rounds[name].append(_step_ms(model, x, y, args.iters))
            a, b = statistics.median(rounds["plain"]), statistics.median(rounds["exact"])
            print(f"{n:>6}{a:>12.2f}{b:>12.2f}{b - a:>10.2f}{100 * (b - a) / a:>9.1f}%")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
