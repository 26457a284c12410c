"""Drift against a side-by-side static post-drift plan, emulated noise, hetero2, gpu-alone.

Pure figures from synthetic step logs (no Ray): the bench's own analysis and selection code.
"""

from __future__ import annotations

import math
import statistics

import pytest

from benchmarks.analysis import (
    drift_figures,
    fit_figures,
    live_replans,
    steps_to_recover,
    summarize,
)
from benchmarks.contenders import contender_workers
from benchmarks.report import format_table
from benchmarks.scenarios import CONTENDERS, NOISE_AMPLITUDE, SCENARIOS
from raytrain_hetero.config import EmulationConfig, WorkerSpec
from raytrain_hetero.errors import ConfigError
from raytrain_hetero.worker.measure.emulation import SlowdownSchedule, noise_multiplier


def step_log(step_times, *, batch=60, world=2):
    """Rank logs of a fit whose step k takes step_times[k] seconds (no evaluations)."""
    records = [{"event": "start", "rank": 0, "time": 0.0, "pid": "1"}]
    t = 1.0
    for step, seconds in enumerate(step_times):
        t += seconds
        for rank in range(world):
            record = {
                "step": step,
                "rank": rank,
                "world": world,
                "slice": batch // world,
                "time": t,
                "pid": str(rank + 1),
            }
            if step == 0:
                record["first_batch_time"] = t - seconds
            records.append(record)
    return records


def drift_fit(contender, step_times, phase, plans=()):
    figures = fit_figures(
        step_log(step_times), global_batch_size=60, target_accuracy=0.9, phase_step=phase
    )
    return {
        "contender": contender,
        "counted": True,
        "wall_s": 1.0,
        "figures": figures,
        "plans": list(plans),
    }


def test_steps_to_recover_waits_for_a_rolling_median_that_stays_within_10_percent():
    rates = dict.fromkeys(range(10), 100.0)
    rates.update({10: 50.0, 11: 50.0, 12: 95.0, 13: 50.0, 14: 95.0, 15: 95.0, 16: 95.0})
    rates.update(dict.fromkeys(range(17, 25), 95.0))
    # Step 12's window (50, 50, 95) is low; from 14 on (50, 95, 95 -> 95) it stays >= 90.
    assert steps_to_recover(rates, 10, 100.0) == 4
    assert steps_to_recover(dict.fromkeys(range(10, 30), 50.0), 10, 100.0) is None


def test_drift_splits_transition_from_steady_state_against_the_static_post_plan():
    phase = 10
    # Live: 1.0 s steps for 10 steps after the injection, then 0.5 s (the static plan's).
    live = [0.4] * phase + [1.0] * 10 + [0.5] * 40
    static_post = [0.5] * 60
    fits = [
        drift_fit("hetero-static-post", static_post, phase),
        drift_fit(
            "hetero-live",
            live,
            phase,
            plans=[{"reason": "probe"}, {"reason": "live: measured speeds"}],
        ),
    ]
    reference = fits[0]["figures"]["samples_per_s"]
    assert reference == pytest.approx(120.0)
    figures = drift_figures(fits[1]["figures"], reference)
    # The transition ends once three steps at 120/s are in the rolling window (step 20 + 1).
    assert figures["transition_steps"] == 11
    assert figures["samples_per_s_steady"] == pytest.approx(120.0)
    assert figures["samples_per_s_transition"] < 70.0
    assert figures["vs_static_post_after_30"] == pytest.approx(1.0)
    summary = summarize(fits, ["hetero-live", "hetero-static-post"], SCENARIOS["drift"].targets)
    row = summary["contenders"]["hetero-live"]
    assert row["transition_steps"] == 11 and row["replans"] == 1
    assert row["replans_per_100_steps"] == pytest.approx(100 / 60)
    verdicts = {(v["contender"], v["metric"]): v["met"] for v in summary["targets"]}
    assert verdicts[("hetero-live", "vs_static_post_after_30")] is True
    # Never back within 10%: no transition end, the +30 figure fails the target.
    stuck = drift_fit("hetero-live", [0.4] * phase + [0.8] * 50, phase)
    summary = summarize(
        [fits[0], stuck], ["hetero-live", "hetero-static-post"], SCENARIOS["drift"].targets
    )
    row = summary["contenders"]["hetero-live"]
    assert row["recovered"] == 0 and math.isnan(row["transition_steps"])
    assert row["vs_static_post_after_30"] == pytest.approx(0.625)
    verdicts = {(v["contender"], v["metric"]): v["met"] for v in summary["targets"]}
    assert verdicts[("hetero-live", "vs_static_post_after_30")] is False
    table = format_table(
        {
            "scenario": "drift",
            "description": "d",
            "emulated": True,
            "options": {"repeats": 1, "global_batch_size": 60, "width": 8, "target_accuracy": 0.9},
            "machine": {"cpu_model": "cpu", "usable_cpus": 2, "load_average": [1.0]},
            "fits": [fits[0], stuck],
            "summary": summary,
        }
    )
    assert "against hetero-static-post" in table and "0/1 recovered" in table


