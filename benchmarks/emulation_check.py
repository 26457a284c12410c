"""Does an emulated slowdown of k make a worker's step k times longer, whatever the step's size?

EMULATION check (no Ray): one process trains a model on a fixed slice with the library's step
timing (:class:`~raytrain_hetero.worker.measure.timing.StepTiming`), stretching at the same
points as a training step (one per gradient bucket), at factors 1 and k, and prints each
factor's median step wall time and its ratio to factor 1. Two models: a tiny MLP whose steps
take well under a millisecond (where ``time.sleep``'s fixed overshoot used to dominate) and a
CNN of a few milliseconds a step. ``--min-sleep-s 0`` shows the emulator sleeping every
interval's stretch at once (the behaviour before the owed-stretch quantum).

    python -m benchmarks.emulation_check
    python -m benchmarks.emulation_check --min-sleep-s 0     # the old, per-interval sleeps
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence

import torch
from torch import nn

from raytrain_hetero.worker.measure.clock import ComputeClock
from raytrain_hetero.worker.measure.emulation import MIN_SLEEP_S, SlowdownEmulator
from raytrain_hetero.worker.measure.timing import StepInfo, StepTiming

#: Stretch points per step: DDP calls the hook once per gradient bucket.
EXCHANGES_PER_STEP = 3


def _models() -> dict[str, tuple[Callable[[], nn.Module], tuple[int, ...]]]:
    return {
        "tiny-mlp": (lambda: nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), (8,)),
        "small-cnn": (
            lambda: nn.Sequential(
                nn.Conv2d(3, 16, 3, padding=1),
                nn.ReLU(),
                nn.Conv2d(16, 16, 3, padding=1),
                nn.ReLU(),
                nn.AdaptiveAvgPool2d(1),
                nn.Flatten(),
                nn.Linear(16, 4),
            ),
            (3, 32, 32),
        ),
    }


def step_walls(
    build: Callable[[], nn.Module],
    shape: Sequence[int],
    *,
    factor: float,
    slice_size: int,
    steps: int,
    min_sleep_s: float,
) -> list[float]:
    """Wall seconds of each of ``steps`` steps at ``factor`` (after two warm-up steps)."""
    torch.manual_seed(0)
    model = build()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.randn(slice_size, *shape)
    labels = torch.randint(0, 4, (slice_size,))
    timing = StepTiming(ComputeClock("cpu"), lambda step: factor)
    timing._emulator = SlowdownEmulator(timing.clock, min_sleep_s=min_sleep_s)
    walls = []
    for step in range(steps + 2):
        started = time.perf_counter()
        timing.begin(StepInfo(step, 0, step, (slice_size,), 0, 0))
        loss = nn.functional.cross_entropy(model(inputs), labels)
        timing.before_collective()
        timing.after_collective()
        loss.backward()
        for _ in range(EXCHANGES_PER_STEP - 1):
            timing.before_collective()
            timing.after_collective()
        optimizer.step()
        optimizer.zero_grad()
        timing.end()
        if step >= 2:
            walls.append(time.perf_counter() - started)
    return walls


def main(argv: Sequence[str] | None = None) -> None:
    """Print the table (one row per model and factor)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--factors", default="2,4", help="slowdowns to compare with 1")
    parser.add_argument("--slice", type=int, default=16, help="samples per step")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument(
        "--min-sleep-s", type=float, default=MIN_SLEEP_S, help="the emulator's sleep quantum"
    )
    args = parser.parse_args(argv)
    factors = [float(f) for f in args.factors.split(",")]
    torch.set_num_threads(1)  # the emulator reads thread CPU time with one thread
    print(f"min_sleep_s={args.min_sleep_s}  slice={args.slice}  steps={args.steps}")
    print(f"{'model':<10} {'factor':>6} {'median step ms':>15} {'x factor 1':>11}")
    for name, (build, shape) in _models().items():
        base = None
        for factor in [1.0, *factors]:
            walls = step_walls(
                build,
                shape,
                factor=factor,
                slice_size=args.slice,
                steps=args.steps,
                min_sleep_s=args.min_sleep_s,
            )
            median = statistics.median(walls)
            base = median if base is None else base
            print(f"{name:<10} {factor:>6.1f} {median * 1e3:>15.3f} {median / base:>11.2f}")


if __name__ == "__main__":
    main()
