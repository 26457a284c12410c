"""Elastic join/leave and worker failure on a real multi-node Ray cluster.

A restarted worker group resumes from the newest checkpoint, so steps that the old group ran
after that checkpoint are rolled back (their updates are discarded with the old model state).
The ledger that must be exactly-once per epoch is therefore: every group's steps up to the
cursor where the next group resumed. Dropping the rest is only correct if the restored model
state is the state recorded at that cursor, so every restore is checked against the parameter
digest the checkpoint's writer recorded with it (``ledgers.assert_restores_match``): a resume
at the wrong cursor (or with another checkpoint's model) fails the test.
"""

from __future__ import annotations

import threading

import ledgers
import numpy as np
import pytest
import ray
import torch
from ledgers import assert_exactly_once, assert_restores_match, params_digest
from ray.cluster_utils import Cluster
from ray.train import FailureConfig, RunConfig
from ray_env import FAST_NODE_DEATH, worker_runtime_env
from train_loops import live_loop, make_regression_data, one_device_params, wide_model

from raytrain_hetero import BatchConfig, ElasticConfig, HeteroTrainer, WorkerSpec

pytestmark = pytest.mark.ray

CRASH_SIZE, CRASH_BATCH = 240, 48  # 5 steps per epoch, no short tail


def fresh_digest() -> str:
    """Digest of live_loop's freshly built model (what a group without a checkpoint holds)."""
    return params_digest(wide_model(64, 3))


def committed_ledger(out):
    """Ledger entries that survived restarts, once every restore is checked (module docstring).

    A group's steps count up to the next group's resume cursor, which is only correct if the
    model state that group restored IS the state at that cursor: checked first.
    """
    assert_restores_match(out, fresh_digest())
    return ledgers.committed_ledger(out)


