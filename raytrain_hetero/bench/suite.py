"""``raytrain-hetero bench SCENARIO``: every contender in one run, alternating, honestly timed.

Honesty rules (as in :mod:`raytrain_hetero.bench.probe_vs_equal`):

* all contenders run in the same session on the same data, model, global batch, steps and
  emulated slowdowns, in the order A B C A B C ... so slow drifts of a shared machine hit
  them alike;
* the first fit of a Ray session runs slow (process start-up, cold caches): one short
  warm-up fit is run first and not counted;
* every figure comes from the same per-step logs, computed by the same code
  (:mod:`raytrain_hetero.bench.analysis`); medians over repeats are reported, raw per-repeat
  figures are kept in ``bench.json``;
* each worker's speed "alone" (the efficiency's denominator) is measured right after each
  fit, at the slices and factors that fit used, one worker at a time;
* the table says which figures come from EMULATED heterogeneity and prints each target
  beside its figure, met or not.

Outputs in ``--output``: ``bench.json`` (raw figures, options, machine), ``COMMAND``,
``throughput.png``, ``accuracy.png`` and, for drift and join, ``timeline.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from raytrain_hetero.atomic import atomic_write_text
from raytrain_hetero.bench.scenarios import CONTENDERS, SCENARIOS, Scenario

__all__ = [
    "EXIT_UNAVAILABLE",
    "add_arguments",
    "format_table",
    "main",
    "run_from_args",
    "run_scenario",
]

#: Exit status when a scenario cannot run on this machine (cpu-gpu without CUDA).
EXIT_UNAVAILABLE = 3


class ScenarioUnavailable(RuntimeError):
    """The scenario needs hardware this machine does not have."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``raytrain-hetero bench`` (also ``python -m raytrain_hetero.bench``)."""
    parser.add_argument("scenario", choices=sorted(SCENARIOS), help="scenario to run")
    parser.add_argument(
        "--output",
        type=Path,
        default=None,
        help="output directory (default outputs/bench/<scenario>)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="counted fits per contender (default: the scenario's)",
    )
    parser.add_argument(
        "--contenders",
        default=None,
        help="comma-separated subset, e.g. stock,hetero (default: the scenario's)",
    )
    parser.add_argument("--epochs", type=int, default=None, help="epochs per fit")
    parser.add_argument("--max-steps", type=int, default=None, help="stop each fit after N steps")
    parser.add_argument("--width", type=int, default=None, help="SmallCNN width")
    parser.add_argument("--batch", type=int, default=None, help="global batch size")
    parser.add_argument(
        "--samples-per-class", type=int, default=None, help="synthetic EuroSAT images per class"
    )
    parser.add_argument(
        "--eval-every",
        type=int,
        default=None,
        help="steps between validations (0: only at the end)",
    )
    parser.add_argument(
        "--target-accuracy",
        type=float,
        default=None,
        help="validation accuracy of the time-to-accuracy figure",
    )
    parser.add_argument("--lr", type=float, default=None, help="SGD learning rate")
    parser.add_argument(
        "--data-root",
        type=Path,
        default=Path("data/bench"),
        help="where the synthetic data is generated and cached (data/bench)",
    )
    parser.add_argument(
        "--no-warmup",
        action="store_true",
        help="do not run the uncounted warm-up fit (not for real figures)",
    )
    parser.add_argument(
        "--alone-steps",
        type=int,
        default=5,
        help="timed steps of each alone measurement (default 5)",
    )
    parser.add_argument(
        "--keep-logs", action="store_true", help="keep the per-step logs under OUTPUT/logs"
    )
    parser.add_argument(
        "--slowdown-scale",
        type=float,
        default=1.0,
        metavar="S",
        help="multiply every emulated slowdown by S (keeps their ratios; S > 1 "
        "lowers the CPU demand on a small shared machine). Default 1",
    )
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="run nothing: recompute the summary, table and plots from the "
        "bench.json already in --output",
    )
    parser.add_argument(
        "--wait-load",
        type=float,
        default=None,
        metavar="L",
        help="on a shared machine: before each fit, wait (at most 90 s) until "
        "the 1-minute load average is <= L",
    )


