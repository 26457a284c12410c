"""The benchmark's epoch-start figure: each epoch's first step over the median step."""

from __future__ import annotations

import math

import pytest

from benchmarks.epoch_start import epoch_start_figures, epoch_start_lines


def _steps(gaps, steps_per_epoch, *, rank=0, pid="1", evals=()):
    """Rank ``rank``'s step records with the given gaps (the first step at t=10)."""
    records, t = [], 10.0
    for step, gap in enumerate([0.0, *gaps]):
        t += gap
        record = {"step": step, "epoch": step // steps_per_epoch, "rank": rank, "pid": pid,
                  "time": t, "world": 2, "slice": 4}  # fmt: skip
        if step in evals:
            record.update(eval_start=t, eval_end=t + 5.0)
            t += 5.0
        records.append(record)
    return records


def test_a_slow_epoch_start_is_its_gap_over_the_median_step():
    # Four steps per epoch: steps 4 and 8 start epochs 1 and 2, the second one waits 3x.
    records = _steps([1.0, 1.0, 1.0, 1.2, 1.0, 1.0, 1.0, 3.0, 1.0], 4)
    records += _steps([7.0] * 9, 4, rank=1)  # other ranks do not count
    figures = epoch_start_figures(records)
    assert figures["epoch_start_ratios"] == pytest.approx([1.2, 3.0])
    assert figures["epoch_start_ratio"] == pytest.approx(3.0)
    assert figures["median_step_s"] == pytest.approx(1.0)


def test_evaluation_before_an_epoch_start_is_not_the_steps():
    records = _steps([1.0, 1.0, 1.0, 1.0, 1.0], 4, evals=(3,))
    assert epoch_start_figures(records)["epoch_start_ratio"] == pytest.approx(1.0)


def test_no_epoch_start_after_the_first_step_gives_nan_and_no_line():
    figures = epoch_start_figures(_steps([1.0, 1.0], 4))
    assert math.isnan(figures["epoch_start_ratio"])
    fit = {"contender": "hetero", "counted": True, "figures": figures}
    assert epoch_start_lines({"summary": {"contenders": {"hetero": {}}}, "fits": [fit]}) == []


def test_the_table_line_takes_the_worst_counted_fit_against_the_target():
    fits = [
        {"contender": "hetero", "counted": True, "figures": {"epoch_start_ratio": 1.1}},
        {"contender": "hetero", "counted": True, "figures": {"epoch_start_ratio": 1.5}},
        {"contender": "hetero", "counted": False, "figures": {"epoch_start_ratio": 9.0}},
        {"contender": "stock", "counted": True, "figures": {"epoch_start_ratio": 1.2}},
    ]
    result = {"summary": {"contenders": {"stock": {}, "hetero": {}}}, "fits": fits}
    lines = epoch_start_lines(result)
    assert "1.20x [goal <= 1.3: met]" in lines[1] and lines[1].strip().startswith("stock")
    assert "1.50x [goal <= 1.3: NOT met]" in lines[2]
