"""benchmarks.rent_sim: the cases, the comparison with the best single type, the table."""

from __future__ import annotations

import json
import statistics

from benchmarks import rent_sim


def test_cases_cover_jobs_scenarios_and_both_limits():
    cases = rent_sim.build_cases()
    assert len(cases) >= 20
    assert {c.job for c in cases} == set(rent_sim.JOBS)
    assert {c.scenario for c in cases} == {"on-demand", "spot"}
    assert {c.limit for c in cases} == {"deadline", "budget"}
    assert len({c.name for c in cases}) == len(cases)


def test_a_case_compares_the_choice_with_the_best_single_type():
    case = rent_sim.Case("nvidia-amp", 10, "spot", "deadline", 2.0)
    result = rent_sim.run_case(case)
    row = result.row()
    assert row["never_worse"] and row["feasible"]
    d = result.decision
    # the deadline is twice the fastest single type's time, so some single type keeps it
    assert d.best_single.expected_time_s <= result.limit_value
    assert d.chosen.expected_cost <= d.best_single.expected_cost * (1 + 1e-9)
    if result.mix_chosen:
        assert row["saving"] == round(1 - d.chosen.expected_cost / d.best_single.expected_cost, 4)


def test_median_saving_counts_only_cases_where_a_mix_is_chosen():
    results = [
        rent_sim.run_case(rent_sim.Case("nvidia-amp", 10, "spot", "deadline", f))
        for f in (2.0, 4.0)
    ]
    mixes = [r.decision.saving for r in results if r.mix_chosen and r.decision.saving is not None]
    got = rent_sim.median_saving(results, "deadline")
    assert got == (statistics.median(mixes) if mixes else None)
    assert rent_sim.median_saving(results, "budget") is None


def test_main_writes_the_table_and_refuses_none(tmp_path, monkeypatch, capsys):
    few = tuple(rent_sim.build_cases()[:3])
    monkeypatch.setattr(rent_sim, "build_cases", lambda: few)
    assert rent_sim.main(["--output", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| case | limit | chosen |")
    report = json.loads((tmp_path / "results.json").read_text())
    assert report["summary"]["cases"] == 3
    assert report["summary"]["never_worse_violations"] == 0
    assert (tmp_path / "COMMAND").read_text().startswith("python -m benchmarks.rent_sim")