def _options(scenario: Scenario, args: argparse.Namespace) -> dict[str, Any]:
    options = dict(scenario.defaults)
    for key, arg in (
        ("repeats", "repeats"),
        ("epochs", "epochs"),
        ("width", "width"),
        ("global_batch_size", "batch"),
        ("samples_per_class", "samples_per_class"),
        ("eval_every", "eval_every"),
        ("target_accuracy", "target_accuracy"),
        ("lr", "lr"),
        ("max_steps", "max_steps"),
    ):
        value = getattr(args, arg)
        if value is not None:
            options[key] = value
    options.setdefault("max_steps", None)
    options["contenders"] = (
        [c.strip() for c in args.contenders.split(",") if c.strip()]
        if args.contenders
        else list(scenario.contenders)
    )
    unknown = [c for c in options["contenders"] if c not in CONTENDERS]
    if unknown or not options["contenders"]:
        raise ValueError(f"unknown contenders {unknown}; choose from {sorted(CONTENDERS)}")
    if options["repeats"] < 1:
        raise ValueError("--repeats must be >= 1")
    options["warmup"] = not args.no_warmup
    options["wait_load"] = args.wait_load
    if args.slowdown_scale < 1.0:
        raise ValueError("--slowdown-scale must be >= 1")
    options["slowdown_scale"] = args.slowdown_scale
    options["alone_steps"] = args.alone_steps
    return options


def _ray_env() -> dict[str, Any] | None:
    from raytrain_hetero.driver._ray_compat import train_env_passthrough

    env = train_env_passthrough(os.environ)
    return {"env_vars": env} if env else None


def _check_hardware(scenario: Scenario) -> None:
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


def run_scenario(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run one scenario end to end; returns the result written to ``bench.json``."""
    from raytrain_hetero.bench.contenders import machine_description

    scenario = SCENARIOS[name]
    options = _options(scenario, args)
    _check_hardware(scenario)
    from raytrain_hetero.bench.data import prepare_bench_data
    from raytrain_hetero.driver.trainer import expand_worker_specs

    machine = machine_description()
    data = prepare_bench_data(args.data_root, int(options["samples_per_class"]))
    data.train_limit(int(options["global_batch_size"]))  # fails early with a clear message
    scale = float(options["slowdown_scale"])
    specs = [
        s.model_copy(update={"emulated_slowdown": s.emulated_slowdown * scale})
        if scenario.emulated
        else s
        for s in expand_worker_specs(scenario.workers)
    ]
    scratch = Path(tempfile.mkdtemp(prefix=f"rh-bench-{name}-"))
    from raytrain_hetero.bench.contenders import FitSetup

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
    )
    result: dict[str, Any] = {
        "scenario": name,
        "description": scenario.description,
        "emulated": scenario.emulated,
        "command": _command_line(args),
        "options": options,
        "workers": [s.model_dump() for s in specs],
        "schedule": list(scenario.schedule),
        "contenders": {c: CONTENDERS[c] for c in options["contenders"]},
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
    from raytrain_hetero.bench.analysis import summarize

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


def _command_line(args: argparse.Namespace) -> str:
    """The ``raytrain-hetero bench`` command that repeats this run (non-default options)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    defaults = parser.parse_args([args.scenario])
    words = ["raytrain-hetero", "bench", args.scenario]
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        value = getattr(args, action.dest, None)
        if value == getattr(defaults, action.dest):
            continue
        if isinstance(value, bool):
            words.append(action.option_strings[0])
        else:
            words += [action.option_strings[0], str(value)]
    return shlex.join(words)


def _fit_line(fit: dict[str, Any]) -> str:
    f = fit["figures"]
    parts = [f"fit {fit['index']:2d} {fit['contender']:<11}"]
    if "join_latency_s" in fit:
        parts.append(f"join -> first step at full size {fit['join_latency_s']:6.1f} s")
    parts.append(f"{f.get('samples_per_s', float('nan')):8.1f} samples/s")
    if math.isfinite(f.get("efficiency", float("nan"))):
        parts.append(f"eff {f['efficiency']:.3f}")
    if f.get("curve"):
        parts.append(
            f"tta {f.get('tta_s', float('nan')):6.2f} s  final acc {f.get('final_accuracy'):.3f}"
        )
    parts.append(f"slices {f.get('slices')}")
    parts.append(f"wall {fit['wall_s']:.0f} s")
    if fit.get("load_average_1min") is not None:
        parts.append(f"load {fit['load_average_1min']:.1f}")
    if not fit["counted"]:
        parts.append("(warm-up, not counted)")
    return "  ".join(parts)


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

    from raytrain_hetero.bench.analysis import alone_jobs, fit_figures
    from raytrain_hetero.bench.contenders import measure_alone_speeds, run_fit
    from raytrain_hetero.bench.plots import timeline_points

    cpus = sum(float(s.resources.get("CPU", 1)) for s in setup.specs)
    if ray.is_initialized():
        ray.shutdown()
    # address="local": always a new Ray of our own, never a cluster someone left running.
    ray.init(
        address="local",
        num_cpus=math.ceil(cpus) + 2,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env=_ray_env(),
    )
    contenders = options["contenders"]
    order = [(c, r) for r in range(int(options["repeats"])) for c in contenders]
    if options["warmup"]:
        order.insert(0, (contenders[0], -1))
    phase = min((int(i.get("from_step", 0)) for i in scenario.schedule), default=None)
    target = float(options["target_accuracy"])
    try:
        for index, (contender, repeat) in enumerate(order):
            counted = repeat >= 0
            waited = _wait_for_load(options.get("wait_load"))
            load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
            saved_steps = setup.max_steps
            if not counted:
                setup.max_steps = 3
            try:
                fit = run_fit(setup, contender, logs / f"{index:02d}-{contender}")
            finally:
                setup.max_steps = saved_steps
            records = fit["records"]
            jobs = alone_jobs(records) if counted else []
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
                "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
                "load_before": load_before,
                "waited_for_load_s": waited,
            }
            result["fits"].append(entry)
            print(_fit_line(entry), flush=True)
    finally:
        ray.shutdown()


