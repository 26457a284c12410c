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

Every node is one ``ray start --block`` process started in its own process session; ``start``
records each node's PID, process group and start time. ``stop`` first lists the processes of
the recorded nodes that are still the processes it started (same PID *and* start time, read
from /proc): their process groups and every process below them (Ray workers the raylet put in
groups of their own); it signals only those (SIGTERM, then SIGKILL after a grace period).
It never matches command lines and never runs ``ray stop`` (which ends every Ray process on
the machine).

Private state: the state directory (default ``$XDG_RUNTIME_DIR/rh-cluster``, else
``/tmp/rh-cluster-<uid>``) is created with mode 0700; an existing one that is a symlink, is
owned by another user or is open to group/others is refused, and so is a token file this tool
did not write (its SHA-256 is recorded in the state file), so nobody can plant a known token.

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
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# The sibling module, also when this file is loaded by path (the tests do).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from cluster_safety import (
    ClusterStateError,
    ProcessIdentity,
    ProcStat,
    all_proc_stats,
    check_private,
    proc_stat,
    secure_state_dir,
    token_digest,
)

logger = logging.getLogger("local_cluster")

STATE_DIR_ENV_VAR = "RAYTRAIN_HETERO_LOCAL_CLUSTER"


def default_state_dir() -> Path:
    """``$RAYTRAIN_HETERO_LOCAL_CLUSTER``, else ``$XDG_RUNTIME_DIR/rh-cluster`` (a per-user
    0700 directory), else ``<tmp>/rh-cluster-<uid>`` (short: Ray's unix sockets live below it
    and a socket path has at most 107 bytes)."""
    if os.environ.get(STATE_DIR_ENV_VAR):
        return Path(os.environ[STATE_DIR_ENV_VAR])
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and Path(runtime).is_dir():
        return Path(runtime) / "rh-cluster"
    return Path(tempfile.gettempdir()) / f"rh-cluster-{os.getuid()}"


DEFAULT_STATE_DIR = default_state_dir()
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
    start_ticks: int = -1  # /proc start time: stop() signals it only while it still matches

    @property
    def identity(self) -> ProcessIdentity:
        """The process ``start`` launched (PID plus start time)."""
        return ProcessIdentity(self.pid, self.start_ticks)


