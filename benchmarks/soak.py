#!/usr/bin/env python3
"""Soak: N seeded random faults over one longer run, checked against a fault-free run.

FAULT INJECTION (test/ops tooling). Draws ``--faults`` faults (action, phase, step, rank)
with :func:`raytrain_hetero.config.faults.random_faults` from ``--seed``, runs the
fault-injection suite's loop (``tests/integration/fault_loops.py``) once without faults and
once with them (``FailureConfig(max_failures=N + K)``: a fault or node loss costs at most one
restart), and
prints one line per fault and a summary:

* faults injected: faults whose marker shows they fired;
* survived: the run finished after all of them;
* samples lost: per epoch, sample ids not seen exactly once in the committed ledger (the
  steps of every worker group up to the cursor the next group resumed at);
* restores matched: every restored model state equals the state recorded at its cursor;
* max |param diff|: final parameters vs the fault-free run (float32).

Actions drawn: ``kill`` (SIGKILL of a worker), ``hang`` (a rank stalls past the collective
timeout) and ``kill_scheduler`` (``ray.kill`` of the run's scheduler actor, which Ray restarts;
it counts only if the marker says the actor was found and killed). ``--node-losses K`` adds
node loss while restarting: the run goes to a ``ray.cluster_utils.Cluster`` (a head for the
driver, the controller and the scheduler, and ``--workers`` + 1 one-CPU nodes for the
workers), and K times, one second after a ``kill`` fault fired (its group is being torn down
and restarted), one worker node is removed like a lost spot instance (SIGKILL of its raylet
and processes) and a fresh node joins in its place. ``--notice-preemptions P`` (also on the
Cluster) preempts a worker node with notice P times, spread over the run: drained through
Ray's drain API (reason PREEMPTION, a deadline ``--notice-s`` ahead, Ray Train's watcher on),
removed at the deadline, replaced by a fresh node (docs/reliability/preemption.md).

    python benchmarks/soak.py --faults 8 --seed 0        # ~5 minutes on 2 cores
    python benchmarks/soak.py --faults 100 --node-losses 10 --seed 0   # ~35 minutes

Without node losses it runs on an embedded local Ray (``ray.init(address="local")``,
127.0.0.1-only node address). Exits non-zero unless every fault and node loss happened, the
run survived, no sample was lost, every restore matched and the parameters agree within
``--tolerance``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

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
        "--actions",
        default="kill,hang,kill_scheduler",
        help="comma-separated actions to draw from",
    )
    parser.add_argument(
        "--node-losses",
        type=int,
        default=0,
        help="worker nodes lost while a group restarts (runs on a multi-node local Cluster)",
    )
    parser.add_argument(
        "--notice-preemptions",
        type=int,
        default=0,
        help="worker nodes preempted with notice: drained (reason PREEMPTION, a deadline "
        "--notice-s ahead) while the run trains, removed at the deadline, replaced",
    )
    parser.add_argument("--notice-s", type=float, default=10.0, help="notice of a preemption")
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


#: The label of the worker nodes (the head has none, so no worker lands there).
POOL = {"pool": "soak"}


class NodeLosses:
    """Loses a worker node while a group restarts, ``count`` times, and replaces it.

    :meth:`watch` runs on the main thread (Ray adds a node only there: it installs signal
    handlers) while the fit runs on another; one second after the chosen ``kill`` firings
    (every k-th, spread over the run) it removes a random worker node without a graceful
    drain and adds a fresh one with the same resources, so the restart that is under way
    meets a node that vanished and one that joined.
    """

    def __init__(self, cluster: Any, faults: Any, count: int, seed: int) -> None:
        from raytrain_hetero.worker.setup.faults import fired_markers

        self._fired_markers = fired_markers
        self._cluster = cluster
        self._faults = faults
        kills = sum(f.action == "kill" for f in faults.faults)
        if count and not kills:
            raise SystemExit("--node-losses needs kill faults to follow (add kill to --actions)")
        self._every = max(1, kills // count) if count else 0
        self._count = count
        self._rng = random.Random(seed)
        self.losses: list[dict[str, Any]] = []
        self._seen: set[int] = set()
        self._kills_seen = 0

    def watch(self, fit: threading.Thread, tick: Any = None) -> None:
        """Until ``fit`` ends: lose a node after each chosen ``kill`` firing (and call
        ``tick`` every 0.1 s: the preemptions with notice)."""
        while fit.is_alive():
            fit.join(0.1)
            if tick is not None:
                tick()
            if len(self.losses) >= self._count:
                continue
            for marker in self._fired_markers(self._faults):
                index = marker["fault"]
                if index in self._seen or self._faults.faults[index].action != "kill":
                    continue
                self._seen.add(index)
                self._kills_seen += 1
                if self._kills_seen % self._every == 0 and len(self.losses) < self._count:
                    time.sleep(1.0)  # the killed rank's group is failing over by now
                    self._lose_a_node(index)

    def _lose_a_node(self, after_fault: int) -> None:
        nodes = sorted(self._cluster.worker_nodes, key=lambda n: n.unique_id)
        doomed = self._rng.choice(nodes)
        self._cluster.remove_node(doomed, allow_graceful=False)
        joined = self._cluster.add_node(num_cpus=1, labels=POOL)
        self.losses.append(
            {
                "after_fault": after_fault,
                "removed": doomed.node_id[:12],
                "joined": joined.node_id[:12],
                "time": time.time(),
            }
        )
        print(
            f"node loss {len(self.losses)}: after fault {after_fault}, removed node "
            f"{doomed.node_id[:12]}, node {joined.node_id[:12]} joined",
            flush=True,
        )


class NoticePreemptions:
    """Preempts a worker node with notice, ``count`` times, spread over the run, and replaces it.

    One node at a time: every ``interval_s`` seconds a random worker node is drained through
    Ray's drain API with reason PREEMPTION and a deadline ``notice_s`` ahead; at the deadline
    it is removed and a fresh node joins. :meth:`tick` runs on the main thread (Ray adds a
    node only there: it installs signal handlers), called by :meth:`NodeLosses.watch`.
    """

    def __init__(self, cluster: Any, count: int, notice_s: float, interval_s: float, seed: int):
        self._cluster = cluster
        self._count = count
        self._notice_s = notice_s
        self._interval_s = interval_s
        self._rng = random.Random(seed + 1)
        self._next_at = time.time() + interval_s
        self._doomed: Any = None
        self._deadline = 0.0
        self.preemptions: list[dict[str, Any]] = []

    def tick(self) -> None:
        """Drain a node when one is due; remove and replace the drained one at its deadline."""
        from raytrain_hetero.driver._ray_compat import drain_node_for_preemption

        now = time.time()
        if self._doomed is None:
            if len(self.preemptions) >= self._count or now < self._next_at:
                return
            nodes = sorted(self._cluster.worker_nodes, key=lambda n: n.unique_id)
            self._doomed = self._rng.choice(nodes)
            self._deadline = drain_node_for_preemption(
                self._cluster.address, self._doomed.node_id, self._notice_s
            )
            return
        if now < self._deadline:
            return
        doomed, self._doomed = self._doomed, None
        if doomed in self._cluster.worker_nodes:
            self._cluster.remove_node(doomed, allow_graceful=False)
        joined = self._cluster.add_node(num_cpus=1, labels=POOL)
        self._next_at = time.time() + self._interval_s
        self.preemptions.append(
            {"removed": doomed.node_id[:12], "joined": joined.node_id[:12], "time": now}
        )
        print(
            f"preemption with notice {len(self.preemptions)}: node {doomed.node_id[:12]} "
            f"drained {self._notice_s:.0f} s ahead, removed at the deadline, node "
            f"{joined.node_id[:12]} joined",
            flush=True,
        )


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
    from raytrain_hetero.worker.setup.faults import KILLED_SCHEDULER, fired_markers

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
    runtime_env = {
        "env_vars": {"PYTHONPATH": pythonpath, "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"}
    }
    cluster = None
    label_selector = None
    if args.notice_preemptions:
        # Ray Train's watcher delivers the notices (Ray's default; the tests turn it off).
        os.environ["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] = "1"
        os.environ.setdefault("RAY_TRAIN_PREEMPTION_POLL_INTERVAL_S", "1")
    if args.node_losses or args.notice_preemptions:
        from ray.cluster_utils import Cluster
        from ray_env import FAST_NODE_DEATH

        # A restart that still counts a lost node (not yet declared dead) waits this long
        # for its placement before Ray Train retries (default 60 s; retries are free).
        os.environ.setdefault("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "8")
        cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 1, "_system_config": FAST_NODE_DEATH},
        )
        for _ in range(args.workers + 1):  # one spare: a restart may find it first
            cluster.add_node(num_cpus=1, labels=POOL)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, runtime_env=runtime_env)
        label_selector = POOL
    else:
        ray.init(
            address="local",
            num_cpus=args.workers + 1,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env=runtime_env,
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
            workers=[WorkerSpec(name="w", count=args.workers, label_selector=label_selector)],
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
                failure_config=FailureConfig(
                    max_failures=len(faults) + args.node_losses if with_faults else 0
                ),
            ),
        )
        started = time.monotonic()
        losses = NodeLosses(
            cluster, trainer.faults, args.node_losses if with_faults else 0, args.seed
        )
        errors: list[str] = []

        def fit() -> None:
            try:
                trainer.fit()
            except Exception as exc:  # noqa: BLE001 - reported in the table
                errors.append(f"{type(exc).__name__}: {str(exc).splitlines()[0]}")

        fitting = threading.Thread(target=fit, name="soak-fit")
        fitting.start()
        notices = None
        if with_faults and args.notice_preemptions:
            # Spread over the fault-free run's duration (the soak takes longer).
            interval = max(5.0, reference_s[0] / (args.notice_preemptions + 1))
            notices = NoticePreemptions(
                cluster, args.notice_preemptions, args.notice_s, interval, args.seed
            )
        losses.watch(fitting, tick=notices.tick if notices is not None else None)
        if notices is not None:
            preempted.extend(notices.preemptions)
        error = errors[0] if errors else None
        return trainer, out, error, time.monotonic() - started, losses.losses

    import torch

    fresh = params_digest(plain_model(6, 3, torch.float32))
    print(f"soak: {len(faults)} faults, seed {args.seed}, {args.workers} workers, {steps} steps")
    reference_s: list[float] = []
    preempted: list[dict[str, Any]] = []
    _ref_trainer, ref_out, ref_error, ref_s, _ = run("reference", with_faults=False)
    reference_s.append(ref_s)
    if ref_error:
        print(f"fault-free run failed: {ref_error}")
        return 1
    trainer, out, error, soak_s, losses = run("soak", with_faults=True)
    # A scheduler kill counts only if it found the actor (its marker says what it did).
    fired = {
        m["fault"]: m
        for m in fired_markers(trainer.faults)
        if faults[m["fault"]].action != "kill_scheduler" or m.get("effect") == KILLED_SCHEDULER
    }
    print()
    print(f"{'#':>2}  {'fault':<44} {'fired':>5}  {'group':<12}")
    for i, fault in enumerate(faults):
        marker = fired.get(i)
        group = marker["group"] if marker else "-"
        print(f"{i:>2}  {fault.describe():<44} {'yes' if marker else 'no':>5}  {group:<12}")
    # A node loss happened while restarting if it came after its kill fired and before the
    # next worker group restored its checkpoint.
    starts = [r["time"] for r in restores(out)]
    for loss in losses:
        killed_at = fired[loss["after_fault"]]["time"]
        next_start = min((t for t in starts if t > killed_at), default=float("inf"))
        loss["while_restarting"] = killed_at < loss["time"] < next_start
    for j, loss in enumerate(losses):
        what = f"node loss after fault {loss['after_fault']}, while restarting"
        flag = "yes" if loss["while_restarting"] else "no"
        print(f"N{j}  {what:<44} {flag:>5}  {loss['removed']:<12}")
    losses = [loss for loss in losses if loss["while_restarting"]]
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
        "faults_injected": len(fired) + len(losses) + len(preempted),
        "faults_drawn": len(faults) + args.node_losses + args.notice_preemptions,
        "node_losses": len(losses),
        "notice_preemptions": len(preempted),
        "survived": len(fired) + len(losses) + len(preempted) if survived else 0,
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
        f"faults injected: {summary['faults_injected']}/{summary['faults_drawn']} "
        f"({len(fired)}/{len(faults)} drawn, {len(losses)}/{args.node_losses} node losses, "
        f"{len(preempted)}/{args.notice_preemptions} preemptions with notice)   "
        f"survived: {summary['survived']}   samples lost: {lost}   restores matched: {matched}   "
        f"max |param diff|: {diff}"
    )
    print(f"fault-free run {ref_s:.0f} s, soak run {soak_s:.0f} s; ledgers under {base}")
    print(json.dumps(summary))
    ray.shutdown()
    if cluster is not None:
        cluster.shutdown()
    ok = (
        survived
        and len(fired) == len(faults)
        and len(losses) == args.node_losses
        and len(preempted) == args.notice_preemptions
        and lost == 0
        and matched == "yes"
        and isinstance(diff, float)
        and diff <= args.tolerance
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
