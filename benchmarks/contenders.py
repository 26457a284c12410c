"""Running one fit of one contender, and timing each worker alone, on a live Ray session."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ContenderWorkers",
    "FitSetup",
    "contender_workers",
    "machine_description",
    "measure_alone_speeds",
    "read_logs",
    "run_fit",
]


@dataclass
class FitSetup:
    """Everything a fit of any contender needs (identical across contenders).

    Attributes:
        specs: Expanded WorkerSpecs (one per worker slot, in order).
        data: BenchData fields.
        width: SmallCNN width.
        global_batch_size: Samples per step.
        epochs: Epochs (each a multiple of the global batch).
        eval_every: Steps between rank 0's validations (0: only at the end).
        lr: SGD learning rate (momentum 0.9, weight decay 5e-4).
        schedule: Injected slowdowns by worker name (``worker``, ``factor``, ``from_step``).
        storage: Directory for Ray Train run storage.
        seed: Seed of the model and the shuffles.
        max_steps: Stop after this many steps (None: all epochs).
        probe: ProbeConfig fields for the raytrain_hetero contenders.
        scheduler: SchedulerConfig fields (``live`` excepted: the contender sets it) for the
            raytrain_hetero contenders, e.g. ``{"plan_sync_every": 2, "policy": {...}}``.
        min_workers: Elastic: start with this many, grow to all slots.
        monitor_interval_s: Elastic resize monitor interval (both stock and raytrain_hetero).
        extra_loop: Further loop config (join: checkpoint_every, stop_at_world, ...).
        gpu_loader_workers: DataLoader processes of every CUDA rank.
        best_subset: Indices of the workers the ``best-subset`` contender runs
            (:mod:`benchmarks.best_subset` finds them).
        cpu_sets: Cores each worker (by name) is pinned to, every contender alike
            (:mod:`benchmarks.pinning`); None: no pinning.
        gpu_stand_ins: Names of the CPU workers ``gpu-alone`` runs instead of the CUDA ones
            (a dry run of the device check on a machine without a GPU); None: the CUDA ones.
    """

    specs: list[Any]
    data: dict[str, Any]
    width: int
    global_batch_size: int
    epochs: int
    eval_every: int
    lr: float
    schedule: tuple[dict[str, Any], ...] = ()
    storage: str = ""
    seed: int = 0
    max_steps: int | None = None
    probe: dict[str, Any] = field(default_factory=dict)
    scheduler: dict[str, Any] = field(default_factory=dict)
    min_workers: int | None = None
    monitor_interval_s: float = 5.0
    extra_loop: dict[str, Any] = field(default_factory=dict)
    gpu_loader_workers: int = 0
    best_subset: tuple[int, ...] | None = None
    cpu_sets: dict[str, list[int]] | None = None
    gpu_stand_ins: tuple[str, ...] | None = None

    def loop_config(self, mode: str, out: Path) -> dict[str, Any]:
        config = {
            "mode": mode,
            "data": dict(self.data),
            "width": self.width,
            "lr": self.lr,
            "seed": self.seed,
            "global_batch_size": self.global_batch_size,
            "epochs": self.epochs,
            "eval_every": self.eval_every,
            "out": str(out),
            "max_steps": self.max_steps,
            "gpu_loader_workers": self.gpu_loader_workers,
            **self.extra_loop,
        }
        if self.cpu_sets:
            config["cpu_sets"] = {k: list(v) for k, v in self.cpu_sets.items()}
        if mode == "stock":
            names = [s.name for s in self.specs]
            config.update(
                factors=[float(s.emulated_slowdown) for s in self.specs],
                worker_names=names,
                # The same injections, addressed by rank (rank i runs worker slot i).
                schedule=[
                    {
                        "factor": i["factor"],
                        "rank": names.index(i["worker"]),
                        "from_step": i.get("from_step", 0),
                    }
                    for i in self.schedule
                ],
                devices=[_device(s) for s in self.specs],
                threads=[max(1, int(s.resources.get("CPU", 1))) for s in self.specs],
                link_delays=[float(s.emulated_collective_delay_s) for s in self.specs],
            )
        return config


@dataclass(frozen=True)
class ContenderWorkers:
    """The workers, injections and noise one contender's fit runs with.

    Attributes:
        specs: WorkerSpecs of the fit (a subset or re-scaled copy of the scenario's).
        schedule: Slowdown injections (``worker``, ``factor``, ``from_step``).
        noise: EMULATED per-step noise amplitude (0: none).
    """

    specs: list[Any]
    schedule: tuple[dict[str, Any], ...]
    noise: float = 0.0


def contender_workers(
    contender: str,
    specs: Sequence[Any],
    schedule: Sequence[dict[str, Any]],
    *,
    subset: Sequence[int] | None = None,
    gpu_stand_ins: Sequence[str] | None = None,
) -> ContenderWorkers:
    """What ``contender`` runs on, from the scenario's workers and injections (pure).

    * ``hetero-static-post``: every injection folded into the base slowdown of the workers
      it targets, none injected: the static plan the probe builds for the post-drift speeds;
    * ``hetero-live-noise``: no injections, base slowdowns divided by ``1 - noise`` (so a
      -10 % draw stays representable: emulation only slows down) and per-step noise on;
    * ``gpu-alone``: only the workers whose device resolves to CUDA (or those named in
      ``gpu_stand_ins``: a dry run's stand-ins), no injections;
    * ``best-subset``: the workers at the indices ``subset``, with the injections aimed at
      them;
    * every other contender: the scenario's workers and injections as they are.

    Raises:
        ValueError: ``gpu-alone`` on a scenario without a CUDA worker; ``best-subset``
            without a valid ``subset``.
    """
    from benchmarks.scenarios import NOISE_AMPLITUDE

    specs = list(specs)
    if contender == "hetero-static-post":
        post = []
        for spec in specs:
            factor = 1.0
            for injection in schedule:
                if injection.get("worker") == spec.name:
                    factor *= float(injection["factor"])
            post.append(
                spec.model_copy(update={"emulated_slowdown": spec.emulated_slowdown * factor})
            )
        return ContenderWorkers(post, ())
    if contender == "hetero-live-noise":
        scale = 1.0 / (1.0 - NOISE_AMPLITUDE)
        return ContenderWorkers(
            [
                s.model_copy(update={"emulated_slowdown": s.emulated_slowdown * scale})
                for s in specs
            ],
            (),
            NOISE_AMPLITUDE,
        )
    if contender == "gpu-alone":
        gpus = [
            s
            for s in specs
            if (s.name in gpu_stand_ins if gpu_stand_ins else s.resolved_device() == "cuda")
        ]
        if not gpus:
            raise ValueError(
                "contender gpu-alone needs a worker whose device is cuda; this scenario has "
                f"none ({[s.name for s in specs]}). Fix: leave gpu-alone out (--contenders)."
            )
        return ContenderWorkers(gpus, ())
    if contender == "best-subset":
        if not subset or any(not 0 <= i < len(specs) for i in subset):
            raise ValueError(
                f"contender best-subset needs the indices of its workers among {len(specs)}, "
                f"got {subset!r}. Fix: let the runner search them (benchmarks.best_subset)."
            )
        mine = [specs[i] for i in sorted(set(subset))]
        kept = {s.name for s in mine}
        return ContenderWorkers(mine, tuple(i for i in schedule if i.get("worker") in kept))
    return ContenderWorkers(specs, tuple(schedule))


def _batchnorm_setting(contender: str) -> dict[str, Any]:
    """The contender's BatchConfig BatchNorm fields: ``hetero-local`` local,
    ``hetero-ghost<g>`` ghost with groups of g (the global batch must be a multiple of g),
    every other raytrain_hetero contender exact."""
    from benchmarks.scenarios import ghost_size_of

    ghost = ghost_size_of(contender)
    if ghost is not None:
        return {"batchnorm": "ghost", "ghost_size": ghost}
    return {"batchnorm": "local" if contender == "hetero-local" else "exact"}


def _device(spec: Any) -> str:
    return "cuda:0" if spec.resolved_device() == "cuda" else "cpu"


def read_logs(directory: Path) -> list[dict[str, Any]]:
    """Every JSON line of the per-rank logs in ``directory``, with the writer's pid."""
    records: list[dict[str, Any]] = []
    for path in sorted(Path(directory).glob("rank*_*.jsonl")):
        pid = path.stem.split("_", 1)[1]
        for line in path.read_text().splitlines():
            if line.strip():
                records.append({**json.loads(line), "pid": pid})
    return records


def _rank0_condition(out: Path, condition: Callable[[dict[str, Any]], bool]) -> bool:
    """Whether some step record of rank 0's logs in ``out`` satisfies ``condition``."""
    for path in out.glob("rank0_*.jsonl"):
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line being written
            if "step" in record and condition(record):
                return True
    return False


def _worker_stats(records: Sequence[Any]) -> list[dict[str, Any]]:
    """Per rank, raytrain_hetero's own step accounting (diagnostics), from the one
    aggregation of step records (:func:`raytrain_hetero.core.records.summarize_workers`).

    compute_s: median own compute (emulated stretch included); busy_s: median wall time busy
    (compute and loading, waits in collectives excluded); wall_s: median whole step.
    """
    from raytrain_hetero.core.records import summarize_workers

    return [summary.to_dict() for summary in summarize_workers(records)]


def run_fit(
    setup: FitSetup,
    contender: str,
    out: Path,
    *,
    watch: tuple[Callable[[dict[str, Any]], bool], Callable[[], None]] | None = None,
) -> dict[str, Any]:
    """One fit of ``contender``; returns its raw records, plans, wall time and trigger time."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig

    # Logs of an earlier bench into the same --output would be read as this fit's own.
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    run_config = RunConfig(
        name=f"bench-{contender}-{uuid.uuid4().hex[:8]}",
        storage_path=setup.storage,
        failure_config=FailureConfig(max_failures=3 if setup.min_workers else 0),
    )
    plans: list[dict[str, Any]] = []
    stats: list[dict[str, Any]] = []

    from benchmarks.loop import bench_loop
    from benchmarks.pinning import pinned_bench_loop

    loop = pinned_bench_loop if setup.cpu_sets else bench_loop

    def fit_once() -> Any:
        if contender == "stock":
            from ray.train.torch import TorchTrainer

            from raytrain_hetero.driver.backend import common_resources

            n = len(setup.specs)
            elastic = setup.min_workers is not None and setup.min_workers < n
            # One resources dict for every worker is all a stock ScalingConfig can say.
            common = common_resources([dict(s.resources) for s in setup.specs])
            trainer = TorchTrainer(
                loop,
                train_loop_config=setup.loop_config("stock", out),
                scaling_config=ScalingConfig(
                    num_workers=(setup.min_workers, n) if elastic else n,
                    resources_per_worker={k: v for k, v in common.items() if k != "GPU"},
                    use_gpu=False,
                    elastic_resize_monitor_interval_s=setup.monitor_interval_s,
                ),
                run_config=run_config,
            )
            return trainer.fit()
        from raytrain_hetero.config import (
            BatchConfig,
            ElasticConfig,
            EmulationConfig,
            ProbeConfig,
            SchedulerConfig,
        )
        from raytrain_hetero.driver.trainer import HeteroTrainer

        mine = contender_workers(
            contender,
            setup.specs,
            setup.schedule,
            subset=setup.best_subset,
            gpu_stand_ins=setup.gpu_stand_ins,
        )
        probe = dict(setup.probe)
        if contender in ("hetero-static-post", "best-subset"):
            # A probed static plan (the probe's repeated timings, not the cheap start's three
            # passive steps): the post-drift plan's reference, and the subset's best plan.
            probe["mode"] = "probe"
        if contender == "best-subset":
            probe.pop("admission", None)  # the old names of group
            probe.pop("roles", None)
            probe["group"] = "all"  # every worker of the subset trains
        hetero = HeteroTrainer(
            loop,
            train_loop_config={
                **setup.loop_config("hetero", out),
                # The ablation switches the layers off in prepare_model; hetero-local goes
                # through the run's batchnorm setting as a user would.
                "sync_batchnorm": False if contender == "hetero-nobnsync" else None,
            },
            workers=mine.specs,
            batch=BatchConfig(
                global_batch_size=setup.global_batch_size,
                weighting="uniform" if contender == "hdp" else "proportional",
                **_batchnorm_setting(contender),
                seed=setup.seed,
            ),
            scheduler=SchedulerConfig(
                **setup.scheduler, live=contender in ("hetero-live", "hetero-live-noise")
            ),
            probe=ProbeConfig(**probe),
            emulation=EmulationConfig(slowdowns=mine.schedule, noise=mine.noise),
            elastic=ElasticConfig(
                min_workers=setup.min_workers,
                resize_monitor_interval_s=setup.monitor_interval_s,
            ),
            run_config=run_config,
        )
        try:
            return hetero.fit()
        finally:
            plans.extend(p.to_dict() for p in hetero.plans)
            stats.extend(_worker_stats(hetero.step_records))

    started = time.time()
    fired_at: float | None = None
    if watch is None:
        result = fit_once()
    else:
        # The trigger (e.g. Cluster.add_node) must run on the main thread: fit in a thread.
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["result"] = fit_once()
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                box["error"] = exc

        thread = threading.Thread(target=target, name="bench-fit", daemon=True)
        thread.start()
        condition, trigger = watch
        while thread.is_alive():
            thread.join(0.25)
            if fired_at is None and thread.is_alive() and _rank0_condition(out, condition):
                trigger()
                fired_at = time.time()
        if "error" in box:
            raise box["error"]
        result = box["result"]
    wall = time.time() - started
    if result.error is not None:
        raise result.error
    return {
        "contender": contender,
        "records": read_logs(out),
        "plans": [
            {k: p.get(k) for k in ("version", "effective_step", "slices", "reason", "world_size")}
            for p in plans
        ],
        "wall_s": wall,
        "started": started,
        "triggered_at": fired_at,
        "worker_stats": stats,
    }


def measure_alone_speeds(
    setup: FitSetup, jobs: Sequence[dict[str, Any]], *, steps: int = 5
) -> dict[tuple[float, int, str], float]:
    """Samples/s of each (factor, slice, worker) job, each worker computing alone.

    Jobs of workers with the same resources and device share one Ray task holding those
    resources; tasks run one after another, so nothing else of the benchmark runs meanwhile.
    """
    import ray

    from benchmarks.loop import measure_alone

    by_name = {s.name: s for s in setup.specs}
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for job in jobs:
        spec = by_name[job["worker"]]
        key = (_device(spec), tuple(sorted(spec.resources.items())))
        groups.setdefault(key, []).append(job)
    speeds: dict[tuple[float, int, str], float] = {}
    task = ray.remote(measure_alone)
    for (device, resources), group in groups.items():
        res = dict(resources)
        distinct = sorted({(float(j["factor"]), int(j["slice"])) for j in group})
        figures = ray.get(
            task.options(
                num_cpus=res.get("CPU", 1),
                num_gpus=res.get("GPU", 0),
            ).remote(
                setup.data,
                setup.width,
                setup.seed,
                [{"factor": f, "slice": b} for f, b in distinct],
                steps,
                int(res.get("CPU", 1)),
                device,
            )
        )
        measured = dict(zip(distinct, figures))
        for job in group:
            speeds[(float(job["factor"]), int(job["slice"]), job["worker"])] = measured[
                (float(job["factor"]), int(job["slice"]))
            ]
    return speeds


def machine_description() -> dict[str, Any]:
    """CPU model, cores, memory, GPU, versions and load: what the figures were measured on."""
    import numpy as np

    description: dict[str, Any] = {
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "cpu_model": platform.processor() or platform.machine(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "numpy": np.__version__,
        "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                description["cpu_model"] = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                description["memory_gib"] = round(int(line.split()[1]) / 2**20, 1)
                break
    except OSError:
        pass
    for module in ("torch", "ray", "torchgeo", "raytrain_hetero"):
        try:
            description[module] = __import__(module).__version__
        except Exception:  # noqa: BLE001 - a version is informative only
            description[module] = None
    try:
        import torch

        description["gpus"] = [
            torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())
        ]
    except Exception:  # noqa: BLE001
        description["gpus"] = []
    try:
        description["git_commit"] = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                timeout=5,
                check=False,
                cwd=Path(__file__).resolve().parent,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        description["git_commit"] = None
    return description
