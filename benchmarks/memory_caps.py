"""Memory-aware slices: a fast worker capped below its speed share, cap-only vs accumulation.

The EuroSAT job (3 CPU workers, EMULATED speeds 1, 1/2, 1/4) with the fast worker's memory cap
forced to ``--cap`` samples per pass (``WorkerSpec.max_micro_batch``, the explicit form of the
cap the probe derives from ``max_memory_fraction``), well below its share of the global batch.
Two contenders, alternated A B B A in one Ray session after one uncounted warm-up fit:

* ``cap-only`` (``memory_cap_mode: slice``): the allocation caps the fast worker's slice at the
  cap and spreads the rest over the slower workers;
* ``accumulate`` (``memory_cap_mode: accumulate``): the fast worker keeps its speed share and
  runs it in micro-batches of at most the cap (count-weighted, exact);
* ``uncapped`` (reference): no cap, one pass per slice: what micro-batching costs.

The model has no BatchNorm (``marques_cnn``), so both contenders make the one-device update.
Figure: global samples/s (median over steps after the first 3) per contender and the ratio.

    python -m benchmarks.memory_caps --output benchmarks/results/memory_caps
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks.replan_recovery import per_step_throughput

#: Contender -> memory_cap_mode (None: the "uncapped" reference, no cap at all).
CONTENDERS: dict[str, str | None] = {
    "cap-only": "slice",
    "accumulate": "accumulate",
    "uncapped": None,
}


def ideal_samples_per_s_ratio(cap: int, batch: int, speeds: list[float]) -> float:
    """Accumulation's over cap-only's step throughput with affine-free costs (beta only).

    Cap-only: the capped worker does ``cap`` samples, the others share the rest by speed, so
    the step takes ``(batch - cap) / sum(other speeds)``; accumulation: ``batch / sum(speeds)``
    (1 when the cap is at or above the capped worker's share).
    """
    fast, others = speeds[0], sum(speeds[1:])
    held = min(cap, batch * fast / (fast + others))  # a cap above the share does not bind
    capped = max((batch - held) / others, held / fast)
    return capped / (batch / (fast + others))


def _plot(results: dict[str, Any], path: Path) -> None:
    from benchmarks.plots import _figure, _save

    fig = _figure((6.5, 4.0))
    ax = fig.subplots()
    names = list(CONTENDERS)
    medians = [results["contenders"][n]["median_samples_per_s"] for n in names]
    ax.bar(names, medians, color=["#7f7f7f", "#1f77b4", "#2ca02c"][: len(names)])
    for i, name in enumerate(names):
        runs = results["contenders"][name]["runs"]
        ax.scatter([i] * len(runs), [r["samples_per_s"] for r in runs], color="black", zorder=3)
    ax.axhline(0, color="black", linewidth=0.5)
    ax.set_ylabel("global samples/s (median over steps)")
    ax.set_title(
        f"fast worker capped at {results['cap']} samples/pass (share ~{results['fast_share']})"
        f"\naccumulate / cap-only = {results['ratio']:.2f}x (ideal {results['ideal_ratio']:.2f}x)"
    )
    _save(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("examples/configs/eurosat_local.yaml"))
    parser.add_argument("--cap", type=int, default=16, help="fast worker's samples per pass")
    parser.add_argument("--batch", type=int, default=96)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--width", type=int, default=8, help="marques_cnn conv1 kernels")
    parser.add_argument("--repeats", type=int, default=2, help="fits per contender (A B B A)")
    parser.add_argument("--output", type=Path, default=Path("outputs/bench_memory_caps"))
    args = parser.parse_args(argv)

    import ray

    from benchmarks.fit_capture import capture_fits
    from raytrain_hetero.app.config import load_config
    from raytrain_hetero.app.job import init_ray, run_job

    captured = capture_fits()
    base = load_config(args.config)

    def workers(capped: bool) -> list[dict[str, Any]]:
        return [
            {**w.model_dump(), "max_micro_batch": args.cap if capped and w.name == "fast" else None}
            for w in base.workers
        ]

    speeds = [1.0 / w.emulated_slowdown for w in base.workers]
    jobs = {
        name: load_config(
            args.config,
            {
                "model": {"name": "marques_cnn", "width": args.width},
                "train": {
                    "epochs": args.epochs,
                    "global_batch_size": args.batch,
                    "memory_cap_mode": mode or "accumulate",
                },
                "scheduler": {"live": False},
                "workers": workers(mode is not None),
            },
        )
        for name, mode in CONTENDERS.items()
    }
    init_ray(jobs["accumulate"])
    run_job(jobs["accumulate"], output_dir=args.output / "warmup", progress=False)  # uncounted
    names = list(CONTENDERS)
    order = [n for i in range(args.repeats) for n in (names if i % 2 == 0 else names[::-1])]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in CONTENDERS}
    for index, name in enumerate(order):
        run_job(jobs[name], output_dir=args.output / f"{name}-{index}", progress=False)
        rates = per_step_throughput(captured.records)
        steady = [v for s, v in rates.items() if s >= 3]
        plan = captured.plans[-1]
        runs[name].append(
            {
                "samples_per_s": statistics.median(steady),
                "slices": list(plan["slices"]),
                "steps": len(rates),
            }
        )
        print(f"{name}: {runs[name][-1]['samples_per_s']:.1f} samples/s, slices {plan['slices']}")
    ray.shutdown()
    contenders = {
        name: {
            "memory_cap_mode": CONTENDERS[name] or "no cap",
            "median_samples_per_s": statistics.median(r["samples_per_s"] for r in rs),
            "runs": rs,
        }
        for name, rs in runs.items()
    }
    ratio = (
        contenders["accumulate"]["median_samples_per_s"]
        / contenders["cap-only"]["median_samples_per_s"]
    )
    results = {
        "emulated": True,
        "machine": "2-core shared CPU box; speeds EMULATED (1, 1/2, 1/4)",
        "cap": args.cap,
        "global_batch_size": args.batch,
        "fast_share": round(args.batch * speeds[0] / sum(speeds)),
        "model": f"marques_cnn width {args.width} (no BatchNorm)",
        "contenders": contenders,
        "ratio": ratio,
        "accumulate_vs_uncapped": contenders["accumulate"]["median_samples_per_s"]
        / contenders["uncapped"]["median_samples_per_s"],
        "ideal_ratio": ideal_samples_per_s_ratio(args.cap, args.batch, speeds),
    }
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "bench.json").write_text(json.dumps(results, indent=2))
    _plot(results, args.output / "memory_caps.png")
    print(
        f"\naccumulate {contenders['accumulate']['median_samples_per_s']:.1f} vs cap-only "
        f"{contenders['cap-only']['median_samples_per_s']:.1f} samples/s: {ratio:.2f}x "
        f"(ideal {results['ideal_ratio']:.2f}x); accumulate / uncapped "
        f"{results['accumulate_vs_uncapped']:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
