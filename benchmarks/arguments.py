"""The options of ``python -m benchmarks``.

The parser, the scenario options the command line overrides, and the command that repeats a run.
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from benchmarks.scenarios import (
    CONTENDERS,
    MP_SCENARIOS,
    SCENARIOS,
    Scenario,
    describe_contender,
)

__all__ = ["add_arguments", "command_line", "parse_scheduler", "scenario_options"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``python -m benchmarks``."""
    parser.add_argument(
        "scenario", choices=sorted([*SCENARIOS, *MP_SCENARIOS]), help="scenario to run"
    )
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
    parser.add_argument(
        "--seed",
        type=int,
        default=0,
        help="seed of repeat 0 (model and data order); repeat r uses seed + r for every "
        "contender, so the repeats span data orders and each is compared on the same one",
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
        "--gpu-loader-workers",
        type=int,
        default=0,
        metavar="N",
        help="DataLoader processes of every CUDA rank, every contender (default 0: the rank "
        "loads in its own process, before its forward). N >= 1 prefetches its slices while it "
        "waits for the CPU ranks",
    )
    parser.add_argument(
        "--screen-steps",
        type=int,
        default=12,
        metavar="N",
        help="steps of each screening fit of the best-subset contender's search (default 12)",
    )
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="run nothing: recompute the summary, table and plots from the "
        "bench.json already in --output",
    )
    model_parallel = parser.add_argument_group(
        "model parallelism (conv-split, branches)",
        "conv-split: Marques' CNN split by kernels vs data parallelism; branches: the S1+S2 "
        "fusion model's branches placed on workers vs data parallelism",
    )
    model_parallel.add_argument(
        "--quick", action="store_true", help="the smallest form (tests, a first look)"
    )
    model_parallel.add_argument(
        "--batches", default=None, help="conv-split: comma-separated global batch sizes"
    )
    model_parallel.add_argument("--steps", type=int, default=None, help="timed steps per round")
    model_parallel.add_argument(
        "--rounds", type=int, default=None, help="alternation rounds (A B C D, D C B A, ...)"
    )
    model_parallel.add_argument(
        "--delays",
        default=None,
        help="conv-split: comma-separated EMULATED link delays in ms per MB for the sweep "
        "(1 GB/s = 1), or none",
    )
    model_parallel.add_argument(
        "--configs",
        default=None,
        help="worker configurations (conv-split: hetero2, hetero3, same2, same4; "
        "branches: hetero2, hetero3)",
    )
    parser.add_argument(
        "--scheduler",
        default=None,
        metavar="K=V,...",
        help="SchedulerConfig settings of the raytrain_hetero contenders, e.g. "
        "plan_sync_every=2,policy.window_steps=4 (default: the library's defaults)",
    )
    parser.add_argument(
        "--probe-group",
        choices=("all", "train", "auto"),
        default=None,
        help="ProbeConfig.group of the raytrain_hetero contenders (default: the library's "
        "default); best-subset always trains every worker of its subset",
    )
    parser.add_argument(
        "--wait-load",
        type=float,
        default=None,
        metavar="L",
        help="on a shared machine: before each fit, wait (at most 90 s) until "
        "the 1-minute load average is <= L",
    )


def _is_contender(name: str) -> bool:
    """Whether the runner knows ``name`` (the table's contenders and any ``hetero-ghost<g>``)."""
    try:
        describe_contender(name)
    except KeyError:
        return False
    return True


def scenario_options(scenario: Scenario, args: argparse.Namespace) -> dict[str, Any]:
    """The scenario's default options with those given on the command line instead."""
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
    unknown = [c for c in options["contenders"] if not _is_contender(c)]
    if unknown or not options["contenders"]:
        raise ValueError(
            f"unknown contenders {unknown}; choose from {sorted(CONTENDERS)} "
            "(or hetero-ghost<g> for any group size g)"
        )
    if options["repeats"] < 1:
        raise ValueError("--repeats must be >= 1")
    options["warmup"] = not args.no_warmup
    options["wait_load"] = args.wait_load
    if args.seed < 0:
        raise ValueError("--seed must be >= 0 (numpy's generators take no negative seeds)")
    options["seed"] = args.seed
    if args.slowdown_scale < 1.0:
        raise ValueError("--slowdown-scale must be >= 1")
    if args.slowdown_scale != 1.0 and not scenario.emulated:
        # The scale stretches emulated slowdowns; a scenario without any would run unscaled.
        raise ValueError(
            f"--slowdown-scale {args.slowdown_scale:g} has nothing to scale: this scenario's "
            "workers run at real speed (no emulated slowdowns); drop --slowdown-scale"
        )
    options["slowdown_scale"] = args.slowdown_scale
    options["alone_steps"] = args.alone_steps
    if args.gpu_loader_workers < 0:
        raise ValueError("--gpu-loader-workers must be >= 0")
    options["gpu_loader_workers"] = args.gpu_loader_workers
    options["scheduler"] = parse_scheduler(args.scheduler)
    options["probe_group"] = args.probe_group
    if args.screen_steps < 4:
        raise ValueError("--screen-steps must be >= 4 (the first 2 steps are not counted)")
    options["screen_steps"] = args.screen_steps
    return options


def parse_scheduler(text: str | None) -> dict[str, Any]:
    """``plan_sync_every=2,policy.window_steps=4`` -> SchedulerConfig fields (validated).

    Raises:
        ValueError: A malformed item, or a value SchedulerConfig refuses (its message).
    """
    if not text:
        return {}
    from raytrain_hetero.config import SchedulerConfig

    fields: dict[str, Any] = {}
    for item in text.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--scheduler: {item!r} is not KEY=VALUE (e.g. plan_sync_every=2)")
        number: Any = float(value) if any(c in value for c in ".e") else int(value)
        *groups, name = key.strip().split(".")
        target = fields
        for group in groups:
            target = target.setdefault(group, {})
        target[name] = number
    if "live" in fields:
        raise ValueError("--scheduler: live is the contender's (hetero or hetero-live)")
    SchedulerConfig(**fields)  # refuses bad values with a message naming the field
    return fields


def command_line(args: argparse.Namespace) -> str:
    """The ``python -m benchmarks`` command that repeats this run (non-default options)."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    defaults = parser.parse_args([args.scenario])
    words = ["python", "-m", "benchmarks", args.scenario]
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
