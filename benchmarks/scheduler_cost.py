"""``python -m benchmarks.scheduler_cost``: what the live scheduler costs a step, measured directly.

Two measurements, neither a difference of two noisy throughputs:

1. **The worker's side, in the worker**: every step record carries ``overhead_s``, the wall
   seconds the library's between-step work took on that rank (pushing records to the
   scheduler actor, the plan-sync collective, the preemption read; see
   :func:`raytrain_hetero.worker.runtime.plan_flow.on_step_end`). Fits of the static plan
   (``hetero``: the scheduler actor records, never re-plans) and the live scheduler
   (``hetero-live``) run side by side in one Ray session on the same seeds, alternating
   (static, live, live, static, ...); the figure is each rank's mean ``overhead_s`` per step
   over its median step time (rank 0's step-to-step wall time of the benchmark's own log),
   so a loaded machine makes both the cost and the step longer, not the ratio meaningless.
   Samples/s of both are printed beside it, with the CPU model and load.
2. **The actor's side, in process**: CPU seconds (``time.thread_time``) the scheduler's
   record intake and live policy take per step, static vs live, on synthetic records of the
   same shape (the actor runs beside the workers: on a small machine its CPU is theirs).

The full side-by-side target of issue 47 (live >= 0.98x static, 3 seeds, on a quiet machine)
is ``python -m benchmarks hetero2 --repeats 3 --slowdown-scale 2 --contenders
hetero,hetero-live``; this script is the direct, load-robust figure.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["actor_cost", "fit_cost", "main"]

CONTENDERS = ("hetero", "hetero-live")


def actor_cost(*, ranks: int = 2, steps: int = 400, push_every: int = 5) -> dict[str, Any]:
    """CPU seconds per step of the scheduler actor's intake (and live policy), static vs live.

    The actor's own methods on synthetic records (two ranks at slices 144/48 by default, busy
    times with 5 % noise), pushed ``push_every`` steps at a time per rank and polled after each
    push, as the workers do; timed on this thread's CPU clock.
    """
    import random

    from raytrain_hetero.core.plan import Plan
    from raytrain_hetero.core.records import StepRecord
    from raytrain_hetero.driver.scheduler import HeteroScheduler

    out: dict[str, Any] = {}
    for name, live in (("hetero", False), ("hetero-live", True)):
        rng = random.Random(0)
        scheduler = HeteroScheduler("cost", live=live)
        plan = Plan.from_shares(192, [3.0] + [1.0] * (ranks - 1))
        scheduler.register_group("g", ranks, plan)
        spent = 0.0
        for first in range(0, steps, push_every):
            for rank in range(ranks):
                batch = []
                for step in range(first, first + push_every):
                    n = plan.slices[rank]
                    busy = n * (0.001 if rank == 0 else 0.003) * (1 + rng.uniform(-0.05, 0.05))
                    batch.append(
                        StepRecord(
                            step=step, epoch=0, rank=rank, worker=f"w{rank}", device="cpu",
                            slice=n, weight=n / 192, compute_s=busy, load_s=0.0, busy_s=busy,
                            samples_per_s=n / busy, loss=1.0, global_samples_per_s=1.0,
                            plan_version=plan.version, group="g", world_size=ranks,
                            wall_s=busy, time=1000.0 + step,
                        )
                    )  # fmt: skip
                started = time.thread_time()
                scheduler.record_steps(batch)
                spent += time.thread_time() - started
            started = time.thread_time()
            scheduler.poll("g", plan.version)
            spent += time.thread_time() - started
        out[name] = {"cpu_ms_per_step": 1e3 * spent / steps, "steps": steps, "ranks": ranks}
    return out


def fit_cost(fit: dict[str, Any], global_batch_size: int) -> dict[str, Any]:
    """The per-step figures of one benchmark fit (``benchmarks.contenders.run_fit``'s answer)."""
    from benchmarks.analysis import fit_figures, rank_timelines

    figures = fit_figures(fit["records"], global_batch_size=global_batch_size, target_accuracy=1.0)
    gaps = []
    for process in rank_timelines(fit["records"]).get(0, []):
        for prev, cur in itertools.pairwise(process):
            if cur["step"] == prev["step"] + 1 and "eval_start" not in prev and cur["step"] >= 2:
                gaps.append(cur["time"] - prev["time"])
    step_s = statistics.median(gaps) if gaps else math.nan
    ranks = []
    for stats in sorted(fit["worker_stats"], key=lambda s: s["rank"]):
        overhead = float(stats.get("overhead_s", math.nan))
        ranks.append(
            {
                "rank": stats["rank"],
                "worker": stats["worker"],
                "overhead_ms": 1e3 * overhead,
                "overhead_of_step": overhead / step_s if step_s > 0 else math.nan,
                "busy_ms": 1e3 * float(stats["busy_s"]),
                "samples_per_s": float(stats["samples_per_s"]),
            }
        )
    return {
        "samples_per_s": figures["samples_per_s"],
        "step_ms": 1e3 * step_s,
        "ranks": ranks,
        "max_overhead_of_step": max((r["overhead_of_step"] for r in ranks), default=math.nan),
        "replans": sum(1 for p in fit["plans"] if str(p.get("reason", "")).startswith("live")),
    }


def _setup(args: argparse.Namespace, scratch: Path) -> Any:
    from benchmarks.contenders import FitSetup
    from benchmarks.data import prepare_bench_data
    from benchmarks.scenarios import SCENARIOS
    from raytrain_hetero.driver.trainer import expand_worker_specs

    scenario = SCENARIOS["hetero2"]
    data = prepare_bench_data(args.data_root, args.samples_per_class)
    specs = [
        s.model_copy(update={"emulated_slowdown": s.emulated_slowdown * args.slowdown_scale})
        for s in expand_worker_specs(scenario.workers)
    ]
    scheduler: dict[str, Any] = {"plan_sync_every": args.plan_sync_every}
    return FitSetup(
        specs=specs,
        data=data.__dict__.copy(),
        width=args.width,
        global_batch_size=args.batch,
        epochs=args.epochs,
        eval_every=0,
        lr=0.05,
        storage=str(scratch / "ray_results"),
        max_steps=args.max_steps,
        scheduler=scheduler,
    )


def _order(repeats: int) -> list[tuple[str, int]]:
    """Static and live alternating A B B A ..., one seed per pair."""
    order: list[tuple[str, int]] = []
    for r in range(repeats):
        pair = CONTENDERS if r % 2 == 0 else CONTENDERS[::-1]
        order += [(c, r) for c in pair]
    return order


def _table(result: dict[str, Any]) -> str:
    lines = [
        f"scheduler cost on {result['machine'].get('cpu_model')} "
        f"(load {result['machine'].get('load_average')}); hetero2 x{result['slowdown_scale']} "
        f"slowdowns, plan_sync_every={result['plan_sync_every']}",
        "",
        "worker side (mean library between-step time per step, measured in the worker):",
        f"{'contender':<12} {'seed':>4} {'samples/s':>10} {'step ms':>8} "
        f"{'rank: overhead ms (% of step)':<44} replans",
    ]
    for fit in result["fits"]:
        cost = fit["cost"]
        per_rank = "  ".join(
            f"r{r['rank']}: {r['overhead_ms']:.2f} ({100 * r['overhead_of_step']:.2f} %)"
            for r in cost["ranks"]
        )
        lines.append(
            f"{fit['contender']:<12} {fit['seed']:>4} {cost['samples_per_s']:>10.1f} "
            f"{cost['step_ms']:>8.1f} {per_rank:<44} {cost['replans']}"
        )
    summary = result["summary"]
    lines += ["", "medians over the fits:"]
    for name in CONTENDERS:
        row = summary.get(name, {})
        lines.append(
            f"  {name:<12} samples/s {row.get('samples_per_s', math.nan):.1f}, worst rank's "
            f"overhead {100 * row.get('max_overhead_of_step', math.nan):.2f} % of a step"
        )
    lines.append(
        f"  live / static samples/s: {summary.get('live_over_static', math.nan):.3f} "
        "(side by side on one machine; noisy when it is loaded, the overhead figures are not)"
    )
    lines += ["", "actor side (CPU per step of record intake + policy + poll, in process):"]
    for name, row in result["actor"].items():
        lines.append(f"  {name:<12} {row['cpu_ms_per_step']:.3f} ms CPU per step")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.scheduler_cost", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--repeats", type=int, default=2, help="seeds (static and live each)")
    parser.add_argument("--max-steps", type=int, default=45, help="steps per fit")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch", type=int, default=192)
    parser.add_argument("--width", type=int, default=32)
    parser.add_argument("--samples-per-class", type=int, default=300)
    parser.add_argument("--slowdown-scale", type=float, default=2.0)
    parser.add_argument("--plan-sync-every", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-root", type=Path, default=Path("data/bench"))
    parser.add_argument("--output", type=Path, default=Path("outputs/bench/scheduler_cost"))
    parser.add_argument("--no-fits", action="store_true", help="the actor's side only")
    args = parser.parse_args(argv)

    from benchmarks.contenders import machine_description

    result: dict[str, Any] = {
        "command": "python -m benchmarks.scheduler_cost " + " ".join(sys.argv[1:]),
        "machine": machine_description(),
        "slowdown_scale": args.slowdown_scale,
        "plan_sync_every": args.plan_sync_every,
        "actor": actor_cost(push_every=max(1, args.plan_sync_every)),
        "fits": [],
        "summary": {},
    }
    if not args.no_fits:
        _run_fits(args, result)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "result.json").write_text(json.dumps(result, indent=1, default=str))
    table = _table(result)
    (args.output / "table.txt").write_text(table + "\n")
    print(table)
    return 0


