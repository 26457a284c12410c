"""benchmarks/soak_figure.py: totals over several soak runs and the figure, from the files the
soak writes (its printed report and its --out folder's fault markers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import soak_figure


def _write_run(folder: Path, name: str, summary: dict, fired: list[tuple[str, str]]) -> str:
    report = folder / f"{name}.txt"
    report.write_text("table lines\nfaults injected: ...\n" + json.dumps(summary) + "\n")
    markers = folder / name / "soak" / "faults"
    markers.mkdir(parents=True)
    for i, (action, phase, *effect) in enumerate(fired):
        what = f"{action} rank 1 at {phase}"
        body = {"fault": i, "what": what, "phase": phase, "time": 1000.0 + 7 * i}
        if effect:
            body["effect"] = effect[0]
        (markers / f"fault{i:02d}-{phase}-{action}.fired.json").write_text(json.dumps(body))
    return f"{report}:{folder / name}"


def _summary(injected: int, lost: int = 0, matched: str = "yes", diff: float = 3e-8) -> dict:
    return {
        "faults_injected": injected,
        "faults_drawn": injected,
        "node_losses": 1,
        "notice_preemptions": 1,
        "survived": injected,
        "samples_lost": lost,
        "restores_matched": matched,
        "max_param_diff": diff,
        "worker_groups_started": 5,
        "soak_s": 100.0,
    }


def test_totals_add_runs_and_keep_the_worst_check(tmp_path):
    fired_a = [
        ("kill", "probe"),
        ("hang", "mid_epoch"),
        ("kill_scheduler", "calibration", soak_figure.KILLED_SCHEDULER),
        ("kill_scheduler", "calibration"),  # fired, found no actor: not injected
    ]
    a = _write_run(tmp_path, "a", _summary(4), fired_a)
    b = _write_run(
        tmp_path, "b", _summary(3, lost=2, matched="NO (x)", diff=5e-5), [("kill", "probe")]
    )
    assert soak_figure.main(["--run", a, "--run", b, "--output", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "summary.txt").read_text()
    total = json.loads(text.strip().splitlines()[-1])
    assert total["faults_injected"] == 7
    assert total["node_losses"] == 2 and total["notice_preemptions"] == 2
    assert total["samples_lost"] == 2
    assert total["restores_matched"] == "NO"
    assert total["max_param_diff"] == 5e-5
    assert total["worker_groups_started"] == 10
    # By phase and action: two kills at probe, one hang mid-epoch.
    probe = next(line for line in text.splitlines() if line.startswith("probe "))
    assert probe.split()[1:] == ["2", "0", "0"]
    calibration = next(line for line in text.splitlines() if line.startswith("calibration "))
    assert calibration.split()[1:] == ["0", "0", "1"]
    assert (tmp_path / "out" / "soak.png").stat().st_size > 0


def test_an_unfinished_run_is_one_clear_error(tmp_path):
    report = tmp_path / "r.txt"
    report.write_text("the run was killed before its summary\n")
    with pytest.raises(ValueError, match="no JSON summary"):
        soak_figure.read_run(report, tmp_path)