def _run_join(
    scenario: Scenario, setup: Any, options: dict[str, Any], logs: Path, result: dict[str, Any]
) -> None:
    import ray
    from ray.cluster_utils import Cluster

    from raytrain_hetero.bench.analysis import fit_figures
    from raytrain_hetero.bench.contenders import run_fit
    from raytrain_hetero.bench.plots import timeline_points

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
    if ray.is_initialized():
        ray.shutdown()
    for index, (contender, repeat) in enumerate(order):
        # A fresh cluster per fit: every fit starts at `start` workers and sees one join.
        _wait_for_load(options.get("wait_load"))
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
        try:
            cluster.add_node(num_cpus=start)
            cluster.wait_for_nodes()
            ray.init(address=cluster.address, log_to_driver=False, runtime_env=_ray_env())
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
            "counted": True,
            "wall_s": fit["wall_s"],
            "figures": figures,
            "plans": fit["plans"],
            "join_latency_s": latency,
            "alone": [],
            "time_breakdown": _time_breakdown(fit),
            "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            "timeline": timeline_points(records, setup.global_batch_size, join_time=join_time),
        }
        result["fits"].append(entry)
        print(_fit_line(entry), flush=True)


# ----------------------------------------------------------------------------- output


def _num(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, fmt)


def _goal(result: dict[str, Any], contender: str, metric: str) -> str:
    for verdict in result["summary"]["targets"]:
        if verdict["contender"] == contender and verdict["metric"] == metric:
            goal = verdict["goal"]
            shown = f"{goal:.0%}" if metric == "overhead" else f"{goal:g}"
            return f" [goal {verdict['op']}{shown}: {'met' if verdict['met'] else 'NOT met'}]"
    return ""


