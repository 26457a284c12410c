"""Heterogeneous placement on a real multi-node Ray cluster (ray.cluster_utils.Cluster)."""

from __future__ import annotations

import json

import pytest
import ray
from ray.cluster_utils import Cluster
from ray.train import RunConfig
from ray_env import worker_runtime_env
from train_loops import placement_loop

from raytrain_hetero import BatchConfig, HeteroTrainer, WorkerSpec
from raytrain_hetero.driver.backend import common_resources, extra_resources

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def two_pool_cluster():
    """One cluster for the module's tests (a start costs seconds on 2 cores): a 1-CPU head,
    a 2-CPU ``fast`` pool with a custom resource and a 3-CPU ``slow`` pool."""
    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=2, resources={"fast_tag": 1}, labels={"pool": "fast"})
    cluster.add_node(num_cpus=3, labels={"pool": "slow"})
    ray.init(address=cluster.address, runtime_env=worker_runtime_env(), log_to_driver=False)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_each_worker_lands_where_its_spec_says(two_pool_cluster, tmp_path):
    out = tmp_path / "where"
    out.mkdir()
    workers = [
        # Needs a 2nd CPU and the node's tag beyond the common {CPU: 1}: held by a lease.
        WorkerSpec(
            name="fast", resources={"CPU": 2, "fast_tag": 1}, label_selector={"pool": "fast"}
        ),
        WorkerSpec(
            name="slow",
            count=2,
            resources={"CPU": 1},
            label_selector={"pool": "slow"},
            emulated_slowdown=2.0,
        ),
    ]
    trainer = HeteroTrainer(
        placement_loop,
        train_loop_config={"out": str(out)},
        workers=workers,
        batch=BatchConfig(global_batch_size=12, fixed_shares=[2.0, 1.0, 1.0]),
        run_config=RunConfig(name="placement", storage_path=str(tmp_path / "results")),
    )
    assert trainer.scaling_config().resources_per_worker == {"CPU": 1}
    result = trainer.fit()
    assert result.error is None
    landed = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
    assert len(landed) == 3
    by_worker = {r["worker"]: r for r in landed}
    assert set(by_worker) == {"fast", "slow-0", "slow-1"}
    assert by_worker["fast"]["pool"] == "fast"
    assert by_worker["slow-0"]["pool"] == by_worker["slow-1"]["pool"] == "slow"
    assert by_worker["fast"]["threads"] == 2 and by_worker["slow-0"]["threads"] == 1
    assert all(r["device"] == "cpu" for r in landed)
    # Slices followed the workers, whatever ranks Ray assigned.
    slices = {r.worker: r.slice for r in trainer.step_records if r.step == 0}
    assert slices == {"fast": 6, "slow-0": 3, "slow-1": 3}


def test_unsatisfiable_lease_names_worker_and_resources(two_pool_cluster, tmp_path, monkeypatch):
    import raytrain_hetero.driver.backend as backend

    monkeypatch.setattr(backend, "LEASE_TIMEOUT_S", 3.0)
    workers = [
        # The slow pool has no fast_tag: the lease cannot be granted there.
        WorkerSpec(
            name="greedy", resources={"CPU": 1, "fast_tag": 1}, label_selector={"pool": "slow"}
        ),
        WorkerSpec(name="plain", resources={"CPU": 1}, label_selector={"pool": "slow"}),
    ]
    trainer = HeteroTrainer(
        placement_loop,
        train_loop_config={"out": str(tmp_path)},
        workers=workers,
        batch=BatchConfig(global_batch_size=4, fixed_shares=[1.0, 1.0]),
        run_config=RunConfig(name="lease", storage_path=str(tmp_path / "results")),
    )
    result_error = None
    try:
        result = trainer.fit()
        result_error = result.error
    except Exception as exc:  # noqa: BLE001 - Ray Train may raise or return the error
        result_error = exc
    assert result_error is not None
    text = str(result_error)
    assert "greedy" in text and "fast_tag" in text


def test_resource_split_helpers():
    common = common_resources([{"CPU": 2, "GPU": 1}, {"CPU": 4}])
    assert common == {"CPU": 2}
    assert extra_resources({"CPU": 2, "GPU": 1}, common) == {"GPU": 1}
    assert extra_resources({"CPU": 4}, common) == {"CPU": 2}
