"""The large-cluster simulator: pure, deterministic, sane figures, and the CLI."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from raytrain_hetero.app.cli import main as cli_main
from raytrain_hetero.sim.simulator import (
    ALLOCATION_GOAL_MS,
    STRATEGIES,
    SimConfig,
    allocation_time,
    format_table,
    run_sweep,
    simulate,
)

QUIET = dict(
    drift=0.0, noise=0.0, sudden_fraction=0.0, fail_fraction=0.0, join_fraction=0.0, probe_error=0.0
)


def by_strategy(results):
    return {r.strategy: r for r in results}


def test_every_strategy_reports_sane_figures():
    results = by_strategy(simulate(SimConfig(workers=12, steps=60)))
    assert set(results) == set(STRATEGIES)
    for r in results.values():
        assert math.isfinite(r.samples_per_s) and r.samples_per_s > 0
        assert 0 < r.efficiency_vs_optimum <= 1.05
        assert 0 < r.efficiency_vs_bound <= 1.05
        assert r.restarts == 2  # one failure, one join
    assert results["oracle"].efficiency_vs_optimum == pytest.approx(1.0)
    assert results["equal"].efficiency_vs_optimum < results["static"].efficiency_vs_optimum


def test_same_seed_same_figures_and_other_seed_differs():
    cfg = SimConfig(workers=8, steps=40)
    assert simulate(cfg) == simulate(cfg)
    assert simulate(cfg) != simulate(replace(cfg, seed=1))


def test_identical_workers_need_no_plan_and_equal_split_is_optimal():
    cfg = SimConfig(workers=6, steps=80, spread=0.0, alpha_spread=0.0, **QUIET)
    results = by_strategy(simulate(cfg))
    for name in ("equal", "static", "live"):
        assert results[name].efficiency_vs_optimum == pytest.approx(1.0, abs=1e-9), name
    assert results["live"].replans == 0


def test_exact_probe_on_a_steady_cluster_is_the_optimum():
    cfg = SimConfig(workers=16, steps=50, spread=0.6, **QUIET)
    results = by_strategy(simulate(cfg))
    assert results["static"].efficiency_vs_optimum == pytest.approx(1.0, abs=1e-9)
    assert results["equal"].efficiency_vs_optimum < 0.8
    assert results["live"].replans == 0  # nothing changed: no churn


def test_live_recovers_from_a_sudden_slowdown_that_static_cannot():
    cfg = SimConfig(
        workers=10,
        steps=200,
        spread=0.3,
        sudden_factor=4.0,
        sudden_at=0.2,
        **{**QUIET, "sudden_fraction": 0.2},
    )
    results = by_strategy(simulate(cfg))
    assert results["live"].replans >= 1
    assert results["live"].efficiency_vs_optimum > results["static"].efficiency_vs_optimum + 0.1
    assert 0 < results["live"].moved_fraction < 1


def test_invalid_configs_are_refused():
    with pytest.raises(ValueError, match="workers"):
        SimConfig(workers=0)
    with pytest.raises(ValueError, match="fail_fraction"):
        SimConfig(workers=4, fail_fraction=1.5)
    with pytest.raises(ValueError, match="unknown strategies"):
        simulate(SimConfig(workers=4, steps=5), strategies=("fastest",))


def test_a_plan_for_ten_thousand_workers_is_fast():
    timing = allocation_time(10_000, repeats=5)
    assert timing["allocate_ms"] < ALLOCATION_GOAL_MS
    assert timing["decide_ms"] > 0


def test_sweep_table_and_cli_outputs(tmp_path, capsys):
    sweep = run_sweep([5, 20], base=SimConfig(workers=5, steps=30), timing_repeats=1)
    table = format_table(sweep)
    for name in STRATEGIES:
        assert name in table
    assert "goal: < 50 ms" in table

    out = tmp_path / "sim"
    assert cli_main(["sim", "--workers", "5", "20", "--steps", "30", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "SIMULATED" in printed and "oracle" in printed
    data = json.loads((out / "bench.json").read_text())
    assert {r["workers"] for r in data["rows"]} == {5, 20}
    assert {r["strategy"] for r in data["rows"]} == set(STRATEGIES)
    assert (out / "sim.png").stat().st_size > 10_000


def test_simulator_imports_neither_ray_nor_torch():
    code = (
        "import sys, raytrain_hetero.sim.simulator; "
        "bad = [m for m in ('ray', 'torch') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("workers", [10, 100])
def test_ten_percent_noise_replans_at_most_once_per_100_steps(workers):
    """The noise target, in the simulator: constant speeds, ±10 % step-time noise.

    Lognormal sigma 0.058 has the standard deviation of uniform ±10 % noise.
    """
    cfg = SimConfig(workers=workers, steps=300, **{**QUIET, "noise": 0.058, "probe_error": 0.05})
    live = by_strategy(simulate(cfg, strategies=("live",)))["live"]
    per_100 = [sum(1 for s in live.replan_steps if lo <= s < lo + 100) for lo in (0, 100, 200)]
    assert max(per_100) <= 1, live.replan_steps


def test_restart_and_probe_costs_come_from_the_measured_join(capsys, tmp_path):
    from raytrain_hetero.sim.traces import JOIN_PROBE_S, JOIN_RESTART_S

    join = json.loads(
        (Path(__file__).parents[2] / "benchmarks/results/join/bench.json").read_text()
    )
    hetero = join["summary"]["contenders"]["hetero"]
    stock = join["summary"]["contenders"]["stock"]
    probe = hetero["startup_s"] - stock["startup_s"]
    assert pytest.approx(probe, abs=0.05) == JOIN_PROBE_S
    assert pytest.approx(hetero["join_latency_s"] - probe, abs=0.05) == JOIN_RESTART_S
    cfg = SimConfig(workers=4)
    assert (cfg.restart_s, cfg.probe_s) == (JOIN_RESTART_S, JOIN_PROBE_S)
    out = tmp_path / "sim"
    assert cli_main(["sim", "--workers", "4", "--steps", "20", "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "restart 12.3 s, probe 1.7 s" in printed and "benchmarks/results/join" in printed
