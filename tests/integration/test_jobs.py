"""Ray Jobs: ``ray job submit ... -- raytrain-hetero train`` against a real running cluster.

The test starts its own cluster with ``deploy/local/local_cluster.py`` (a head that runs no
training plus worker nodes labelled ``pool=fast`` / ``pool=slow``, every node one
``ray start --block`` in its own process session, private temp dir, token auth, dashboard on
127.0.0.1) and ends exactly those processes afterwards; no other Ray instance is touched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from local_cluster_helper import bystander, end_process, load_local_cluster, pids_naming
from network_sockets import connect_outcome, listening_sockets, non_loopback_ipv4_addresses

REPO = Path(__file__).resolve().parents[2]
CLUSTER_EXAMPLE = REPO / "examples" / "configs" / "eurosat_local_cluster.yaml"

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def cluster():
    """The cluster; its teardown also proves ``LocalCluster.stop`` on a real one: every
    process it started ends, none escapes the tree it walks (e.g. by daemonizing), and an
    unrelated process whose command line names the state dir and temp dir survives."""
    lc = load_local_cluster()
    # Short path: Ray's unix sockets live under the temp dir (108-byte limit).
    state = Path(tempfile.mkdtemp(prefix="rhjobs-", dir="/tmp"))
    cluster = lc.LocalCluster(state, extra_env={"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"})
    unrelated = bystander(str(cluster.temp_dir), str(state))
    try:
        cluster.start_head(num_cpus=0)
        started = cluster.cluster_pids()
        assert len(started) >= 3 and unrelated.pid not in started  # ray start, gcs, raylet...
        assert oct(state.stat().st_mode & 0o777) == "0o700"
        assert cluster.token_path.stat().st_mode & 0o777 == 0o600
        cluster.add_pool("fast", 2)
        cluster.add_pool("slow", 1)
        yield cluster
        # A short grace: some node process outlives SIGTERM for the whole default 20 s (seen
        # as a 20 s teardown); what is asserted is that none survives stop(), SIGKILL or not.
        cluster.stop(grace_s=5.0)
        assert cluster.cluster_pids() == [], "processes of the test cluster survived stop()"
        assert unrelated.poll() is None, "stop ended an unrelated process naming its state dir"
        time.sleep(1)
        assert pids_naming(str(state)) == [unrelated.pid]
    finally:
        if cluster.nodes:
            cluster.stop(grace_s=5.0)
        end_process(unrelated)
        shutil.rmtree(state, ignore_errors=True)


def _http_status(url: str, headers: dict[str, str] | None = None) -> int:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_dashboard_is_loopback_only_and_needs_the_token(cluster):
    assert _http_status(f"{cluster.dashboard_url}/api/jobs/") == 401
    assert _http_status(f"{cluster.dashboard_url}/api/jobs/", cluster.auth_headers()) == 200
    bad = {"Authorization": "Bearer " + "0" * 64}
    assert _http_status(f"{cluster.dashboard_url}/api/jobs/", bad) == 403
    # Bound to loopback: every socket of the cluster's processes on the dashboard port.
    on_port = [
        s for s in listening_sockets(cluster.cluster_pids()) if s.port == cluster.dashboard_port
    ]
    assert on_port, f"nothing of the cluster listens on the dashboard port {cluster.dashboard_port}"
    assert all(s.loopback_only for s in on_port), [str(s) for s in on_port]


def test_dashboard_refuses_connections_on_non_loopback_addresses(cluster):
    addresses = non_loopback_ipv4_addresses()
    if not addresses:
        pytest.skip(
            "this machine has no non-loopback IPv4 address to connect through; the bind "
            "address of the dashboard is still checked by the test above"
        )
    outcomes = {a: connect_outcome(a, cluster.dashboard_port) for a in addresses}
    assert set(outcomes.values()) == {"refused"}, outcomes


def test_ray_job_submit_trains_on_the_tagged_pools(cluster, tmp_path):
    from ray.job_submission import JobStatus, JobSubmissionClient

    # The documented command, run from a working directory holding the config.
    workdir = tmp_path / "project"
    (workdir / "configs").mkdir(parents=True)
    shutil.copy(CLUSTER_EXAMPLE, workdir / "configs" / "cluster.yaml")
    out, data = tmp_path / "out", tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN")}
    env.update(cluster.client_env())
    submitted = subprocess.run(
        [
            "ray",
            "job",
            "submit",
            "--no-wait",
            "--working-dir",
            ".",
            "--",
            "raytrain-hetero",
            "train",
            "--config",
            "configs/cluster.yaml",
            "--no-progress",
            "--output",
            str(out),
            "--set",
            f"data.root={data}",
            "--set",
            "data.generate.samples_per_class=20",
            "--set",
            "train.epochs=1",
            "--set",
            "train.fixed_shares=[2,1]",  # skip probing: keeps the test short
        ],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job_id = next(
        word.strip("'\"")
        for line in submitted.stdout.splitlines() + submitted.stderr.splitlines()
        for word in line.split()
        if word.strip("'\"").startswith("raysubmit_")
    )

    client = JobSubmissionClient(cluster.dashboard_url, headers=cluster.auth_headers())
    deadline = time.monotonic() + 420
    while not (status := client.get_job_status(job_id)).is_terminal():
        assert time.monotonic() < deadline, f"job {job_id} still {status}"
        time.sleep(0.5)
    logs = client.get_job_logs(job_id)
    assert status == JobStatus.SUCCEEDED, logs[-4000:]
    assert "final validation accuracy:" in logs
    info = client.get_job_info(job_id)
    assert info.entrypoint.startswith("raytrain-hetero train --config configs/cluster.yaml")
    assert info.runtime_env["working_dir"].startswith("gcs://")  # the uploaded directory

    summary = json.loads((out / "summary.json").read_text())
    workers = {w["worker"]: w for w in summary["workers"]}
    assert set(workers) == {"fast", "slow"}
    assert sum(w["slice"] for w in workers.values()) == summary["global_batch_size"]
    assert 0.0 <= summary["final_val_accuracy"] <= 1.0
    # The head offers no CPU: both workers ran on the labelled pool nodes.
    nodes = {n["node_id"]: n for n in cluster.alive_nodes()}
    assert sorted(n["labels"].get("pool", "head") for n in nodes.values()) == [
        "fast",
        "head",
        "slow",
    ]
