"""Issue 44's benchmark pieces without Ray: a real search's timeline turned into the simulator's
input and checked (benchmarks.tune_record, benchmarks.tune_check), the replayed schedule read
from a recorded search, and the device check's dry run (benchmarks.tune_device)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.tune_check import check_timelines, format_check
from benchmarks.tune_check import main as check_main
from benchmarks.tune_device import BUDGET_S, device_check
from benchmarks.tune_record import promotion_schedule, recorded_run

ROOT = Path(__file__).resolve().parents[2]
SEED0 = ROOT / "benchmarks" / "results" / "tune_asha_seeds" / "seed0" / "results.json"


def _report(iteration, total, start, rate, workers):
    return {
        "training_iteration": iteration,
        "time_total_s": total,
        "timestamp": 1000 + total,  # launched at unix 1000
        "hetero/fit_start_s": start,
        "samples_per_s": rate,
        "workers": {w: {"samples_per_s": rate / len(workers), "slice": 100} for w in workers},
    }


def _timeline(contender: str) -> dict:
    # 1,000 samples an epoch at batch 100; 100 samples/s on a fast worker (10 s of steps),
    # 2 s outside the steps: a 12 s epoch. Trial 0 moves to two workers after epoch 2.
    if contender == "auto":
        first = [["fast-0"], ["fast-0"], ["fast-0", "fast-1"]]
        t0 = [
            _report(1, 30.0, 18.0, 100.0, first[0]),
            _report(2, 42.0, 18.0, 100.0, first[1]),
            _report(3, 62.0, 12.0, 200.0, first[2]),  # resumed: 12 s start, 5 + 2 s epoch
        ]
    else:
        t0 = [_report(k, 18.0 + 12 * k, 18.0, 100.0, ["any"]) for k in (1, 2, 3)]
    t1 = [_report(1, 30.0, 18.0, 100.0, ["fast-1" if contender == "auto" else "any"])]
    log = {"prices": {"restart_s": 12.0, "contention": 0.1, "step_error": 0.2}, "events": []}
    if contender == "auto":
        log["events"] = [{"gain_s": 3.0}, {"gain_s": None}]
    return {
        "contender": contender,
        "makespan_s": 70.0,
        "started_at": 1000.0,
        "global_batch": 100,
        "samples_per_epoch": 1000,
        "max_epochs": 4,
        "grace_period": 1,
        "reduction_factor": 2.0,
        "max_workers_per_trial": 2,
        "slots": {"fast": 2},
        "trials": [
            {"trial_id": "x_00000", "index": 0, "config": {}, "reports": t0},
            {"trial_id": "x_00001", "index": 1, "config": {}, "reports": t1},
        ],
        "allocation": log if contender == "auto" else None,
    }


def test_a_timeline_becomes_the_simulators_measured_input():
    run = recorded_run(_timeline("auto"))
    assert run.policy == "auto" and run.slots == {"fast": 2}
    assert [t.launch_s for t in run.trials] == [0.0, 0.0]
    assert [t.start_s for t in run.trials] == [18.0, 18.0]
    assert [t.epochs for t in run.trials] == [3, 1]
    # one-worker reports give the type's rate: 100 samples/s
    assert run.trials[0].costs["fast"].beta == pytest.approx(0.01)
    assert run.epoch_overhead_s == pytest.approx(2.0)  # 12 s between reports, 10 s of steps
    assert run.restart_s == 12.0  # the resumed fit's start
    assert run.contention == 0.1 and run.step_error == 0.2
    assert run.tail_s == pytest.approx(70.0 - 62.0)
    fixed = recorded_run(_timeline("fixed"))
    assert fixed.policy == "fixed" and fixed.slots == {"any": 2}
    assert fixed.trials[0].own_type == "any" and fixed.contention == 0.0


def test_the_check_predicts_each_run_and_says_the_error(tmp_path):
    paths = []
    for contender in ("auto", "fixed"):
        path = tmp_path / "seed0" / contender / "timeline.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(_timeline(contender)))
        paths.append(path)
    rows = check_timelines(paths)
    fixed = rows[1]
    # fixed: 18 s start + 3 epochs of 12 s + 16 s of wind-down: the 70 s measured
    assert fixed["predicted_s"] == pytest.approx(70.0) and fixed["error"] == pytest.approx(0.0)
    # auto: the measured 12 s restart and 20 % margin outweigh the 10 s a second worker
    # saves trial 0 (2 epochs expected): the simulator does not make the measured move
    assert rows[0]["moves_predicted"] == 0
    assert rows[0]["moves_measured"] == 1
    table = format_check(rows)
    assert "| fixed | 2 / 4 | 70 | 70 | +0.0% |" in table and "goal within 15%" in table
    out = tmp_path / "check"
    assert check_main([str(tmp_path / "seed0"), "--output", str(out)]) == 0
    assert len(json.loads((out / "check.json").read_text())) == 2
    with pytest.raises(SystemExit):
        check_main([str(tmp_path / "nothing")])


def test_the_replayed_schedule_is_a_recorded_searchs_stops(tmp_path):
    schedule = promotion_schedule(SEED0, "fixed")
    assert schedule.epochs == (4, 8, 2, 2, 4, 4, 1, 1)
    assert schedule.configs[0]["train.lr"] == pytest.approx(0.0674, abs=1e-4)
    assert promotion_schedule(SEED0, "auto").epochs == (2, 1, 1, 2, 8, 4, 1, 1)
    saved = schedule.save(tmp_path / "promotions.json")
    assert promotion_schedule(saved) == schedule


def test_the_device_checks_dry_run_plans_and_fits_the_budget(tmp_path, capsys):
    assert device_check(tmp_path, dry_run=True) == 0
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert plan["dry_run"] and plan["budget_s"] == BUDGET_S
    assert plan["total_s"] <= BUDGET_S
    assert plan["estimate_s"]["auto"] < plan["estimate_s"]["fixed"]
    assert plan["schedule"]["epochs"] == [4, 8, 2, 2, 4, 4, 1, 1]
    printed = capsys.readouterr().out
    assert "would run python -m benchmarks.tune_device" in printed
    # the real run refuses a machine with too few cores, in one line
    assert device_check(tmp_path, cores=2) == 1
    assert "needs 12" in capsys.readouterr().err
