"""The driver's front door without a cluster (issue 48): the one-line placement messages,
what may still come by itself, the embedded Ray's sizing and its refusals before it starts,
and the default checkpoint retention. The real-Ray side: tests/integration/test_front_door.py
and test_placement.py."""

from __future__ import annotations

import pytest
import ray
from ray.train import CheckpointConfig, RunConfig

from raytrain_hetero import WorkerSpec
from raytrain_hetero.core.placement import NodeCapacity, Shortfall, SlotDemand, first_shortfall
from raytrain_hetero.driver._ray_compat import machine_cpu_count
from raytrain_hetero.driver.placement_check import (
    RAY_RESOURCES,
    ClusterView,
    _may_still_come,
    _waiting_for,
    describe_shortfall,
    embedded_num_cpus,
    size_embedded_ray,
    start_embedded_ray,
)
from raytrain_hetero.driver.run_results import (
    DEFAULT_CHECKPOINTS_TO_KEEP,
    with_checkpoint_retention,
)
from raytrain_hetero.errors import PlacementError

LAPTOP = ClusterView({"n": NodeCapacity({"CPU": 2.0, "memory": 8e9})}, None, False, embedded=True)


def _message(slots, view, names=None):
    short = first_shortfall(slots, view.totals, RAY_RESOURCES)
    assert short is not None
    names = names or [f"w{i}" for i in range(len(slots))]
    text = describe_shortfall(short, names, slots, view)
    assert "\n" not in text and text.startswith("HeteroTrainer: worker ") and "Fix: " in text
    return text


def test_three_one_cpu_workers_on_two_cpus_name_the_cpus_to_give():
    text = _message([SlotDemand({"CPU": 1})] * 3, LAPTOP)
    assert "worker 'w2'" in text and "CPU: 3 in all" in text and "offer 2" in text
    assert "ray.init(num_cpus=3)" in text and "ray.num_cpus: 3" in text


def test_a_gpu_on_a_machine_without_one_says_how_to_get_one_or_train_on_cpu():
    text = _message([SlotDemand({"CPU": 1, "GPU": 1})], LAPTOP)
    assert "GPU: 1" in text and "no node of the embedded local Ray offers GPU" in text
    assert "ray.init(address=...)" in text


def test_a_custom_resource_on_a_cluster_says_how_to_start_nodes_with_it():
    cluster = ClusterView({"n": NodeCapacity({"CPU": 8.0})}, None, False)
    text = _message([SlotDemand({"CPU": 1, "ssd": 1})], cluster)
    assert "ray start --resources='{\"ssd\": 1}'" in text


def test_a_worker_bigger_than_any_node_says_the_largest():
    cluster = ClusterView(
        {"a": NodeCapacity({"CPU": 4.0}), "b": NodeCapacity({"CPU": 2.0})}, None, False
    )
    text = _message([SlotDemand({"CPU": 8})], cluster)
    assert "CPU: 8" in text and "offers is 4" in text and "<= 4" in text


def test_labels_of_the_readme_example_on_a_laptop():
    slots = [SlotDemand({"CPU": 8, "GPU": 1}, {"pool": "a100"})]
    text = _message(slots, LAPTOP, names=["a100"])
    assert "worker 'a100'" in text and "pool=a100" in text
    assert "drop the WorkerSpec's label_selector" in text


def test_what_an_autoscaler_may_still_bring():
    short = Shortfall(0, "resource", "GPU", 1.0, 0.0)
    fixed = ClusterView({}, None, may_grow=False)
    assert not _may_still_come(short, fixed)
    assert _may_still_come(short, ClusterView({}, None, may_grow=True))
    assert _may_still_come(short, ClusterView({}, None, may_grow=None))  # unknown: wait
    # Its published config offers no GPU at all: nothing to wait for.
    none_ever = ClusterView({}, None, may_grow=True, ever={"CPU": 64.0})
    assert not _may_still_come(short, none_ever)
    assert _may_still_come(short, ClusterView({}, None, True, ever={"GPU": 8.0}))


