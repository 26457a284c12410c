"""The search's allocator (``tune.allocation: auto``) as an object: no Ray, clock and nodes
injected; the trial-side helpers; the YAML setting and what auto refuses; the history in
trials.csv and the Gantt chart."""

from __future__ import annotations

import csv

import pytest

from raytrain_hetero.config import WorkerSpec
from raytrain_hetero.config.allocation import TrialAllocatorConfig
from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.trial_allocation import ClusterNode, WorkerType
from raytrain_hetero.errors import AllocationError, ConfigError
from raytrain_hetero.tune.allocator import (
    NODE_ID_LABEL,
    TrialAllocator,
    allocated_worker_specs,
    epoch_end_moves,
    type_costs,
    worker_types,
)
from raytrain_hetero.tune.results import (
    add_allocation_history,
    allocation_spans,
    plot_allocations,
    write_trials_csv,
)

CPU = WorkerType("cpu", {"CPU": 1.0})


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def allocator(nodes, *, cap=2, restart_s=0.0, asha=None, types=(CPU,), clock=None):
    return TrialAllocator(
        types,
        lambda: list(nodes),
        max_epochs=4,
        samples_per_epoch=640,
        asha=asha,
        config=TrialAllocatorConfig(max_workers_per_trial=cap, restart_s=restart_s),
        driver_cpus=0.25,
        clock=clock or Clock(),
    )


def test_trials_share_the_node_and_the_survivor_grows_into_freed_workers():
    clock = Clock()
    nodes = [ClusterNode("n1", {"CPU": 4.0})]
    alloc = allocator(nodes, clock=clock)
    a = alloc.request("a", global_batch=64, driver_node="n1")
    assert a is not None and a.version == 1 and len(a.workers) == 2  # the cap
    assert a.nodes == ("n1", "n1")
    # Two drivers take 0.5 CPU: 3 worker slots are left, so b gets the third.
    b = alloc.request("b", global_batch=64, driver_node="n1")
    assert b is not None and len(b.workers) == 1
    assert not {w.slot_id for w in a.workers} & {w.slot_id for w in b.workers}
    # Nothing changed: an epoch end keeps b where it is (same version: it does not move).
    assert alloc.epoch_ended("b", 1) == b
    clock.now = 130.0
    alloc.release("a")
    grown = alloc.epoch_ended("b", 2)
    assert grown is not None and grown.version == 2 and len(grown.workers) == 2
    assert {w.slot_id for w in b.workers} < {w.slot_id for w in grown.workers}  # kept its own
    history = alloc.history()
    assert [(e.trial_id, e.version, len(e.slots)) for e in history] == [
        ("a", 1, 2),
        ("b", 1, 1),
        ("a", 0, 0),
        ("b", 2, 2),
    ]
    assert history[2].time_s == 30.0 and history[3].cause == "a: trial ended"


def test_a_trial_waits_for_a_free_worker_and_starts_when_one_is_released():
    nodes = [ClusterNode("n1", {"CPU": 1.5})]  # one slot beside one driver
    alloc = allocator(nodes, cap=None)
    assert alloc.request("a", global_batch=32, driver_node=None) is not None
    assert alloc.request("b", global_batch=32, driver_node=None) is None  # waits
    assert alloc.request("b", global_batch=32, driver_node=None) is None  # still
    alloc.release("a")
    held = alloc.holding("b")
    assert held is not None and held.version == 1 and len(held.workers) == 1
    # A waiting trial's poll sees a node that joined meanwhile.
    assert alloc.request("c", global_batch=32) is None
    nodes.append(ClusterNode("n2", {"CPU": 1.0}))
    started = alloc.request("c", global_batch=32)
    assert started is not None and started.nodes == ("n2",)


def test_restart_cost_keeps_a_trial_in_place_when_growing_gains_less():
    nodes = [ClusterNode("n1", {"CPU": 4.0})]
    alloc = allocator(nodes, restart_s=1e6)
    alloc.request("a", global_batch=64, driver_node="n1")
    b = alloc.request("b", global_batch=64, driver_node="n1")
    alloc.release("a")
    assert alloc.epoch_ended("b", 1) == b  # a move would cost more than it gains


