"""The one probe timer (worker.timing.ProbeTimer): warm-up, interleaved repeats, the clock,
the EMULATION stretch and the setup rule (no Ray)."""

from __future__ import annotations

import time

import pytest
from cpu_time import burn

from raytrain_hetero.errors import ProbeError
from raytrain_hetero.worker.measure.clock import ComputeClock, WallClock
from raytrain_hetero.worker.measure.timing import ProbeTimer, ProbeTimings


def test_warm_up_then_interleaved_rounds_with_cleanup_after_every_call():
    calls: list[str] = []
    timer = ProbeTimer(WallClock("cpu"))
    a, b = (lambda: calls.append("a")), (lambda: calls.append("b"))
    timings = timer.run([a, b], repeats=3, warmup=2, cleanup=lambda: calls.append("-"))
    assert calls == ["a", "-", "a", "-", "b", "-", "b", "-"] + ["a", "-", "b", "-"] * 3
    assert [len(t.seconds) for t in timings] == [3, 3]

    calls.clear()
    timer.run([a, b], repeats=1, warmup=2, warm=[b])  # only the chosen call warms up
    assert calls == ["b", "b", "a", "b"]


def test_compute_clock_counts_own_work_stretched_and_not_waits(one_thread):
    timer = ProbeTimer(ComputeClock("cpu"), slowdown=3.0)
    (work, wait) = timer.run(
        [lambda: burn(0.05, size=100), lambda: time.sleep(0.1)], repeats=2, warmup=0
    )
    assert 0.12 <= work.best <= 0.3  # 3 x ~0.05 s of own compute
    assert wait.best < 0.01  # sleeping is no compute


def test_setup_is_dropped_or_counted_unstretched_and_cleanup_is_not_timed():
    def call(timer: ProbeTimer) -> None:
        time.sleep(0.1)  # setup: e.g. reading a batch, or a barrier
        timer.setup_done()
        time.sleep(0.05)

    dropped = ProbeTimer(WallClock("cpu"), slowdown=2.0)
    (only_compute,) = dropped.run(
        [lambda: call(dropped)], repeats=1, warmup=0, cleanup=lambda: time.sleep(0.2)
    )
    assert 0.09 <= only_compute.best < 0.2  # 2 x 0.05; neither setup nor cleanup
    counted = ProbeTimer(WallClock("cpu"), slowdown=2.0, count_setup=True)
    (with_setup,) = counted.run([lambda: call(counted)], repeats=1, warmup=0)
    assert 0.19 <= with_setup.best < 0.3  # 0.1 unstretched + 2 x 0.05


def test_timings_summaries_and_bad_arguments():
    timings = ProbeTimings((0.3, 0.1, 0.2, 5.0))
    assert timings.best == 0.1
    assert timings.median == 0.25
    with pytest.raises(ProbeError, match="repeats >= 1"):
        ProbeTimer(WallClock("cpu")).run([lambda: None], repeats=0)
    with pytest.raises(ProbeError, match="warmup >= 0"):
        ProbeTimer(WallClock("cpu")).run([lambda: None], repeats=1, warmup=-1)
    with pytest.raises(ProbeError, match="slowdown factor must be > 0"):
        ProbeTimer(WallClock("cpu"), slowdown=0.0)
