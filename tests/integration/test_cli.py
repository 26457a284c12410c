"""The main job through the real CLI: outputs, and clear errors that leave nothing behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from raytrain_hetero.app.cli import main
from raytrain_hetero.app.outputs import read_metrics_csv

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "configs" / "eurosat_local.yaml"


@pytest.mark.ray
def test_train_writes_outputs_and_prints_accuracy(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    code = main(
        [
            "train",
            "--config",
            str(EXAMPLE),
            "--output",
            str(out),
            "--no-progress",
            "--set",
            "data.generate.samples_per_class=30",
            "--set",
            "train.epochs=2",
            "--set",
            "train.global_batch_size=48",
            "--set",
            "model.width=8",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "final validation accuracy:" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert 0.0 <= summary["final_val_accuracy"] <= 1.0
    assert summary["samples_per_s"] > 0
    workers = {w["worker"]: w for w in summary["workers"]}
    assert set(workers) == {"fast", "medium", "slow"}
    assert sum(w["slice"] for w in workers.values()) == 48
    # Emulated slowdowns 1, 2, 4: the probe gives the fast worker the largest slice.
    assert workers["fast"]["slice"] > workers["medium"]["slice"] > workers["slow"]["slice"]
    reported = summary["reported"]
    assert {f"hetero/rank{r}/slice" for r in range(3)} <= set(reported)
    assert reported["hetero/plan_version"] >= 1
    rows = read_metrics_csv(out / "metrics.csv")
    assert {r["rank"] for r in rows} == {0, 1, 2}
    assert len(rows) == 3 * summary["steps"]
    png = (out / "throughput.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 10_000
    # The synthetic dataset was generated in the real torchgeo layout under the relative root.
    assert (tmp_path / "data" / "eurosat_synth" / "eurosat-train.txt").exists()


def test_unknown_key_is_one_clear_error(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("  lr: 0.05", "  learning_rate: 0.05"))
    out = tmp_path / "out"
    code = main(["train", "--config", str(bad), "--output", str(out)])
    assert code == 2
    err = capsys.readouterr().err
    assert "learning_rate" in err and "lr" in err and "Fix" in err
    assert not out.exists()


def test_missing_data_root_names_the_path_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "out"
    missing = tmp_path / "no_such_eurosat"
    code = main(
        [
            "train",
            "--config",
            str(EXAMPLE),
            "--output",
            str(out),
            "--set",
            f"data.root={missing}",
            "--set",
            "data.generate=null",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert str(missing) in err
    assert not out.exists() and not missing.exists()


def test_console_script_help_runs():
    done = subprocess.run(
        [sys.executable, "-m", "raytrain_hetero", "train", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "--config" in done.stdout


@pytest.mark.ray
def test_probe_prints_each_worker_and_the_plan(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code = main(
        [
            "probe",
            "--config",
            str(EXAMPLE),
            "--set",
            "data.generate.samples_per_class=12",
            "--set",
            "train.global_batch_size=24",
            "--set",
            "model.width=8",
            "--set",
            "probe.calibration_steps=1",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    for name in ("fast", "medium", "slow"):
        assert name in printed
    plan_line = next(line for line in printed.splitlines() if line.startswith("plan v1"))
    slices = [int(x) for x in plan_line.split("[")[1].split("]")[0].split(",")]
    assert sum(slices) == 24 and min(slices) >= 1
    # The admission table: one verdict per worker with the numbers, then the summary.
    lines = printed.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("admission: group samples/s"))
    rows = lines[head + 2 : head + 5]
    assert all(("admit" in row or "LEAVE OUT" in row) and " ms " in row for row in rows), rows
    assert lines[head + 5].startswith("admission: ")