def test_a_node_that_joins_is_used_and_one_that_leaves_moves_its_trials():
    nodes = [ClusterNode("n1", {"CPU": 1.0})]
    alloc = allocator(nodes, cap=None)
    first = alloc.request("a", global_batch=64)
    assert first is not None and first.nodes == ("n1",)
    assert alloc.refresh() is False
    nodes.append(ClusterNode("n2", {"CPU": 2.0}))
    assert alloc.refresh() is True
    grown = alloc.holding("a")
    assert grown is not None and grown.version == 2 and sorted(grown.nodes) == ["n1", "n2", "n2"]
    del nodes[0]
    assert alloc.refresh() is True
    moved = alloc.holding("a")
    assert moved is not None and moved.nodes == ("n2", "n2") and moved.version == 3
    assert alloc.history()[-1].cause == "nodes changed"


def test_measured_costs_replace_the_prior_and_are_shared_with_new_trials():
    fast = WorkerType("fast", {"CPU": 1.0}, {"kind": "fast"})
    slow = WorkerType("slow", {"CPU": 1.0}, {"kind": "slow"})
    nodes = [
        ClusterNode("f1", {"CPU": 1.0}, {"kind": "fast"}),
        ClusterNode("s1", {"CPU": 1.0}, {"kind": "slow"}),
        ClusterNode("s2", {"CPU": 1.0}, {"kind": "slow"}),
    ]
    alloc = allocator(nodes, cap=1, types=(fast, slow))
    assert alloc.request("a", global_batch=64).nodes == ("f1",)
    # Unmeasured, the types look alike: b starts on a slow node.
    assert alloc.request("b", global_batch=64).nodes == ("s1",)
    # a measured both types: a slow worker is 1000x slower. A new trial would rather wait
    # for a fast worker than start there (max_start_slowdown).
    alloc.measured("a", {"fast": (0.0, 1e-3), "slow": (0.0, 1.0)})
    assert alloc.request("c", global_batch=64) is None


def test_a_trial_that_fits_no_node_is_one_clear_line_and_not_registered():
    gpu = WorkerType("a100", {"CPU": 1.0, "GPU": 1.0}, {"gpu": "A100"})
    alloc = allocator([ClusterNode("n1", {"CPU": 8.0})], types=(gpu,))
    with pytest.raises(AllocationError, match=r"trial 'a' fits no node: .*offers no slot") as info:
        alloc.request("a", global_batch=64)
    assert "\n" not in str(info.value)
    assert alloc.holding("a") is None and alloc.history() == ()


def test_asha_budget_counts_expected_epochs():
    # Under ASHA (grace 1, eta 2, 4 epochs) a trial's expected work shrinks past a rung; the
    # allocator reads it (a unit check of the demand, through a decision that must not fail).
    nodes = [ClusterNode("n1", {"CPU": 3.0})]
    alloc = allocator(nodes, asha=(1, 2.0))
    alloc.request("a", global_batch=64)
    assert alloc.epoch_ended("a", 4) is not None  # done: nothing left, keeps its workers
    assert alloc.epoch_ended("unknown", 1) is None


def test_allocated_worker_specs_pin_each_worker_to_its_node():
    alloc = allocator([ClusterNode("n1", {"CPU": 2.0}), ClusterNode("n2", {"CPU": 2.0})], cap=3)
    holding = alloc.request("a", global_batch=64)
    types = {"cpu": WorkerSpec(name="cpu", resources={"CPU": 1}, label_selector={"pool": "x"})}
    specs = allocated_worker_specs(holding, types)
    assert [s.name for s in specs] == ["cpu-0", "cpu-1", "cpu-2"]
    assert [s.label_selector[NODE_ID_LABEL] for s in specs] == list(holding.nodes)
    assert all(s.label_selector["pool"] == "x" and s.count == 1 for s in specs)


