"""``raytrain-hetero rent``: the rent file, its inputs, the table, bad input, the plan's slots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from raytrain_hetero.app.cli import main
from raytrain_hetero.app.rent_apply import (
    NodeSpan,
    incurred_cost,
    replan,
    resource_request,
    worker_specs,
)
from raytrain_hetero.app.rent_inputs import remembered_costs, rent_inputs
from raytrain_hetero.app.rent_job import format_decision, plan_rent
from raytrain_hetero.app.rent_schema import load_rent_file
from raytrain_hetero.errors import ConfigError
from raytrain_hetero.storage import storage_location

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "rent" / "resnet50_imagenet.yaml"

BASE = {
    "rent": {"region": "us-east-1", "planner": {"startup_s": 60, "max_nodes_per_type": 3}},
    "deadline_h": 2,
    "job": {"samples_per_epoch": 100000, "epochs": 10, "global_batch": 512},
    "exchange": {"across_nodes_s": 0.05},
    "cost_models": [
        {"instance_type": "g5.xlarge", "alpha": 0.01, "beta": 0.002},
        {"instance_type": "p3.2xlarge", "samples_per_s": 833, "source": "Lambda V100 AMP"},
    ],
    "spot_loss": {"rates": {"g5.xlarge": 0.5}},
}


def _write(tmp_path: Path, **changes) -> Path:
    data = json.loads(json.dumps(BASE))
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    path = tmp_path / "rent.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _error_line(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("raytrain-hetero: error: ")
    return err


def test_the_example_prints_the_front_the_choice_and_why(capsys):
    assert main(["rent", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["time", "cost", "$/h", "nodes", "losses", "mix"]
    assert any(line.startswith(">") for line in lines)  # the chosen plan
    assert any(line[1:2] == "1" for line in lines)  # the best single type
    assert "chosen: the cheapest plan within 3.0 h is" in out
    assert "a snapshot, not current prices" in out
    assert "*" in out and "an estimate" in out  # published figures flagged


def test_inputs_read_costs_estimates_losses_and_the_batch(tmp_path):
    rf = load_rent_file(_write(tmp_path))
    inputs = rent_inputs(rf)
    keys = {o.key for o in inputs.options}
    assert keys == {"g5.xlarge:on_demand", "g5.xlarge:spot", "p3.2xlarge:on_demand"}
    assert any("p3.2xlarge: no spot loss rate known" in f for f in inputs.findings)
    p3 = next(c for c in inputs.costs if c.instance_type == "p3.2xlarge")
    assert p3.estimate == "Lambda V100 AMP" and p3.cost.beta == pytest.approx(1 / 833)
    assert inputs.job.samples == 1e6 and inputs.job.global_batch == 512
    decision = plan_rent(rf, inputs)
    table = format_decision(decision)
    assert decision.chosen.describe() in table


def test_a_spot_trace_gives_the_loss_rate(tmp_path):
    (tmp_path / "trace.json").write_text(
        json.dumps({"metadata": {"gap_seconds": 1800}, "data": [0, 0, 1, 0, 0, 1]})
    )
    path = _write(tmp_path, spot_loss={"traces": {"g5.xlarge": {"path": "trace.json"}}})
    inputs = rent_inputs(load_rent_file(path))
    spot = next(o for o in inputs.options if o.key == "g5.xlarge:spot")
    assert spot.loss_per_h == pytest.approx(2 / 2.0)  # 2 losses over 4 held ticks of 0.5 h


def test_catalog_rows_add_and_replace_rows(tmp_path):
    row = {"InstanceType": "g5.xlarge", "AcceleratorName": "A10G", "AcceleratorCount": 1,
           "vCPUs": 4, "MemoryGiB": 16, "Price": 0.5, "SpotPrice": 0.1,
           "Region": "us-east-1", "AvailabilityZone": "use1-az1"}  # fmt: skip
    inputs = rent_inputs(load_rent_file(_write(tmp_path, catalog_rows=[row])))
    assert inputs.offers["g5.xlarge"].price == 0.5  # lower than the snapshot's 1.006
    assert inputs.offers["g5.xlarge"].spot_price == 0.1


def test_remembered_cost_models_are_matched_by_what_they_describe(tmp_path):
    store = storage_location(tmp_path / "runs").cost_models()
    store.write("k1", 0.02, 0.003, {"hardware": {"gpu": "NVIDIA A10G"}})
    store.write("k2", 0.01, 0.001, {"hardware": {"gpu": "Tesla V100-SXM2-16GB"}})
    costs = remembered_costs(str(tmp_path / "runs"), {"g5.xlarge": "A10G", "p3.2xlarge": "V100"})
    by_type = {c.instance_type: c.cost for c in costs}
    assert by_type["g5.xlarge"].beta == 0.003 and by_type["p3.2xlarge"].alpha == 0.01
    with pytest.raises(ConfigError, match=r"no entry mention 'H100' for p5\.48xlarge\. Fix"):
        remembered_costs(str(tmp_path / "runs"), {"p5.48xlarge": "H100"})
    with pytest.raises(ConfigError, match=r"2 entries \(k1, k2\) mention 'gpu'"):
        remembered_costs(str(tmp_path / "runs"), {"x": "gpu"})


# ------------------------------------------------------------------------- bad input, one line


def test_a_catalog_row_without_a_price_is_one_line(tmp_path, capsys):
    row = {"InstanceType": "g5.xlarge", "Region": "us-east-1", "AvailabilityZone": "use1-az9",
           "AcceleratorName": "A10G", "AcceleratorCount": 1}  # fmt: skip
    err = _error_line(capsys, ["rent", str(_write(tmp_path, catalog_rows=[row]))])
    assert "g5.xlarge in us-east-1 (use1-az9) has no Price. Fix:" in err


def test_an_instance_type_no_cost_model_covers_is_one_line(tmp_path, capsys):
    rent = {**BASE["rent"], "instance_types": ["g5.xlarge", "p5.48xlarge"]}
    err = _error_line(capsys, ["rent", str(_write(tmp_path, rent=rent))])
    assert "instance type 'p5.48xlarge' has no cost model. Fix:" in err


def test_an_unknown_region_is_one_line(tmp_path, capsys):
    rent = {**BASE["rent"], "region": "eu-mars-1"}
    err = _error_line(capsys, ["rent", str(_write(tmp_path, rent=rent))])
    assert "region 'eu-mars-1' is not in the catalog" in err and "Fix:" in err


def test_a_negative_budget_is_one_line(tmp_path, capsys):
    err = _error_line(capsys, ["rent", str(_write(tmp_path, deadline_h=None, budget=-5))])
    assert "the budget is -5.0 (negative). Fix: give a positive number of dollars." in err


def test_a_cost_model_with_two_kinds_of_figure_is_refused(tmp_path, capsys):
    models = [{"instance_type": "g5.xlarge", "beta": 0.002, "published": "lambda-resnet50-amp/A10"}]
    err = _error_line(capsys, ["rent", str(_write(tmp_path, cost_models=models))])
    assert "gives 2 kinds of figure" in err


def test_an_infeasible_deadline_exits_1_naming_the_fastest(tmp_path, capsys):
    assert main(["rent", str(_write(tmp_path, deadline_h=0.01))]) == 1
    out = capsys.readouterr().out
    assert "NOT FEASIBLE: no plan ends within 36 s; the fastest is" in out


# ------------------------------------------------------------------------- --apply's pieces


def test_the_plan_becomes_labelled_worker_slots_on_demand_first(tmp_path):
    rf = load_rent_file(_write(tmp_path))
    inputs = rent_inputs(rf)
    decision = plan_rent(rf, inputs)
    specs = worker_specs(decision.chosen, inputs, rf)
    markets = [s["label_selector"]["raytrain-hetero.io/market"] for s in specs]
    assert markets == sorted(markets, key=lambda m: m == "spot")
    assert sum(s["count"] for s in specs) == decision.chosen.workers
    bundles, selectors = resource_request(specs)
    assert len(bundles) == len(selectors) == decision.chosen.workers
    assert all(b == {"CPU": 1.0, "GPU": 1.0} for b in bundles)  # GPU types: one GPU per slot
    assert {s["raytrain-hetero.io/instance-type"] for s in selectors} <= {"g5.xlarge", "p3.2xlarge"}


def test_replan_keeps_the_slots_and_prices_what_is_left(tmp_path):
    rf = load_rent_file(_write(tmp_path, deadline_h=3))
    inputs = rent_inputs(rf)
    decision = plan_rent(rf, inputs)
    planned = {f"{n.instance_type}:{n.market}": n.nodes for n in decision.chosen.nodes}
    key = next(iter(planned))
    held = {**planned, key: planned[key] - 1}
    new = replan(inputs, decision, held, elapsed_s=decision.chosen.expected_time_s / 2, spent=0.0)
    assert new.objective == "deadline"
    assert new.limit == pytest.approx(decision.limit - decision.chosen.expected_time_s / 2)
    for n in new.chosen.nodes:
        assert n.nodes <= planned[f"{n.instance_type}:{n.market}"]
    # nothing lost: the held mix needs neither start-up nor a restart
    same = replan(inputs, decision, planned, elapsed_s=0.0, spent=0.0)
    assert same.chosen.startup_s == 0.0 or same.chosen.describe() != decision.chosen.describe()


def test_incurred_cost_is_node_seconds_at_catalog_prices(tmp_path):
    inputs = rent_inputs(load_rent_file(_write(tmp_path)))
    spans = [
        NodeSpan("a", "g5.xlarge", "on_demand", 0.0, 3600.0),
        NodeSpan("b", "g5.xlarge", "spot", 1800.0, None),
    ]
    spot = next(o.price_per_h for o in inputs.options if o.key == "g5.xlarge:spot")
    assert incurred_cost(spans, inputs, now_s=5400.0) == pytest.approx(1.006 + spot)


def test_steps_done_reads_the_newest_checkpoint_snapshot(tmp_path):
    import os
    import time as _time

    from raytrain_hetero.app.rent_apply import steps_done

    runs = storage_location(tmp_path / "runs")
    assert steps_done(runs, 0.0) is None
    old = tmp_path / "runs" / "old-run"
    new = tmp_path / "runs" / "new-run"
    for folder, step in ((old, 500), (new, 40)):
        folder.mkdir(parents=True)
        snapshot = {"latest_checkpoint_result": {"metrics": {"hetero/global_step": step}}}
        (folder / "checkpoint_manager_snapshot.json").write_text(json.dumps(snapshot))
    then = _time.time() - 3600
    os.utime(old / "checkpoint_manager_snapshot.json", (then, then))
    assert steps_done(runs, _time.time() - 60) == 40  # the old run is before the apply
