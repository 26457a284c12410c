"""``python -m benchmarks tune-sim``: the Gavel table as shipped, the command and its outputs."""

from __future__ import annotations

import json

from benchmarks.suite import main as suite_main
from benchmarks.tune_sim import TABLE_PATH, load_table


def test_gavel_table_as_shipped():
    table = load_table()
    assert len(table) == 26  # Gavel's job configurations (83 with their scale factors)
    assert sum(len(scales) for scales in table.values()) == 83
    for scales in table.values():
        assert set(scales["1"]) == {"k80", "p100", "v100"}  # no *_unconsolidated duplicates
    assert (TABLE_PATH.parent / "LICENSE.gavel").read_text().count("MIT License") == 1


def test_command_writes_its_results(tmp_path, capsys):
    out = tmp_path / "tune_sim"
    assert suite_main(["tune-sim", "--output", str(out), "--seeds", "0", "--trials", "12"]) == 0
    printed = capsys.readouterr().out
    assert "fifo/ours" in printed and "decision, 12 trials on 100 nodes" in printed
    assert "ours/online" in printed and "reachable online bound" in printed
    report = json.loads((out / "results.json").read_text())
    for name in ("all-configs", "resnet50"):
        figures = report["searches"][name]["0"]
        assert set(figures["policies"]) == {"fifo", "distribute", "ours"}
        ours = figures["policies"]["ours"]["makespan_s"]
        assert figures["bound_s"] <= ours * (1 + 1e-9)
        assert figures["bound_s"] <= figures["online_bound_s"] * (1 + 1e-6)
        assert figures["ours_vs_online"] == ours / figures["online_bound_s"]
        assert figures["speedup_vs_fifo"] == figures["policies"]["fifo"]["makespan_s"] / ours
    assert report["decision_benchmark"]["unchanged_kept"] == 1.0
    assert (out / "COMMAND").read_text().startswith("python -m benchmarks tune-sim")
    assert "fifo/ours" in (out / "results.md").read_text()
