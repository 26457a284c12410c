#!/usr/bin/env python3
"""Rent a mix on a real autoscaler, lose a spot node mid-run, re-plan, finish.

Ray's fake multinode provider stands in for the cloud (as in ``scripts/autoscaling_demo.py``,
whose head, config and stop this reuses): its "instances" are real raylets on this machine.
The catalog is made up for the demo (``local-1``: ``cpu.big``, 2 CPUs, and ``cpu.small``, 1
CPU, each on demand and spot); every (type, market) is a node type of the autoscaler, with the
rent labels. Speeds are EMULATED: ``cpu.small`` workers run 2x slower
(``emulation.node_slowdowns`` on the instance-type label); the rent file's cost models say the
same. Prices are made up too; the incurred cost is node-seconds x these prices.

1. ``rent`` plans the mix for the deadline (it must mix types and include spot nodes) and
   prints the table;
2. ``--apply`` (in this process) asks the autoscaler for the plan's slots and trains the
   EuroSAT job (generated data, small CNN) on them;
3. once the job has written a checkpoint and a spot node has been up a while, this script
   sends it a preemption notice
   (a drain with a deadline) and, at the deadline, kills its raylet (by the PID whose
   environment names that node: a process of this cluster);
4. the watcher re-plans (deadline left, work left, nodes held), asks for a replacement if the
   plan wants one; Ray Train shrinks the group and grows it back; the job finishes.

    python scripts/rent_autoscaler_demo.py            # ~3-5 minutes on 2 cores

Prints the table, the events, every node's seconds and the incurred cost, the measured and
predicted times; writes ``rent_report.json`` under ``<state-dir>/outputs``; exits non-zero if
the job did not finish or no spot node was lost and re-planned for.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
REGION = "local-1"
INSTANCE_LABEL = "raytrain-hetero.io/instance-type"
MARKET_LABEL = "raytrain-hetero.io/market"
#: type -> (CPUs, on-demand $/h, spot $/h): made up for the demo.
TYPES = {"cpu.big": (2, 0.40, 0.15), "cpu.small": (1, 0.20, 0.05)}
SMALL_SLOWDOWN = 2.0


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def catalog_csv() -> str:
    """The demo's catalog, in SkyPilot's vms.csv (v8) columns."""
    lines = [
        "InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,"
        "Region,AvailabilityZone,Arch"
    ]
    for name, (cpus, price, spot) in TYPES.items():
        lines.append(f"{name},,,{cpus}.0,4.0,,{price},{spot},{REGION},{REGION}a,x86_64")
    return "\n".join(lines) + "\n"


def job_dict(state_dir: Path, address: str, epochs: int) -> dict[str, Any]:
    """The training job (its workers come from the rent plan)."""
    return {
        "name": "rent-demo",
        "data": {
            "dataset": "eurosat",
            "root": str(state_dir / "data"),
            "generate": {"samples_per_class": 40},
            "bands": "all",
            "cache": True,
        },
        "model": {"name": "small_cnn", "width": 16},
        "train": {"epochs": epochs, "global_batch_size": 64, "lr": 0.05},
        "workers": [{"name": "placeholder", "resources": {"CPU": 1}}],
        "elastic": {"resize_monitor_interval_s": 2, "placement_timeout_s": 300},
        "emulation": {"node_slowdowns": {INSTANCE_LABEL: {"cpu.small": SMALL_SLOWDOWN}}},
        "ray": {"address": address, "storage_path": str(state_dir / "ray_results")},
        "output_dir": str(state_dir / "outputs"),
    }


def rent_dict(epochs: int, deadline_h: float) -> dict[str, Any]:
    """The rent file: the made-up catalog; start-up and restart as an earlier run of this
    script measured them on 2 shared cores (~140 s from the request to the first step: nodes
    joined after 11-30 s, Ray Train's worker group took ~80 s to start); cost models as the
    EMULATION intends the types (cpu.small 2x slower per sample), not measured: on 2 shared
    cores a step of this small job is mostly fixed overhead (~0.6 s for 64 samples over
    three workers in that run), which they do not describe; a deadline."""
    beta_big = 0.004  # seconds per sample of one cpu.big worker (as emulated, not measured)
    return {
        "rent": {
            "region": REGION,
            "planner": {
                "startup_s": 140,
                "restart_s": 60,
                "notice_s": 10,
                "max_nodes_per_type": 2,
                "max_nodes": {"cpu.big:spot": 0, "cpu.big:on_demand": 1},
            },
            "watch_interval_s": 1.0,
        },
        "deadline_h": deadline_h,
        "job": {"samples_per_epoch": 320, "epochs": epochs},
        "catalog": "catalog.csv",
        "exchange": {"across_nodes_s": 0.05, "within_node_s": 0.01},
        "cost_models": [
            {"instance_type": "cpu.big", "alpha": 0.05, "beta": beta_big},
            {"instance_type": "cpu.small", "alpha": 0.05, "beta": beta_big * SMALL_SLOWDOWN},
        ],
        "spot_loss": {"rates": {"cpu.small": 0.5}},
        "worker_shapes": {
            name: {"resources": {"CPU": cpus}, "device": "cpu"}
            for name, (cpus, _, _) in TYPES.items()
        },
        "train_job": "job.yaml",
    }


def node_types(inputs: Any) -> dict[str, Any]:
    """One autoscaler node type per rent option, with the rent labels."""
    cfg = inputs.config
    types = {}
    for o in inputs.options:
        cpus = TYPES[o.instance_type][0]
        types[f"{o.instance_type.replace('.', '-')}-{cfg.market_value(o.market)}"] = {
            "resources": {"CPU": cpus},
            "labels": {
                cfg.instance_label: o.instance_type,
                cfg.market_label: cfg.market_value(o.market),
            },
            "node_config": {},
            "min_workers": 0,
            "max_workers": o.max_nodes,
        }
    return types


def raylet_pid(cluster: Any, node_id: str) -> int | None:
    """The PID of ``node_id``'s raylet among this cluster's processes (by its environment)."""
    marker = f"RAY_OVERRIDE_NODE_ID_FOR_TESTING={node_id}".encode()
    for pid in cluster.cluster_pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if b"raylet" in cmdline.split(b"\0")[0] and marker in environ.split(b"\0"):
            return pid
    return None


class SpotKiller(threading.Thread):
    """Notices, then terminates, the first spot node once the job has written a checkpoint
    (it trains) and the node has been up ``after_s``."""

    def __init__(
        self, cluster: Any, address: str, after_s: float, notice_s: float, storage: Path
    ) -> None:
        super().__init__(name="spot-killer", daemon=True)
        self.cluster, self.address, self.storage = cluster, address, storage
        self.after_s, self.notice_s = after_s, notice_s
        self.killed: dict[str, Any] = {}
        self.stop_event = threading.Event()

    def run(self) -> None:
        import ray

        from raytrain_hetero.driver._ray_compat import drain_node_for_preemption

        first_seen: dict[str, float] = {}
        while not self.stop_event.wait(1.0):
            for node in ray.nodes():
                labels = node.get("Labels") or {}
                if node.get("Alive") and labels.get(MARKET_LABEL) == "spot":
                    first_seen.setdefault(node["NodeID"], time.monotonic())
            ready = [n for n, t in first_seen.items() if time.monotonic() - t >= self.after_s]
            if not ready or not any(self.storage.rglob("checkpoint_*")):
                continue
            node_id = ready[0]
            print(
                f"[killer] preemption notice to spot node …{node_id[-6:]} ({self.notice_s:.0f} s)",
                flush=True,
            )
            drain_node_for_preemption(self.address, node_id, self.notice_s)
            time.sleep(self.notice_s)
            pid = raylet_pid(self.cluster, node_id)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            print(f"[killer] terminated spot node …{node_id[-6:]} (raylet pid {pid})", flush=True)
            self.killed = {"node_id": node_id, "pid": pid}
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--state-dir", type=Path, default=None)
    parser.add_argument("--epochs", type=int, default=25)
    parser.add_argument(
        "--deadline-h",
        type=float,
        default=None,
        help="default: 0.97 x the best single type's expected time (a mix must do it)",
    )
    parser.add_argument("--kill-after-s", type=float, default=25.0)
    args = parser.parse_args(argv)
    state_dir = args.state_dir or Path(tempfile.mkdtemp(prefix="rh-rent-", dir="/tmp"))
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.environ.update(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(state_dir / "auth_token"),
        RAY_TRAIN_HEALTH_CHECK_INTERVAL_S="0.2",
    )
    for key in ("RAY_ADDRESS", "RAY_AUTH_TOKEN"):
        os.environ.pop(key, None)
    demo = _load("autoscaling_demo", REPO / "scripts" / "autoscaling_demo.py")
    lc = demo.load_local_cluster()

    import yaml

    from raytrain_hetero.app.config import load_config
    from raytrain_hetero.app.rent_apply import apply_rent
    from raytrain_hetero.app.rent_inputs import rent_inputs
    from raytrain_hetero.app.rent_job import format_decision, plan_rent
    from raytrain_hetero.app.rent_schema import load_rent_file

    (state_dir / "catalog.csv").write_text(catalog_csv())
    (state_dir / "rent.yaml").write_text(
        yaml.safe_dump(rent_dict(args.epochs, args.deadline_h or 1.0))
    )
    cluster = lc.LocalCluster(state_dir, extra_env={"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"})
    killer: SpotKiller | None = None
    ok = False
    try:
        # The plan does not need the cluster; the autoscaler's node types come from it.
        (state_dir / "job.yaml").write_text(
            yaml.safe_dump(job_dict(state_dir, "auto", args.epochs))
        )
        rf = load_rent_file(state_dir / "rent.yaml")
        if args.deadline_h is None:  # just sooner than any single type: a mix must do it
            fastest = min(p.expected_time_s for p in plan_rent(rf, rent_inputs(rf, 64)).front
                          if p.is_single)  # fmt: skip
            rent = rent_dict(args.epochs, 0.97 * fastest / 3600.0)
            (state_dir / "rent.yaml").write_text(yaml.safe_dump(rent))
            rf = load_rent_file(state_dir / "rent.yaml")
        inputs = rent_inputs(rf, 64)
        decision = plan_rent(rf, inputs)
        print(format_decision(decision), flush=True)
        chosen = decision.chosen
        if chosen.is_single or not any(n.market == "spot" for n in chosen.nodes):
            print("RESULT: the plan is not a mix with spot nodes; nothing to show", flush=True)
            return 3

        def write_config(gcs_address: str) -> Path:
            config = demo.fake_autoscaling_config(gcs_address)
            head = {
                k: v for k, v in config["available_node_types"].items() if v["max_workers"] == 0
            }
            config["available_node_types"] = {**head, **node_types(inputs)}
            config["max_workers"] = sum(o.max_nodes for o in inputs.options)
            path = state_dir / "autoscaling.json"
            path.write_text(json.dumps(config, indent=2))
            return path

        env = {**demo.head_environment(), "AUTOSCALER_UPDATE_INTERVAL_S": "5"}
        cluster.start_head(
            num_cpus=1, autoscaling_config=write_config, env=env, labels={"pool": "head"}
        )
        print(f"head up at {cluster.address}; node types {sorted(node_types(inputs))}", flush=True)
        (state_dir / "job.yaml").write_text(
            yaml.safe_dump(job_dict(state_dir, cluster.address, args.epochs))
        )
        train_job = load_config(state_dir / "job.yaml")
        import ray

        from raytrain_hetero.app.job import init_ray

        init_ray(train_job)
        killer = SpotKiller(
            cluster,
            cluster.address,
            args.kill_after_s,
            rf.rent.planner.notice_s,
            state_dir / "ray_results",
        )
        killer.start()
        report = apply_rent(rf, inputs, decision, train_job, output_dir=state_dir / "outputs")
        print("events:")
        for e in report.events:
            print(f"  [{e.at_s:7.1f}s] {e.kind}: {e.text}")
        print("nodes:")
        for s in report.spans:
            end = f"{s.end_s:.1f}" if s.end_s is not None else "-"
            print(
                f"  {s.instance_type} {s.market} …{s.node_id[-6:]}: {s.start_s:.1f}-{end} s ({s.how})"
            )
        ratio = report.wall_s / report.predicted_s if report.predicted_s else float("nan")
        print(
            f"measured {report.wall_s:.0f} s, predicted {report.predicted_s:.0f} s "
            f"(measured/predicted {ratio:.2f}); incurred ${report.incurred_cost:.4f} at the "
            f"demo's prices; steps {report.summary.get('steps')}",
            flush=True,
        )
        replanned = any(e.kind == "replan" for e in report.events)
        lost = any(s.how == "lost" and s.market == "spot" for s in report.spans)
        ok = bool(report.summary.get("steps")) and replanned and lost
        print(
            "RESULT:",
            "finished after a spot loss and a re-plan" if ok else "NOT as planned",
            flush=True,
        )
    finally:
        if killer is not None:
            killer.stop_event.set()
        import ray

        if ray.is_initialized():
            ray.shutdown()
        killed = cluster.stop()
        left = cluster.cluster_pids()
        print(f"cluster stopped ({len(killed)} process(es) needed SIGKILL, {len(left)} left)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