@dataclass
class LocalCluster:
    """A head node plus tagged worker nodes on this machine, all owned by this object.

    Attributes:
        state_dir: Holds the state file, token, logs and the cluster's Ray temp directory;
            private to this user (mode 0700, checked by ``start_head`` and ``load``).
        gcs_port, dashboard_port: Ports of the head (the dashboard on 127.0.0.1).
        nodes: The started processes, head first.
        extra_env: Added to every node's environment (e.g. RAY_TRAIN_* settings).
        token_sha256: Digest of the token this tool wrote (a token file that does not match
            is refused).
    """

    state_dir: Path
    gcs_port: int = 0
    dashboard_port: int = 0
    nodes: list[NodeProcess] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)
    token_sha256: str = ""
    #: Every process ``stop`` found and signalled (``cluster_pids`` still reports survivors).
    _stopped: set[ProcessIdentity] = field(default_factory=set, repr=False)

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

    def _recordedtoken_digest(self) -> str:
        if self.token_sha256:
            return self.token_sha256
        state = self.state_dir / STATE_FILE
        if not state.exists():
            return ""
        check_private(state, kind="file")
        return str(json.loads(state.read_text()).get("token_sha256", ""))

    def _ensure_token(self) -> None:
        """Write a new token (mode 0600), or reuse one only if this tool wrote it."""
        try:
            check_private(self.token_path, kind="file")
        except FileNotFoundError:
            token = secrets.token_hex(32)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            with os.fdopen(os.open(self.token_path, flags, 0o600), "w") as fh:
                fh.write(token)
            self.token_sha256 = token_digest(token)
            self.save()
            return
        recorded = self._recordedtoken_digest()
        if not recorded or recorded != token_digest(self.token_path.read_text()):
            raise ClusterStateError(
                f"refusing the token file {self.token_path}: it was not written by this tool "
                f"(its digest is not the one recorded in {self.state_dir / STATE_FILE}), so "
                "its value may be known to someone else. Fix: delete it; start writes a new one."
            )
        self.token_sha256 = recorded

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
        found = proc_stat(proc.pid)
        node = NodeProcess(
            name,
            proc.pid,
            os.getpgid(proc.pid),
            str(log),
            labels,
            resources,
            start_ticks=found.start_ticks if found else -1,
        )
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
        self.state_dir = secure_state_dir(self.state_dir)
        self.temp_dir.mkdir(mode=0o700, exist_ok=True)
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

    def _live_processes(self) -> set[ProcessIdentity]:
        """The processes of this cluster running now: the process groups of the recorded
        nodes that are still the processes ``start`` launched, and every process below those
        nodes (Ray workers the raylet put in process groups of their own). Found by PID,
        process group, parent and start time, never by command line."""
        stats = all_proc_stats()
        ours = [n for n in self.nodes if n.identity.alive()]
        pgids = {n.pgid for n in ours}
        children: dict[int, list[ProcStat]] = {}
        for st in stats:
            children.setdefault(st.ppid, []).append(st)
        found = {ProcessIdentity(st.pid, st.start_ticks) for st in stats if st.pgid in pgids}
        todo = [n.pid for n in ours]
        while todo:
            for child in children.get(todo.pop(), []):
                found.add(ProcessIdentity(child.pid, child.start_ticks))
                todo.append(child.pid)
        found |= {p for p in self._stopped if p.alive()}
        return {p for p in found if p.pid != os.getpid() and p.alive()}

    def cluster_pids(self) -> list[int]:
        """PIDs of every process of this cluster that runs now (see ``stop``)."""
        return sorted(p.pid for p in self._live_processes())

    def stop(self, grace_s: float = 20.0) -> list[int]:
        """End every process this cluster started; returns the PIDs that needed SIGKILL.

        Only recorded nodes whose PID *and* start time still match are signalled (by process
        group), plus the processes found below them before signalling.
        """
        targets = self._live_processes()
        self._stopped |= targets
        for node in reversed(self.nodes):  # workers first, the head last
            if node.identity.alive():
                _signal_group(node.pgid, signal.SIGTERM)
            elif _pid_alive(node.pid):
                logger.warning(
                    "node '%s': pid %d now belongs to another process (start time differs from "
                    "the recorded one); not signalled",
                    node.name,
                    node.pid,
                )
            else:
                logger.info("node '%s' (pid %d) already gone", node.name, node.pid)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(p.alive() for p in targets):
            self._reap()
            time.sleep(0.5)
        leftover = [p for p in targets if p.alive()]
        for process in leftover:
            if process.alive():  # checked again just before the signal
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGKILL)
        killed = sorted(p.pid for p in leftover)
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
        """Write the state file (what ``stop`` and ``status`` read), mode 0600, atomically."""
        data = {
            "state_dir": str(self.state_dir),
            "gcs_port": self.gcs_port,
            "dashboard_port": self.dashboard_port,
            "nodes": [asdict(n) for n in self.nodes],
            "extra_env": self.extra_env,
            "token_sha256": self.token_sha256,
        }
        tmp = self.state_dir / f".{STATE_FILE}.{os.getpid()}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
        with os.fdopen(os.open(tmp, flags, 0o600), "w") as fh:
            fh.write(json.dumps(data, indent=2))
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.state_dir / STATE_FILE)

    @classmethod
    def load(cls, state_dir: Path) -> LocalCluster:
        """The cluster recorded in ``state_dir`` (raises FileNotFoundError if none).

        Raises:
            ClusterStateError: The directory or its state file is not private to this user
                (a planted state file could name processes for ``stop`` to signal).
        """
        state_dir = Path(state_dir).absolute()
        check_private(state_dir, kind="directory")
        state = state_dir / STATE_FILE
        check_private(state, kind="file")
        data = json.loads(state.read_text())
        return cls(
            state_dir=state_dir,
            gcs_port=data["gcs_port"],
            dashboard_port=data["dashboard_port"],
            nodes=[NodeProcess(**n) for n in data["nodes"]],
            extra_env=data.get("extra_env", {}),
            token_sha256=data.get("token_sha256", ""),
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
    state_dir = args.state_dir.absolute()

    try:
        return _run(args, state_dir)
    except ClusterStateError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _run(args: argparse.Namespace, state_dir: Path) -> int:
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
        print(f"(state, token and logs in {cluster.state_dir}, mode 0700)")
        return 0

    try:
        cluster = LocalCluster.load(state_dir)
    except FileNotFoundError:
        print(f"no cluster recorded in {state_dir}", file=sys.stderr)
        return 1
    if args.command == "status":
        for node in cluster.nodes:
            print(
                f"{node.name:8s} pid {node.pid:7d} {'alive' if node.identity.alive() else 'gone':5s} "
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