def test_type_costs_average_each_types_ranks():
    costs = (CostModel(0.1, 0.01), CostModel(0.5, 0.08), CostModel(0.3, 0.03))
    assert type_costs(costs, ["cpu", "gpu", "cpu"]) == {
        "cpu": pytest.approx((0.2, 0.02)),
        "gpu": pytest.approx((0.5, 0.08)),
    }
    assert type_costs((), []) == {}


def _fast_and_slow(restart_s=0.0):
    fast = WorkerType("fast", {"CPU": 1.0}, {"kind": "fast"})
    slow = WorkerType("slow", {"CPU": 1.0}, {"kind": "slow"})
    nodes = [
        ClusterNode("f1", {"CPU": 1.0}, {"kind": "fast"}),
        ClusterNode("s1", {"CPU": 1.0}, {"kind": "slow"}),
    ]
    return allocator(nodes, cap=1, types=(fast, slow), restart_s=restart_s)


@pytest.mark.parametrize("sent", [True, False])
def test_costs_sent_at_epoch_ends_move_a_survivor_onto_the_worker_asha_freed(sent):
    # a on the fast node, b on the slow one (unmeasured, the types look alike). a reports
    # its epoch (with its costs when sent) and ASHA stops it; at b's epoch end the allocator
    # knows the fast type is 10x faster only if the costs came with the epoch ends.
    alloc = _fast_and_slow()
    assert alloc.request("a", global_batch=64).nodes == ("f1",)
    b = alloc.request("b", global_batch=64)
    assert b.nodes == ("s1",)
    alloc.epoch_ended("a", 1, costs={"fast": (0.0, 1e-3)} if sent else None)
    alloc.release("a", "stopped by ASHA")
    after = alloc.epoch_ended("b", 1, costs={"slow": (0.0, 1e-2)} if sent else None)
    if sent:
        assert after.nodes == ("f1",) and after.version == b.version + 1
    else:
        assert after == b


def test_the_restart_charge_is_measured_where_it_runs_unless_configured():
    nodes = [ClusterNode("n1", {"CPU": 4.0})]
    alloc = allocator(nodes, restart_s=None)
    assert alloc.restart_s() == 30.0  # the prior
    alloc.request("a", global_batch=64, driver_node="n1")
    b = alloc.request("b", global_batch=64, driver_node="n1")
    alloc.release("a")
    # Unusable figures are not measurements; under the prior, growing does not pay.
    assert alloc.epoch_ended("b", 1, start_s=float("nan"), resumed=True) == b
    assert alloc.epoch_ended("b", 1, start_s=-1.0, resumed=True) == b
    # Before any move is measured: the quickest first start of the search (every trial
    # starts at once, so each is an upper estimate of one restart here).
    assert alloc.epoch_ended("x", 1, start_s=50.0) is None  # a trial the allocator forgot
    assert alloc.restart_s() == 50.0
    alloc.epoch_ended("y", 1, start_s=20.0)
    assert alloc.restart_s() == 20.0 and alloc.prices().first_starts == 2
    # b's 1,920 remaining samples take ~1.9 s on one worker, ~1 s on two: with a measured
    # 0.1 s restart, growing pays even with the prior error margins and contention.
    grown = alloc.epoch_ended("b", 1, start_s=0.1, resumed=True)
    assert grown is not None and grown.version == b.version + 1
    assert len(grown.workers) > len(b.workers)
    move = alloc.history()[-1]
    assert move.is_move and move.gain_s > move.margin_s > 0 and move.cost_s >= 0.1
    alloc.epoch_ended("b", 2, start_s=6.0, resumed=True)
    alloc.epoch_ended("b", 3, start_s=3.0, resumed=True)
    assert alloc.restart_s() == 3.0  # the median of the resumed fits' 0.1, 3, 6
    alloc.epoch_ended("unknown", 1, start_s=5.0, resumed=True)  # a stopped trial's too
    assert alloc.restart_s() == 4.0
    assert [s.total_s for s in alloc.fit_starts()["b"]] == [0.1, 6.0, 3.0]
    prices = alloc.prices()
    assert prices.restarts == 4 and prices.restart_error == pytest.approx(0.8325)
    # A configured charge is kept whatever the trials measure, and trusted (no error).
    fixed = allocator(nodes, restart_s=1e6)
    fixed.epoch_ended("x", 1, start_s=0.1, resumed=True)
    assert fixed.restart_s() == 1e6 and fixed.prices().restart_error == 0.0


