"""Tests for raytrain_hetero.app.outputs: CSV, summary JSON, throughput plot, worker table."""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import math
import sys
from pathlib import Path

import matplotlib.image
import pytest

from raytrain_hetero.app.outputs import (
    METRICS_COLUMNS,
    format_worker_table,
    plot_worker_throughput,
    read_metrics_csv,
    write_metrics_csv,
    write_summary,
)
from raytrain_hetero.core.records import StepRecord

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
WORKERS = (("fast", 400.0), ("medium", 200.0), ("slow", 100.0))


def make_records(steps: int = 30) -> list[dict]:
    """Complete step records as dicts (``StepRecord.to_dict()`` of :func:`make_step_records`)."""
    return [r.to_dict() for r in make_step_records(steps)]


def make_step_records(steps: int = 30) -> list[StepRecord]:
    records = []
    for step in range(steps):
        plan = 0 if step < 5 else (1 if step < 20 else 2)
        for rank, (worker, speed) in enumerate(WORKERS):
            slc = 64 if plan == 0 else int(192 * speed / 700) + plan
            records.append(
                StepRecord(
                    step=step,
                    epoch=step // 10,
                    rank=rank,
                    worker=worker,
                    device="cpu",
                    slice=slc,
                    weight=slc / 192,
                    compute_s=slc / speed,
                    load_s=0.001 * rank,
                    busy_s=slc / speed + 0.001 * rank,
                    samples_per_s=speed * (1 + 0.01 * (step % 3)) + 1 / 3,
                    loss=2.0 / (1 + step),
                    global_samples_per_s=700.0 + step / 7,
                    plan_version=plan,
                    group="g0",
                    world_size=len(WORKERS),
                    wall_s=0.3 + step / 100,
                    time=1.7e9 + step / 3,
                )
            )
    return records


def no_temp_files(directory: Path) -> bool:
    return not [p for p in directory.iterdir() if p.name.startswith(".") or p.suffix == ".tmp"]


# ------------------------------------------------------------------------------ CSV


