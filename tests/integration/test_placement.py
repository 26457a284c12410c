"""Heterogeneous placement on a real multi-node Ray cluster (ray.cluster_utils.Cluster)."""

from __future__ import annotations

import json
import logging
import threading

import pytest
import ray
from ray.cluster_utils import Cluster
from ray.train import RunConfig
from ray_env import worker_runtime_env
from train_loops import placement_loop

from raytrain_hetero import BatchConfig, HeteroTrainer, WorkerSpec
from raytrain_hetero.driver.backend import common_resources, extra_resources
from raytrain_hetero.errors import PlacementError

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


class _OnWait(logging.Handler):
    """Sets ``event`` when the placement check says it waits."""

    def __init__(self, event: threading.Event) -> None:
        super().__init__(logging.WARNING)
        self.event = event

    def emit(self, record: logging.LogRecord) -> None:
        if "waiting up to" in record.getMessage():
            self.event.set()


def test_each_worker_lands_where_its_spec_says(two_pool_cluster, tmp_path, caplog):
    """Also: the slow pool busy with other work when ``fit()`` starts, the run waits (a
    progress line) and trains once the work frees it."""
    from ray.util.placement_group import placement_group, remove_placement_group

    busy = placement_group([{"CPU": 3}], bundle_label_selector=[{"pool": "slow"}])
    assert busy.wait(timeout_seconds=30)
    waiting = threading.Event()
    handler = _OnWait(waiting)
    check_logger = logging.getLogger("raytrain_hetero.driver.placement_check")
    check_logger.addHandler(handler)
    caplog.set_level(logging.WARNING, logger=check_logger.name)

    def free_when_waited_for() -> None:
        waiting.wait(timeout=120)
        remove_placement_group(busy)

    freer = threading.Thread(target=free_when_waited_for, daemon=True)
    freer.start()
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
    try:
        result = trainer.fit()
    finally:
        check_logger.removeHandler(handler)
        waiting.set()
        freer.join(timeout=60)
    assert result.error is None
    assert "other work holds the resources now" in caplog.text
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


def _refused(workers, tmp_path, **groups):
    """The PlacementError ``fit()`` raises for ``workers``, checked to come before Ray Train
    was asked for anything (no run folder: no controller, no worker group)."""
    trainer = HeteroTrainer(
        placement_loop,
        train_loop_config={"out": str(tmp_path)},
        workers=workers,
        batch=BatchConfig(global_batch_size=4 * len(workers)),
        run_config=RunConfig(name="refused", storage_path=str(tmp_path / "results")),
        **groups,
    )
    with pytest.raises(PlacementError) as caught:
        trainer.fit()
    assert not (tmp_path / "results" / "refused").exists()
    message = str(caught.value)
    assert "\n" not in message and "Fix:" in message
    return message


def test_a_resource_the_selected_pool_lacks_is_refused_before_any_worker_starts(
    two_pool_cluster, tmp_path
):
    # The slow pool has no fast_tag: no node of it could host 'greedy' (the fast node does
    # offer the tag, so it is no typo).
    message = _refused(
        [
            WorkerSpec(
                name="greedy", resources={"CPU": 1, "fast_tag": 1}, label_selector={"pool": "slow"}
            ),
            WorkerSpec(name="plain", resources={"CPU": 1}, label_selector={"pool": "slow"}),
        ],
        tmp_path,
    )
    assert "worker 'greedy'" in message and "fast_tag" in message and "pool=slow" in message
    assert "did you mean" not in message


def test_a_typo_of_a_resource_on_every_worker_names_the_resource_it_resembles(
    two_pool_cluster, tmp_path
):
    workers = [WorkerSpec(name="w", count=2, resources={"CPU": 1, "GPUS": 1})]
    message = _refused(workers, tmp_path)
    assert "worker 'w-0'" in message and "GPUS" in message and "did you mean 'GPU'?" in message
    assert "resources={'CPU': 1.0, 'GPU': 1.0}" in message  # the WorkerSpec to write


def test_more_workers_than_their_pool_holds_are_refused_naming_the_resource(
    two_pool_cluster, tmp_path
):
    # Three 1-CPU workers on the 2-CPU fast pool (the head and slow pool have room, unused).
    message = _refused(
        [WorkerSpec(name="f", count=3, resources={"CPU": 1}, label_selector={"pool": "fast"})],
        tmp_path,
    )
    assert "worker 'f-2'" in message and "CPU: 3 in all" in message and "offer 2" in message


def test_a_label_no_node_carries_is_refused(two_pool_cluster, tmp_path):
    message = _refused([WorkerSpec(name="gpu", label_selector={"pool": "a100"})], tmp_path)
    assert "worker 'gpu'" in message and "pool=a100" in message
    assert "pool=fast" in message and "pool=slow" in message  # what the nodes do carry


def test_busy_resources_are_waited_for_then_named(two_pool_cluster, tmp_path, caplog):
    """Room the cluster has but other work holds: the run waits (a progress line saying what
    for) up to elastic.placement_timeout_s, then fails naming the worker."""
    from ray.util.placement_group import placement_group, remove_placement_group

    from raytrain_hetero.driver._ray_compat import autoscaler_may_add_nodes

    assert autoscaler_may_add_nodes() is False  # a cluster started by hand never grows
    held = placement_group([{"CPU": 2}], bundle_label_selector=[{"pool": "fast"}])
    assert held.wait(timeout_seconds=30)
    caplog.set_level(logging.WARNING, logger="raytrain_hetero.driver.placement_check")
    try:
        message = _refused(
            [WorkerSpec(name="f", resources={"CPU": 1}, label_selector={"pool": "fast"})],
            tmp_path,
            elastic={"placement_timeout_s": 2.0},
        )
    finally:
        remove_placement_group(held)
    assert "waiting up to 2 s (elastic.placement_timeout_s)" in caplog.text
    assert "other work holds the resources" in message and "within 2 s" in message
    assert "room for 1 worker(s) (f)" in message


def test_resource_split_helpers():
    common = common_resources([{"CPU": 2, "GPU": 1}, {"CPU": 4}])
    assert common == {"CPU": 2}
    assert extra_resources({"CPU": 2, "GPU": 1}, common) == {"GPU": 1}
    assert extra_resources({"CPU": 4}, common) == {"CPU": 2}
