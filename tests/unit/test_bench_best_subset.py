"""The best-subset contender's search, the new scenarios, and the tables' best-subset column.

Pure: the search's pruning rules, the contender's workers, the figures and the table from
synthetic fits; no Ray (the device check's dry run, tests/unit/test_bench_device.py, runs a
real one).
"""

from __future__ import annotations

import argparse
import json
import os

import pytest

from benchmarks.analysis import summarize
from benchmarks.arguments import add_arguments, scenario_options
from benchmarks.best_subset import (
    candidate_subsets,
    dominates,
    should_skip,
    upper_bound,
    worker_classes,
)
from benchmarks.contenders import FitSetup, contender_workers
from benchmarks.data import ArrayDataset, BenchData, slow_storage_view
from benchmarks.pinning import disjoint_cpu_sets, pin_process, usable_cpus
from benchmarks.report import format_table
from benchmarks.scenarios import BEST_SUBSET, CONTENDERS, DEFAULTS, SCENARIOS
from raytrain_hetero.config import WorkerSpec
from raytrain_hetero.driver.trainer import expand_worker_specs


def specs(scenario: str) -> list[WorkerSpec]:
    return list(expand_worker_specs(SCENARIOS[scenario].workers))


def names(workers, subsets):
    return [[workers[i].name for i in s] for s in subsets]


def test_interchangeable_workers_count_once_and_dominated_ones_come_last():
    three = specs("homogeneous3")
    assert worker_classes(three) == [[0, 1, 2]]
    assert names(three, candidate_subsets(three)) == [["w-0"], ["w-0", "w-1"], three_names()]
    hetero3 = specs("hetero3")
    assert names(hetero3, candidate_subsets(hetero3)) == [
        ["fast"],
        ["fast", "medium"],
        ["fast", "medium", "slow"],
    ]
    shape = specs("cpu-gpu-shape")
    assert names(shape, candidate_subsets(shape)) == [
        ["fast"],
        ["fast", "slow-0"],
        ["fast", "slow-0", "slow-1"],
    ]


def three_names():
    return ["w-0", "w-1", "w-2"]


def test_a_gpu_and_cpus_are_not_comparable_so_every_mix_is_a_candidate():
    cpu_gpu = specs("cpu-gpu")
    subsets = candidate_subsets(cpu_gpu)
    assert len(subsets) == 2 * 4 - 1
    assert ["gpu"] in names(cpu_gpu, subsets) and ["cpu-0"] in names(cpu_gpu, subsets)


def test_dominance_needs_every_respect_at_least_as_good():
    fast = WorkerSpec(name="a", resources={"CPU": 4})
    assert dominates(fast, WorkerSpec(name="b", resources={"CPU": 2}))
    assert not dominates(WorkerSpec(name="b", resources={"CPU": 2}), fast)
    assert not dominates(fast, WorkerSpec(name="c", resources={"CPU": 4}))  # identical
    capped = WorkerSpec(name="e", resources={"CPU": 8}, max_batch=10)
    assert not dominates(capped, WorkerSpec(name="f", resources={"CPU": 1}))
    linked = WorkerSpec(name="g", resources={"CPU": 4}, emulated_collective_delay_s=0.1)
    assert not dominates(linked, WorkerSpec(name="h", resources={"CPU": 2}))
    gpu = WorkerSpec(name="i", resources={"CPU": 1, "GPU": 1})
    assert not dominates(gpu, WorkerSpec(name="j", resources={"CPU": 1}))


def test_a_bound_skips_only_what_cannot_reach_the_best_screened():
    assert upper_bound((0, 2), [100.0, 50.0, 30.0]) == 130.0
    assert not should_skip(130.0, 0.0)  # nothing screened yet
    assert not should_skip(130.0, 140.0)  # within the slack: screened
    assert should_skip(100.0, 140.0)


def test_the_best_subset_contender_runs_its_workers_and_their_injections():
    drift = SCENARIOS["drift"]
    workers = specs("drift")
    chosen = contender_workers("best-subset", workers, drift.schedule, subset=(0, 1))
    assert [s.name for s in chosen.specs] == ["fast", "medium"]
    assert chosen.schedule == tuple(drift.schedule)  # aimed at "fast"
    alone = contender_workers("best-subset", workers, drift.schedule, subset=(2,))
    assert alone.schedule == ()
    with pytest.raises(ValueError, match="best-subset needs the indices"):
        contender_workers("best-subset", workers, (), subset=None)
    stand_in = contender_workers("gpu-alone", workers, (), gpu_stand_ins=("medium",))
    assert [s.name for s in stand_in.specs] == ["medium"]


def test_new_scenarios_and_every_table_holds_the_defaults_to_the_best_subset():
    assert {"homogeneous2", "cpu-gpu-shape", "cpu-real3"} <= set(SCENARIOS)
    assert BEST_SUBSET in CONTENDERS and DEFAULTS == "hetero-live"
    two = SCENARIOS["homogeneous2"]
    assert not two.emulated and [s.resources for s in specs("homogeneous2")] == [{"CPU": 1}] * 2
    shape = SCENARIOS["cpu-gpu-shape"]
    assert shape.emulated and shape.defaults["read_delay_s"] > 0
    assert [s.emulated_collective_delay_s for s in specs("cpu-gpu-shape")] == [0.0, 0.3, 0.3]
    real = SCENARIOS["cpu-real3"]
    assert real.pin and [s.resources["CPU"] for s in specs("cpu-real3")] == [8, 4, 2]
    for name in ("hetero2", "hetero3", "homogeneous3", "homogeneous2", "cpu-gpu-shape"):
        scenario = SCENARIOS[name]
        assert BEST_SUBSET in scenario.contenders and DEFAULTS in scenario.contenders
        assert any(
            t.metric == "vs_best_subset" and t.value == 0.97 and DEFAULTS in t.contenders
            for t in scenario.targets
        )


