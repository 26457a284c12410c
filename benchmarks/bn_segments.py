"""Where exact BatchNorm's step time goes on uneven ranks: compute, per-layer imbalance, exchanges.

Exact BatchNorm synchronises the ranks at every statistics exchange (two per layer and step),
so a step takes the sum over its *segments* (the work between two exchanges) of the slowest
rank's segment, not the slowest rank's whole step. Slices balanced on whole steps leave waits
wherever a layer's cost ratio between the ranks differs from the step's (a large slice's
first convolution runs slower per sample than a small one's, for one).

This runs SmallCNN on uneven gloo ranks (one process and one torch thread each, EMULATED
slowdown factors stretching each rank's compute as in training), alternating per-slice
BatchNorm (``local``: one collective per step, the gradient all-reduce) with exact BatchNorm,
times every segment on every rank, and splits exact's extra step time into:

* **compute**: the slowest rank's busy time grows (the statistics, the exchanges' launch);
* **per-layer imbalance**: sum over segments of the slowest rank's segment, minus the slowest
  rank's busy time (0 if every segment kept the step's ratio), beyond local's same figure;
* **exchanges and scheduling**: what the step took beyond that, against local's same figure.

A segment ends at every collective call, the start of a backward exchange included: the
work a rank overlaps with that exchange (started, then awaited) is a segment of its own, so
the imbalance figure may overstate by that work (a few ms a step at these sizes). The gradient
sync is one all-reduce after the backward (no bucket overlap), the same in both modes. Usage: ``python -m benchmarks.bn_segments [--slices 144,48] [--factors 1,3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from raytrain_hetero.worker.measure.clock import ComputeClock
from raytrain_hetero.worker.measure.timing import StepInfo, StepTiming
from raytrain_hetero.worker.sync.batchnorm.binding import BatchNormBinding
from raytrain_hetero.worker.sync.batchnorm.convert import convert_batchnorm
from raytrain_hetero.workloads import build_model

MODES = ("local", "exact")


def _rank_main(rank: int, args: argparse.Namespace, port: int, out: Path) -> None:
    """One rank: alternate the modes, time every segment of every step, send them to rank 0."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    world = len(args.slices)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        timing = StepTiming(ComputeClock("cpu"), lambda _step: args.factors[rank])
        events: list[float] = []  # wall times: arrive, leave, arrive, leave, ...

        def arrive() -> None:
            timing.before_collective()
            events.append(time.perf_counter())

        def leave() -> None:
            events.append(time.perf_counter())
            timing.after_collective()

        weight = args.slices[rank] / sum(args.slices)
        binding = BatchNormBinding(lambda: weight, arrive, leave)
        torch.manual_seed(0)
        models = {
            "local": build_model("small_cnn", in_channels=13, num_classes=10, width=args.width)
        }
        models["exact"] = convert_batchnorm(
            build_model("small_cnn", in_channels=13, num_classes=10, width=args.width),
            dist.group.WORLD,
            binding,
        )
        models["exact"].load_state_dict(models["local"].state_dict())
        x = torch.randn(args.slices[rank], 13, 64, 64)
        y = torch.randint(0, 10, (args.slices[rank],))
        steps: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
        for k in range(args.rounds):
            for mode in MODES if k % 2 == 0 else MODES[::-1]:
                model = models[mode]
                for step in range(args.steps + 1):  # the first sets kernels up: not kept
                    events.clear()
                    timing.begin(StepInfo(step, 0, step, tuple(args.slices), rank, 0))
                    started = time.perf_counter()
                    (F.cross_entropy(model(x), y) * weight).backward()
                    grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
                    arrive()
                    dist.all_reduce(grads)
                    leave()
                    model.zero_grad(set_to_none=True)
                    timing.end()
                    ended = time.perf_counter()
                    marks = [started, *events, ended]
                    segments = [marks[i + 1] - marks[i] for i in range(0, len(marks) - 1, 2)]
                    waits = [marks[i + 1] - marks[i] for i in range(1, len(marks) - 1, 2)]
                    if step > 0:
                        steps[mode].append(
                            {"wall": ended - started, "segments": segments, "waits": waits}
                        )
        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, steps)
        if rank == 0:
            out.write_text(json.dumps(gathered))
    finally:
        dist.destroy_process_group()


