"""``raytrain-hetero bench --config JOB.yaml``: stock Ray Train vs raytrain_hetero on a job.

The figures' rules by hand (no Ray), the refusals and bad input (exit 2, nothing written),
and one tiny real comparison in one Ray session.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from lean_job import lean_job

from raytrain_hetero.app.bench import FitFigures, summarize, training_rate
from raytrain_hetero.app.cli import main

REPO = Path(__file__).resolve().parents[2]


def test_training_rate_counts_each_epoch_from_first_start_to_last_end():
    spans = [
        # epoch 0: steps from 10.0 to 12.0 (2 s), 3 x 8 samples
        (0, 10.0, 10.5, 8),
        (0, 10.6, 11.5, 8),
        (0, 11.5, 12.0, 8),
        # epoch 1 starts after a 5 s validation, which is not training time: 1 s, 2 x 8
        (1, 17.0, 17.4, 8),
        (1, 17.5, 18.0, 8),
    ]
    assert training_rate(spans) == pytest.approx(40 / 3.0)
    assert math.isnan(training_rate([]))


def test_summary_takes_medians_and_divides_by_stock():
    def fit(contender, repeat, startup, rate, wall, accuracy):
        return FitFigures(contender, repeat, startup, rate, wall, accuracy, 10)

    fits = [
        fit("stock", 0, 4.0, 100.0, 30.0, 0.80),
        fit("stock", 1, 6.0, 120.0, 34.0, 0.82),
        fit("raytrain_hetero", 0, 5.0, 150.0, 20.0, 0.81),
        fit("raytrain_hetero", 1, 7.0, 170.0, 24.0, 0.83),
    ]
    rows = summarize(fits)
    assert rows["stock"]["samples_per_s"] == 110.0 and rows["stock"]["repeats"] == 2
    assert rows["stock"]["samples_per_s_vs_stock"] == 1.0
    hetero = rows["raytrain_hetero"]
    assert hetero["samples_per_s_vs_stock"] == pytest.approx(160 / 110)
    assert hetero["wall_s_vs_stock"] == pytest.approx(22 / 32)
    assert hetero["startup_s_vs_stock"] == pytest.approx(6 / 5)
    assert hetero["accuracy_vs_stock_pt"] == pytest.approx(1.0)


def _write(tmp_path: Path, job: dict) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


@pytest.mark.parametrize(
    ("config", "sets", "expected"),
    [
        (REPO / "examples/configs/conv_split_local.yaml", [], "parallel.mode is conv_split"),
        (
            REPO / "examples/configs/torchgeo_segmentation_local.yaml",
            [],
            "is a Lightning task",
        ),
        (None, ["--repeats", "0"], "--repeats is 0; it must be at least 1"),
    ],
)
def test_jobs_it_cannot_compare_and_bad_input_exit_2(
    tmp_path, monkeypatch, capsys, config, sets, expected
):
    monkeypatch.chdir(tmp_path)
    config = config or _write(tmp_path, lean_job())
    out = tmp_path / "out"
    assert main(["bench", "--config", str(config), "--output", str(out), *sets]) == 2
    err = capsys.readouterr().err
    assert err.startswith("raytrain-hetero: error: ") and expected in err
    assert len(err.strip().splitlines()) == 1
    assert "compares data-parallel" in err or "--repeats" in err
    assert not out.exists()


def test_an_existing_bench_json_is_kept_without_overwrite(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "bench.json").write_text("{}")
    assert main(["bench", _write(tmp_path, lean_job()).as_posix(), "--output", str(out)]) == 2
    assert "already holds a bench.json" in capsys.readouterr().err
    assert (out / "bench.json").read_text() == "{}"


@pytest.mark.ray
def test_tiny_comparison_prints_the_table_and_writes_only_bench_json(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    # Two workers, the second EMULATED 3x slower; probed plan (no fixed shares), static.
    job = lean_job(
        train={"epochs": 2, "global_batch_size": 20},
        workers=[
            {"name": "a", "resources": {"CPU": 1}},
            {"name": "b", "resources": {"CPU": 1}, "emulated_slowdown": 3},
        ],
        scheduler={"live": False},
    )
    del job["train"]["fixed_shares"]
    out = tmp_path / "out"
    assert main(["bench", "--config", str(_write(tmp_path, job)), "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "start-up s" in printed and "samples/s" in printed and "final acc" in printed
    assert [p.name for p in out.iterdir()] == ["bench.json"]
    result = json.loads((out / "bench.json").read_text())
    assert [f["contender"] for f in result["fits"]] == ["raytrain_hetero", "stock"]
    assert result["stock_batch_per_worker"] == 10
    train = result["train_samples"]
    for f in result["fits"]:
        name = f["contender"]
        assert 0 < f["startup_s"] < f["wall_s"], f
        assert math.isfinite(f["samples_per_s"]) and f["samples_per_s"] > 0, f
        assert 0.0 <= f["final_accuracy"] <= 1.0, f
        # Stock: ceil(train / 2 ranks / 10) steps an epoch (DistributedSampler pads); ours:
        # ceil(train / 20) (the last step of an epoch may be short).
        per_epoch = math.ceil(math.ceil(train / 2) / 10) if name == "stock" else -(-train // 20)
        assert f["steps"] == 2 * per_epoch, f
        # The training steps took no longer than the fit after its start-up.
        samples = 2 * (train if name == "raytrain_hetero" else 2 * math.ceil(train / 2))
        trained = samples / f["samples_per_s"]
        assert trained <= f["wall_s"] - f["startup_s"] + 0.5, f
        assert f"{name} fit 0: start-up" in printed
    rows = result["summary"]
    assert rows["stock"]["samples_per_s_vs_stock"] == 1.0
    hetero = rows["raytrain_hetero"]
    assert hetero["samples_per_s_vs_stock"] == pytest.approx(
        hetero["samples_per_s"] / rows["stock"]["samples_per_s"]
    )
    assert f"{hetero['samples_per_s_vs_stock']:.2f}" in printed
