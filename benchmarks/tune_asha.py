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
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from raytrain_hetero.atomic import atomic_write_text
from raytrain_hetero.tune.trial import abort_train_on_stop

__all__ = [
    "CONTENDERS",
    "FULL",
    "QUICK",
    "CpuMonitor",
    "Setup",
    "main",
    "search_figures",
    "stock_trial",
    "stock_tune_loop",
]

ROOT = Path(__file__).resolve().parents[1]
#: The node label whose value decides a worker's emulated factor.
SPEED_LABEL = "speed"
#: The custom resource only worker nodes have (keeps workers off the head).
WORKER_RESOURCE = "worker_node"
CONTENDERS = ("fixed", "auto", "stock")
#: Done-when of issue 34 item 4.
TARGET_MAKESPAN_VS_FIXED = 1.3
TARGET_ACCURACY_PT = 0.5


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


# ---------------------------------------------------------------------------- stock


def stock_tune_loop(config: dict[str, Any]) -> None:
    """Per-worker loop of ``stock``: Ray's docs' loop (``prepare_model``, a ``DataLoader`` of
    ``B / N`` through ``prepare_data_loader``, ``set_epoch``), one report per epoch with rank
    0's validation accuracy and a small checkpoint; EMULATED node speed through the one
    emulator (:class:`raytrain_hetero.app.bench_stock.StockEmulation`, the factor from this
    node's label). Every rank appends its steps to ``<out>/rank<r>_<pid>.jsonl``.
    """
    import ray.train
    import ray.train.torch
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader

    from raytrain_hetero.app.bench_stock import StockEmulation
    from raytrain_hetero.app.config import validate_config
    from raytrain_hetero.app.datasets import open_worker_data
    from raytrain_hetero.worker.measure.emulation import (
        SlowdownSchedule,
        current_node_labels,
        node_slowdown,
    )
    from raytrain_hetero.workloads.evaluation import dataset_accuracy

    job = validate_config(config["job"], source="stock job on a worker")
    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    labels = current_node_labels()
    factor = node_slowdown(job.emulation.node_slowdowns, labels)
    speed = labels.get(SPEED_LABEL, "?")
    device = torch.device("cpu")
    torch.set_num_threads(1)
    torch.manual_seed(job.train.seed)
    _, datasets, model = open_worker_data(job, ("train", "val"))
    model = ray.train.torch.prepare_model(model, move_to_device=device)
    emulation = StockEmulation(SlowdownSchedule(factor, worker=speed, rank=rank), device)
    emulation.install(model)
    loader = DataLoader(
        datasets["train"], batch_size=max(1, job.train.global_batch_size // world), shuffle=True
    )
    loader = ray.train.torch.prepare_data_loader(loader, move_to_device=False)
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=job.train.lr,
        momentum=job.train.momentum,
        weight_decay=job.train.weight_decay,
    )
    out = Path(config["out"])
    out.mkdir(parents=True, exist_ok=True)
    with (out / f"rank{rank}_{os.getpid()}.jsonl").open("a", buffering=1) as log:
        for epoch in range(job.train.epochs):
            model.train()
            sampler = getattr(loader, "sampler", None)
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
            for batch in loader:
                x, y = batch["image"].to(device), batch["label"].to(device)
                started = time.time()
                loss = F.cross_entropy(model(x), y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()  # the comm hook stretches before each all-reduce
                optimizer.step()
                emulation.step += 1
                log.write(
                    json.dumps(
                        {
                            "epoch": epoch,
                            "rank": rank,
                            "speed": speed,
                            "factor": factor,
                            "slice": int(y.shape[0]),
                            "start": started,
                            "end": time.time(),
                        }
                    )
                    + "\n"
                )
            metrics: dict[str, Any] = {"epoch": epoch}
            if rank != 0:
                ray.train.report(metrics)
                continue
            inner = getattr(model, "module", model)
            metrics["val_accuracy"] = dataset_accuracy(inner, datasets["val"], device)
            with tempfile.TemporaryDirectory() as directory:
                Path(directory, "epoch").write_text(f"{epoch}\n")
                ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(directory))


