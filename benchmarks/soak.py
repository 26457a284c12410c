#!/usr/bin/env python3
"""Soak: N seeded random faults over one longer run, checked against a fault-free run.

FAULT INJECTION (test/ops tooling). Draws ``--faults`` faults (action, phase, step, rank)
with :func:`raytrain_hetero.config.faults.random_faults` from ``--seed``, runs the
fault-injection suite's loop (``tests/integration/fault_loops.py``) once without faults and
once with them (``FailureConfig(max_failures=N)``: every fault costs exactly one restart), and
prints one line per fault and a summary:

* faults injected: faults whose marker shows they fired;
* survived: the run finished after all of them;
* samples lost: per epoch, sample ids not seen exactly once in the committed ledger (the
  steps of every worker group up to the cursor the next group resumed at);
* restores matched: every restored model state equals the state recorded at its cursor;
* max |param diff|: final parameters vs the fault-free run (float32).

    python benchmarks/soak.py --faults 8 --seed 0        # ~5 minutes on 2 cores

Runs on an embedded local Ray (``ray.init(address="local")``, 127.0.0.1-only node address);
exits non-zero unless every fault fired, the run survived, no sample was lost, every restore
matched and the parameters agree within ``--tolerance``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
LOOPS = ROOT / "tests" / "integration"
sys.path.insert(0, str(LOOPS))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--faults", type=int, default=8, help="number of random faults")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault draw")
    parser.add_argument("--workers", type=int, default=3, help="worker processes (1 CPU each)")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--size", type=int, default=144, help="samples per epoch")
    parser.add_argument("--batch", type=int, default=24, help="global batch size")
    parser.add_argument("--checkpoint-every", type=int, default=2)
    parser.add_argument(
        "--actions", default="kill,hang", help="comma-separated actions to draw from"
    )
    parser.add_argument(
        "--phases",
        default="probe,calibration,plan_switch,mid_epoch,checkpoint_commit",
        help="comma-separated phases to draw from",
    )
    parser.add_argument("--collective-timeout-s", type=int, default=6)
    parser.add_argument(
        "--hang-s", type=float, default=60.0, help="how long a hang blocks (> the timeout)"
    )
    parser.add_argument("--tolerance", type=float, default=1e-4)
    parser.add_argument("--out", type=Path, default=None, help="keep ledgers here (default: tmp)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
    import ray
    from fault_loops import fault_loop
    from ledgers import (
        assert_restores_match,
        committed_ledger,
        params_digest,
        restores,
        samples_lost,
    )
    from ray.train import FailureConfig, RunConfig
    from train_loops import plain_model

    from raytrain_hetero import HeteroTrainer, WorkerSpec
    from raytrain_hetero.config import FaultInjectionConfig, ProbeConfig
    from raytrain_hetero.config.faults import random_faults
    from raytrain_hetero.worker.faults import fired_markers

    steps_per_epoch = -(-args.size // args.batch)
    steps = steps_per_epoch * args.epochs
    switch_steps = [steps_per_epoch // 2 + e * steps_per_epoch for e in range(args.epochs)]
    faults = random_faults(
        args.seed,
        args.faults,
        steps=steps,
        world_size=args.workers,
        actions=tuple(args.actions.split(",")),
        phases=tuple(args.phases.split(",")),
        checkpoint_every=args.checkpoint_every,
        switch_steps=switch_steps,
        hang_s=args.hang_s,
    )
    base = args.out or Path(tempfile.mkdtemp(prefix="raytrain_hetero_soak_"))
    pythonpath = os.pathsep.join([str(LOOPS), str(ROOT), os.environ.get("PYTHONPATH", "")])
    ray.init(
        address="local",
        num_cpus=args.workers + 1,
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={
            "env_vars": {"PYTHONPATH": pythonpath, "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"}
        },
    )

    def run(name: str, with_faults: bool):
        out = base / name
        out.mkdir(parents=True)
        loop = {
            "size": args.size,
            "epochs": args.epochs,
            "out": str(out),
            "checkpoint_every": args.checkpoint_every,
            "replan_at": {str(s): [float(1 + (r + s) % 3) for r in range(8)] for s in switch_steps},
        }
        trainer = HeteroTrainer(
            fault_loop,
            train_loop_config=loop,
            workers=[WorkerSpec(name="w", count=args.workers)],
            batch={"global_batch_size": args.batch},
            # An explicit probe: under the cheap start (the default) the probe and calibration
            # phases never come, and faults drawn there would never fire.
            probe=ProbeConfig(
                mode="probe",
                batch_sizes=[2, 4],
                warmup=0,
                repeats=1,
                calibration_steps=1,
                calibration_rounds=1,
            ),
            backend={"collective_timeout_s": args.collective_timeout_s},
            faults=FaultInjectionConfig(
                faults=faults if with_faults else (), marker_dir=out / "faults"
            ),
            run_config=RunConfig(
                name=name,
                storage_path=str(base / "results"),
                failure_config=FailureConfig(max_failures=len(faults) if with_faults else 0),
            ),
        )
        started = time.monotonic()
        error = None
        try:
            trainer.fit()
        except Exception as exc:  # noqa: BLE001 - reported in the table
            error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        return trainer, out, error, time.monotonic() - started

    import torch

    fresh = params_digest(plain_model(6, 3, torch.float32))
    print(f"soak: {len(faults)} faults, seed {args.seed}, {args.workers} workers, {steps} steps")
    _ref_trainer, ref_out, ref_error, ref_s = run("reference", with_faults=False)
    if ref_error:
        print(f"fault-free run failed: {ref_error}")
        return 1
    trainer, out, error, soak_s = run("soak", with_faults=True)
    fired = {m["fault"]: m for m in fired_markers(trainer.faults)}
    print()
    print(f"{'#':>2}  {'fault':<44} {'fired':>5}  {'group':<12}")
    for i, fault in enumerate(faults):
        marker = fired.get(i)
        group = marker["group"] if marker else "-"
        print(f"{i:>2}  {fault.describe():<44} {'yes' if marker else 'no':>5}  {group:<12}")
    survived = error is None and (out / "final_params.npy").exists()
    lost: int | str = "-"
    matched = "-"
    diff: float | str = "-"
    if survived:
        try:
            assert_restores_match(out, fresh)
            matched = "yes"
        except AssertionError as exc:
            matched = f"NO ({exc})"
        kept, groups = committed_ledger(out)
        lost = samples_lost(kept, args.size, range(args.epochs))
        want = np.load(ref_out / "final_params.npy")
        diff = float(np.max(np.abs(np.load(out / "final_params.npy") - want)))
    summary = {
        "faults_injected": len(fired),
        "faults_drawn": len(faults),
        "survived": len(fired) if survived else 0,
        "run_finished": survived,
        "error": error,
        "samples_lost": lost,
        "restores_matched": matched,
        "max_param_diff": diff,
        "worker_groups_started": len(restores(out)) if survived else None,
        "worker_groups_that_trained": len(groups) if survived else None,
        "fault_free_s": round(ref_s, 1),
        "soak_s": round(soak_s, 1),
    }
    print()
    print(
        f"faults injected: {len(fired)}/{len(faults)}   survived: {summary['survived']}   "
        f"samples lost: {lost}   restores matched: {matched}   max |param diff|: {diff}"
    )
    print(f"fault-free run {ref_s:.0f} s, soak run {soak_s:.0f} s; ledgers under {base}")
    print(json.dumps(summary))
    ray.shutdown()
    ok = (
        survived
        and len(fired) == len(faults)
        and lost == 0
        and matched == "yes"
        and isinstance(diff, float)
        and diff <= args.tolerance
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
