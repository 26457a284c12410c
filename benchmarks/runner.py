"""Running one benchmark scenario: its fits, alternating contenders, and the figures of each.

The honesty rules are in :mod:`benchmarks.suite`; the figures come from
:mod:`benchmarks.analysis`, the fits from :mod:`benchmarks.contenders`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.arguments import command_line, scenario_options
from benchmarks.report import fit_line
from benchmarks.scenarios import BEST_SUBSET, SCENARIOS, Scenario, describe_contender

__all__ = ["ScenarioUnavailable", "run_scenario"]


class ScenarioUnavailable(RuntimeError):
    """The scenario needs hardware this machine does not have."""


def _check_hardware(scenario: Scenario) -> None:
    if scenario.needs_cpus is not None:
        from benchmarks.pinning import usable_cpus

        usable = len(usable_cpus())
        if usable < scenario.needs_cpus:
            raise ScenarioUnavailable(
                f"scenario {scenario.name!r} needs {scenario.needs_cpus} usable CPU cores and "
                f"this machine has {usable}. Run it on a machine with at least "
                f"{scenario.needs_cpus} cores."
            )
    if not scenario.needs_gpu:
        return
    try:
        import torch

        available = torch.cuda.is_available()
        detail = f"torch {torch.__version__} sees {torch.cuda.device_count()} CUDA devices"
    except Exception as exc:  # noqa: BLE001 - any failure means no usable GPU
        available, detail = False, f"torch could not query CUDA ({exc})"
    if not available:
        raise ScenarioUnavailable(
            f"scenario {scenario.name!r} needs an NVIDIA GPU with CUDA and this machine has "
            f"none ({detail}). Run it on a machine with a GPU and at least 13 CPU cores."
        )


def run_scenario(
    name: str, args: argparse.Namespace, *, scenario: Scenario | None = None
) -> dict[str, Any]:
    """Run one scenario end to end; returns the result written to ``bench.json``.

    ``scenario``: run this one instead of ``SCENARIOS[name]`` (the device check's scaled-down
    forms); its name is ``name``.
    """
    from benchmarks.contenders import machine_description

    scenario = SCENARIOS[name] if scenario is None else scenario
    options = scenario_options(scenario, args)
    _check_hardware(scenario)
    from benchmarks.data import prepare_bench_data, slow_storage_view
    from raytrain_hetero.driver.trainer import expand_worker_specs

    machine = machine_description()
    data = prepare_bench_data(args.data_root, int(options["samples_per_class"]))
    data.train_limit(int(options["global_batch_size"]))  # fails early with a clear message
    # EMULATED slow storage: every sample read waits (the loader-bound worker of cpu-gpu-shape).
    data = slow_storage_view(data, float(options.get("read_delay_s") or 0.0))
    scale = float(options["slowdown_scale"])
    specs = [
        s.model_copy(update={"emulated_slowdown": s.emulated_slowdown * scale})
        if scenario.emulated
        else s
        for s in expand_worker_specs(scenario.workers)
    ]
    scratch = Path(tempfile.mkdtemp(prefix=f"rh-bench-{name}-"))
    from benchmarks.contenders import FitSetup

    setup = FitSetup(
        specs=specs,
        data=data.__dict__.copy(),
        width=int(options["width"]),
        global_batch_size=int(options["global_batch_size"]),
        epochs=int(options["epochs"]),
        eval_every=int(options["eval_every"]),
        lr=float(options["lr"]),
        schedule=tuple(scenario.schedule),
        storage=str(scratch / "ray_results"),
        max_steps=options["max_steps"],
        min_workers=scenario.min_workers,
        monitor_interval_s=float(options.get("monitor_interval_s", 5.0)),
        scheduler=dict(options.get("scheduler") or {}),
        probe={"group": options["probe_group"]} if options.get("probe_group") else {},
        gpu_loader_workers=int(options.get("gpu_loader_workers", 0)),
    )
    if scenario.pin:
        from benchmarks.pinning import RESERVED, disjoint_cpu_sets, usable_cpus

        reserved = int(options.get("pin_reserved", RESERVED))
        setup.cpu_sets = disjoint_cpu_sets(specs, usable_cpus(), reserved=reserved)
    if options.get("gpu_stand_ins"):
        setup.gpu_stand_ins = tuple(options["gpu_stand_ins"])
    result: dict[str, Any] = {
        "scenario": name,
        "description": scenario.description,
        "emulated": scenario.emulated,
        "command": command_line(args),
        "options": options,
        "workers": [s.model_dump() for s in specs],
        "schedule": list(scenario.schedule),
        "contenders": {c: describe_contender(c) for c in options["contenders"]},
        "cpu_sets": setup.cpu_sets,
        "machine": machine,
        "data": {
            "train_samples": data.train_size,
            "train_samples_used": data.train_limit(setup.global_batch_size),
            "val_samples": data.val_size,
            "bands": data.bands,
        },
        "fits": [],
    }
    logs = (args.output / "logs") if args.keep_logs else scratch / "logs"
    started = time.time()
    try:
        if scenario.kind == "join":
            _run_join(scenario, setup, options, logs, result)
        else:
            _run_train(scenario, setup, options, logs, result)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    from benchmarks.analysis import summarize

    result["summary"] = summarize(result["fits"], options["contenders"], scenario.targets)
    result["elapsed_s"] = time.time() - started
    result["machine"]["load_average_end"] = (
        list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    )
    return result


def _time_breakdown(fit: dict[str, Any]) -> dict[str, float]:
    """Where a fit's wall time went: launching workers, set-up (probing), steps, shutdown."""
    records = fit["records"]
    rank0 = [r for r in records if r.get("rank") == 0]
    starts = [r["time"] for r in rank0 if r.get("event") == "start"]
    firsts = [r["first_batch_time"] for r in rank0 if "first_batch_time" in r]
    steps = [r["time"] for r in rank0 if "step" in r]
    if not (starts and firsts and steps):
        return {}
    end = fit["started"] + fit["wall_s"]
    return {
        "launch_s": min(starts) - fit["started"],
        "setup_s": min(firsts) - min(starts),
        "steps_s": max(steps) - min(firsts),
        "finish_s": end - max(steps),
    }


