"""The device check (``python -m benchmarks device``): its table, its parts hook, its dry run.

The dry run starts a real local Ray and runs every part at the tiniest size on this CPU
machine (the GPU worker replaced by a CPU stand-in): the command the lent GPU machine will
run, minus the GPU. No timing is asserted.
"""

from __future__ import annotations

import json
import math
import os

import pytest

from benchmarks import device
from benchmarks.device import DevicePart, Row, format_device_table, register_part


def test_the_table_has_one_line_per_row_and_says_whether_each_goal_is_met():
    rows = [
        Row("a", "cpu-gpu", "hetero-live", 6210.0, "gpu-alone", 0.62, ">= 1.0", False, "n"),
        Row("a", "", "gpu-alone", 10012.0),
        Row("b", "real", "ideal", math.nan, "hetero-live", 0.95, ">= 0.9", True),
    ]
    table = format_device_table(rows, ["part c skipped: no CUDA"])
    lines = table.splitlines()
    assert lines[0].split() == ["part", "check", "contender", "samples/s", "vs", "ratio", "goal"]
    assert ">= 1.0 NOT met" in lines[2] and lines[2].endswith("(n)")
    assert "10012.0" in lines[3] and ">= 0.9 met" in lines[4] and " - " in lines[4]
    assert lines[-1] == "note: part c skipped: no CUDA"
    assert "note: x" in format_device_table([], ["x"])  # an empty run still renders


def test_parts_run_in_order_and_another_check_registers_its_own():
    assert [p.key for p in device.PARTS][:2] == ["a+c", "b"]
    assert device.PARTS[0].needs_gpu and not device.PARTS[1].needs_gpu
    with pytest.raises(ValueError, match="registered already"):
        register_part(DevicePart("b", "again", lambda run: [], 1.0))
    extra = DevicePart("tune", "issue 44's check", lambda run: [], 1.0)
    register_part(extra)
    try:
        assert device.PARTS[-1] is extra
    finally:
        device.PARTS.remove(extra)


def test_unknown_parts_are_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        device.main(["--output", str(tmp_path), "--parts", "zz"])
    assert "unknown parts ['zz']" in capsys.readouterr().err


def test_a_gpu_part_is_skipped_and_said_so_without_cuda(tmp_path, monkeypatch):
    monkeypatch.setattr(device, "_cuda", lambda: False)
    assert device.main(["--output", str(tmp_path), "--parts", "a+c"]) == 0
    table = (tmp_path / "table.txt").read_text()
    assert "part a+c skipped: it needs CUDA and torch sees none" in table
    assert json.loads((tmp_path / "device.json").read_text())["parts"] == {}


@pytest.mark.ray
def test_the_dry_run_runs_every_part_on_this_cpu_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
    rc = device.main(
        ["--dry-run", "--output", str(tmp_path / "out"), "--data-root", str(tmp_path / "data")]
    )
    out = tmp_path / "out"
    payload = json.loads((out / "device.json").read_text())
    assert rc == 0, payload["notes"]
    assert payload["dry_run"] and set(payload["parts"]) == {"a+c", "b", "t"}
    rows = {(r["part"], r["contender"]): r for r in payload["rows"]}
    assert {("a", "hetero-live"), ("a", "gpu-alone"), ("c", "hetero-ghost8")} <= set(rows)
    assert {("b", "hetero-live"), ("b", "stock"), ("b", "ideal")} <= set(rows)
    # Part t (issue 44) in a dry run: the simulator's estimate of fixed vs auto, no search run.
    assert ("t", "auto") in rows
    assert all(r["samples_per_s"] > 0 for r in rows.values())
    # gpu-alone ran the stand-in alone; part b pinned each worker to a core of its own.
    alone = [f for f in payload["parts"]["a+c"]["fits"] if f["contender"] == "gpu-alone"]
    assert alone and all(len(f["figures"]["slices"]) == 1 for f in alone)
    cores = payload["parts"]["b"]["cpu_sets"]
    assert set(cores) == {"big", "small"}
    if len(os.sched_getaffinity(0)) >= 2:
        assert sorted(len(v) for v in cores.values()) == [1, 1]
        assert not set(cores["big"]) & set(cores["small"])
    table = (out / "table.txt").read_text()
    assert "hetero-ghost8" in table and "gpu-alone" in table