def test_replans_count_only_live_plans_and_the_noise_target_holds_them_to_one_per_100():
    assert live_replans([{"reason": "probe + calibration"}, {"reason": "live: x"}]) == 1
    noisy = drift_fit(
        "hetero-live-noise",
        [0.5] * 200,
        10,
        plans=[{"reason": "probe"}, {"reason": "live: a"}, {"reason": "live: b"}],
    )
    summary = summarize([noisy], ["hetero-live-noise"], SCENARIOS["drift"].targets)
    assert summary["contenders"]["hetero-live-noise"]["replans_per_100_steps"] == 1.0
    (verdict,) = summary["targets"]
    assert verdict["metric"] == "replans_per_100_steps" and verdict["met"] is True
    # A rate pooled over repeats: 0 and 3 re-plans in 2 x 80 steps are 1.875 per 100.
    quiet = drift_fit("hetero-live-noise", [0.5] * 80, 10, plans=[{"reason": "probe"}])
    busy = drift_fit(
        "hetero-live-noise", [0.5] * 80, 10, plans=[{"reason": "live: x"} for _ in range(3)]
    )
    summary = summarize([quiet, busy], ["hetero-live-noise"], SCENARIOS["drift"].targets)
    assert summary["contenders"]["hetero-live-noise"]["replans_per_100_steps"] == 1.875
    assert summary["targets"][0]["met"] is False


def test_hetero2_is_two_one_core_workers_at_1_and_3_with_its_targets():
    scenario = SCENARIOS["hetero2"]
    assert scenario.emulated and not scenario.schedule
    assert [w["emulated_slowdown"] for w in scenario.workers] == [1, 3]
    assert all(w["resources"] == {"CPU": 1} and w["count"] == 1 for w in scenario.workers)
    assert scenario.contenders == ("stock", "hetero", "hetero-live", "best-subset")
    # Ideal over equal slices: max(B/2 / 1, B/2 / (1/3)) / (B / (1 + 1/3)) = 2.0.
    speeds = [1 / w["emulated_slowdown"] for w in scenario.workers]
    assert max(0.5 / s for s in speeds) / (1 / sum(speeds)) == pytest.approx(2.0)
    goals = {(t.metric, t.op, t.value) for t in scenario.targets}
    assert goals == {
        ("vs_best_subset", ">=", 0.97),
        ("efficiency", ">=", 0.95),
        ("tta_speedup", ">=", 1.9),
    }


def specs(scenario):
    from raytrain_hetero.driver.trainer import expand_worker_specs

    return expand_worker_specs(SCENARIOS[scenario].workers)


def test_static_post_folds_the_injections_into_the_base_slowdowns():
    drift = SCENARIOS["drift"]
    assert {"hetero-static-post", "hetero-live-noise"} <= set(drift.contenders)
    chosen = contender_workers("hetero-static-post", specs("drift"), drift.schedule)
    assert [s.emulated_slowdown for s in chosen.specs] == [3.0, 2.0, 4.0]
    assert chosen.schedule == () and chosen.noise == 0.0
    live = contender_workers("hetero-live", specs("drift"), drift.schedule)
    assert [s.emulated_slowdown for s in live.specs] == [1.0, 2.0, 4.0]
    assert live.schedule == tuple(drift.schedule)


def test_noise_contender_runs_without_drift_and_keeps_minus_10_percent_representable():
    drift = SCENARIOS["drift"]
    chosen = contender_workers("hetero-live-noise", specs("drift"), drift.schedule)
    assert chosen.schedule == () and chosen.noise == NOISE_AMPLITUDE == 0.1
    assert min(s.emulated_slowdown for s in chosen.specs) * (1 - chosen.noise) == pytest.approx(1)