def repeat_seed(options: dict[str, Any], repeat: int) -> int:
    """The seed of every contender's fit in ``repeat`` (-1: the warm-up, as repeat 0).

    One data order and model init per repeat, the same for every contender: the medians of the
    accuracy figures then span data orders instead of repeating one order's luck, and each
    repeat still compares the contenders on the same order.
    """
    return int(options.get("seed", 0)) + max(repeat, 0)


def _wait_for_load(limit: float | None, most_s: float = 90.0) -> float:
    """Wait until the 1-minute load average is <= ``limit`` (at most ``most_s``); seconds waited."""
    if limit is None or not hasattr(os, "getloadavg"):
        return 0.0
    started = time.time()
    while os.getloadavg()[0] > limit and time.time() - started < most_s:
        time.sleep(5)
    return time.time() - started


def _run_train(
    scenario: Scenario, setup: Any, options: dict[str, Any], logs: Path, result: dict[str, Any]
) -> None:
    import ray

    from benchmarks.analysis import alone_jobs, fit_figures
    from benchmarks.best_subset import find_best_subset
    from benchmarks.contenders import measure_alone_speeds, run_fit
    from benchmarks.plots import timeline_points
    from raytrain_hetero.driver.session import init_ray

    cpus = sum(float(s.resources.get("CPU", 1)) for s in setup.specs)
    if ray.is_initialized():
        ray.shutdown()
    # Always a new Ray of our own (bound to 127.0.0.1), never a cluster someone left running.
    init_ray(num_cpus=math.ceil(cpus) + 2)
    contenders = options["contenders"]
    if BEST_SUBSET in contenders:
        # Its subset is searched once, in this session, before the alternating fits.
        result["best_subset"] = find_best_subset(
            setup, options, logs, screen_steps=int(options.get("screen_steps", 12))
        )
    order = [(c, r) for r in range(int(options["repeats"])) for c in contenders]
    if options["warmup"]:
        order.insert(0, (contenders[0], -1))
    phase = min((int(i.get("from_step", 0)) for i in scenario.schedule), default=None)
    target = float(options["target_accuracy"])
    try:
        for index, (contender, repeat) in enumerate(order):
            counted = repeat >= 0
            waited = _wait_for_load(options.get("wait_load"))
            load_before = _load_1min()
            saved_steps = setup.max_steps
            if not counted:
                setup.max_steps = 3
            setup.seed = repeat_seed(options, repeat)
            try:
                fit = run_fit(setup, contender, logs / f"{index:02d}-{contender}")
            finally:
                setup.max_steps = saved_steps
            records = fit["records"]
            # Under per-step noise every step has its own factor: no alone figure to time.
            jobs = alone_jobs(records) if counted and contender != "hetero-live-noise" else []
            alone = (
                measure_alone_speeds(setup, jobs, steps=int(options["alone_steps"]))
                if jobs
                else None
            )
            figures = fit_figures(
                records,
                global_batch_size=setup.global_batch_size,
                target_accuracy=target,
                alone=alone,
                phase_step=phase,
            )
            entry = {
                "index": index,
                "contender": contender,
                "repeat": repeat,
                "seed": setup.seed,
                "counted": counted,
                "wall_s": fit["wall_s"],
                "figures": figures,
                "plans": fit["plans"],
                "alone": [
                    {"factor": k[0], "slice": k[1], "worker": k[2], "samples_per_s": v}
                    for k, v in sorted((alone or {}).items())
                ],
                "timeline": timeline_points(records, setup.global_batch_size),
                "time_breakdown": _time_breakdown(fit),
                "worker_stats": fit.get("worker_stats", []),
                "load_average_1min": _load_1min(),
                "load_before": load_before,
                "waited_for_load_s": waited,
            }
            result["fits"].append(entry)
            print(fit_line(entry), flush=True)
            # The fits so far, beside the logs: a run cut short (a lent machine's time limit,
            # a crash) still renders with ``--render-only`` once this is renamed bench.json.
            logs.mkdir(parents=True, exist_ok=True)
            (logs / "bench.partial.json").write_text(json.dumps(result, default=str))
    finally:
        ray.shutdown()


