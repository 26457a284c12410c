"""``python -m benchmarks.tune_device [--dry-run]``: issue 44's run on a lent 16-core machine.

``fixed`` against ``auto`` with the promotions replayed (the stops of seed 0's recorded
``fixed`` search, ``benchmarks/results/tune_asha_seeds/seed0/results.json``: 26 epochs over 8
trials), on a local labelled cluster of 6 fast and 6 slow worker nodes (EMULATED speeds,
factors 2 and 8: about 3.8 cores of emulated compute, so a 16-core machine is not what limits
it), smaller data than the 2-core run so the whole command fits in 8 minutes. Writes what
``benchmarks.tune_asha`` writes (``results.md``: the makespans, issue 44's never-slower verdict
and the simulator's check against both searches).

``--dry-run`` (any machine, no Ray, seconds): validates both jobs and the replayed schedule
against the setup, estimates each search's makespan with the simulator
(:func:`raytrain_hetero.sim.tune_replay.predict_run`) from stated assumptions (the rates and
start costs below, measured on the 2-core VM and rounded up), and exits 1 if the estimate does
not fit :data:`BUDGET_S`. The same command runs for real where the machine has at least
:data:`MIN_CORES` cores.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.tune_asha import Setup, job_dict, run_benchmark
from benchmarks.tune_record import promotion_schedule
from raytrain_hetero.atomic import atomic_write_text
from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.sim.tune_replay import RecordedRun, RecordedTrial, predict_run
from raytrain_hetero.tune.replay import PromotionSchedule

__all__ = ["BUDGET_S", "DEVICE", "MIN_CORES", "DevicePlan", "device_check", "main", "plan"]

#: The lent machine's wall-clock budget for the whole command.
BUDGET_S = 480.0
#: Cores the real run needs (12 worker processes, 8 trial drivers and Train controllers).
MIN_CORES = 12
#: The recorded search whose stops both contenders replay.
SCHEDULE = Path(__file__).parent / "results" / "tune_asha_seeds" / "seed0" / "results.json"
#: The setup: the 2-core run's search (seed 0, 8 trials of 8 epochs, same space) on 12 nodes.
DEVICE = Setup(
    fast_nodes=6,
    slow_nodes=6,
    fast_factor=2.0,
    slow_factor=8.0,
    samples_per_class=120,
    head_cpus=8,
    seed=0,
)

#: ASSUMED for the estimate: one unslowed worker's samples/s (the 2-core VM measured ~850
#: with the cores shared), a first start, a restart, an epoch's overhead outside its steps,
#: Tune's wind-down and the cluster's start with the data generated.
ASSUMED_RATE = 600.0
ASSUMED_FIRST_START_S = 40.0
ASSUMED_RESTART_S = 20.0
ASSUMED_OVERHEAD_S = 4.0
ASSUMED_TAIL_S = 5.0
ASSUMED_SETUP_S = 60.0


@dataclass(frozen=True)
class DevicePlan:
    """What the device run will do, and its estimate.

    Attributes:
        setup: The benchmark size.
        schedule: The replayed stops.
        estimate_s: Per contender the simulator's makespan, from the assumptions.
        total_s: Both searches plus the cluster's start (:data:`ASSUMED_SETUP_S`).
        command: The command that runs it.
    """

    setup: Setup
    schedule: PromotionSchedule
    estimate_s: dict[str, float]
    total_s: float
    command: str

    @property
    def fits(self) -> bool:
        """The estimate fits :data:`BUDGET_S`."""
        return self.total_s <= BUDGET_S


def _estimate(setup: Setup, schedule: PromotionSchedule, policy: str) -> float:
    """The simulator's makespan for ``policy`` under the assumptions; ``fixed`` puts the
    longest trials on slow nodes (Ray picks any free node: the worst case)."""
    fast = CostModel(0.0, setup.fast_factor / ASSUMED_RATE)
    slow = CostModel(0.0, setup.slow_factor / ASSUMED_RATE)
    order = sorted(range(len(schedule.epochs)), key=lambda i: -schedule.epochs[i])
    on_slow = set(order[: setup.slow_nodes])
    trials = tuple(
        RecordedTrial(
            trial_id=f"t{i}",
            launch_s=1.0 + 0.5 * i,
            start_s=ASSUMED_FIRST_START_S,
            epochs=epochs,
            costs=(
                {"any": slow if i in on_slow else fast}
                if policy == "fixed"
                else {"fast": fast, "slow": slow}
            ),
            own_type="any" if policy == "fixed" else None,
        )
        for i, epochs in enumerate(schedule.epochs)
    )
    slots = {"fast": setup.fast_nodes, "slow": setup.slow_nodes}
    run = RecordedRun(
        policy=policy,
        makespan_s=1.0,
        trials=trials,
        slots=slots if policy == "auto" else {"any": setup.worker_nodes},
        global_batch=setup.global_batch_size,
        samples_per_epoch=int(setup.samples_per_class * 10 * 0.7),
        max_epochs=setup.epochs,
        grace_period=setup.grace_period,
        reduction_factor=setup.reduction_factor,
        epoch_overhead_s=ASSUMED_OVERHEAD_S,
        restart_s=ASSUMED_RESTART_S,
        contention=0.1,
        step_error=0.2,
        restart_error=0.5,
        tail_s=ASSUMED_TAIL_S,
        max_workers_per_trial=setup.worker_nodes,
    )
    return predict_run(run).makespan_s


def plan(out: Path) -> DevicePlan:
    """The device run's plan: both jobs validated, the schedule checked, the estimate.

    Raises:
        ConfigError: A job does not validate, or the schedule does not fit the setup.
    """
    from raytrain_hetero.app.config import validate_config
    from raytrain_hetero.errors import ConfigError

    schedule = promotion_schedule(SCHEDULE, "fixed")
    setup = DEVICE
    if len(schedule.epochs) != setup.trials or max(schedule.epochs) > setup.epochs:
        raise ConfigError(
            f"the replayed schedule ({schedule.source}) has {len(schedule.epochs)} trials; "
            f"the device setup runs {setup.trials} of {setup.epochs} epochs"
        )
    for contender in ("fixed", "auto"):
        validate_config(job_dict(setup, contender, out / "data", "auto"), f"{contender} job")
    estimate = {p: _estimate(setup, schedule, p) for p in ("fixed", "auto")}
    command = shlex.join(["python", "-m", "benchmarks.tune_device", "--output", str(out)])
    return DevicePlan(setup, schedule, estimate, ASSUMED_SETUP_S + sum(estimate.values()), command)


def device_check(out: Path, *, dry_run: bool = False, cores: int | None = None) -> int:
    """Run (or with ``dry_run`` only plan) the device check; see the module docstring.

    Returns:
        0 on success; 1 if the plan does not fit the budget, the machine has too few cores,
        or a search failed.
    """
    out = out.resolve()
    the_plan = plan(out)
    report: dict[str, Any] = {
        "setup": asdict(the_plan.setup),
        "schedule": the_plan.schedule.to_dict(),
        "estimate_s": the_plan.estimate_s,
        "total_s": the_plan.total_s,
        "budget_s": BUDGET_S,
        "command": the_plan.command,
        "dry_run": dry_run,
    }
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "plan.json", json.dumps(report, indent=1) + "\n")
    print(
        f"device check: fixed vs auto, promotions replayed from {the_plan.schedule.source} "
        f"({sum(the_plan.schedule.epochs)} epochs over {len(the_plan.schedule.epochs)} trials); "
        f"{the_plan.setup.fast_nodes} fast + {the_plan.setup.slow_nodes} slow nodes; estimated "
        + ", ".join(f"{k} {v:.0f} s" for k, v in the_plan.estimate_s.items())
        + f", {the_plan.total_s:.0f} s in all (budget {BUDGET_S:.0f} s)",
        flush=True,
    )
    if not the_plan.fits:
        print(f"device check: the estimate exceeds the {BUDGET_S:.0f} s budget", file=sys.stderr)
        return 1
    if dry_run:
        print(f"device check (dry run): would run {the_plan.command}")
        return 0
    have = cores if cores is not None else (os.cpu_count() or 1)
    if have < MIN_CORES:
        print(
            f"device check: this machine has {have} cores, the run needs {MIN_CORES}; "
            "use --dry-run here",
            file=sys.stderr,
        )
        return 1
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
    return run_benchmark(
        the_plan.setup,
        ("fixed", "auto"),
        out,
        command=the_plan.command,
        replay=the_plan.schedule,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m benchmarks.tune_device [--output DIR] [--dry-run]``."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.tune_device", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--output", type=Path, default=Path("outputs/bench/tune_device"))
    parser.add_argument("--dry-run", action="store_true", help="plan and estimate only (no Ray)")
    args = parser.parse_args(argv)
    return device_check(args.output, dry_run=args.dry_run)


if __name__ == "__main__":
    sys.exit(main())
