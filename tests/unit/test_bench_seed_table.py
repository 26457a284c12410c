"""``benchmarks.seed_table``: every repeat against its own stock fit, and the worst seed."""

from __future__ import annotations

import json

import pytest

from benchmarks.seed_table import seed_rows, seed_table


def fit(contender, repeat, *, samples, tta, startup, accuracy):
    return {
        "contender": contender,
        "repeat": repeat,
        "seed": 10 + repeat,
        "counted": True,
        "figures": {
            "samples_per_s": samples,
            "tta_s": tta,
            "startup_s": startup,
            "tta_total_s": tta + startup,
            "final_accuracy": accuracy,
        },
    }


RESULT = {
    "scenario": "hetero2",
    "workers": [{"emulated_slowdown": 1}, {"emulated_slowdown": 3}],  # ideal speed-up 2x
    "fits": [
        {**fit("stock", -1, samples=1, tta=1, startup=1, accuracy=0), "counted": False},
        fit("stock", 0, samples=100, tta=20, startup=4, accuracy=0.990),
        fit("ghost", 0, samples=180, tta=10, startup=4, accuracy=0.985),
        fit("stock", 1, samples=200, tta=10, startup=2, accuracy=0.980),
        fit("ghost", 1, samples=300, tta=8, startup=4, accuracy=0.990),
    ],
}


def test_each_repeat_is_measured_against_its_own_stock_fit():
    first, second = seed_rows(RESULT)
    assert first["seed"] == 10 and second["seed"] == 11
    assert first["samples_x_stock"] == pytest.approx(1.8)
    assert first["clock_x_stock"] == pytest.approx(24 / 14)
    # Ideal clock of repeat 0: (20 + 4) / (20 / 2 + 4) = 24 / 14, which ghost reached.
    assert first["of_ideal_clock"] == pytest.approx(1.0)
    assert first["accuracy_pt"] == pytest.approx(-0.5)
    assert second["samples_x_stock"] == pytest.approx(1.5)
    assert second["of_ideal_clock"] == pytest.approx((12 / 12) / (12 / 7))
    assert second["accuracy_pt"] == pytest.approx(1.0)


def test_the_table_names_the_worst_seed(tmp_path):
    (tmp_path / "bench.json").write_text(json.dumps(RESULT))
    text = seed_table(tmp_path)
    assert "| ghost | 10 | 1.80 | 1.71 | 1.00 | 0.985 | -0.5 |" in text
    # Worst seed: the lowest share of the ideal clock, the largest accuracy gap either way.
    assert text.rstrip().endswith("| ghost | 0.58 | +1.0 |")
