"""``python -m benchmarks.tune_asha --output DIR [--quick]``: issue 34 item 4, a real ASHA search
on a local labelled multi-node cluster with EMULATED node speeds, three ways.

One ``ray.cluster_utils.Cluster`` in this process tree: a head that holds only the trial
drivers (logical CPUs, no ``worker_node`` resource) and ``fast_nodes`` + ``slow_nodes`` worker
nodes of 1 logical CPU and 1 ``worker_node`` each, labelled ``speed: fast|slow``. Every
training worker asks for ``{CPU: 1, worker_node: 1}``, so it lands on a worker node, and the
node's label decides how much slower it runs (EMULATION, the one emulator:
``emulation.node_slowdowns`` -> :func:`raytrain_hetero.worker.measure.emulation.node_slowdown`; a
worker computes, then sleeps ``(k - 1)`` times its own compute time, measured as thread CPU
time). The same search (same space, seed, ASHA grace period and reduction factor, ``trials``
samples drawn by ``BasicVariantGenerator(random_state=seed)``) runs three times:

* ``auto``: ``raytrain-hetero tune`` with ``tune.allocation: auto``: two worker types
  (``fast`` and ``slow``, one label selector each); the search's allocator decides which
  workers each live trial holds and moves trials at epoch ends;
* ``fixed``: today's ``raytrain-hetero tune`` (``tune.allocation: fixed``): every trial gets
  the job's worker list, ``fixed_workers`` worker(s) on any worker node (the node decides its
  speed), and the search runs as many whole trials at once as the cluster holds;
* ``stock``: plain Ray Tune: a function trainable that runs ``ray.train.torch.TorchTrainer``
  at fixed resources (``stock_workers`` workers of ``{CPU: 1, worker_node: 1}``), the loop
  as Ray's docs write it (``prepare_model``: DDP averaging; ``prepare_data_loader``: a
  ``DistributedSampler``, equal ``B / N`` slices), same model, data, SGD and emulated node
  speeds; its trials stop through the same clean abort as ours
  (:func:`raytrain_hetero.tune.trial.abort_train_on_stop`), so ASHA frees their workers at
  once for all three.

Figures per contender: makespan (``Tuner.fit`` wall time), the time from the search's start
until the best trial (highest last ``val_accuracy``, Tune's ``scope="last"``) reported its
final accuracy, that accuracy, trials completed (ran every epoch), epochs each trial ran
(ASHA's stops) and the makespan ratio to ``fixed``. The CPU check the issue asks for, since
the machine has 2 cores: the load average and the CPU seconds per second of this process tree
(Ray's processes are its children) sampled during each search, and per worker type the median
samples/s of the library's step records (``workers/<name>/samples_per_s`` in each report:
``slice / busy_s``) times the type's factor: equal across types when the cores are not what
limits the run. Outputs in ``--output``: ``results.json``, ``results.md`` (the table),
``COMMAND``, and each contender's own outputs under ``<contender>/``.

Do not trust timings from a loaded machine: run it alone.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.tune_check import check_timelines
from benchmarks.tune_cpu import CpuMonitor, hetero_cpu_check, stock_cpu_check
from benchmarks.tune_record import promotion_schedule, write_timeline
from benchmarks.tune_report import (
    format_table,
    num,
    verdicts,
)
from benchmarks.tune_stock import (
    SPEED_LABEL,
    WORKER_RESOURCE,
    run_stock,
    stock_trial,
    stock_tune_loop,
)
from raytrain_hetero.atomic import atomic_write_text
from raytrain_hetero.tune.replay import PromotionReplay, PromotionSchedule

__all__ = [
    "CONTENDERS",
    "FULL",
    "QUICK",
    "CpuMonitor",
    "Setup",
    "format_table",
    "main",
    "run_benchmark",
    "run_contender",
    "search_figures",
    "stock_trial",
    "stock_tune_loop",
    "verdicts",
]

ROOT = Path(__file__).resolve().parents[1]
CONTENDERS = ("fixed", "auto", "stock")


@dataclass(frozen=True)
class Setup:
    """One benchmark size.

    Attributes:
        fast_nodes: Worker nodes labelled ``speed: fast``.
        slow_nodes: Worker nodes labelled ``speed: slow``.
        fast_factor: EMULATED slowdown of a worker on a fast node.
        slow_factor: EMULATED slowdown of a worker on a slow node.
        trials: Samples of the search (ASHA).
        epochs: Every trial's budget (ASHA's ``max_t``).
        grace_period: ASHA's grace period (epochs).
        reduction_factor: ASHA's reduction factor.
        samples_per_class: Synthetic EuroSAT (RGB, 64x64) images per class: 70 % train,
            15 % validation.
        width: ``small_cnn`` width.
        global_batch_size: Every trial's global batch.
        fixed_workers: Workers per trial of ``fixed`` (any worker node).
        stock_workers: Workers per trial of ``stock`` (any worker node).
        max_workers_per_trial: ``auto``: the most workers one trial may hold (None: all).
        restart_s: ``auto``: what the allocator charges a move (seconds; None: the
            trials' measured fit starts, the library's default).
        seed: The search's seed (and every trial's model seed).
        head_cpus: Logical CPUs of the head (trial drivers only).
    """

    fast_nodes: int = 4
    slow_nodes: int = 4
    fast_factor: float = 8.0
    slow_factor: float = 32.0
    trials: int = 8
    epochs: int = 8
    grace_period: int = 1
    reduction_factor: float = 2.0
    samples_per_class: int = 200
    width: int = 32
    global_batch_size: int = 128
    fixed_workers: int = 1
    stock_workers: int = 2
    max_workers_per_trial: int | None = None
    restart_s: float | None = None
    seed: int = 0
    head_cpus: int = 8

    @property
    def worker_nodes(self) -> int:
        """Worker nodes in all."""
        return self.fast_nodes + self.slow_nodes

    @property
    def factors(self) -> dict[str, float]:
        """``{label value: factor}``."""
        return {"fast": self.fast_factor, "slow": self.slow_factor}

    @property
    def emulated_cores(self) -> float:
        """Cores all workers need at most when every node computes at once (sum of 1/k):
        the emulated compute only; loading, collectives and Ray add to it."""
        return self.fast_nodes / self.fast_factor + self.slow_nodes / self.slow_factor


#: The full run (the lead's): ~25 minutes for the three on a quiet 2-core machine.
FULL = Setup()
#: A smoke (~3 minutes): tiny data, 4 trials of 2 epochs on 3 worker nodes.
QUICK = Setup(
    fast_nodes=1,
    slow_nodes=2,
    fast_factor=2.0,
    slow_factor=6.0,
    trials=4,
    epochs=2,
    samples_per_class=20,
    width=8,
    global_batch_size=32,
    head_cpus=4,
)


# ---------------------------------------------------------------------------- the job


def job_dict(setup: Setup, contender: str, data_root: Path, address: str) -> dict[str, Any]:
    """The YAML job (as a dict) of ``auto`` or ``fixed``; ``stock`` reads the same one."""
    resources = {"CPU": 1, WORKER_RESOURCE: 1}
    if contender == "auto":
        workers = [
            {
                "name": speed,
                "resources": resources,
                "device": "cpu",
                "label_selector": {SPEED_LABEL: speed},
            }
            for speed in ("fast", "slow")
        ]
    else:
        workers = [
            {"name": "any", "count": setup.fixed_workers, "resources": resources, "device": "cpu"}
        ]
    tune: dict[str, Any] = {
        "num_samples": setup.trials,
        "metric": "val_accuracy",
        "mode": "max",
        "scheduler": "asha",
        "grace_period": setup.grace_period,
        "reduction_factor": setup.reduction_factor,
        "trial_cpus": 0.25,
        "seed": setup.seed,
        "allocation": "auto" if contender == "auto" else "fixed",
        "search_space": {
            "train.lr": {"loguniform": [0.01, 0.2]},
            "train.weight_decay": {"choice": [0.0, 0.0005]},
        },
    }
    if contender == "auto":
        tune["allocator"] = {
            "max_workers_per_trial": setup.max_workers_per_trial or setup.worker_nodes,
        }
        if setup.restart_s is not None:
            tune["allocator"]["restart_s"] = setup.restart_s
    return {
        "name": f"tune-asha-{contender}",
        "data": {
            "dataset": "eurosat",
            "root": str(data_root),
            "generate": {"samples_per_class": setup.samples_per_class},
            "bands": "rgb",
            "cache": True,
        },
        "model": {"name": "small_cnn", "width": setup.width},
        "train": {
            "epochs": setup.epochs,
            "global_batch_size": setup.global_batch_size,
            "lr": 0.05,
            "seed": setup.seed,
        },
        "workers": workers,
        # EMULATION: the node a worker lands on decides its factor, in all three contenders.
        "emulation": {"node_slowdowns": {SPEED_LABEL: setup.factors}},
        "tune": tune,
        "ray": {"address": address},
    }


# ---------------------------------------------------------------------------- figures


def _reports(storage: Path) -> dict[str, list[dict[str, Any]]]:
    """Every trial's reports (``result.json`` lines), by trial id."""
    trials: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(Path(storage).glob("*/result.json")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        rows = [r for r in rows if "val_accuracy" in r]
        if rows:
            trials[str(rows[0]["trial_id"])] = rows
    return trials


def search_figures(
    reports: Mapping[str, Sequence[Mapping[str, Any]]],
    *,
    started: float,
    wall_s: float,
    epochs: int,
) -> dict[str, Any]:
    """The figures of one search from its trials' reports (``started``: unix seconds when
    the search began): makespan, best trial, its time to its final accuracy, completed
    trials and the epochs each trial ran (in the search's sample order)."""
    order = sorted(reports, key=lambda t: t.rsplit("_", 1)[-1])
    last = {t: reports[t][-1] for t in order}
    scored = [t for t in order if math.isfinite(float(last[t]["val_accuracy"]))]
    best = max(scored, key=lambda t: float(last[t]["val_accuracy"])) if scored else None
    figures: dict[str, Any] = {
        "makespan_s": wall_s,
        "trials": len(order),
        "completed": sum(1 for t in order if int(last[t]["epoch"]) + 1 >= epochs),
        "epochs_per_trial": [int(last[t]["epoch"]) + 1 for t in order],
        "lr_per_trial": [_config_value(reports[t][-1], "train.lr") for t in order],
        "best_trial": best,
        "best_accuracy": float(last[best]["val_accuracy"]) if best else None,
        "best_time_s": float(last[best]["timestamp"]) - started if best else None,
    }
    return figures


def _config_value(row: Mapping[str, Any], key: str) -> Any:
    config = row.get("config") or {}
    return config.get(key)


# ---------------------------------------------------------------------------- running


def run_contender(
    contender: str,
    setup: Setup,
    out: Path,
    data_root: Path,
    address: str,
    verbose: int = 0,
    replay: PromotionSchedule | None = None,
) -> dict[str, Any]:
    """One search; its figures and CPU check (``verbose``: Tune's, and under ``auto`` the
    live allocation view). ``replay``: stop each trial where the schedule says instead of
    ASHA deciding (:class:`~raytrain_hetero.tune.replay.PromotionReplay`). ``auto`` and
    ``fixed`` also write ``<contender>/timeline.json`` (:mod:`benchmarks.tune_record`)."""
    base = job_dict(setup, contender, data_root, address)
    scheduler = PromotionReplay(replay) if replay is not None else None
    with CpuMonitor() as monitor:
        if contender == "stock":
            ran = run_stock(setup, base, out / contender, verbose, scheduler=scheduler)
            reports = _reports(Path(ran["storage"]))
            wall, started = ran["wall_time_s"], ran["started"]
            check = stock_cpu_check(out / contender / "steps", setup.factors)
        else:
            from raytrain_hetero.app.config import validate_config
            from raytrain_hetero.app.tune_job import run_tune

            job = validate_config(base, source=f"{contender} job")
            started = time.time()
            summary = run_tune(
                job,
                output_dir=out / contender,
                verbose=verbose,
                overwrite=True,
                scheduler=scheduler,
            )
            wall = float(summary["wall_time_s"])
            reports = _reports(Path(summary["storage"]))
            check = hetero_cpu_check(reports, setup.factors)
    figures = search_figures(reports, started=started, wall_s=wall, epochs=setup.epochs)
    figures["cpu"] = monitor.summary()
    figures["per_type"] = check
    if contender != "stock":
        figures["timeline"] = str(
            write_timeline(
                out / contender,
                contender=contender,
                summary=summary,
                setup=asdict(setup),
                samples_per_epoch=_split_size(data_root, "train"),
                slots={"fast": setup.fast_nodes, "slow": setup.slow_nodes},
            )
        )
    if replay is not None:
        figures["replay_held"] = list(figures["epochs_per_trial"]) == list(replay.epochs)
    return figures


def _split_size(data_root: Path, split: str) -> int:
    """Samples of a generated EuroSAT split (its split file's lines)."""
    return sum(1 for line in (data_root / f"eurosat-{split}.txt").read_text().splitlines() if line)


def start_cluster(setup: Setup) -> Any:
    """The labelled local cluster, connected."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": setup.head_cpus,
            "include_dashboard": False,
            "object_store_memory": 150 * 2**20,
        },
    )
    for speed, count in (("fast", setup.fast_nodes), ("slow", setup.slow_nodes)):
        for _ in range(count):
            cluster.add_node(
                num_cpus=1,
                resources={WORKER_RESOURCE: 1},
                labels={SPEED_LABEL: speed},
                object_store_memory=100 * 2**20,
            )
    cluster.wait_for_nodes()
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    ray.init(
        address=cluster.address,
        log_to_driver=False,
        runtime_env={
            "env_vars": {"PYTHONPATH": pythonpath, "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"}
        },
    )
    return cluster


def run_benchmark(
    setup: Setup,
    contenders: Sequence[str],
    out: Path,
    *,
    command: str,
    replay: PromotionSchedule | None = None,
    verbose: int = 0,
    quick: bool = False,
) -> int:
    """Start the labelled cluster, run the contenders in order, write ``results.json`` and
    ``results.md`` after each (what ran survives a later failure) and, at the end, the
    simulator's check against the ``auto`` and ``fixed`` searches; 1 if a contender failed."""
    import ray

    from benchmarks.contenders import machine_description

    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "COMMAND", command + "\n")
    if replay is not None:
        replay.save(out / "promotions.json")
    machine = machine_description()  # before the run: its load average says how quiet

    def write(results: dict[str, Any], errors: dict[str, str], check: Any = None) -> str:
        result = {
            "setup": asdict(setup),
            "quick": quick,
            "emulated": True,
            "emulated_cores": setup.emulated_cores,
            "command": command,
            "machine": machine,
            "contenders": results,
            "errors": errors,
            "verdicts": verdicts(results, replayed=replay is not None),
            "replay": replay.to_dict() if replay is not None else None,
            "sim_check": check,
        }
        table = format_table(result)
        atomic_write_text(out / "results.json", json.dumps(result, indent=2, default=str) + "\n")
        atomic_write_text(out / "results.md", table)
        return table

    cluster = start_cluster(setup)
    results: dict[str, Any] = {}
    errors: dict[str, str] = {}
    try:
        for contender in contenders:
            t0 = time.perf_counter()
            try:
                figures = run_contender(
                    contender,
                    setup,
                    out,
                    out / "data" / "eurosat",
                    cluster.address,
                    verbose,
                    replay,
                )
            except Exception as exc:  # noqa: BLE001 - the others still run and are written
                errors[contender] = f"{type(exc).__name__}: {exc}"
                print(f"{contender}: FAILED: {errors[contender]}", file=sys.stderr, flush=True)
                write(results, errors)
                continue
            results[contender] = figures
            print(
                f"{contender}: makespan {figures['makespan_s']:.0f} s, best "
                f"{num(figures['best_accuracy'], '.4f')}, epochs per trial "
                f"{figures['epochs_per_trial']} ({time.perf_counter() - t0:.0f} s with outputs)",
                flush=True,
            )
            write(results, errors)
    finally:
        ray.shutdown()
        cluster.shutdown()
    timelines = [Path(f["timeline"]) for f in results.values() if f.get("timeline")]
    check = check_timelines(timelines) if timelines else None
    table = write(results, errors, check)
    print()
    print(table)
    return 1 if errors else 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.tune_asha``."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.tune_asha", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--output", type=Path, default=Path("outputs/bench/tune_asha"))
    parser.add_argument("--quick", action="store_true", help="a ~3-minute smoke (tiny sizes)")
    parser.add_argument(
        "--contenders",
        default=",".join(CONTENDERS),
        help=f"comma-separated, in running order (default {','.join(CONTENDERS)})",
    )
    parser.add_argument("--seed", type=int, default=None, help="the search's seed (default 0)")
    parser.add_argument(
        "--max-workers-per-trial",
        type=int,
        default=None,
        help="auto: the most workers one trial may hold (default: every worker node)",
    )
    parser.add_argument(
        "--replay",
        type=Path,
        default=None,
        help="replay the stops of a recorded search (a tune_asha results.json, its "
        "--replay-contender's; or a promotions.json) for every contender",
    )
    parser.add_argument("--replay-contender", default="fixed")
    parser.add_argument(
        "--replay-epochs",
        default=None,
        help="replay these epochs per trial (comma-separated, in sample order)",
    )
    parser.add_argument(
        "--verbose",
        type=int,
        default=0,
        help="Tune's progress output (1: its tables and, under auto, the allocation lines)",
    )
    args = parser.parse_args(argv)
    setup = QUICK if args.quick else FULL
    if args.seed is not None:
        setup = replace(setup, seed=args.seed)
    if args.max_workers_per_trial is not None:
        setup = replace(setup, max_workers_per_trial=args.max_workers_per_trial)
    contenders = [c for c in args.contenders.split(",") if c]
    unknown = sorted(set(contenders) - set(CONTENDERS))
    if unknown:
        parser.error(f"unknown contender(s) {unknown}; known: {', '.join(CONTENDERS)}")
    replay = _replay(parser, args, setup)
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
    command = shlex.join(["python", "-m", "benchmarks.tune_asha", *sys.argv[1:]])
    return run_benchmark(
        setup,
        contenders,
        args.output.resolve(),
        command=command,
        replay=replay,
        verbose=args.verbose,
        quick=args.quick,
    )


def _replay(parser: Any, args: Any, setup: Setup) -> PromotionSchedule | None:
    """The schedule ``--replay`` / ``--replay-epochs`` name, checked against the setup."""
    if args.replay is not None and args.replay_epochs is not None:
        parser.error("give --replay or --replay-epochs, not both")
    if args.replay is not None:
        schedule = promotion_schedule(args.replay, args.replay_contender)
    elif args.replay_epochs is not None:
        epochs = tuple(int(e) for e in args.replay_epochs.split(",") if e.strip())
        schedule = PromotionSchedule(epochs, (), f"--replay-epochs {args.replay_epochs}")
    else:
        return None
    if len(schedule.epochs) != setup.trials or max(schedule.epochs) > setup.epochs:
        parser.error(
            f"the replayed schedule has {len(schedule.epochs)} trials of at most "
            f"{max(schedule.epochs)} epochs; this setup runs {setup.trials} trials of "
            f"{setup.epochs}: record it from a search of the same size"
        )
    return schedule


if __name__ == "__main__":
    sys.exit(main())