def fit(contender, samples_per_s):
    return {
        "contender": contender,
        "counted": True,
        "wall_s": 1.0,
        "figures": {"samples_per_s": samples_per_s},
    }


def test_the_table_has_the_best_subset_column_and_the_search():
    scenario = SCENARIOS["cpu-gpu-shape"]
    fits = [fit("hetero-live", 291.0), fit("best-subset", 300.0), fit("hetero", 200.0)]
    summary = summarize(fits, list(scenario.contenders), scenario.targets)
    rows = summary["contenders"]
    assert rows["hetero-live"]["vs_best_subset"] == pytest.approx(0.97)
    assert rows["best-subset"]["vs_best_subset"] == pytest.approx(1.0)
    assert [v["met"] for v in summary["targets"]] == [True]
    result = {
        "scenario": "cpu-gpu-shape",
        "description": scenario.description,
        "emulated": True,
        "options": {"repeats": 1, "global_batch_size": 192, "width": 32, "target_accuracy": 0.9},
        "machine": {"cpu_model": "cpu", "usable_cpus": 2, "load_average": [1.0]},
        "fits": fits,
        "summary": summary,
        "best_subset": {
            "chosen": ["fast"],
            "screen_steps": 12,
            "candidates": [
                {"names": ["fast"], "samples_per_s": 310.0, "bound": None, "skipped": ""},
                {"names": ["fast", "slow-0"], "samples_per_s": 250.0, "bound": None},
                {"names": ["slow-0"], "samples_per_s": None, "bound": 30.0, "skipped": "bound"},
            ],
        },
    }
    table = format_table(result)
    assert "x best-subset" in table
    assert "best-subset: fast (screened over 12 steps each" in table
    assert "at 0.97x of it" in table and "slow-0: not screened: bound (bound 30.0)" in table
    # A scenario run without best-subset shows the column empty, not an error.
    del result["best_subset"]
    result["summary"] = summarize(fits[:1], ["hetero-live"], ())
    assert "x best-subset" in format_table(result)


def test_screen_steps_are_an_option_and_recorded():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    options = scenario_options(SCENARIOS["hetero2"], parser.parse_args(["hetero2"]))
    assert options["screen_steps"] == 12
    with pytest.raises(ValueError, match="--screen-steps must be >= 4"):
        scenario_options(
            SCENARIOS["hetero2"], parser.parse_args(["hetero2", "--screen-steps", "3"])
        )


def test_fit_setup_carries_the_pinning_into_the_loop_config(tmp_path):
    setup = FitSetup(
        specs=specs("cpu-real3"),
        data={},
        width=4,
        global_batch_size=8,
        epochs=1,
        eval_every=0,
        lr=0.1,
        cpu_sets={"big": [0]},
    )
    assert setup.loop_config("stock", tmp_path)["cpu_sets"] == {"big": [0]}
    setup.cpu_sets = None
    assert "cpu_sets" not in setup.loop_config("hetero", tmp_path)


def test_disjoint_cores_in_worker_order_with_room_left_for_ray():
    workers = specs("cpu-real3")
    sets = disjoint_cpu_sets(workers, list(range(16)))
    assert sets == {
        "big": list(range(8)),
        "medium": list(range(8, 12)),
        "small": [12, 13],
    }
    with pytest.raises(ValueError, match="pinning needs 14 cores for the workers"):
        disjoint_cpu_sets(workers, list(range(15)))


def test_pin_process_keeps_this_process_where_it_already_runs():
    mine = usable_cpus()
    assert pin_process(mine) >= 1
    assert sorted(os.sched_getaffinity(0)) == mine


def test_slow_storage_view_makes_every_read_wait(tmp_path):
    import numpy as np

    source = tmp_path / "arrays"
    source.mkdir()
    np.save(source / "train_x.npy", np.zeros((4, 1, 2, 2), dtype=np.float32))
    np.save(source / "train_y.npy", np.arange(4))
    (source / "meta.json").write_text("{}")
    data = BenchData(str(source), 4, 0, 1, 2)
    assert slow_storage_view(data, 0.0) is data
    view = slow_storage_view(data, 0.0025)
    assert view.directory != data.directory and view.train_size == 4
    assert json.loads((tmp_path / "arrays_read2500us" / "read_delay.json").read_text()) == {
        "seconds_per_sample": 0.0025,
        "emulated": True,
    }
    slow = ArrayDataset(view.path("train_x"), view.path("train_y"))
    assert slow.read_delay_s == 0.0025 and int(slow[3]["label"]) == 3
    assert ArrayDataset(data.path("train_x"), data.path("train_y")).read_delay_s == 0.0
    assert slow_storage_view(data, 0.0025) == view  # made once, reused
    with pytest.raises(ValueError, match="read delay"):
        slow_storage_view(data, -1.0)