@abort_train_on_stop
def stock_trial(
    params: dict[str, Any],
    *,
    base_job: dict[str, Any],
    workers: int,
    storage_path: str,
    steps_dir: str,
) -> None:
    """Tune function trainable of ``stock``: a ``TorchTrainer`` at fixed resources."""
    from ray import tune
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from raytrain_hetero.app.config import JobConfig
    from raytrain_hetero.app.tune_job import trial_job
    from raytrain_hetero.tune.trial import trial_report_callback

    job = trial_job(JobConfig.model_validate(base_job), params)
    context = tune.get_context()
    trial_id = context.get_trial_id()
    trainer = TorchTrainer(
        stock_tune_loop,
        train_loop_config={
            "job": job.model_dump(mode="json"),
            "out": str(Path(steps_dir) / trial_id),
        },
        scaling_config=ScalingConfig(
            num_workers=workers, resources_per_worker={"CPU": 1, WORKER_RESOURCE: 1}
        ),
        run_config=RunConfig(
            name=f"{context.get_experiment_name()}-{trial_id}",
            storage_path=storage_path,
            # The same report path and clean stop as ours: ASHA's stops free the workers.
            callbacks=[trial_report_callback()],
        ),
    )
    trainer.fit()


def run_stock(setup: Setup, base: dict[str, Any], out: Path, verbose: int = 0) -> dict[str, Any]:
    """The ``stock`` search; returns ``{"wall_time_s", "storage", "started"}``."""
    from ray import tune
    from ray.tune.search.basic_variant import BasicVariantGenerator

    # By reference from its module (not __main__), so Tune's workers can import it.
    from benchmarks.tune_asha import stock_trial as trainable
    from raytrain_hetero.app.config import validate_config
    from raytrain_hetero.app.job import prepare_dataset
    from raytrain_hetero.tune.search import param_space, trial_scheduler

    job = validate_config(base, source="stock job")
    cfg = job.tune
    assert cfg is not None
    prepare_dataset(job)  # generated once (cached) for all three
    out.mkdir(parents=True, exist_ok=True)
    storage = out / "ray_results"
    name = f"tune-asha-stock-{time.strftime('%Y%m%d-%H%M%S')}"
    tuner = tune.Tuner(
        tune.with_resources(
            tune.with_parameters(
                trainable,
                base_job=job.model_dump(mode="json"),
                workers=setup.stock_workers,
                storage_path=str(storage),
                steps_dir=str(out / "steps"),
            ),
            {"cpu": cfg.trial_cpus},
        ),
        param_space=param_space(cfg.search_space),
        tune_config=tune.TuneConfig(
            metric=cfg.metric,
            mode=cfg.mode,
            scheduler=trial_scheduler(
                "asha",
                max_epochs=job.train.epochs,
                grace_period=cfg.grace_period,
                reduction_factor=cfg.reduction_factor,
            ),
            search_alg=BasicVariantGenerator(random_state=cfg.seed),
            num_samples=cfg.num_samples,
        ),
        run_config=tune.RunConfig(name=name, storage_path=str(storage), verbose=verbose),
    )
    started = time.time()
    t0 = time.perf_counter()
    tuner.fit()
    return {
        "wall_time_s": time.perf_counter() - t0,
        "storage": str(storage / name),
        "started": started,
    }


# ---------------------------------------------------------------------------- figures


