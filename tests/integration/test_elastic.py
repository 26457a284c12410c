"""Elastic join and leave on a real multi-node Ray cluster, in one run (a node that dies
while the group restarts: test_faults.py).

(A worker process dying mid-step, resumed to the parameters of a run without the crash, is
proven on test_carving_e2e.py's fit, which needs no cluster of its own.)

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
import pytest
import ray
from ledgers import assert_exactly_once, assert_restores_match, params_digest
from ray.cluster_utils import Cluster
from ray.train import FailureConfig, RunConfig
from ray_env import FAST_NODE_DEATH, worker_runtime_env
from train_loops import live_loop, wide_model

from raytrain_hetero import BatchConfig, ElasticConfig, HeteroTrainer, WorkerSpec

pytestmark = pytest.mark.ray


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


def test_a_node_joins_then_leaves_the_group_grows_shrinks_and_stays_exact(
    cluster, pool, tmp_path, monkeypatch
):
    """One elastic run: 2 workers, a node joins (3, from remembered cost models), that node
    is removed under the running group (back to 2), and the run completes exactly once."""
    # A restart that still counts the lost node (not yet declared dead) waits this long for
    # its placement before Ray Train retries with the workers that fit (default 60 s). Only
    # the placement group's wait is bounded (not the workers' start-up), and a start that
    # times out is retried without counting against max_failures: short is safe.
    monkeypatch.setenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "8")
    pool(2)
    cluster.wait_for_nodes()
    out = tmp_path / "elastic"
    out.mkdir()
    size = 480  # B=48: 10 steps per epoch
    trainer = HeteroTrainer(
        live_loop,
        train_loop_config={
            "size": size,
            "epochs": 40,  # ends after 4 steps back at 2 workers (stop_after_regrowth)
            "out": str(out),
            "checkpoint_every": 2,
            "stop_after_regrowth": 2,
            "steps_at_full": 4,
            "step_sleep_s": 0.05,
        },
        workers=[WorkerSpec(name="w", count=3, label_selector={"pool": pool.name})],
        batch=BatchConfig(global_batch_size=48),
        elastic=ElasticConfig(min_workers=2, resize_monitor_interval_s=1.0),
        run_config=RunConfig(
            name="elastic",
            storage_path=str(tmp_path / "results"),
            failure_config=FailureConfig(max_failures=3),
        ),
    )
    joined, removed = threading.Event(), threading.Event()
    grown_steps: set[int] = set()
    joining = []  # the node that joins

    def progress(update):
        if not joined.is_set() and any(r.world_size == 2 for r in update.records):
            joining.append(pool(1))
            joined.set()
        grown_steps.update(r.step for r in update.records if r.world_size == 3)
        if not removed.is_set() and len(grown_steps) >= 4:
            cluster.remove_node(joining[0])  # under the running group of 3
            removed.set()

    result = trainer.fit(progress=progress, poll_interval_s=0.5)
    assert result.error is None
    assert joined.is_set() and removed.is_set()
    # In the order the steps ended: a group resumed from a checkpoint repeats the steps its
    # predecessor ran after that checkpoint, so ordering by step would interleave the two.
    by_time = sorted(trainer.step_records, key=lambda r: r.time)
    worlds = [r.world_size for r in by_time]
    runs = [w for i, w in enumerate(worlds) if i == 0 or w != worlds[i - 1]]
    assert runs[0] == 2 and 3 in runs and runs[-1] == 2, runs
    grown = [r for r in trainer.step_records if r.world_size == 3]
    assert {r.rank for r in grown} == {0, 1, 2}
    assert min(r.slice for r in grown) >= 1
    # The grown group started from known cost models: the two slots the first group
    # measured (and the new slot's worker type, remembered in the run's storage).
    grown_plans = [p for p in trainer.plans if p.world_size == 3]
    assert grown_plans and "remembered cost models" in grown_plans[0].reason, grown_plans
    kept, groups = committed_ledger(out)
    assert len(groups) >= 3
    epochs = sorted({e["epoch"] for e in kept})
    full_epochs = list(epochs[:-1])  # the last epoch stops early by design
    assert full_epochs, "expected at least one complete epoch"
    assert_exactly_once(kept, size, full_epochs)