def test_what_a_wait_is_for_in_words():
    grows = ClusterView({"head": NodeCapacity({"CPU": 1.0}, {"pool": "head"})}, None, may_grow=True)
    slots = [SlotDemand({"CPU": 1}, {"pool": "fsat"})]
    text = _waiting_for(first_shortfall(slots, grows.totals), ["w"], slots, grows)
    assert text == (
        "worker 'w' ({'CPU': 1} on a node with pool=fsat): the autoscaler may add nodes; "
        "the nodes now carry pool=head"
    )
    typo = [SlotDemand({"CPU": 1, "GPUS": 1})]
    short = first_shortfall(typo, grows.totals, RAY_RESOURCES)
    assert "did you mean 'GPU' for 'GPUS'?" in _waiting_for(short, ["w"], typo, grows)
    busy = _waiting_for(None, ["a", "b"], [SlotDemand({"CPU": 1})] * 2, grows)
    assert busy.startswith("room for 2 worker(s) (a, b)") and "other work holds" in busy


def test_the_embedded_ray_is_sized_only_when_the_workers_need_more():
    machine = machine_cpu_count()
    assert (
        size_embedded_ray([WorkerSpec(name="a", resources={"CPU": machine})], datasets=False)
        is None
    )
    specs = [WorkerSpec(name="a", resources={"CPU": machine}), WorkerSpec(name="b")]
    assert size_embedded_ray(specs, datasets=False) == machine + 1
    assert size_embedded_ray(specs, datasets=True) == machine + 2  # one for Ray Data's tasks


def test_sizing_the_embedded_ray_says_so(caplog):
    machine = machine_cpu_count()
    specs = [WorkerSpec(name="a", resources={"CPU": machine}), WorkerSpec(name="b")]
    with caplog.at_level("WARNING", logger="raytrain_hetero.driver.placement_check"):
        assert embedded_num_cpus([WorkerSpec(name="a")], datasets=False) is None
        assert embedded_num_cpus(specs, datasets=True) == machine + 2
    assert caplog.messages == [
        f"HeteroTrainer: 2 workers declare {machine + 1:g} CPUs in all (+1 for Ray Data's tasks) "
        f"but this machine has {machine}: starting the embedded local Ray with {machine + 2} "
        "logical CPUs, so the workers share the cores (slower; the plan follows their measured "
        "speeds). To choose: ray.init(num_cpus=...) before fit(), or lower WorkerSpec resources."
    ]


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        (WorkerSpec(name="t", resources={"CPU": 1, "GPUS": 1}), "did you mean 'GPU'?"),
        (WorkerSpec(name="t", resources={"CPU": 1, "ssd": 1}), "ray.init(resources={'ssd': 1})"),
        (WorkerSpec(name="t", label_selector={"pool": "a100"}), "pool=a100"),
    ],
)
def test_the_embedded_ray_refuses_what_it_cannot_have_before_it_starts(spec, named):
    assert not ray.is_initialized()
    with pytest.raises(PlacementError, match="worker 't' cannot be placed") as caught:
        start_embedded_ray([spec, WorkerSpec(name="ok")], min_workers=2, datasets=False)
    assert named in str(caught.value)
    assert not ray.is_initialized()  # refused without starting Ray


def test_checkpoints_keep_the_latest_unless_the_run_config_says():
    kept = with_checkpoint_retention(RunConfig(name="x"))
    assert kept.checkpoint_config.num_to_keep == DEFAULT_CHECKPOINTS_TO_KEEP == 1
    assert kept.name == "x"
    mine = RunConfig(checkpoint_config=CheckpointConfig(num_to_keep=5))
    assert with_checkpoint_retention(mine).checkpoint_config.num_to_keep == 5
    scored = RunConfig(checkpoint_config=CheckpointConfig(checkpoint_score_attribute="acc"))
    kept = with_checkpoint_retention(scored).checkpoint_config
    assert (kept.num_to_keep, kept.checkpoint_score_attribute) == (1, "acc")


def test_the_readme_cluster_example_stops_at_once_on_a_machine_without_its_pools():
    """The README's trainer as shown (GPU pools by label), fitted without a cluster: one line
    naming the first worker, its pool and the fix, and no Ray started."""
    import sys
    from pathlib import Path

    sys.path.append(str(Path(__file__).resolve().parents[1] / "integration"))
    from docs_fixtures import docs_block, run_block

    where, code = docs_block("README.md", "def train_loop")
    trainer = run_block(code, where, fit=False)["trainer"]
    assert not ray.is_initialized()
    with pytest.raises(PlacementError) as caught:
        trainer.fit()
    message = str(caught.value)
    assert "worker 'a100'" in message and "pool=a100" in message and "Fix: " in message
    assert not ray.is_initialized()
