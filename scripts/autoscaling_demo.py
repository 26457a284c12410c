#!/usr/bin/env python3
"""Autoscaling, shown on one machine: the autoscaler adds tagged nodes for a raytrain_hetero run
and the worker group grows.

Ray's fake multinode provider stands in for the cloud: a head started with
``RAY_FAKE_CLUSTER=1 ray start --head --autoscaling-config=...`` whose autoscaler "launches"
nodes as local raylets. The config has two node types with different tags, like
``deploy/cluster.yaml``: ``fast`` (2 CPUs, label ``pool=fast``) and ``slow`` (1 CPU, label
``pool=slow``), none running at first. The head offers 1 CPU (label ``pool=head``).

The run has three worker slots: ``local`` (1 CPU, ``pool=head``: fits the head), ``fast``
(``pool=fast``) and ``slow`` (``pool=slow``), with ``elastic.min_workers: 1``. Ray Train
starts it with the one worker the head can hold and asks the autoscaler for the rest; the
autoscaler starts one node of each type (their labels are what the workers select), Ray
Train sees the room, restarts the worker group with three workers from the last
checkpoint, and the carving continues exactly where it was.

    python scripts/autoscaling_demo.py                # ~2 minutes on 2 cores

Prints a timeline (node joins, worker-group size per step) and exits non-zero if the group
did not grow. The head runs in its own process session with a private temp dir and is
stopped through that process group (never ``ray stop``, which would end every Ray process
on the machine); token auth stays on, the dashboard listens on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
logger = logging.getLogger("autoscaling_demo")

#: Node types the fake provider may launch: name -> (CPUs, labels, max_workers).
NODE_TYPES: dict[str, tuple[int, dict[str, str], int]] = {
    "fast": (2, {"pool": "fast"}, 1),
    "slow": (1, {"pool": "slow"}, 1),
}
HEAD_CPUS = 1
#: Every worker slot selects its node type by label, the head's included: a slot without a
#: selector could take a bundle on a labelled node and starve that node's own worker.
HEAD_LABELS = {"pool": "head"}


def load_local_cluster() -> Any:
    """``deploy/local/local_cluster.py`` as a module."""
    path = REPO / "deploy" / "local" / "local_cluster.py"
    spec = importlib.util.spec_from_file_location("local_cluster", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["local_cluster"] = module
    spec.loader.exec_module(module)
    return module


def fake_autoscaling_config(gcs_address: str) -> dict[str, Any]:
    """Cluster config for Ray's fake multinode provider (its example.yaml is not in the wheel)."""
    from ray.autoscaler._private.fake_multi_node.node_provider import (
        FAKE_HEAD_NODE_ID,
        FAKE_HEAD_NODE_TYPE,
    )

    types: dict[str, Any] = {
        FAKE_HEAD_NODE_TYPE: {"resources": {"CPU": HEAD_CPUS}, "node_config": {}, "max_workers": 0},
    }
    for name, (cpus, labels, max_workers) in NODE_TYPES.items():
        types[name] = {
            "resources": {"CPU": cpus},
            "labels": labels,
            "node_config": {},
            "min_workers": 0,
            "max_workers": max_workers,
        }
    return {
        "cluster_name": "raytrain-hetero-fake",
        "max_workers": sum(t[2] for t in NODE_TYPES.values()),
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": 5,
        # The fake provider, loaded as an "external" provider: Ray fills a "fake_multinode"
        # config out from example.yaml, which the wheel does not ship.
        "provider": {
            "type": "external",
            "module": "ray.autoscaler._private.fake_multi_node.node_provider.FakeMultiNodeProvider",
            "gcs_address": gcs_address,
            "head_node_id": FAKE_HEAD_NODE_ID,
            "launch_multiple": True,
            "use_node_id_as_ip": True,
            "disable_node_updaters": True,
            "disable_launch_config_check": True,
        },
        "auth": {"ssh_user": "ubuntu"},
        "available_node_types": types,
        "head_node_type": FAKE_HEAD_NODE_TYPE,
        "docker": {},
        "file_mounts": {},
        "cluster_synced_files": [],
        "file_mounts_sync_continuously": False,
        "rsync_exclude": [],
        "rsync_filter": [],
        "initialization_commands": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }


