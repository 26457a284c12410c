"""Probe-based slices vs equal slices on 3 emulated workers (slowdowns 1, 2, 4).

Runs the main EuroSAT job (13-band small CNN, global batch 192) with both contenders in one
Ray session, alternating A B B A ... after one uncounted warm-up fit, and prints the median
samples/s of each and their ratio. Samples/s counts only training steps: the sum of global
samples over the sum of per-step wall times (the slowest rank's), so start-up, probing and
validation are excluded for both contenders alike.

Heterogeneity here is EMULATED (``emulated_slowdown`` stretches each worker's own compute),
on a shared 2-core machine: expect noise, which is why contenders alternate.

    python -m benchmarks.probe_vs_equal --rounds 2 --output outputs/bench_probe
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

IDEAL = (1 + 1 / 2 + 1 / 4) / (3 * 1 / 4)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("examples/configs/eurosat_local.yaml"))
    parser.add_argument("--rounds", type=int, default=2, help="A B B A repeats (default 2)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument(
        "--width", type=int, default=None, help="SmallCNN width (default: the config's)"
    )
    parser.add_argument("--output", type=Path, default=Path("outputs/bench_probe_vs_equal"))
    args = parser.parse_args(argv)

    import ray

    from benchmarks.contenders import machine_description
    from raytrain_hetero.app.config import load_config
    from raytrain_hetero.app.job import init_ray, run_job

    base: dict = {"train": {"epochs": args.epochs}}
    if args.width is not None:
        base["model"] = {"width": args.width}
    contenders = {
        "probe": base,
        "equal": {**base, "train": {**base["train"], "fixed_shares": [1.0, 1.0, 1.0]}},
    }
    jobs = {name: load_config(args.config, overrides) for name, overrides in contenders.items()}
    init_ray(jobs["probe"])
    order = ["probe"] + ["probe", "equal", "equal", "probe"] * args.rounds
    figures: dict[str, list[float]] = {"probe": [], "equal": []}
    raw = []
    for i, name in enumerate(order):
        summary = run_job(jobs[name], output_dir=args.output / f"{i:02d}-{name}", progress=False)
        counted = i > 0  # the first fit of a Ray session runs slow: not counted
        raw.append(
            {
                "fit": i,
                "contender": name,
                "counted": counted,
                "samples_per_s": summary["samples_per_s"],
                "slices": [w["slice"] for w in summary["workers"]],
                "val_accuracy": summary["final_val_accuracy"],
            }
        )
        if counted:
            figures[name].append(summary["samples_per_s"])
        print(
            f"fit {i} {name:5s} {summary['samples_per_s']:8.1f} samples/s "
            f"slices {raw[-1]['slices']}{'' if counted else ' (warm-up, not counted)'}",
            flush=True,
        )
    ray.shutdown()
    probe = statistics.median(figures["probe"])
    equal = statistics.median(figures["equal"])
    result = {
        "probe_samples_per_s": probe,
        "equal_samples_per_s": equal,
        "ratio": probe / equal,
        "ideal_ratio": IDEAL,
        "target_ratio": 1.9,
        "fits": raw,
        "model_width": jobs["probe"].model.width,
        "machine": machine_description(),
    }
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "bench.json").write_text(json.dumps(result, indent=2))
    print(
        f"\nprobe-based {probe:.1f} samples/s | equal {equal:.1f} samples/s | "
        f"ratio {probe / equal:.2f}x (target >= 1.9x, ideal {IDEAL:.2f}x)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