def format_table(result: dict[str, Any]) -> str:
    """The printed table: medians per contender, ratios to stock, targets beside figures."""
    summary = result["summary"]["contenders"]
    options = result["options"]
    factors = ", ".join(format(w["emulated_slowdown"], "g") for w in result.get("workers") or [])
    kind = (
        f"EMULATED heterogeneity (compute stretched by per-worker factors {factors or '?'})"
        if result["emulated"]
        else "REAL hardware, no emulation"
    )
    machine = result["machine"]
    lines = [
        f"scenario {result['scenario']}: {result['description']}",
        (
            f"{kind}; medians of {options['repeats']} repeat(s), contenders alternating; "
            f"global batch {options['global_batch_size']}, SmallCNN width {options['width']}"
        ),
        (
            f"machine: {machine.get('cpu_model')}, {machine.get('usable_cpus')} usable CPUs, "
            f"GPUs {machine.get('gpus') or 'none'}; 1-min load average {_loads(result)}"
        ),
        "",
    ]
    join = any("join_latency_s" in f for f in result["fits"])
    if join:
        columns = [
            ("contender", 12, lambda n, r: n),
            (
                "join->first step at full size (s)",
                34,
                lambda n, r: _num(r.get("join_latency_s"), ".1f"),
            ),
            (
                "vs stock (s)",
                12,
                lambda n, r: (
                    _num(
                        r.get("join_latency_s", math.nan)
                        - summary.get("stock", {}).get("join_latency_s", math.nan),
                        "+.1f",
                    )
                    if n != "stock"
                    else ""
                ),
            ),
            ("wall s", 7, lambda n, r: _num(r.get("wall_s"), ".0f")),
        ]
    else:
        target = options["target_accuracy"]
        columns = [
            ("contender", 12, lambda n, r: n),
            (
                "samples/s (range)",
                9,
                lambda n, r: (
                    _num(r.get("samples_per_s"), ".1f")
                    + (
                        f" ({r['samples_per_s_min']:.0f}-{r['samples_per_s_max']:.0f})"
                        if r.get("repeats", 0) > 1 and "samples_per_s_min" in r
                        else ""
                    )
                ),
            ),
            (
                "x stock",
                8,
                lambda n, r: _num(r.get("speedup"), ".2f") + _goal(result, n, "speedup"),
            ),
            (
                "efficiency",
                10,
                lambda n, r: _num(r.get("efficiency"), ".3f") + _goal(result, n, "efficiency"),
            ),
            (
                f"time to {target:.2f} (s)",
                16,
                lambda n, r: (
                    _num(r.get("tta_s"), ".1f")
                    + (
                        f" [{r.get('reached_target')}/{r.get('repeats')} reached]"
                        if r.get("reached_target") != r.get("repeats")
                        else ""
                    )
                ),
            ),
            ("steps", 5, lambda n, r: _num(r.get("steps_to_target"), ".0f")),
            (
                "x stock",
                8,
                lambda n, r: _num(r.get("tta_speedup"), ".2f") + _goal(result, n, "tta_speedup"),
            ),
            ("incl. start-up (s)", 18, lambda n, r: _num(r.get("tta_total_s"), ".1f")),
            ("final acc", 9, lambda n, r: _num(r.get("final_accuracy"), ".3f")),
            ("wall s", 6, lambda n, r: _num(r.get("wall_s"), ".0f")),
        ]
        if any(v["metric"] == "overhead" for v in result["summary"]["targets"]):
            columns.insert(
                3,
                (
                    "overhead",
                    8,
                    lambda n, r: (
                        (_num(r.get("overhead"), "+.1%") if n != "stock" else "")
                        + _goal(result, n, "overhead")
                    ),
                ),
            )
        if any("samples_per_s_after" in r for r in summary.values()):
            columns[4:4] = [
                ("before", 8, lambda n, r: _num(r.get("samples_per_s_before"), ".1f")),
                ("after drift", 11, lambda n, r: _num(r.get("samples_per_s_after"), ".1f")),
                ("eff after", 9, lambda n, r: _num(r.get("efficiency_after"), ".3f")),
            ]
    rows = [[fn(name, summary[name]) for _, _, fn in columns] for name in summary]
    widths = [max(w, len(h), *(len(r[i]) for r in rows)) for i, (h, w, _) in enumerate(columns)]
    lines.append(
        "  ".join(
            f"{h:<{w}}" if i == 0 else f"{h:>{w}}"
            for i, ((h, _, _), w) in enumerate(zip(columns, widths))
        )
    )
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append(
            "  ".join(
                f"{c:<{w}}" if i == 0 else f"{c:>{w}}" for i, (c, w) in enumerate(zip(row, widths))
            ).rstrip()
        )
    if not join:
        lines.append("")
        lines.append(
            "samples/s: steady-state training steps only (start-up, probing and "
            "evaluation excluded); efficiency: ideal time / time, ideal = B / sum of each "
            "worker's samples/s measured alone at its slice; time to accuracy: training "
            "time from the first step ('steps': steps it took); 'incl. start-up' adds "
            "model preparation and (raytrain_hetero) probing."
        )
    verdicts = result["summary"]["targets"]
    if verdicts:
        lines.append("")
        lines.append("targets:")
        for v in verdicts:
            figure = v["figure"]
            shown = _num(figure, "+.1%" if v["metric"] == "overhead" else ".3f")
            note = f" ({v['note']})" if v["note"] else ""
            lines.append(
                f"  {v['contender']:<11} {v['target']}: {shown}{note} -> "
                f"{'met' if v['met'] else 'NOT MET'}"
            )
    return "\n".join(lines)