def head_environment() -> dict[str, str]:
    """Environment of the head process: fake provider, autoscaler v2 (label-aware)."""
    from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID

    return {
        "RAY_FAKE_CLUSTER": "1",
        # The autoscaler looks for unmet demand every 20 s, so new nodes arrive a while after
        # the run asked for them (as cloud VMs do) and the group visibly trains small first.
        "AUTOSCALER_UPDATE_INTERVAL_S": "20",
        "RAY_enable_autoscaler_v2": "1",
        "RAY_CLOUD_INSTANCE_ID": FAKE_HEAD_NODE_ID,
        "RAY_OVERRIDE_NODE_ID_FOR_TESTING": FAKE_HEAD_NODE_ID,
    }


def job_dict(state_dir: Path, address: str, epochs: int) -> dict[str, Any]:
    """The training job: three slots, one fits the head, min_workers 1."""
    return {
        "name": "autoscaling-demo",
        "data": {
            "dataset": "eurosat",
            "root": str(state_dir / "data"),
            "generate": {"samples_per_class": 40},
            "bands": "all",
            "cache": True,
        },
        "model": {"name": "small_cnn", "width": 16},
        "train": {"epochs": epochs, "global_batch_size": 64, "lr": 0.05, "fixed_shares": [1, 2, 1]},
        "workers": [
            {
                "name": "local",
                "resources": {"CPU": 1},
                "device": "cpu",
                "label_selector": {"pool": "head"},
            },
            {
                "name": "fast",
                "resources": {"CPU": 2},
                "device": "cpu",
                "label_selector": {"pool": "fast"},
            },
            {
                "name": "slow",
                "resources": {"CPU": 1},
                "device": "cpu",
                "label_selector": {"pool": "slow"},
            },
        ],
        "elastic": {"min_workers": 1, "resize_monitor_interval_s": 2},
        "ray": {"address": address, "storage_path": str(state_dir / "ray_results")},
        "output_dir": str(state_dir / "outputs"),
    }


class NodeWatcher(threading.Thread):
    """Logs every node that joins, with its labels and the seconds since the start; ends the
    demo if the head process dies (a driver would otherwise wait for it forever)."""

    def __init__(self, cluster: Any, started: float) -> None:
        super().__init__(name="node-watcher", daemon=True)
        self.cluster, self.started = cluster, started
        self.events: list[tuple[float, str, dict[str, str]]] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        seen: set[str] = set()
        while not self.stop_event.wait(1.0):
            head = self.cluster.nodes[0] if self.cluster.nodes else None
            if head is not None and not _alive(head.pid):
                tail = Path(head.log).read_text(errors="replace")[-3000:]
                print(f"the head process died; its log ends:\n{tail}", flush=True)
                self.cluster.stop()
                os._exit(2)
            for node in self.cluster.alive_nodes():
                if node["node_id"] not in seen:
                    seen.add(node["node_id"])
                    labels = {
                        k: v
                        for k, v in node.get("labels", {}).items()
                        if not k.startswith("ray.io/")
                    }
                    event = (time.monotonic() - self.started, "…" + node["node_id"][-6:], labels)
                    self.events.append(event)
                    print(
                        f"[{event[0]:6.1f}s] node {event[1]} joined, labels {labels}, "
                        f"resources {node.get('resources_total')}",
                        flush=True,
                    )


