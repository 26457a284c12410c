"""``admission: all`` vs ``auto`` side by side: measured samples/s beside the prediction.

Three 1-CPU workers in one local Ray session: two real-speed ones and one EMULATED 20x slower
one behind an EMULATED slow link (it sleeps ``--delay`` seconds before every gradient
all-reduce, so the whole group waits for it). A small MLP on synthetic tensors, B samples per
step. Fits alternate A B B A (after one uncounted warm-up fit); each fit's steady samples/s is
the median of the per-step global samples/s after its first ``--skip`` steps. The ``auto``
fits' admission decision gives the predicted samples/s with every worker and with the
admitted ones, printed beside the measured figures; their wall time includes the probe, the
admission measurement and the group's restart without the left-out worker.

    RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.2 \
        python -m benchmarks.admission --output benchmarks/results/admission
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.replan_recovery import per_step_throughput

__all__ = ["admission_bench_loop", "main"]


def admission_bench_loop(config: dict[str, Any]) -> None:
    """Per-worker loop: a few epochs of an MLP on seeded synthetic tensors."""
    import torch
    import torch.nn.functional as F

    import raytrain_hetero as rh

    generator = torch.Generator().manual_seed(1)
    x = torch.randn(config["size"], 64, generator=generator)
    y = (x[:, :3].argmax(dim=1)).long()
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(64, 768),
        torch.nn.ReLU(),
        torch.nn.Linear(768, 768),
        torch.nn.ReLU(),
        torch.nn.Linear(768, 3),
    )
    model = rh.prepare_model(net)
    optim = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = rh.prepare_data_loader(torch.utils.data.TensorDataset(x, y))
    for _ in range(loader.epoch, config["epochs"]):
        for xb, yb in loader:
            loss = F.cross_entropy(model(xb), yb)
            optim.zero_grad()
            loss.backward()
            optim.step()
    rh.report({"done": 1})


def _fit(admission: str, args: argparse.Namespace, storage: Path) -> dict[str, Any]:
    from ray.train import RunConfig

    from raytrain_hetero import HeteroTrainer, WorkerSpec
    from raytrain_hetero.config import BatchConfig, ProbeConfig

    trainer = HeteroTrainer(
        admission_bench_loop,
        train_loop_config={"size": args.batch * args.steps, "epochs": 1},
        workers=[
            WorkerSpec(name="fast", count=2),
            WorkerSpec(
                name="slow", emulated_slowdown=args.slowdown, emulated_collective_delay_s=args.delay
            ),
        ],
        batch=BatchConfig(global_batch_size=args.batch),
        probe=ProbeConfig(admission=admission, calibration_steps=1, calibration_rounds=1),
        scheduler={"live": False},
        run_config=RunConfig(name=f"admission-{uuid.uuid4().hex[:8]}", storage_path=str(storage)),
    )
    started = time.perf_counter()
    result = trainer.fit()
    wall = time.perf_counter() - started
    if result.error is not None:
        raise result.error
    throughput = per_step_throughput(list(trainer.step_records))
    steady = [v for s, v in sorted(throughput.items()) if s >= args.skip]
    return {
        "admission": admission,
        "samples_per_s": statistics.median(steady),
        "wall_s": wall,
        "world_sizes": sorted({p.world_size for p in trainer.plans}),
        "decision": trainer.admission,
    }


def _plot(summary: dict[str, Any], path: Path) -> None:
    from benchmarks.plots import _figure, _save

    fig = _figure((6.0, 3.2))
    ax = fig.add_subplot()
    names = ["all (3 workers)", "auto (slow one left out)"]
    measured = [summary["all"]["measured_samples_per_s"], summary["auto"]["measured_samples_per_s"]]
    predicted = [
        summary["all"]["predicted_samples_per_s"],
        summary["auto"]["predicted_samples_per_s"],
    ]
    positions = [0, 1]
    ax.bar([p - 0.18 for p in positions], measured, width=0.36, label="measured", color="#1f77b4")
    ax.bar([p + 0.18 for p in positions], predicted, width=0.36, label="predicted", color="#aec7e8")
    ax.set_xticks(positions, names)
    ax.set_ylabel("samples/s")
    ax.set_title("admission (EMULATED: 20x slower worker behind a slow link)")
    ax.legend()
    _save(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=96)
    parser.add_argument("--steps", type=int, default=30, help="steps per fit (one epoch)")
    parser.add_argument("--skip", type=int, default=5, help="first steps left out of steady")
    parser.add_argument("--slowdown", type=float, default=20.0)
    parser.add_argument("--delay", type=float, default=0.1, help="EMULATED link delay, s")
    parser.add_argument("--output", type=Path, default=Path("outputs/bench_admission"))
    args = parser.parse_args(argv)

    import ray

    from raytrain_hetero.driver.session import init_ray

    args.output.mkdir(parents=True, exist_ok=True)
    storage = Path(tempfile.mkdtemp(prefix="bench-admission-"))
    init_ray(num_cpus=4)  # three 1-CPU workers and Ray's helpers on a 2-core machine
    _fit("all", args, storage)  # warm-up, not counted
    fits = [_fit(mode, args, storage) for mode in ("all", "auto", "auto", "all")]
    ray.shutdown()
    decision = next(f["decision"] for f in fits if f["decision"] is not None)
    summary: dict[str, Any] = {"fits": fits, "args": {k: str(v) for k, v in vars(args).items()}}
    for mode, predicted in (
        ("all", decision["all_samples_per_s"]),
        ("auto", decision["admitted_samples_per_s"]),
    ):
        mine = [f for f in fits if f["admission"] == mode]
        summary[mode] = {
            "measured_samples_per_s": statistics.median(f["samples_per_s"] for f in mine),
            "predicted_samples_per_s": predicted,
            "wall_s": statistics.median(f["wall_s"] for f in mine),
            "world_sizes": sorted({w for f in mine for w in f["world_sizes"]}),
        }
    summary["auto_over_all"] = (
        summary["auto"]["measured_samples_per_s"] / summary["all"]["measured_samples_per_s"]
    )
    (args.output / "bench.json").write_text(json.dumps(summary, indent=2))
    (args.output / "COMMAND").write_text(
        "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S=0.2 python -m benchmarks.admission "
        + " ".join(argv or sys.argv[1:])
        + "\n"
    )
    _plot(summary, args.output / "admission.png")
    for mode in ("all", "auto"):
        row = summary[mode]
        print(
            f"admission {mode}: measured {row['measured_samples_per_s']:.0f} samples/s, "
            f"predicted {row['predicted_samples_per_s']:.0f}, fit wall {row['wall_s']:.1f} s, "
            f"world sizes {row['world_sizes']}"
        )
    print(f"auto / all: {summary['auto_over_all']:.2f}x   ({decision['summary']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