def _loads(result: dict[str, Any]) -> str:
    """The machine's 1-minute load average at the start, after each fit (range) and the end."""
    machine = result["machine"]
    start = (machine.get("load_average") or [math.nan])[0]
    fits = [
        f["load_average_1min"] for f in result["fits"] if f.get("load_average_1min") is not None
    ]
    during = f", {min(fits):.1f}-{max(fits):.1f} after fits" if fits else ""
    return f"{_num(start, '.1f')} at start{during} (the machine is shared)"


def _ratio(a: Any, b: Any) -> float:
    try:
        return float(a) / float(b) if float(b) != 0 else float("nan")
    except (TypeError, ValueError):
        return float("nan")


def _json_default(value: Any) -> Any:
    try:
        import numpy as np

        if isinstance(value, (np.integer, np.floating)):
            return value.item()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def write_outputs(result: dict[str, Any], output: Path) -> list[Path]:
    """bench.json, COMMAND and the plots."""
    from raytrain_hetero.bench.plots import (
        plot_accuracy,
        plot_throughput,
        plot_timeline,
    )

    output.mkdir(parents=True, exist_ok=True)
    written = []
    path = output / "bench.json"
    atomic_write_text(path, json.dumps(result, indent=2, default=_json_default, allow_nan=True))
    written.append(path)
    atomic_write_text(output / "COMMAND", result["command"] + "\n")
    written.append(output / "COMMAND")
    if not result.get("skipped"):
        atomic_write_text(output / "table.txt", format_table(result) + "\n")
        written.append(output / "table.txt")
    if result.get("skipped"):
        return written
    join = any("join_latency_s" in f for f in result["fits"])
    if not join:
        written.append(plot_throughput(result, output / "throughput.png"))
        written.append(plot_accuracy(result, output / "accuracy.png"))
    if result["schedule"]:
        step = min(int(i.get("from_step", 0)) for i in result["schedule"])
        written.append(
            plot_timeline(
                result, output / "timeline.png", marker=step, marker_label="slowdown injected"
            )
        )
    if join:
        written.append(
            plot_timeline(
                result, output / "timeline.png", marker=0.0, marker_label="node joined", x="join"
            )
        )
    return written


def render_only(name: str, output: Path) -> int:
    """Recompute summary, table and plots from an existing ``bench.json`` (no fits run)."""
    from raytrain_hetero.bench.analysis import summarize

    path = output / "bench.json"
    if not path.exists():
        print(f"raytrain-hetero bench: error: no {path} to render", file=sys.stderr)
        return 2
    result = json.loads(path.read_text())
    if result.get("scenario") != name:
        print(
            f"raytrain-hetero bench: error: {path} holds scenario {result.get('scenario')!r}, "
            f"not {name!r}",
            file=sys.stderr,
        )
        return 2
    scenario = SCENARIOS[name]
    result["emulated"] = scenario.emulated and any(
        w.get("emulated_slowdown", 1.0) != 1.0 for w in result.get("workers") or [{}]
    )
    result["description"] = scenario.description
    result["summary"] = summarize(result["fits"], result["options"]["contenders"], scenario.targets)
    print(format_table(result))
    write_outputs(result, output)
    return 0


def run_from_args(args: argparse.Namespace) -> int:
    """Run the scenario named in ``args``; print the table; write the outputs."""
    output = args.output or Path("outputs/bench") / args.scenario
    args.output = output
    if args.render_only:
        return render_only(args.scenario, output)
    try:
        result = run_scenario(args.scenario, args)
    except ScenarioUnavailable as exc:
        print(f"raytrain-hetero bench: {args.scenario} skipped: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except ValueError as exc:
        print(f"raytrain-hetero bench: error: {exc}", file=sys.stderr)
        return 2
    print()
    print(format_table(result))
    written = write_outputs(result, output)
    print(f"\nwrote {', '.join(str(p) for p in written)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m raytrain_hetero.bench SCENARIO ...``."""
    parser = argparse.ArgumentParser(
        prog="python -m raytrain_hetero.bench", description=__doc__.splitlines()[0]
    )
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))