def _run_join(
    scenario: Scenario, setup: Any, options: dict[str, Any], logs: Path, result: dict[str, Any]
) -> None:
    import ray
    from ray.cluster_utils import Cluster

    from benchmarks.analysis import fit_figures
    from benchmarks.contenders import run_fit
    from benchmarks.plots import timeline_points

    total = len(setup.specs)
    start = int(scenario.min_workers or total - 1)
    join_after = int(options.get("join_after_steps", 6))
    setup.extra_loop = {
        "checkpoint_every": int(options.get("checkpoint_every", 2)),
        "stop_at_world": total,
        "steps_at_full": int(options.get("steps_at_full", 6)),
    }
    if setup.max_steps is None:
        setup.max_steps = 5000  # bounds a fit whose join is never picked up
    contenders = options["contenders"]
    order = [(c, r) for r in range(int(options["repeats"])) for c in contenders]
    from raytrain_hetero.driver.session import init_ray

    if ray.is_initialized():
        ray.shutdown()
    for index, (contender, repeat) in enumerate(order):
        # A fresh cluster per fit: every fit starts at `start` workers and sees one join.
        _wait_for_load(options.get("wait_load"))
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
        setup.seed = repeat_seed(options, repeat)
        try:
            cluster.add_node(num_cpus=start)
            cluster.wait_for_nodes()
            init_ray(address=cluster.address)
            joined: dict[str, float] = {}

            def add_node(cluster: Any = cluster, joined: dict[str, float] = joined) -> None:
                cluster.add_node(num_cpus=total - start)
                joined["time"] = time.time()

            fit = run_fit(
                setup,
                contender,
                logs / f"{index:02d}-{contender}",
                watch=(lambda r: r["world"] == start and r["step"] + 1 >= join_after, add_node),
            )
        finally:
            ray.shutdown()
            cluster.shutdown()
        records = fit["records"]
        join_time = joined.get("time")
        full = sorted(
            float(r["time"]) for r in records if "step" in r and int(r.get("world", 0)) == total
        )
        figures = fit_figures(
            records,
            global_batch_size=setup.global_batch_size,
            target_accuracy=float(options["target_accuracy"]),
        )
        latency = (full[0] - join_time) if (full and join_time) else float("nan")
        figures["join_latency_s"] = latency
        figures["restarts"] = (
            len({r["pid"] for r in records if r.get("rank") == 0 and "step" in r}) - 1
        )
        entry = {
            "index": index,
            "contender": contender,
            "repeat": repeat,
            "seed": setup.seed,
            "counted": True,
            "wall_s": fit["wall_s"],
            "figures": figures,
            "plans": fit["plans"],
            "join_latency_s": latency,
            "alone": [],
            "time_breakdown": _time_breakdown(fit),
            "load_average_1min": _load_1min(),
            "timeline": timeline_points(records, setup.global_batch_size, join_time=join_time),
        }
        result["fits"].append(entry)
        print(fit_line(entry), flush=True)


def _load_1min() -> float | None:
    """The machine's 1-minute load average, or None where the OS has none."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None
