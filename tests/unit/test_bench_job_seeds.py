"""``benchmarks.job_seeds``: a YAML job per BatchNorm mode and seed, against stock and exact."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from benchmarks.job_seeds import job_fits, job_table


def write_bench(root, seed, accuracy):
    """``raytrain-hetero bench``'s file: its summary holds the stock fit."""
    path = root / f"s{seed}-bench"
    path.mkdir()
    stock = {"final_accuracy": accuracy, "samples_per_s": 400.0 + seed, "wall_s": 20.0}
    (path / "bench.json").write_text(json.dumps({"summary": {"stock": stock}}))


def write_train(root, seed, mode, accuracy, samples_per_s=500.0):
    """``raytrain-hetero train``'s summary.json (the fields the table reads, and others)."""
    path = root / f"s{seed}-{mode}"
    path.mkdir()
    summary = {
        "final_val_accuracy": accuracy,
        "samples_per_s": samples_per_s,
        "wall_time_s": 30.0 + seed,
        "epochs": 4,
    }
    (path / "summary.json").write_text(json.dumps(summary))


@pytest.fixture
def job(tmp_path):
    root = tmp_path / "eurosat"
    root.mkdir()
    for seed, (stock, exact, ghost) in enumerate([(0.90, 0.91, 0.92), (0.95, 0.93, 0.90)]):
        write_bench(root, seed, stock)
        write_train(root, seed, "exact", exact)
        write_train(root, seed, "ghost32", ghost, samples_per_s=600.0 + 100 * seed)
    (root / "notes.txt").write_text("not a fit")  # other files are ignored
    return root


def test_reads_every_fit_with_its_mode_and_seed(job):
    fits = {(f.mode, f.seed): f for f in job_fits(job)}
    assert sorted(fits) == [(m, s) for m in ("exact", "ghost32", "stock") for s in (0, 1)]
    assert fits[("stock", 1)].final_accuracy == 0.95 and fits[("stock", 1)].samples_per_s == 401
    assert fits[("ghost32", 1)].wall_s == 31.0


def test_the_table_gives_points_against_stock_and_exact_per_seed_and_the_worst(job):
    text = job_table(job)
    rows = {}  # the first row of each mode: the main table (the worst-gap table follows)
    for line in text.splitlines():
        rows.setdefault(line.split(" | ")[0].lstrip("| "), line)
    assert "| stock | 0.900 / 0.950 |  |  | 400 | 20.0 |" in text
    assert rows["exact"].startswith("| exact | 0.910 / 0.930 | +1.0 / -2.0 |  |")
    assert rows["ghost32"].startswith("| ghost32 | 0.920 / 0.900 | +2.0 / -5.0 | +1.0 / -3.0 |")
    assert "| 650 | 30.5 |" in rows["ghost32"]  # medians over the seeds
    assert text.rstrip().endswith("| ghost32 | -3.0 |")  # the largest gap keeps its sign


def test_a_job_without_stock_fits_still_compares_with_exact(tmp_path):
    for seed, (exact, ghost) in enumerate([(0.8, 0.85), (0.9, 0.88)]):
        write_train(tmp_path, seed, "exact", exact)
        write_train(tmp_path, seed, "ghost4", ghost)
    text = job_table(tmp_path)
    assert "| stock |" not in text
    assert "| ghost4 | 0.850 / 0.880 |  | +5.0 / -2.0 |" in text  # no stock column at all


def test_a_directory_without_fits_is_named_with_what_to_pass(tmp_path):
    with pytest.raises(FileNotFoundError, match="no s<seed>-bench/bench.json"):
        job_fits(tmp_path)
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.job_seeds", str(tmp_path / "absent")],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 2 and "not a directory" in run.stderr
