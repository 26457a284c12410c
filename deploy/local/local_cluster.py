#!/usr/bin/env python3
"""A heterogeneous Ray cluster on one machine, for trying raytrain_hetero out.

Starts a head node that runs no training (0 CPUs: only the GCS, the dashboard, job drivers and
Ray Train's controller) and one Ray worker node per *pool*, each tagged with the node label
``pool=<name>`` that ``WorkerSpec.label_selector`` selects on (the same scheme as
``deploy/cluster.yaml`` and ``deploy/kuberay/``; see ``examples/configs/eurosat_local_cluster.yaml``)::

    python deploy/local/local_cluster.py start                 # head + pools fast (2 CPU), slow (1 CPU)
    python deploy/local/local_cluster.py start --pool fast:2 --pool slow:1 --pool gpu:4:1
    python deploy/local/local_cluster.py status
    python deploy/local/local_cluster.py stop                  # stops exactly what start started

Every node is one ``ray start --block`` process started in its own process session; ``stop``
signals those process groups only (SIGTERM, then SIGKILL after a grace period) and then ends
any leftover process of this cluster, recognised by the cluster's private temp directory in
its command line. It never runs ``ray stop`` (which ends every Ray process on the machine).

Safe defaults: the dashboard (and Jobs API) listens on 127.0.0.1 only, and token
authentication stays on: the token lives in ``<state-dir>/auth_token`` (mode 0600) and
``start`` prints the environment a client needs (``RAY_AUTH_MODE``, ``RAY_AUTH_TOKEN_PATH``).
The cluster keeps its session files in ``<state-dir>/ray`` (its own ``--temp-dir``), so it does
not become the cluster a bare ``ray.init()`` elsewhere on the machine joins.

Importable too (the tests use :class:`LocalCluster` directly).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger("local_cluster")

DEFAULT_STATE_DIR = Path(os.environ.get("RAYTRAIN_HETERO_LOCAL_CLUSTER", "/tmp/rh-cluster"))
#: Default pools: name -> (CPUs, GPUs).
DEFAULT_POOLS: dict[str, tuple[float, int]] = {"fast": (2, 0), "slow": (1, 0)}
POOL_LABEL = "pool"
STATE_FILE = "cluster.json"


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ray_executable() -> str:
    found = shutil.which("ray")
    if found:
        return found
    candidate = Path(sys.executable).with_name("ray")
    if candidate.exists():
        return str(candidate)
    raise FileNotFoundError("the 'ray' command is not on PATH: pip install 'ray[default]'")


@dataclass
class NodeProcess:
    """One ``ray start --block`` process (leader of its own process group)."""

    name: str
    pid: int
    pgid: int
    log: str
    labels: dict[str, str] = field(default_factory=dict)
    resources: dict[str, float] = field(default_factory=dict)


@dataclass
class LocalCluster:
    """A head node plus tagged worker nodes on this machine, all owned by this object.

    Attributes:
        state_dir: Holds the state file, token, logs and the cluster's Ray temp directory.
        gcs_port, dashboard_port: Ports of the head (the dashboard on 127.0.0.1).
        nodes: The started processes, head first.
        extra_env: Added to every node's environment (e.g. RAY_TRAIN_* settings).
    """

    state_dir: Path
    gcs_port: int = 0
    dashboard_port: int = 0
    nodes: list[NodeProcess] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)

    # ----------------------------------------------------------------------- properties

    @property
    def temp_dir(self) -> Path:
        """This cluster's private Ray temp directory (``ray start --temp-dir``)."""
        return self.state_dir / "ray"

    @property
    def token_path(self) -> Path:
        """The token file every node and client uses."""
        return self.state_dir / "auth_token"

    @property
    def address(self) -> str:
        """GCS address (what ``ray.init(address=...)`` and worker nodes take)."""
        return f"127.0.0.1:{self.gcs_port}"

    @property
    def dashboard_url(self) -> str:
        """Dashboard / Jobs API URL (what ``ray job submit --address`` takes)."""
        return f"http://127.0.0.1:{self.dashboard_port}"

    def client_env(self) -> dict[str, str]:
        """Environment a client (``ray job submit``, ``ray.init``) needs for this cluster."""
        return {
            "RAY_ADDRESS": self.dashboard_url,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.token_path),
        }

    def auth_headers(self) -> dict[str, str]:
        """HTTP headers that authenticate against this cluster's dashboard."""
        return {"Authorization": f"Bearer {self.token_path.read_text().strip()}"}

    # ----------------------------------------------------------------------- start

    def _node_env(self) -> dict[str, str]:
        env = dict(os.environ)
        for key in ("RAY_ADDRESS", "RAY_AUTH_TOKEN"):
            env.pop(key, None)  # never join or authenticate against another cluster
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(self.token_path))
        # On SIGTERM a node first drains for up to 30 s (for Ray Serve); nothing here needs it.
        env.setdefault("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "0")
        env.update(self.extra_env)
        return env

    def _ensure_token(self) -> None:
        if not self.token_path.exists():
            fd = os.open(self.token_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_hex(32))

    def _launch(
        self,
        name: str,
        args: list[str],
        labels: dict[str, str],
        resources: dict[str, float],
        env: dict[str, str] | None = None,
    ) -> NodeProcess:
        log = self.state_dir / f"{name}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [_ray_executable(), "start", "--block", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env or self._node_env(),
                start_new_session=True,  # its own process group: stop() signals only it
            )
        node = NodeProcess(name, proc.pid, os.getpgid(proc.pid), str(log), labels, resources)
        self.nodes.append(node)
        self.save()
        return node

    @staticmethod
    def _port_args(agent_port: int) -> list[str]:
        # Fixed defaults (e.g. the agent's 52365) collide when several nodes share a machine.
        return [
            f"--node-manager-port={free_port()}",
            f"--object-manager-port={free_port()}",
            f"--dashboard-agent-listen-port={agent_port}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
        ]

    def start_head(
        self,
        *,
        num_cpus: float = 0,
        dashboard_port: int | None = None,
        autoscaling_config: Path | Callable[[str], Path] | None = None,
        env: dict[str, str] | None = None,
        labels: dict[str, str] | None = None,
        attempts: int = 3,
    ) -> NodeProcess:
        """Start the head node (no training resources by default) and wait for its dashboard.

        Ports are picked free just before the start; if another process takes one first (the
        head then exits at once), the head is started again on new ports.

        Args:
            num_cpus: CPUs the head offers (0: it runs no training).
            dashboard_port: Dashboard port (default: a free one).
            autoscaling_config: Autoscaler config (``--autoscaling-config``), e.g. for Ray's
                fake multinode provider (then set ``RAY_FAKE_CLUSTER=1`` in ``env``); or a
                function of the GCS address that writes one and returns its path.
            env: Extra environment of the head process only.
            labels: Ray node labels of the head (e.g. to let some workers select it).
            attempts: Starts to try before giving up.
        """
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.temp_dir.mkdir(parents=True, exist_ok=True)
        self._ensure_token()
        for attempt in range(1, attempts + 1):
            try:
                return self._start_head_once(
                    num_cpus, dashboard_port, autoscaling_config, env, labels
                )
            except RuntimeError as exc:
                self.stop()
                self.gcs_port = self.dashboard_port = 0
                if attempt == attempts or (
                    "already in use" not in str(exc) and "Failed to start" not in str(exc)
                ):
                    raise
                logger.warning(
                    "head start %d/%d failed on a port clash; retrying", attempt, attempts
                )
        raise AssertionError("unreachable")

    def _start_head_once(
        self,
        num_cpus: float,
        dashboard_port: int | None,
        autoscaling_config: Path | Callable[[str], Path] | None,
        env: dict[str, str] | None,
        labels: dict[str, str] | None,
    ) -> NodeProcess:
        self.gcs_port = self.gcs_port or free_port()
        self.dashboard_port = dashboard_port or self.dashboard_port or free_port()
        args = [
            "--head",
            "--node-ip-address=127.0.0.1",
            f"--port={self.gcs_port}",
            f"--temp-dir={self.temp_dir}",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={self.dashboard_port}",
            f"--num-cpus={num_cpus:g}",
            "--num-gpus=0",
            "--disable-usage-stats",
            *self._port_args(agent_port := free_port()),
        ]
        if callable(autoscaling_config):
            autoscaling_config = autoscaling_config(self.address)
        if autoscaling_config is not None:
            args.append(f"--autoscaling-config={autoscaling_config}")
        if labels:
            args.append("--labels=" + ",".join(f"{k}={v}" for k, v in labels.items()))
        node_env = self._node_env()
        node_env.update(env or {})
        node = self._launch("head", args, dict(labels or {}), {"CPU": num_cpus}, env=node_env)
        self.wait_for_nodes(1, timeout_s=120)
        # Job submission goes through the head's dashboard agent: wait until it listens.
        self._wait_for_port(agent_port, node, timeout_s=120)
        return node

    def _wait_for_port(self, port: int, node: NodeProcess, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=2).close()
                return
            except OSError:
                pass
            if not _pid_alive(node.pid):
                raise RuntimeError(f"node '{node.name}' exited; see {node.log}")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"node '{node.name}': nothing listens on {port} after {timeout_s:.0f}s"
                )
            time.sleep(0.5)

    def add_pool(
        self,
        name: str,
        num_cpus: float,
        num_gpus: int = 0,
        resources: dict[str, float] | None = None,
    ) -> NodeProcess:
        """Start a worker node labelled ``pool=<name>`` and wait until it has joined."""
        labels = {POOL_LABEL: name}
        args = [
            f"--address={self.address}",
            "--node-ip-address=127.0.0.1",
            f"--num-cpus={num_cpus:g}",
            f"--num-gpus={num_gpus}",
            f"--labels={POOL_LABEL}={name}",
            "--disable-usage-stats",
            *self._port_args(free_port()),
        ]
        if resources:
            args.append(f"--resources={json.dumps(resources)}")
        expected = len(self.alive_nodes()) + 1
        node = self._launch(
            name, args, labels, {"CPU": num_cpus, "GPU": num_gpus, **(resources or {})}
        )
        self.wait_for_nodes(expected, timeout_s=120)
        return node

    # ----------------------------------------------------------------------- query

    def _api(self, path: str, timeout_s: float = 10) -> Any:
        request = urllib.request.Request(self.dashboard_url + path, headers=self.auth_headers())
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read().decode())

    def alive_nodes(self) -> list[dict[str, Any]]:
        """Alive nodes as the dashboard's state API lists them ([] if it is not up yet)."""
        try:
            body = self._api("/api/v0/nodes?limit=1000&detail=true")
        except (urllib.error.URLError, OSError, ValueError):
            return []
        rows = body.get("data", {}).get("result", {}).get("result", [])
        return [r for r in rows if r.get("state") == "ALIVE"]

    def wait_for_nodes(self, count: int, timeout_s: float) -> list[dict[str, Any]]:
        """Block until ``count`` nodes are alive; raise if a node process died or time ran out."""
        deadline = time.monotonic() + timeout_s
        while True:
            nodes = self.alive_nodes()
            if len(nodes) >= count:
                return nodes
            dead = [n for n in self.nodes if not _pid_alive(n.pid)]
            if dead:
                tail = Path(dead[0].log).read_text(errors="replace")[-3000:]
                raise RuntimeError(f"node '{dead[0].name}' exited during start; its log:\n{tail}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(nodes)}/{count} nodes alive after {timeout_s:.0f}s")
            time.sleep(1.0)

    # ----------------------------------------------------------------------- stop

    def cluster_pids(self) -> list[int]:
        """PIDs of every process of this cluster: the node process groups, plus any process
        whose command line names this cluster's temp directory (e.g. workers the raylet put
        in process groups of their own)."""
        pgids = {n.pgid for n in self.nodes}
        marker = str(self.temp_dir)
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            try:
                in_group = os.getpgid(pid) in pgids
                cmdline = (
                    (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                )
            except (OSError, ProcessLookupError):
                continue
            if pid != os.getpid() and (in_group or marker in cmdline) and _pid_alive(pid):
                found.append(pid)
        return sorted(found)

    def stop(self, grace_s: float = 20.0) -> list[int]:
        """End every process this cluster started; returns the PIDs that needed SIGKILL."""
        for node in reversed(self.nodes):  # workers first, the head last
            _signal_group(node.pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and self.cluster_pids():
            self._reap()
            time.sleep(0.5)
        killed = self.cluster_pids()
        for pid in killed:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if killed:
            logger.warning("SIGKILLed %d leftover process(es): %s", len(killed), killed)
            time.sleep(0.5)
        self._reap()
        self.nodes = []
        self.save()
        return killed

    def _reap(self) -> None:
        """Collect exit statuses of node processes this process started (no zombies)."""
        for node in self.nodes:
            # Not our child (started by an earlier 'start' command), or already reaped.
            with contextlib.suppress(ChildProcessError):
                os.waitpid(node.pid, os.WNOHANG)

    # ----------------------------------------------------------------------- state

    def save(self) -> None:
        """Write the state file (what ``stop`` and ``status`` read)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        data = {
            "state_dir": str(self.state_dir),
            "gcs_port": self.gcs_port,
            "dashboard_port": self.dashboard_port,
            "nodes": [asdict(n) for n in self.nodes],
            "extra_env": self.extra_env,
        }
        tmp = self.state_dir / f".{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(data, indent=2))
        os.replace(tmp, self.state_dir / STATE_FILE)

    @classmethod
    def load(cls, state_dir: Path) -> LocalCluster:
        """The cluster recorded in ``state_dir`` (raises FileNotFoundError if none)."""
        data = json.loads((Path(state_dir) / STATE_FILE).read_text())
        return cls(
            state_dir=Path(data["state_dir"]),
            gcs_port=data["gcs_port"],
            dashboard_port=data["dashboard_port"],
            nodes=[NodeProcess(**n) for n in data["nodes"]],
            extra_env=data.get("extra_env", {}),
        )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by its parent) counts as gone.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def parse_pool(text: str) -> tuple[str, float, int]:
    """``name:cpus[:gpus]`` -> (name, cpus, gpus)."""
    parts = text.split(":")
    if len(parts) not in (2, 3) or not parts[0]:
        raise argparse.ArgumentTypeError(f"--pool {text!r}: write NAME:CPUS or NAME:CPUS:GPUS")
    return parts[0], float(parts[1]), int(parts[2]) if len(parts) == 3 else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: start, status, stop."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("start", "status", "stop"))
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=DEFAULT_STATE_DIR,
        help=f"state, token, logs, Ray temp dir (default {DEFAULT_STATE_DIR})",
    )
    parser.add_argument(
        "--pool",
        action="append",
        type=parse_pool,
        default=None,
        metavar="NAME:CPUS[:GPUS]",
        help="a worker node labelled pool=NAME (repeatable; default fast:2 slow:1)",
    )
    parser.add_argument(
        "--head-cpus",
        type=float,
        default=0,
        help="CPUs of the head (default 0: the head runs no training)",
    )
    parser.add_argument("--dashboard-port", type=int, default=8265)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    state_dir = args.state_dir.resolve()

    if args.command == "start":
        if (state_dir / STATE_FILE).exists() and LocalCluster.load(state_dir).nodes:
            print(
                f"a cluster is already recorded in {state_dir}: run 'stop' first", file=sys.stderr
            )
            return 1
        cluster = LocalCluster(state_dir)
        port = args.dashboard_port if _port_free(args.dashboard_port) else None
        try:
            cluster.start_head(num_cpus=args.head_cpus, dashboard_port=port)
            pools = args.pool or [(n, c, g) for n, (c, g) in DEFAULT_POOLS.items()]
            for name, cpus, gpus in pools:
                cluster.add_pool(name, cpus, gpus)
        except BaseException:
            cluster.stop()
            raise
        env = cluster.client_env()
        print(
            f"cluster up: {len(cluster.nodes)} nodes, GCS {cluster.address}, "
            f"dashboard {cluster.dashboard_url} (127.0.0.1 only, token auth)"
        )
        print("use it from this shell with:")
        for key, value in env.items():
            print(f"  export {key}={value}")
        print(
            "  ray job submit --working-dir . -- raytrain-hetero train "
            "--config examples/configs/eurosat_local_cluster.yaml"
        )
        print(f"stop it with: python deploy/local/local_cluster.py stop --state-dir {state_dir}")
        return 0

    try:
        cluster = LocalCluster.load(state_dir)
    except FileNotFoundError:
        print(f"no cluster recorded in {state_dir}", file=sys.stderr)
        return 1
    if args.command == "status":
        for node in cluster.nodes:
            print(
                f"{node.name:8s} pid {node.pid:7d} {'alive' if _pid_alive(node.pid) else 'gone':5s} "
                f"labels {node.labels} resources {node.resources}"
            )
        alive = cluster.alive_nodes()
        print(f"{len(alive)} node(s) alive per the dashboard at {cluster.dashboard_url}")
        return 0
    killed = cluster.stop()
    print(f"stopped; {len(killed)} process(es) needed SIGKILL")
    return 0


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


if __name__ == "__main__":
    sys.exit(main())