def test_csv_round_trip(tmp_path: Path) -> None:
    records = make_records()
    path = write_metrics_csv(records, tmp_path / "out" / "metrics.csv")
    assert path == tmp_path / "out" / "metrics.csv"
    with open(path, newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        rows = list(reader)
    assert tuple(header) == METRICS_COLUMNS
    assert header == [
        "step", "epoch", "rank", "worker", "device", "slice", "weight", "compute_s",
        "load_s", "busy_s", "samples_per_s", "loss", "global_samples_per_s", "plan_version",
        "group", "world_size", "wall_s", "time", "skipped_nonfinite", "overhead_s",
    ]  # fmt: skip
    assert header == [f.name for f in dataclasses.fields(StepRecord)]  # one schema
    assert len(rows) == len(records)
    back = read_metrics_csv(path)
    assert back == records  # exact: ints stay ints, floats round-trip bit for bit
    assert no_temp_files(path.parent)


def test_csv_takes_step_records_and_reads_back_into_them(tmp_path: Path) -> None:
    records = make_step_records(4)
    path = write_metrics_csv(records, tmp_path / "typed.csv")
    assert [StepRecord.from_dict(row) for row in read_metrics_csv(path)] == records


def test_csv_ignores_extra_keys_and_blanks_missing(tmp_path: Path) -> None:
    rec = {**make_records(1)[0], "extra": "x"}
    del rec["loss"]
    path = write_metrics_csv([rec], tmp_path / "m.csv")
    text = path.read_text().splitlines()
    assert text[0] == ",".join(METRICS_COLUMNS)
    assert "extra" not in text[0] and "x" not in text[1].split(",")
    assert read_metrics_csv(path)[0]["loss"] is None


def test_csv_accepts_generator_and_empty(tmp_path: Path) -> None:
    path = write_metrics_csv((r for r in make_records(2)), tmp_path / "g.csv")
    assert len(read_metrics_csv(path)) == 6
    empty = write_metrics_csv([], tmp_path / "e.csv")
    assert empty.read_text() == ",".join(METRICS_COLUMNS) + "\n"


def test_csv_overwrite_is_atomic(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    write_metrics_csv(make_records(3), path)

    def broken():
        yield make_records(1)[0]
        raise RuntimeError("producer died")

    with pytest.raises(RuntimeError):
        write_metrics_csv(broken(), path)
    assert len(read_metrics_csv(path)) == 9  # the old file is intact
    assert no_temp_files(tmp_path)


def test_csv_failure_mid_write_removes_temp_file(tmp_path: Path) -> None:
    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("cannot format")

    path = tmp_path / "m.csv"
    write_metrics_csv(make_records(2), path)
    bad = [*make_records(2), {**make_records(1)[0], "loss": Unprintable()}]
    with pytest.raises(RuntimeError, match="cannot format"):
        write_metrics_csv(bad, path)
    assert len(read_metrics_csv(path)) == 6
    assert [p.name for p in tmp_path.iterdir()] == ["m.csv"]


# ------------------------------------------------------------------------------ summary


def test_summary_json_replaces_nonfinite(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    summary = {
        "z_last": 1,
        "accuracy": 0.875,
        "loss": float("nan"),
        "nested": {"best": float("inf"), "ok": [1.5, float("-inf")]},
        "output_dir": tmp_path,
        "name": "run",
    }
    with caplog.at_level(logging.WARNING, logger="raytrain_hetero.app.outputs"):
        path = write_summary(summary, tmp_path / "s" / "summary.json")
    text = path.read_text()
    data = json.loads(text)
    assert data == {
        "accuracy": 0.875,
        "loss": None,
        "name": "run",
        "nested": {"best": None, "ok": [1.5, None]},
        "output_dir": str(tmp_path),
        "z_last": 1,
    }
    assert list(data) == sorted(data)  # sorted keys
    assert '\n  "accuracy": 0.875' in text  # indent 2
    assert "NaN" not in text and "Infinity" not in text
    assert "loss" in caplog.text and "nested.best" in caplog.text and "nested.ok[1]" in caplog.text
    assert no_temp_files(path.parent)


def test_summary_all_finite_no_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="raytrain_hetero.app.outputs"):
        write_summary({"a": 1.0, "b": [1, 2]}, tmp_path / "s.json")
    assert not caplog.records


def test_summary_not_serialisable_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(TypeError):
        write_summary({"a": object()}, tmp_path / "s.json")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------------ plot


def test_plot_is_valid_png(tmp_path: Path) -> None:
    path = plot_worker_throughput(make_records(), tmp_path / "plots" / "tp.png", title="demo")
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert len(data) > 20_000  # two panels, three workers: far more than an empty image
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 500
    assert image.shape[2] in (3, 4)
    assert image.std() > 0.01  # something was drawn
    assert no_temp_files(path.parent)


def test_plot_does_not_touch_pyplot_backend(tmp_path: Path) -> None:
    before = sys.modules.get("matplotlib.pyplot")
    plot_worker_throughput(make_records(5), tmp_path / "p.png")
    assert sys.modules.get("matplotlib.pyplot") is before


def test_plot_tolerates_empty_and_missing(tmp_path: Path) -> None:
    path = plot_worker_throughput([], tmp_path / "empty.png")
    assert path.read_bytes()[:8] == PNG_MAGIC
    records = make_records(4)
    records[0]["samples_per_s"] = None
    del records[1]["plan_version"]
    records[2]["loss"] = math.nan
    assert plot_worker_throughput(records, tmp_path / "holes.png").read_bytes()[:8] == PNG_MAGIC


# ------------------------------------------------------------------------------ table


def test_table_contents_and_alignment() -> None:
    rows = [
        {"rank": 0, "worker": "fast", "device": "cuda", "samples_per_s": 1234.56, "slice": 120,
         "weight": 0.625},
        {"rank": 1, "worker": "medium", "device": "cpu", "samples_per_s": 400.0, "slice": 48,
         "weight": 0.25},
        {"rank": 2, "worker": "a-much-longer-name", "device": "cpu", "samples_per_s": 99.94,
         "slice": 24, "weight": 0.125},
    ]  # fmt: skip
    table = format_worker_table(rows)
    lines = table.splitlines()
    assert len(lines) == 2 + len(rows)
    header = lines[0]
    for col in ("rank", "worker", "device", "samples/s", "slice", "weight"):
        assert col in header
    for row in rows:
        assert row["worker"] in table
    assert "0.625" in lines[2] and "0.250" in lines[3] and "0.125" in lines[4]
    assert "1234.6" in lines[2]
    # every column's rule is as wide as the column: each row's text lines up under it
    rule = lines[1]
    assert set(rule) <= {"-", " "}
    starts = [i for i, ch in enumerate(rule) if ch == "-" and (i == 0 or rule[i - 1] == " ")]
    assert [header.index(c) for c in ("rank", "worker", "device")] == [
        0,
        starts[1],
        starts[2],
    ]
    ends = [
        i + 1
        for i, ch in enumerate(rule)
        if ch == "-" and (i + 1 == len(rule) or rule[i + 1] == " ")
    ]
    for line in lines[2:]:
        # right-aligned numeric columns end exactly where their rule ends
        assert line[ends[3] - 1] != " " and line[ends[4] - 1] != " "
        assert len(line) == ends[5]
    assert all(line.index(row["worker"]) == starts[1] for line, row in zip(lines[2:], rows))


def test_table_missing_values_print_dash() -> None:
    table = format_worker_table(
        [{"rank": 3, "worker": "w"}, {"worker": "x", "samples_per_s": float("nan"), "weight": None}]
    )
    lines = table.splitlines()
    assert lines[2].split() == ["3", "w", "-", "-", "-", "-"]
    assert lines[3].split() == ["-", "x", "-", "-", "-", "-"]


def test_table_empty() -> None:
    lines = format_worker_table([]).splitlines()
    assert len(lines) == 2
    assert lines[0].split() == ["rank", "worker", "device", "samples/s", "slice", "weight"]


def test_report_module_imports_neither_ray_nor_torch() -> None:
    import ast

    import raytrain_hetero.app.outputs as report

    tree = ast.parse(Path(report.__file__).read_text())
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module.split(".")[0])
    assert not imported & {"ray", "torch", "numpy"}
    assert "matplotlib" in imported
