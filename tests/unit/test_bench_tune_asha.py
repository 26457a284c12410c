"""``benchmarks.tune_asha``'s figures from synthetic Tune reports (no Ray): makespan, the best
trial and its time, ASHA's stops, the per-type CPU check, the done-when and the jobs."""

from __future__ import annotations

import json

import pytest

from benchmarks.tune_asha import (
    FULL,
    QUICK,
    format_table,
    hetero_cpu_check,
    job_dict,
    search_figures,
    stock_cpu_check,
    verdicts,
)
from raytrain_hetero.app.config import validate_config

FACTORS = {"fast": 8.0, "slow": 32.0}


def _row(trial, epoch, acc, ts, workers=None, lr=0.1):
    row = {
        "trial_id": trial,
        "epoch": epoch,
        "val_accuracy": acc,
        "timestamp": ts,
        "config": {"train.lr": lr},
    }
    if workers is not None:
        row["workers"] = {n: {"samples_per_s": r} for n, r in workers.items()}
    return row


def test_the_best_trial_is_the_best_last_accuracy_and_its_time_is_its_last_report():
    reports = {
        "x_00001": [_row("x_00001", 0, 0.5, 1010)],  # stopped at the first rung
        "x_00000": [_row("x_00000", e, a, 1000 + 20 * e) for e, a in enumerate([0.3, 0.6, 0.7])],
        # A higher accuracy earlier does not count: Tune's scope is the last report.
        "x_00002": [_row("x_00002", 0, 0.9, 1005), _row("x_00002", 1, 0.4, 1030)],
    }
    figures = search_figures(reports, started=990.0, wall_s=70.0, epochs=3)
    assert figures["best_trial"] == "x_00000" and figures["best_accuracy"] == 0.7
    assert figures["best_time_s"] == pytest.approx(1040 - 990)
    assert figures["epochs_per_trial"] == [3, 1, 2]  # in sample order
    assert figures["completed"] == 1 and figures["trials"] == 3
    assert figures["makespan_s"] == 70.0


def test_the_cpu_check_groups_workers_by_type_and_scales_by_the_factor():
    reports = {
        "t": [
            _row("t", 0, 0.1, 1, {"fast-0": 40.0, "slow-0": 10.0, "slow-1": 11.0}),
            _row("t", 1, 0.1, 2, {"fast-0": 42.0, "slow-0": 9.0}),
        ],
        # Flattened keys (Tune's other spelling) count too.
        "u": [{**_row("u", 0, 0.1, 1), "workers/fast-1/samples_per_s": 38.0}],
    }
    check = hetero_cpu_check(reports, FACTORS)
    assert check["fast"]["samples_per_s"] == 40.0 and check["fast"]["reports"] == 3
    assert check["slow"]["samples_per_s"] == 10.0
    assert check["slow"]["unslowed_samples_per_s"] == 320.0
    assert check["fast_over_slow"] == 4.0 and check["expected_fast_over_slow"] == 4.0


def test_stock_check_reads_its_step_logs(tmp_path):
    trial = tmp_path / "t"
    trial.mkdir()
    lines = [
        {"speed": "fast", "slice": 64, "start": 0.0, "end": 2.0},
        {"speed": "slow", "slice": 64, "start": 0.0, "end": 8.0},
    ]
    (trial / "rank0_1.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    check = stock_cpu_check(tmp_path, FACTORS)
    assert check["fast"]["samples_per_s"] == 32.0 and check["slow"]["samples_per_s"] == 8.0


def test_done_when_compares_auto_with_fixed_and_the_table_says_it():
    base = {"trials": 8, "completed": 1, "epochs_per_trial": [1] * 8, "best_time_s": 10.0}
    cpu = {
        f"{k}_{s}": 1.0 for k in ("load1", "tree_cores", "machine_cores") for s in ("mean", "max")
    }
    results = {
        "fixed": {**base, "makespan_s": 300.0, "best_accuracy": 0.80, "cpu": cpu, "per_type": {}},
        "auto": {**base, "makespan_s": 200.0, "best_accuracy": 0.796, "cpu": cpu, "per_type": {}},
    }
    v = verdicts(results)
    assert v["auto"]["fixed_makespan_over_this"] == pytest.approx(1.5)
    assert v["done_when"]["makespan_met"] and v["done_when"]["accuracy_met"]
    results["auto"]["best_accuracy"] = 0.79  # 1 pt below
    assert not verdicts(results)["done_when"]["accuracy_met"]
    table = format_table(
        {
            "setup": {
                "trials": 8,
                "epochs": 8,
                "fast_nodes": 4,
                "slow_nodes": 4,
                "fast_factor": 8.0,
                "slow_factor": 32.0,
            },
            "contenders": results,
            "verdicts": v,
            "emulated_cores": FULL.emulated_cores,
            "machine": {"logical_cpus": 2},
        }
    )
    assert "| auto | 200 |" in table and "1.50x, met" in table and "EMULATED" in table
    assert "auto's -0.40 pt against fixed's, met" in table


@pytest.mark.parametrize("setup", [FULL, QUICK])
@pytest.mark.parametrize("contender", ["auto", "fixed"])
def test_the_jobs_validate_and_emulate_by_node_label(setup, contender, tmp_path):
    job = validate_config(job_dict(setup, contender, tmp_path, "auto"), "tune_asha")
    assert job.emulation.node_slowdowns == {"speed": setup.factors}
    assert job.tune is not None and job.tune.allocation == contender
    assert all(w.emulated_slowdown == 1.0 for w in job.workers)
    # Under 1.5 cores of emulated compute with every worker node busy.
    assert setup.emulated_cores < 1.5
