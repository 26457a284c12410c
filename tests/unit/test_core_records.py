"""core/records.py: the one aggregation of step records (job summary, Tune, benchmarks)."""

from __future__ import annotations

import dataclasses
import math
import statistics

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytrain_hetero.core.records import (
    StepRecord,
    as_step_record,
    median_finite,
    modal,
    nonfinite_steps_skipped,
    run_samples_per_s,
    summarize_workers,
)


def rec(
    step: int,
    rank: int,
    slice_: int,
    rate: float,
    *,
    plan: int = 1,
    wall: float = 0.5,
    worker: str | None = None,
    group: str = "g",
    weight: float | None = None,
) -> StepRecord:
    return StepRecord(
        step=step,
        epoch=0,
        rank=rank,
        worker=worker or f"w{rank}",
        device="cpu",
        slice=slice_,
        weight=slice_ / 60 if weight is None else weight,
        compute_s=0.1 * (rank + 1),
        load_s=0.01,
        busy_s=0.2,
        samples_per_s=rate,
        loss=1.0,
        global_samples_per_s=120.0,
        plan_version=plan,
        group=group,
        world_size=2,
        wall_s=wall,
        time=100.0 + step,
    )


def test_summary_per_worker_from_full_steps_of_the_last_plan() -> None:
    records = [
        rec(0, 0, 30, 50.0, plan=1),
        rec(0, 1, 30, 20.0, plan=1),
        rec(1, 0, 40, 100.0, plan=2),
        rec(1, 1, 20, 45.0, plan=2),
        rec(2, 0, 40, 102.0, plan=2),
        rec(2, 1, 20, math.nan, plan=2),
        rec(3, 0, 25, 98.0, plan=2),
        rec(3, 1, 12, 44.0, plan=2),  # a short epoch tail
    ]
    fast, slow = summarize_workers(records)
    assert (fast.rank, fast.worker, fast.slice) == (0, "w0", 40)
    assert fast.weight == pytest.approx(40 / 60)
    assert fast.samples_per_s == statistics.median([50.0, 100.0, 102.0, 98.0])
    assert fast.mean_slice == pytest.approx((30 + 40 + 40 + 25) / 4)
    assert fast.steps == 4 and fast.measured_steps == 4 and fast.last_step == 3
    assert slow.slice == 20 and slow.samples_per_s == 44.0 and slow.measured_steps == 3
    assert slow.compute_s == pytest.approx(0.2)


def test_run_samples_per_s_is_samples_over_slowest_walls() -> None:
    records = [
        rec(s, r, b, 1.0, wall=w) for s in range(3) for r, b, w in ((0, 40, 0.5), (1, 20, 0.25))
    ]
    assert run_samples_per_s(records) == pytest.approx(180 / 1.5)
    assert math.isnan(run_samples_per_s([]))


def test_a_step_a_restarted_group_repeats_counts_again() -> None:
    records = [rec(0, 0, 40, 1.0, group="a"), rec(0, 0, 40, 1.0, group="b")]
    assert run_samples_per_s(records) == pytest.approx(80 / 1.0)


def test_a_skipped_step_counts_once_per_group_whatever_its_ranks() -> None:
    def skipped(step: int, rank: int, group: str = "g") -> StepRecord:
        return dataclasses.replace(rec(step, rank, 30, 1.0, group=group), skipped_nonfinite=True)

    records = [skipped(3, 0), skipped(3, 1), rec(4, 0, 30, 1.0), skipped(3, 0, group="h")]
    assert nonfinite_steps_skipped(records) == 2
    assert nonfinite_steps_skipped([rec(1, 0, 30, 1.0)]) == 0
    assert StepRecord.from_dict(skipped(3, 0).to_dict()).skipped_nonfinite is True


def test_modal_ties_go_to_the_largest_and_empty_is_an_error() -> None:
    assert modal([43, 37, 43, 37]) == 43
    assert modal([5, 5, 9]) == 5
    with pytest.raises(ValueError):
        modal([])


def test_median_finite_skips_nan_and_none() -> None:
    assert median_finite([1.0, None, math.nan, 3.0, math.inf]) == 2.0
    assert math.isnan(median_finite([None, math.nan]))


def test_as_step_record_accepts_mappings() -> None:
    record = rec(0, 0, 10, 1.0)
    assert as_step_record(record) is record
    assert as_step_record({**record.to_dict(), "extra": 1}) == record


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),
            st.integers(1, 64),
            st.floats(0.1, 1e4, allow_nan=False),
            st.integers(1, 3),
        ),
        min_size=1,
        max_size=60,
    )
)
def test_summary_invariants(rows: list[tuple[int, int, float, int]]) -> None:
    records = [
        rec(step, rank, b, rate, plan=plan) for step, (rank, b, rate, plan) in enumerate(rows)
    ]
    summaries = summarize_workers(records)
    assert [s.rank for s in summaries] == sorted({r.rank for r in records})
    assert sum(s.steps for s in summaries) == len(records)
    for s in summaries:
        mine = [r for r in records if r.rank == s.rank]
        last = max(mine, key=lambda r: r.step)
        assert s.last_step == last.step
        # The slice is one this rank really ran under its latest plan.
        assert s.slice in {r.slice for r in mine if r.plan_version == last.plan_version}
        assert min(r.samples_per_s for r in mine) <= s.samples_per_s
        assert s.samples_per_s <= max(r.samples_per_s for r in mine)
        assert min(r.slice for r in mine) <= s.mean_slice <= max(r.slice for r in mine)