class CpuMonitor:
    """Samples, every ``interval_s`` while running: the 1-minute load average, the machine's
    busy cores (``/proc/stat``) and the CPU seconds per second of this process's tree (Ray's
    raylets and workers are its descendants; a process that ended between two samples loses
    its last interval)."""

    def __init__(self, interval_s: float = 2.0) -> None:
        self.interval_s = interval_s
        self.samples: list[dict[str, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> CpuMonitor:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        ticks = os.sysconf("SC_CLK_TCK")
        before_tree, before_stat, before_t = _tree_ticks(), _machine_ticks(), time.monotonic()
        while not self._stop.wait(self.interval_s):
            tree, stat, now = _tree_ticks(), _machine_ticks(), time.monotonic()
            dt = max(now - before_t, 1e-6)
            used = sum(t - before_tree[p] for p, t in tree.items() if p in before_tree)
            sample = {
                "t": now,
                "load1": os.getloadavg()[0],
                "tree_cores": used / ticks / dt,
            }
            if stat is not None and before_stat is not None:
                busy = (stat[0] - before_stat[0]) / max(stat[1] - before_stat[1], 1)
                sample["machine_cores"] = busy * (os.cpu_count() or 1)
            self.samples.append(sample)
            before_tree, before_stat, before_t = tree, stat, now

    def summary(self) -> dict[str, float | None]:
        """Mean and max of each series (None without samples)."""
        out: dict[str, float | None] = {}
        for key in ("load1", "tree_cores", "machine_cores"):
            values = [s[key] for s in self.samples if key in s]
            out[f"{key}_mean"] = statistics.fmean(values) if values else None
            out[f"{key}_max"] = max(values) if values else None
        return out


def _machine_ticks() -> tuple[int, int] | None:
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return sum(fields) - idle, sum(fields)


def _tree_ticks() -> dict[int, int]:
    """utime + stime (clock ticks) of this process and every descendant."""
    parents: dict[int, int] = {}
    times: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        rest = text[text.rfind(")") + 2 :].split()
        # rest[0] is the state; ppid, then utime and stime are fields 4, 14, 15 of stat.
        parents[int(entry.name)] = int(rest[1])
        times[int(entry.name)] = int(rest[11]) + int(rest[12])
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    tree, todo = {}, [os.getpid()]
    while todo:
        pid = todo.pop()
        if pid in times:
            tree[pid] = times[pid]
        todo.extend(children.get(pid, ()))
    return tree


def _reports(storage: Path) -> dict[str, list[dict[str, Any]]]:
    """Every trial's reports (``result.json`` lines), by trial id."""
    trials: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(Path(storage).glob("*/result.json")):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        rows = [r for r in rows if "val_accuracy" in r]
        if rows:
            trials[str(rows[0]["trial_id"])] = rows
    return trials


def _worker_rates(row: Mapping[str, Any]) -> dict[str, float]:
    """``{worker name: samples/s}`` of one report (nested or flattened keys)."""
    rates: dict[str, float] = {}
    nested = row.get("workers")
    if isinstance(nested, Mapping):
        for name, values in nested.items():
            if isinstance(values, Mapping) and values.get("samples_per_s") is not None:
                rates[name] = float(values["samples_per_s"])
    for key, value in row.items():
        parts = key.split("/")
        if len(parts) == 3 and parts[0] == "workers" and parts[2] == "samples_per_s":
            rates[parts[1]] = float(value)
    return {k: v for k, v in rates.items() if math.isfinite(v) and v > 0}


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


def hetero_cpu_check(
    reports: Mapping[str, Sequence[Mapping[str, Any]]], factors: Mapping[str, float]
) -> dict[str, Any]:
    """Per worker type (the name before ``-<k>``, ``fast``/``slow`` under ``auto``): the
    median samples/s over every report of every worker, and that times the type's factor (the
    unslowed speed it implies: equal across types when the cores do not limit the run)."""
    rates: dict[str, list[float]] = {}
    for rows in reports.values():
        for row in rows:
            for name, rate in _worker_rates(row).items():
                rates.setdefault(name.rsplit("-", 1)[0], []).append(rate)
    return _per_type(rates, factors)


def stock_cpu_check(steps_dir: Path, factors: Mapping[str, float]) -> dict[str, Any]:
    """``stock``'s own step logs: per node speed, the median of each rank's slice over the
    time from its batch in hand to its optimizer step (its compute, stretched, plus the wait
    for the slowest rank in DDP's all-reduce: a fast rank's figure is its group's)."""
    rates: dict[str, list[float]] = {}
    for path in Path(steps_dir).glob("*/rank*.jsonl"):
        for line in path.read_text().splitlines():
            step = json.loads(line)
            span = float(step["end"]) - float(step["start"])
            if span > 0:
                rates.setdefault(str(step["speed"]), []).append(float(step["slice"]) / span)
    return _per_type(rates, factors)


def _per_type(rates: Mapping[str, list[float]], factors: Mapping[str, float]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, values in sorted(rates.items()):
        median = statistics.median(values)
        factor = factors.get(name)
        out[name] = {
            "samples_per_s": median,
            "reports": len(values),
            "factor": factor,
            "unslowed_samples_per_s": median * factor if factor else None,
        }
    fast, slow = out.get("fast"), out.get("slow")
    if fast and slow and slow["samples_per_s"] > 0:
        out["fast_over_slow"] = fast["samples_per_s"] / slow["samples_per_s"]
        out["expected_fast_over_slow"] = factors["slow"] / factors["fast"]
    return out


# ---------------------------------------------------------------------------- running


def run_contender(
    contender: str, setup: Setup, out: Path, data_root: Path, address: str, verbose: int = 0
) -> dict[str, Any]:
    """One search; its figures and CPU check (``verbose``: Tune's, and under ``auto`` the
    live allocation view)."""
    base = job_dict(setup, contender, data_root, address)
    with CpuMonitor() as monitor:
        if contender == "stock":
            ran = run_stock(setup, base, out / contender, verbose)
            reports = _reports(Path(ran["storage"]))
            wall, started = ran["wall_time_s"], ran["started"]
            check = stock_cpu_check(out / contender / "steps", setup.factors)
        else:
            from raytrain_hetero.app.config import validate_config
            from raytrain_hetero.app.tune_job import run_tune

            job = validate_config(base, source=f"{contender} job")
            started = time.time()
            summary = run_tune(job, output_dir=out / contender, verbose=verbose, overwrite=True)
            wall = float(summary["wall_time_s"])
            reports = _reports(Path(summary["storage"]))
            check = hetero_cpu_check(reports, setup.factors)
    figures = search_figures(reports, started=started, wall_s=wall, epochs=setup.epochs)
    figures["cpu"] = monitor.summary()
    figures["per_type"] = check
    return figures


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


def verdicts(results: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """Ratios to ``fixed`` and the done-when."""
    fixed = results.get("fixed")
    out: dict[str, Any] = {}
    for name, figures in results.items():
        if fixed and figures.get("makespan_s"):
            figures_ratio = fixed["makespan_s"] / figures["makespan_s"]
            out[name] = {"fixed_makespan_over_this": figures_ratio}
    auto = results.get("auto")
    if fixed and auto and auto.get("best_accuracy") is not None:
        gap = 100 * ((fixed.get("best_accuracy") or 0.0) - auto["best_accuracy"])
        ratio = out["auto"]["fixed_makespan_over_this"]
        out["done_when"] = {
            "makespan_vs_fixed": ratio,
            "makespan_met": ratio >= TARGET_MAKESPAN_VS_FIXED,
            "accuracy_gap_pt": gap,
            "accuracy_met": gap <= TARGET_ACCURACY_PT,
        }
    return out


def format_table(result: Mapping[str, Any]) -> str:
    """The table, the CPU check and the done-when, as Markdown."""
    setup = result["setup"]
    results = result["contenders"]
    ratios = result["verdicts"]
    lines = [
        f"# ASHA search, {setup['trials']} trials x {setup['epochs']} epochs, "
        f"{setup['fast_nodes']} fast + {setup['slow_nodes']} slow worker nodes "
        "(EMULATED speeds)",
        "",
        f"EMULATED: a worker on a fast node runs {setup['fast_factor']:g}x slower than this "
        f"CPU, on a slow node {setup['slow_factor']:g}x (the node's `speed` label decides, in "
        f"all three); all workers computing at once need {result['emulated_cores']:.2f} cores "
        "of emulated compute (loading, collectives and Ray add to it).",
        "",
        "| contender | makespan s | best reaches final acc. s | best acc. | completed | "
        "epochs per trial | fixed/this makespan |",
        "|---|---:|---:|---:|---:|---|---:|",
    ]
    for name, f in results.items():
        ratio = ratios.get(name, {}).get("fixed_makespan_over_this")
        lines.append(
            f"| {name} | {f['makespan_s']:.0f} | {_num(f['best_time_s'], '.0f')} | "
            f"{_num(f['best_accuracy'], '.4f')} | {f['completed']}/{f['trials']} | "
            f"{' '.join(str(e) for e in f['epochs_per_trial'])} | {_num(ratio, '.2f')} |"
        )
    lines += [
        "",
        "CPU check (this machine: "
        f"{result['machine'].get('logical_cpus')} cores; sampled every 2 s during each search):",
        "",
        "| contender | load1 mean / max | this tree's cores mean / max | machine busy cores mean "
        "| per type: median samples/s (x factor) | fast/slow (expected) |",
        "|---|---|---|---|---|---|",
    ]
    for name, f in results.items():
        cpu, types = f["cpu"], f["per_type"]
        per = ", ".join(
            f"{t} {v['samples_per_s']:.1f} (x{v['factor']:g} = {v['unslowed_samples_per_s']:.0f})"
            for t, v in types.items()
            if isinstance(v, dict) and v.get("factor")
        )
        ratio = (
            f"{types['fast_over_slow']:.2f} ({types['expected_fast_over_slow']:.2f})"
            if "fast_over_slow" in types
            else "-"
        )
        lines.append(
            f"| {name} | {_num(cpu['load1_mean'], '.2f')} / {_num(cpu['load1_max'], '.2f')} | "
            f"{_num(cpu['tree_cores_mean'], '.2f')} / {_num(cpu['tree_cores_max'], '.2f')} | "
            f"{_num(cpu['machine_cores_mean'], '.2f')} | {per or '-'} | {ratio} |"
        )
    lines += [
        "",
        "Per-type samples/s: `auto` and `fixed` from the library's step records "
        "(`workers/<name>/samples_per_s`, slice / busy seconds, in each report; `fixed`'s "
        "workers are all named `any`, so its figure mixes node speeds); `stock` from its own "
        "step logs (slice / batch-to-optimizer-step seconds, which include DDP's wait for "
        "the slowest rank). When the cores are not the limit, `auto`'s x-factor figures "
        "agree across types and fast/slow matches the expected ratio.",
    ]
    done = ratios.get("done_when")
    if done:
        lines += [
            "",
            f"Done-when (issue 34): makespan >= {TARGET_MAKESPAN_VS_FIXED}x better than fixed: "
            f"{done['makespan_vs_fixed']:.2f}x, {'met' if done['makespan_met'] else 'NOT met'}; "
            f"best accuracy within {TARGET_ACCURACY_PT} pt: auto's "
            f"{-done['accuracy_gap_pt']:+.2f} pt against fixed's, "
            f"{'met' if done['accuracy_met'] else 'NOT met'}.",
        ]
    for name, error in (result.get("errors") or {}).items():
        lines += ["", f"{name} FAILED: {error}"]
    lines += ["", "One run per contender, in the order listed; the search is seeded alike."]
    return "\n".join(lines) + "\n"


def _num(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


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
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
    out = args.output.resolve()
    out.mkdir(parents=True, exist_ok=True)
    command = shlex.join(["python", "-m", "benchmarks.tune_asha", *sys.argv[1:]])
    atomic_write_text(out / "COMMAND", command + "\n")
    import ray

    from benchmarks.contenders import machine_description

    machine = machine_description()  # before the run: its load average says how quiet

    def write(results: dict[str, Any], errors: dict[str, str]) -> str:
        result = {
            "setup": asdict(setup),
            "quick": args.quick,
            "emulated": True,
            "emulated_cores": setup.emulated_cores,
            "command": command,
            "machine": machine,
            "contenders": results,
            "errors": errors,
            "verdicts": verdicts(results),
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
                    contender, setup, out, out / "data" / "eurosat", cluster.address, args.verbose
                )
            except Exception as exc:  # noqa: BLE001 - the others still run and are written
                errors[contender] = f"{type(exc).__name__}: {exc}"
                print(f"{contender}: FAILED: {errors[contender]}", file=sys.stderr, flush=True)
                write(results, errors)
                continue
            results[contender] = figures
            print(
                f"{contender}: makespan {figures['makespan_s']:.0f} s, best "
                f"{_num(figures['best_accuracy'], '.4f')}, epochs per trial "
                f"{figures['epochs_per_trial']} ({time.perf_counter() - t0:.0f} s with outputs)",
                flush=True,
            )
            write(results, errors)  # what ran so far survives a later failure
    finally:
        ray.shutdown()
        cluster.shutdown()
    table = write(results, errors)
    print()
    print(table)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