def test_gpu_alone_keeps_only_the_cuda_worker_without_needing_cuda():
    scenario = SCENARIOS["cpu-gpu"]
    assert "gpu-alone" in scenario.contenders and "gpu-alone" in CONTENDERS
    chosen = contender_workers("gpu-alone", specs("cpu-gpu"), scenario.schedule)
    assert [s.name for s in chosen.specs] == ["gpu"]
    assert any(t.metric == "vs_gpu_alone" and t.value == 1.0 for t in scenario.targets)
    with pytest.raises(ValueError, match="gpu-alone needs a worker whose device is cuda"):
        contender_workers("gpu-alone", specs("hetero3"), ())
    fits = [
        {"contender": c, "counted": True, "wall_s": 1.0, "figures": {"samples_per_s": v}}
        for c, v in (("stock", 10.0), ("hetero", 150.0), ("gpu-alone", 100.0))
    ]
    summary = summarize(fits, ["stock", "hetero", "gpu-alone"], scenario.targets)
    assert summary["contenders"]["hetero"]["vs_gpu_alone"] == pytest.approx(1.5)


def test_emulated_noise_is_uniform_deterministic_and_off_outside_steps():
    draws = [noise_multiplier(0.1, worker="fast", step=s) for s in range(2000)]
    assert min(draws) >= 0.9 and max(draws) <= 1.1
    assert min(draws) < 0.91 and max(draws) > 1.09
    assert statistics.mean(draws) == pytest.approx(1.0, abs=0.01)
    assert draws == [noise_multiplier(0.1, worker="fast", step=s) for s in range(2000)]
    assert draws[:50] != [noise_multiplier(0.1, worker="slow", step=s) for s in range(50)]
    assert noise_multiplier(0.1, worker="fast", step=-1) == 1.0
    assert noise_multiplier(0.0, worker="fast", step=7) == 1.0
    schedule = SlowdownSchedule(2.0, worker="fast", rank=0, noise=0.1)
    assert schedule.factor_at(5) == pytest.approx(2.0 * draws[5])
    assert schedule.factor_at(-1) == 2.0
    # Emulation only slows down: an unslowed worker's draws below 1 are clipped to 1.
    assert (
        min(
            SlowdownSchedule(1.0, worker="fast", rank=0, noise=0.1).factor_at(s) for s in range(200)
        )
        == 1.0
    )


def test_emulation_noise_is_one_setting_checked_where_it_is_defined():
    assert EmulationConfig().noise == 0.0
    assert EmulationConfig(noise=0.1).noise == 0.1
    for bad in (-0.1, 1.0, float("nan")):
        with pytest.raises((ConfigError, ValueError)):
            EmulationConfig(noise=bad)
    assert WorkerSpec(name="w").emulated_slowdown == 1.0


def _never_runs(config):
    raise AssertionError


def test_emulation_noise_reaches_the_workers_setup_from_python_and_yaml():
    from ray.train import RunConfig

    from raytrain_hetero.app.config import validate_config
    from raytrain_hetero.app.job import build_trainer
    from raytrain_hetero.app.overrides import merge_overrides, parse_override
    from raytrain_hetero.driver.trainer import HeteroTrainer

    workers = [{"name": "a"}, {"name": "b"}]
    trainer = HeteroTrainer(
        _never_runs,
        workers=workers,
        batch={"global_batch_size": 8},
        emulation=EmulationConfig(noise=0.1),
    )
    assert trainer.setup().emulation.noise == 0.1
    data = merge_overrides(
        {"data": {"root": "data/x"}, "workers": workers}, parse_override("emulation.noise=0.05")
    )
    assert (
        build_trainer(validate_config(data), _never_runs, RunConfig()).setup().emulation.noise
        == 0.05
    )


def test_bench_scheduler_option_builds_validated_scheduler_fields():
    from benchmarks.arguments import parse_scheduler

    assert parse_scheduler(None) == {}
    assert parse_scheduler(
        "plan_sync_every=2,policy.window_steps=4,policy.urgent_improvement=0.2"
    ) == {
        "plan_sync_every": 2,
        "policy": {"window_steps": 4, "urgent_improvement": 0.2},
    }
    with pytest.raises(ValueError, match="window_steps"):
        parse_scheduler("policy.window_steps=0")
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_scheduler("plan_sync_every")
    with pytest.raises(ValueError, match="live"):
        parse_scheduler("live=1")
