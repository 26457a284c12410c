"""``tune.allocation: auto`` on a real Ray cluster whose nodes join while a Tune trial runs:
the trial grows onto them, moving twice, and resumes each time at its cursor."""

from __future__ import annotations

import csv
import json
import threading
import time
from pathlib import Path

import pytest
import ray
import yaml
from ray.cluster_utils import Cluster
from ray_env import worker_runtime_env

from raytrain_hetero.app.config import validate_config

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def growing_cluster():
    """A 2-CPU head (one worker slot beside the trial's driver); the test adds nodes."""
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(
        initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False}
    )
    ray.init(address=cluster.address, runtime_env=worker_runtime_env(), log_to_driver=False)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def _allocator_history(deadline: float) -> list:
    """The running search's allocation history (waits for its allocator to exist)."""
    while time.monotonic() < deadline:
        names = [
            a["name"]
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith("raytrain_hetero_allocator:")
        ]
        if names:
            actor = ray.get_actor(names[0], namespace="raytrain_hetero")
            try:
                return list(ray.get(actor.history.remote(), timeout=30))
            except ray.exceptions.RayActorError:
                return []  # the search ended
        time.sleep(0.5)
    raise AssertionError("no allocator started")


def _wait_for_version(version: int, deadline: float, search: threading.Thread) -> None:
    while time.monotonic() < deadline and search.is_alive():
        if any(e.version >= version for e in _allocator_history(deadline)):
            return
        time.sleep(0.5)
    raise AssertionError(f"the trial never reached holding version {version}")


@pytest.mark.timeout(600)
def test_a_trial_grows_onto_joining_nodes_moving_twice_and_resumes_at_its_cursor(
    growing_cluster, tmp_path
):
    """One trial of 3 epochs starts on the head's one slot. A node joins as soon as it holds
    it (long before its first epoch ends: its worker group still starts), so at the end of
    epoch 1 the allocator gives it 2 workers and the trial moves; a third node joins as soon
    as that happens, so at the end of epoch 2 it moves to 3. Asserted: the holdings (each
    worker pinned to a node id of the cluster), one report per epoch in order across the
    three fits (it resumed at its cursor), and the last fit on 3 workers."""
    from raytrain_hetero.app.tune_job import run_tune

    data = yaml.safe_load((REPO / "examples" / "configs" / "eurosat_tune.yaml").read_text())
    data["name"] = "grow"
    data["data"]["root"] = str(tmp_path / "eurosat")
    data["data"]["generate"] = {"samples_per_class": 20}
    data["train"].update(epochs=3, global_batch_size=32)
    data["workers"] = [{"name": "cpu", "resources": {"CPU": 1}, "device": "cpu"}]
    data["tune"] = {
        "search_space": {"train.lr": {"choice": [0.05]}},
        "num_samples": 1,
        "scheduler": "fifo",
        "trial_cpus": 0.25,
        "allocation": "auto",
        "allocator": {"restart_s": 0.0, "max_workers_per_trial": 3},
    }
    job = validate_config(data, "tune.yaml")
    out = tmp_path / "out"
    result: dict = {}
    failed: list = []

    def search() -> None:
        try:
            result["summary"] = run_tune(job, output_dir=out, verbose=0)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            failed.append(exc)

    thread = threading.Thread(target=search, daemon=True)
    thread.start()
    deadline = time.monotonic() + 480
    _wait_for_version(1, deadline, thread)
    growing_cluster.add_node(num_cpus=1)
    _wait_for_version(2, deadline, thread)
    growing_cluster.add_node(num_cpus=1)
    thread.join(timeout=max(deadline - time.monotonic(), 1))
    assert not failed and "summary" in result, failed
    summary = result["summary"]
    assert summary["allocation"] == "auto" and summary["failed_trials"] == 0

    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert len(nodes) == 3
    with open(out / "trials.csv", newline="") as fh:
        (row,) = list(csv.DictReader(fh))
    assert row["status"] == "completed" and row["epochs"] == "3", row
    holdings = [h for h in row["allocation"].split("; ") if "released" not in h]
    assert [h.split(" ")[1:3] for h in holdings] == [["v1", "1"], ["v2", "2"], ["v3", "3"]], row
    assert row["allocations"] == "3" and row["allocation"].endswith("released")
    # Each fit told the allocator its start at its first epoch end (a change's measured cost).
    starts = [float(s) for s in row["fit_starts_s"].split()]
    assert len(starts) == 3 and all(s > 0 for s in starts), row
    # ... split into Ray Train's part and the library's, which add up to it.
    library = [float(s) for s in row["fit_starts_library_s"].split()]
    ray_train = [float(s) for s in row["fit_starts_ray_train_s"].split()]
    assert len(library) == len(ray_train) == 3 and min(library + ray_train) >= 0, row
    for whole, parts in zip(starts, zip(library, ray_train, strict=True), strict=True):
        assert sum(parts) == pytest.approx(whole, abs=0.16), row  # three roundings to 0.1 s
    assert float(row["fit_start_s"]) == pytest.approx(starts[-1], abs=0.06)  # the last fit's
    short = {n[:8] for n in nodes}
    for h in holdings:
        pinned = {part.split("*")[0] for part in h.split(" on ")[1].split(",")}
        assert pinned <= short, (h, short)
    assert len({p.split("*")[0] for p in holdings[-1].split(" on ")[1].split(",")}) == 3
    # The last fit ran on its 3 held workers.
    workers = sorted(k.split("/")[1] for k in row if k.endswith("/slice") and row[k])
    assert workers == ["cpu-0", "cpu-1", "cpu-2"], row
    # Three fits, one Tune trial: every epoch reported once, in order (resumed at its cursor).
    (trial_dir,) = [p for p in Path(summary["storage"]).iterdir() if row["trial_id"] in p.name]
    reports = [json.loads(line) for line in (trial_dir / "result.json").read_text().splitlines()]
    assert [r["epoch"] for r in reports] == [0, 1, 2]
    assert [r["training_iteration"] for r in reports] == [1, 2, 3]
    assert (out / "allocations.png").read_bytes().startswith(b"\x89PNG")