def decompose(ranks: list[dict[str, list[dict[str, Any]]]]) -> dict[str, dict[str, Any]]:
    """Per mode: medians over steps of the step's wall, the slowest rank's busy time, the sum
    of the per-segment maxima, and each rank's median per segment (seconds)."""
    figures: dict[str, dict[str, Any]] = {}
    for mode in MODES:
        per_step = list(zip(*(rank[mode] for rank in ranks), strict=True))
        walls, busy, seg_max = [], [], []
        for records in per_step:
            walls.append(max(r["wall"] for r in records))
            busy.append(max(sum(r["segments"]) for r in records))
            seg_max.append(sum(max(seg) for seg in zip(*(r["segments"] for r in records))))
        figures[mode] = {
            "wall": statistics.median(walls),
            "busy": statistics.median(busy),
            "segment_max": statistics.median(seg_max),
            "segments": [
                [statistics.median(s) for s in zip(*(r["segments"] for r in rank[mode]))]
                for rank in ranks
            ],
            "rank_busy": [
                statistics.median(sum(r["segments"]) for r in rank[mode]) for rank in ranks
            ],
        }
    return figures


def report(figures: dict[str, dict[str, Any]], args: argparse.Namespace) -> list[str]:
    """The printed lines: a row per mode, exact's extra split in three, exact's segments."""
    ms = 1000.0
    local, exact = figures["local"], figures["exact"]
    compute = exact["busy"] - local["busy"]
    # Local's own (its tail after the all-reduce, the plan's rounding) is not exact's price.
    imbalance = (exact["segment_max"] - exact["busy"]) - (local["segment_max"] - local["busy"])
    exchanges = (exact["wall"] - exact["segment_max"]) - (local["wall"] - local["segment_max"])
    slices = "/".join(map(str, args.slices))
    factors = "/".join(format(f, "g") for f in args.factors)
    lines = [
        f"SmallCNN width {args.width}, slices {slices}, EMULATED factors {factors}, "
        f"{len(args.slices)} gloo ranks of 1 torch thread; medians of {args.steps} steps x "
        f"{args.rounds} alternating rounds (ms)",
        f"{'mode':<7}{'step':>9}{'slowest busy':>14}{'sum of segment max':>20}{'segments':>10}",
    ]
    for mode in MODES:
        f = figures[mode]
        lines.append(
            f"{mode:<7}{f['wall'] * ms:>9.1f}{f['busy'] * ms:>14.1f}"
            f"{f['segment_max'] * ms:>20.1f}{len(f['segments'][0]):>10}"
        )
    lines.append(
        f"exact - local: {(exact['wall'] - local['wall']) * ms:.1f} = compute "
        f"{compute * ms:+.1f}, per-layer imbalance {imbalance * ms:+.1f}, exchanges and "
        f"scheduling {exchanges * ms:+.1f}"
    )
    for mode in MODES:
        busy = " ".join(f"{b * ms:.1f}" for b in figures[mode]["rank_busy"])
        lines.append(f"{mode} busy by rank: {busy}")
    for rank, segments in enumerate(exact["segments"]):
        lines.append(f"exact segments, rank {rank}: " + " ".join(f"{s * ms:.1f}" for s in segments))
    return lines


def main(argv: list[str] | None = None) -> None:
    """Run the ranks, print the decomposition."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slices", default="144,48", help="samples per rank")
    parser.add_argument("--factors", default="1,3", help="EMULATED slowdown per rank")
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--steps", type=int, default=10, help="kept steps per mode and round")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    try:
        args.slices = [int(s) for s in args.slices.split(",")]
        args.factors = [float(f) for f in args.factors.split(",")]
    except ValueError as exc:
        parser.error(f"--slices takes integers and --factors numbers, comma-separated ({exc})")
    if len(args.slices) != len(args.factors) or len(args.slices) < 2:
        parser.error("--slices and --factors need the same number (>= 2) of ranks")
    if min(args.slices) < 1 or min(args.factors) < 1 or args.steps < 1 or args.rounds < 1:
        parser.error("slices, steps and rounds must be >= 1, factors >= 1")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "steps.json"
        mp.start_processes(
            _rank_main, args=(args, port, out), nprocs=len(args.slices), start_method="spawn"
        )
        ranks = json.loads(out.read_text())
    print("\n".join(report(decompose(ranks), args)))


if __name__ == "__main__":
    main()