def test_fixed_trials_never_move():
    assert epoch_end_moves(None, 1) is False and epoch_end_moves({}, 1) is False


def test_worker_types_need_unique_names():
    specs = [WorkerSpec(name="a"), WorkerSpec(name="a", count=2)]
    with pytest.raises(ConfigError, match="names repeat"):
        worker_types(specs)


def test_allocation_history_in_trials_csv_and_gantt_chart(tmp_path):
    clock = Clock()
    alloc = allocator([ClusterNode("node1abcdefgh", {"CPU": 4.0})], clock=clock)
    alloc.request("a", global_batch=64, driver_node="node1abcdefgh")
    alloc.request("b", global_batch=64, driver_node="node1abcdefgh")
    clock.now += 12.5
    alloc.release("a")
    events = alloc.history()
    rows = [{"trial_id": "a", "status": "completed"}, {"trial_id": "b", "status": "completed"}]
    alloc.epoch_ended("b", 1, start_s=21.34, library_s=5.12)
    alloc.epoch_ended("b", 2, start_s=9.0)
    alloc.epoch_ended("b", 3, start_s=4.0, library_s=7.0)  # a part over the whole: unknown
    add_allocation_history(rows, events, alloc.fit_starts())
    write_trials_csv(rows, tmp_path / "trials.csv")
    with open(tmp_path / "trials.csv", newline="") as fh:
        read = {r["trial_id"]: r for r in csv.DictReader(fh)}
    assert read["a"]["allocation"] == "0.0s v1 2 on node1abc*2; 12.5s released"
    assert read["b"]["allocation"] == "0.0s v1 1 on node1abc; 12.5s v2 2 on node1abc*2"
    assert read["a"]["allocations"] == "1" and read["b"]["allocations"] == "2"
    assert read["a"]["fit_starts_s"] == "" and read["b"]["fit_starts_s"] == "21.3 9.0 4.0"
    assert read["b"]["fit_starts_library_s"] == "5.1 - -"
    assert read["b"]["fit_starts_ray_train_s"] == "16.2 - -"
    spans = allocation_spans(events, end_s=20.0)
    assert ("a", "node1abcdefgh", 0.0, 12.5) in spans and (
        "b",
        "node1abcdefgh",
        12.5,
        20.0,
    ) in spans
    png = plot_allocations(events, tmp_path / "allocations.png").read_bytes()
    assert png.startswith(b"\x89PNG")


# ----------------------------------------------------------------------------- the YAML


def _job(tune: dict, **sections):
    from pathlib import Path

    import yaml

    from raytrain_hetero.app.config import validate_config

    data = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "examples/configs/eurosat_tune.yaml").read_text()
    )
    data["tune"] = {**data["tune"], **tune}
    for key, value in sections.items():
        data.setdefault(key, {}).update(value)
    return validate_config(data, "tune.yaml")


def test_allocation_is_fixed_by_default_and_auto_composes_the_library_settings():
    assert _job({}).tune.allocation == "fixed"
    job = _job({"allocation": "auto", "allocator": {"max_workers_per_trial": 2}})
    assert job.tune.allocation == "auto"
    assert job.tune.allocator == TrialAllocatorConfig(max_workers_per_trial=2)
    with pytest.raises(ConfigError, match="tune.allocation"):
        _job({"allocation": "sometimes"})


