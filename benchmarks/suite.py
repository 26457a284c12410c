"""``python -m benchmarks SCENARIO``: every contender in one run, alternating, honestly timed.

Honesty rules (as in :mod:`benchmarks.probe_vs_equal`):

* all contenders run in the same session on the same data, model, global batch, steps and
  emulated slowdowns, in the order A B C A B C ... so slow drifts of a shared machine hit
  them alike;
* the first fit of a Ray session runs slow (process start-up, cold caches): one short
  warm-up fit is run first and not counted;
* every figure comes from the same per-step logs, computed by the same code
  (:mod:`benchmarks.analysis`); medians over repeats are reported, raw per-repeat
  figures are kept in ``bench.json``;
* each worker's speed "alone" (the efficiency's denominator) is measured right after each
  fit, at the slices and factors that fit used, one worker at a time;
* the table says which figures come from EMULATED heterogeneity and prints each target
  beside its figure, met or not.

Outputs in ``--output``: ``bench.json`` (raw figures, options, machine), ``COMMAND``,
``throughput.png``, ``accuracy.png`` and, for drift and join, ``timeline.png``.

Modules: :mod:`~benchmarks.arguments` (options), :mod:`~benchmarks.runner`
(running a scenario), :mod:`~benchmarks.report` (table and outputs) and this one
(the command: run or re-render; it re-exports the public names of the other three).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks.arguments import add_arguments
from benchmarks.report import format_table, write_outputs
from benchmarks.runner import ScenarioUnavailable, run_scenario
from benchmarks.scenarios import MP_SCENARIOS, SCENARIOS

__all__ = [
    "EXIT_UNAVAILABLE",
    "ScenarioUnavailable",
    "add_arguments",
    "format_table",
    "main",
    "render_only",
    "run_from_args",
    "run_scenario",
    "write_outputs",
]

#: Exit status when a scenario cannot run on this machine (cpu-gpu without CUDA).
EXIT_UNAVAILABLE = 3


def render_only(name: str, output: Path) -> int:
    """Recompute summary, table and plots from an existing ``bench.json`` (no fits run)."""
    from benchmarks.analysis import summarize

    path = output / "bench.json"
    if not path.exists():
        print(f"python -m benchmarks: error: no {path} to render", file=sys.stderr)
        return 2
    result = json.loads(path.read_text())
    if result.get("scenario") != name:
        print(
            f"python -m benchmarks: error: {path} holds scenario {result.get('scenario')!r}, "
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
    if args.scenario in MP_SCENARIOS:
        from benchmarks.mp_suite import run_model_parallel

        return run_model_parallel(args)
    output = args.output or Path("outputs/bench") / args.scenario
    args.output = output
    if args.render_only:
        return render_only(args.scenario, output)
    try:
        result = run_scenario(args.scenario, args)
    except ScenarioUnavailable as exc:
        print(f"python -m benchmarks: {args.scenario} skipped: {exc}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    except ValueError as exc:
        print(f"python -m benchmarks: error: {exc}", file=sys.stderr)
        return 2
    print()
    print(format_table(result))
    written = write_outputs(result, output)
    print(f"\nwrote {', '.join(str(p) for p in written)}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks SCENARIO ...``."""
    given = list(sys.argv[1:] if argv is None else argv)
    if given[:1] == ["tune-sim"]:  # a simulation, not a Ray scenario: its own options
        from benchmarks.tune_sim import main as tune_sim_main

        return tune_sim_main(given[1:])
    if given[:1] == ["device"]:  # several scenarios in one go: its own options
        from benchmarks.device import main as device_main

        return device_main(given[1:])
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.splitlines()[0]
    )
    add_arguments(parser)
    return run_from_args(parser.parse_args(argv))