def _run_fits(args: argparse.Namespace, result: dict[str, Any]) -> None:
    import ray

    from benchmarks.contenders import run_fit
    from raytrain_hetero.driver.session import init_ray

    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
    scratch = Path(tempfile.mkdtemp(prefix="rh-scheduler-cost-"))
    setup = _setup(args, scratch)
    init_ray(num_cpus=len(setup.specs) + 2)
    try:
        saved = setup.max_steps
        setup.max_steps = 3
        run_fit(setup, CONTENDERS[0], scratch / "logs" / "warmup")  # a session's first fit is slow
        setup.max_steps = saved
        for index, (contender, repeat) in enumerate(_order(args.repeats)):
            setup.seed = args.seed + repeat
            fit = run_fit(setup, contender, scratch / "logs" / f"{index:02d}-{contender}")
            entry = {
                "contender": contender,
                "seed": setup.seed,
                "cost": fit_cost(fit, setup.global_batch_size),
                "load_average_1min": os.getloadavg()[0],
            }
            result["fits"].append(entry)
            print(json.dumps({k: entry[k] for k in ("contender", "seed")} | entry["cost"]))
    finally:
        ray.shutdown()
    summary: dict[str, Any] = {}
    for name in CONTENDERS:
        mine = [f["cost"] for f in result["fits"] if f["contender"] == name]
        summary[name] = {
            key: statistics.median(c[key] for c in mine)
            for key in ("samples_per_s", "step_ms", "max_overhead_of_step")
        }
    summary["live_over_static"] = (
        summary["hetero-live"]["samples_per_s"] / summary["hetero"]["samples_per_s"]
    )
    result["summary"] = summary


if __name__ == "__main__":
    sys.exit(main())