def worker_group_events(temp_dir: Path) -> list[tuple[str, str]]:
    """(time, message) of Ray Train's controller: worker groups started and resize decisions.

    Read from the controller's structured log in this cluster's own temp dir: the steps in
    metrics.csv cannot show a resize that happens before the first group ran a step.
    """
    wanted = ("Started training worker group of size", "Deciding to resize")
    events = []
    for path in sorted(temp_dir.glob("session_*/logs/train/ray-train-sys-controller-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            message = str(entry.get("message", ""))
            if any(w in message for w in wanted):
                events.append((str(entry.get("asctime", "")), message.split(":")[0].strip()))
    return sorted(set(events))  # session_latest links to the session dir: read once


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def group_sizes(metrics_csv: Path) -> tuple[list[tuple[int, int, list[str]]], list[int]]:
    """Runs of steps trained by the same workers, and the steps that ran twice.

    A resize restarts the worker group from the last checkpoint, so the steps after that
    checkpoint run once in the old group and again in the new one; each such step then has
    records from both groups, and its workers are those of the new group.

    Returns:
        ([(first step, worker count, workers)], [steps that ran twice]).
    """
    from raytrain_hetero.app.outputs import read_metrics_csv

    by_step: dict[int, list[str]] = defaultdict(list)
    for row in read_metrics_csv(metrics_csv):
        by_step[row["step"]].append(row["worker"])
    runs: list[tuple[int, int, list[str]]] = []
    repeated = []
    for step in sorted(by_step):
        workers = sorted(set(by_step[step]))
        if len(workers) != len(by_step[step]):
            repeated.append(step)
        if not runs or runs[-1][2] != workers:
            runs.append((step, len(workers), workers))
    return runs, repeated


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="state/logs/temp dir (default: a new /tmp/rh-autoscale-* dir)",
    )
    parser.add_argument("--epochs", type=int, default=60)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    state_dir = args.state_dir or Path(tempfile.mkdtemp(prefix="rh-autoscale-", dir="/tmp"))
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # private: local_cluster checks
    # This process becomes the job's driver: it must use the cluster's token. Ray reads the
    # auth mode when it is first imported, so set it before anything imports ray.
    os.environ.update(
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN_PATH=str(state_dir / "auth_token"),
        RAY_TRAIN_HEALTH_CHECK_INTERVAL_S="0.2",
    )
    for key in ("RAY_ADDRESS", "RAY_AUTH_TOKEN"):
        os.environ.pop(key, None)
    lc = load_local_cluster()
    cluster = lc.LocalCluster(state_dir, extra_env={"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"})
    config_path = state_dir / "autoscaling.json"

    def write_config(gcs_address: str) -> Path:
        config_path.write_text(json.dumps(fake_autoscaling_config(gcs_address), indent=2))
        return config_path

    started = time.monotonic()
    watcher = NodeWatcher(cluster, started)
    grew = False
    try:
        cluster.start_head(
            num_cpus=HEAD_CPUS,
            autoscaling_config=write_config,
            env=head_environment(),
            labels=HEAD_LABELS,
        )
        print(
            f"head up at {cluster.address} (dashboard {cluster.dashboard_url}); node types "
            f"{ {n: (cpus, labels) for n, (cpus, labels, _) in NODE_TYPES.items()} }, none running",
            flush=True,
        )
        watcher.start()
        assert cluster.token_path == state_dir / "auth_token"
        from raytrain_hetero.app.config import validate_config
        from raytrain_hetero.app.job import run_job

        job = validate_config(job_dict(state_dir, cluster.address, args.epochs), "autoscaling-demo")
        print(
            f"[{time.monotonic() - started:6.1f}s] training: slots "
            f"{[w.name for w in job.workers]}, min_workers {job.elastic.min_workers}",
            flush=True,
        )
        summary = run_job(job, progress=False)
        events = worker_group_events(cluster.temp_dir)
        print("Ray Train's worker group:")
        for when, message in events:
            print(f"  {when}  {message}")
        sizes = [int(m.rsplit(" ", 1)[1]) for _, m in events if m.startswith("Started training")]
        runs, repeated = group_sizes(Path(job.output_dir) / "metrics.csv")
        print("steps trained, by worker group:")
        for step, size, workers in runs:
            print(f"  from step {step:4d}: {size} worker(s) {workers}")
        if repeated:
            print(
                f"  steps {repeated[0]}-{repeated[-1]} ran in both groups: the resize "
                "restarted from the last checkpoint (end of the previous epoch)"
            )
        grew = len(sizes) > 1 and sizes[-1] > sizes[0]
        joined = Counter(tuple(sorted(e[2].items())) for e in watcher.events)
        print(f"nodes that joined: {dict(joined)}")
        print(
            f"final validation accuracy {summary['final_val_accuracy']:.3f}, "
            f"{summary['steps']} steps, {time.monotonic() - started:.0f}s in all"
        )
        print("RESULT:", "the worker group grew" if grew else "the worker group did NOT grow")
    finally:
        watcher.stop_event.set()
        import ray

        if ray.is_initialized():
            ray.shutdown()
        killed = cluster.stop()
        left = cluster.cluster_pids()
        print(f"cluster stopped ({len(killed)} process(es) needed SIGKILL, {len(left)} left)")
    return 0 if grew else 1


if __name__ == "__main__":
    sys.exit(main())