def test_auto_refuses_what_it_cannot_move_in_one_line():
    from raytrain_hetero.app.tune_job import check_auto_allocation

    check_auto_allocation(_job({"allocation": "auto"}))  # the example runs under auto
    job = _job({"allocation": "auto"}, train={"fixed_shares": [2, 1]})
    with pytest.raises(ConfigError) as info:
        check_auto_allocation(job)
    text = str(info.value)
    assert text.startswith("tune.allocation: auto cannot run this job: train.fixed_shares")
    assert "\n" not in text


def test_auto_capacity_needs_a_node_for_some_type_and_a_batch_for_the_most_workers(monkeypatch):
    from raytrain_hetero.app import tune_job
    from raytrain_hetero.tune import allocator as allocator_module

    nodes = [ClusterNode("n1", {"CPU": 3.0})]
    monkeypatch.setattr(allocator_module, "live_cluster_nodes", lambda: list(nodes))
    job = _job({"allocation": "auto", "num_samples": 8, "max_concurrent_trials": None})
    # The example's two types (fast, slow) both fit the node; it offers 3 slots.
    assert tune_job._auto_capacity(job) == (3, 3)
    capped = _job({"allocation": "auto", "allocator": {"max_workers_per_trial": 2}})
    assert tune_job._auto_capacity(capped)[1] == 2
    small = _job({"allocation": "auto"}, train={"global_batch_size": 2})
    with pytest.raises(ConfigError, match=r"train.global_batch_size 2 < 3 x train.min_slice 1"):
        tune_job._auto_capacity(small)
    nodes[:] = [ClusterNode("n1", {"GPU": 1.0})]
    with pytest.raises(ConfigError) as info:
        tune_job._auto_capacity(job)
    assert "no node of this Ray cluster holds any worker type" in str(info.value)
    assert "\n" not in str(info.value)


def test_trials_yet_to_ask_keep_an_equal_share_free_then_survivors_grow():
    """Tune starts the search's trials one by one: the first to ask must not take every worker
    while the others are known to come (they would wait, and ASHA would have no peers)."""
    clock = Clock()
    nodes = [ClusterNode("n1", {"CPU": 4.0})]
    alone = allocator(nodes, cap=None, clock=clock)
    first = alone.request("a", global_batch=64)
    assert first is not None and len(first.workers) == 4  # knows of no other trial
    shared = TrialAllocator(
        (CPU,),
        lambda: list(nodes),
        max_epochs=4,
        samples_per_epoch=640,
        config=TrialAllocatorConfig(max_workers_per_trial=None, restart_s=0.0),
        clock=clock,
        expected_trials=4,
    )
    held = [shared.request(t, global_batch=64) for t in "abcd"]
    assert all(h is not None and len(h.workers) == 1 for h in held), held
    slots = [w.slot_id for h in held for w in h.workers]
    assert len(set(slots)) == 4
    # Three trials end (ASHA stops them): every trial has asked, the cap is lifted, and the
    # survivor grows into the freed workers at its epoch end.
    for t in "bcd":
        shared.release(t)
    grown = shared.epoch_ended("a", 1)
    assert grown is not None and len(grown.workers) == 4


def test_a_search_larger_than_the_cluster_starts_one_worker_per_trial():
    nodes = [ClusterNode("n1", {"CPU": 2.0})]
    alloc = TrialAllocator(
        (CPU,),
        lambda: list(nodes),
        max_epochs=4,
        samples_per_epoch=640,
        config=TrialAllocatorConfig(max_workers_per_trial=None, restart_s=0.0),
        expected_trials=6,
    )
    a = alloc.request("a", global_batch=64)
    b = alloc.request("b", global_batch=64)
    assert a is not None and b is not None and len(a.workers) == len(b.workers) == 1
    assert alloc.request("c", global_batch=64) is None  # waits for a free worker
    alloc.release("a")
    c = alloc.holding("c")
    assert c is not None and len(c.workers) == 1  # 3 trials still to come: a share of 1