@pytest.fixture(scope="module")
def cluster():
    if ray.is_initialized():
        ray.shutdown()
    # The head has CPUs but no `pool` label: Ray 2.60's own elastic sizing would count them as
    # room for a worker that cannot land there (and loop on placement timeouts);
    # HeteroElasticScalingPolicy sizes the group slot by slot, label selectors included.
    # One cluster for the module: each test adds its nodes under its own `pool` label and
    # removes them at its end, so no test sees another's nodes.
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "_system_config": FAST_NODE_DEATH},
    )
    ray.init(address=cluster.address, runtime_env=worker_runtime_env(), log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture
def pool(cluster, request):
    """Adds nodes labelled with this test's own pool; removes those still alive afterwards."""
    name = request.node.name.removeprefix("test_")[:20]
    added = []

    def add(num_cpus):
        node = cluster.add_node(num_cpus=num_cpus, labels={"pool": name})
        added.append(node)
        return node

    add.name = name
    yield add
    for node in added:
        if node in cluster.worker_nodes:
            cluster.remove_node(node)


def test_joining_node_grows_the_group_and_gets_a_slice(cluster, pool, tmp_path):
    pool(2)
    cluster.wait_for_nodes()
    out = tmp_path / "join"
    out.mkdir()
    size = 480  # B=48: 10 steps per epoch
    trainer = HeteroTrainer(
        live_loop,
        train_loop_config={
            "size": size,
            "epochs": 40,
            "out": str(out),
            "checkpoint_every": 2,
            "stop_at_world": 3,
            "steps_at_full": 4,
            "step_sleep_s": 0.05,
        },
        workers=[WorkerSpec(name="w", count=3, label_selector={"pool": pool.name})],
        batch=BatchConfig(global_batch_size=48),
        elastic=ElasticConfig(min_workers=2, resize_monitor_interval_s=1.0),
        run_config=RunConfig(
            name="join",
            storage_path=str(tmp_path / "results"),
            failure_config=FailureConfig(max_failures=3),
        ),
    )
    joined = threading.Event()

    def progress(update):
        if not joined.is_set() and any(r.world_size == 2 for r in update.records):
            pool(1)
            joined.set()

    result = trainer.fit(progress=progress, poll_interval_s=0.5)
    assert result.error is None
    assert joined.is_set()
    worlds = {r.world_size for r in trainer.step_records}
    assert worlds == {2, 3}, worlds
    grown = [r for r in trainer.step_records if r.world_size == 3]
    assert {r.rank for r in grown} == {0, 1, 2}
    assert min(r.slice for r in grown) >= 1
    # The restarted group started from known cost models: the two slots the first group
    # measured (and the new slot's worker type, remembered in the run's storage).
    grown_plans = [p for p in trainer.plans if p.world_size == 3]
    assert grown_plans and "remembered cost models" in grown_plans[0].reason, grown_plans
    kept, groups = committed_ledger(out)
    assert len(groups) >= 2
    epochs = sorted({e["epoch"] for e in kept})
    full_epochs = list(epochs[:-1])  # the last epoch may stop early by design
    assert full_epochs, "expected at least one complete epoch"
    assert_exactly_once(kept, size, full_epochs)


def _crash_run(tmp_path, pool_name):
    out = tmp_path / "crashed"
    out.mkdir()
    config = {"size": CRASH_SIZE, "epochs": 2, "out": str(out), "checkpoint_every": 2}
    config["crash_rank_at"] = 5
    trainer = HeteroTrainer(
        live_loop,
        train_loop_config=config,
        workers=[WorkerSpec(name="w", count=3, label_selector={"pool": pool_name})],
        batch=BatchConfig(global_batch_size=CRASH_BATCH, fixed_shares=[1.0, 2.0, 3.0]),
        run_config=RunConfig(
            name="crashed",
            storage_path=str(tmp_path / "results"),
            failure_config=FailureConfig(max_failures=2),
        ),
    )
    result = trainer.fit()
    assert result.error is None
    return out


def test_worker_crash_resumes_to_the_same_parameters(cluster, pool, tmp_path):
    pool(3)
    cluster.wait_for_nodes()
    crashed = _crash_run(tmp_path, pool.name)
    assert (crashed / "crashed_once").read_text() == "5"
    kept, groups = committed_ledger(crashed)
    assert len(groups) == 2
    # Resumed right after a checkpoint (every 2 steps) no later than the crash; Ray Train may
    # not have registered the newest checkpoint yet when the worker died.
    resume = min(e["step"] for e in groups[1])
    assert resume in (2, 4)
    starts = ledgers.restores(crashed)
    assert [s["resume_step"] for s in starts] == [0, resume]
    assert_exactly_once(kept, CRASH_SIZE, [0, 1])
    # The parameters a run without the crash reaches (float32: sums in another order).
    x, y, _ = make_regression_data(CRASH_SIZE, 64, 3, torch.float32)
    want = one_device_params(wide_model(64, 3), x, y, batch=CRASH_BATCH, epochs=2, lr=0.1)
    got = np.load(crashed / "final_params.npy")
    assert np.linalg.norm(got - want) / np.linalg.norm(want) <= 1e-4


def test_losing_a_node_shrinks_the_group_and_the_run_completes(
    cluster, pool, tmp_path, monkeypatch
):
    # A restart that still counts the lost node (not yet declared dead) waits this long for
    # its placement before Ray Train retries with the workers that fit (default 60 s).
    monkeypatch.setenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "30")
    pool(2)
    doomed = pool(1)
    cluster.wait_for_nodes()
    out = tmp_path / "leave"
    out.mkdir()
    size = 480
    trainer = HeteroTrainer(
        live_loop,
        train_loop_config={
            "size": size,
            "epochs": 3,
            "out": str(out),
            "checkpoint_every": 2,
            "step_sleep_s": 0.05,
        },
        workers=[WorkerSpec(name="w", count=3, label_selector={"pool": pool.name})],
        batch=BatchConfig(global_batch_size=48),
        elastic=ElasticConfig(min_workers=2, resize_monitor_interval_s=1.0),
        run_config=RunConfig(
            name="leave",
            storage_path=str(tmp_path / "results"),
            failure_config=FailureConfig(max_failures=3),
        ),
    )
    removed = threading.Event()

    def progress(update):
        if not removed.is_set() and any(r.step >= 4 for r in update.records):
            cluster.remove_node(doomed)
            removed.set()

    result = trainer.fit(progress=progress, poll_interval_s=0.5)
    assert result.error is None
    assert removed.is_set()
    worlds = [r.world_size for r in sorted(trainer.step_records, key=lambda r: r.step)]
    assert worlds[0] == 3 and worlds[-1] == 2
    kept, _groups = committed_ledger(out)
    assert_exactly_once(kept, size, [0, 1, 2])
