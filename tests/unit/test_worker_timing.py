"""The one slowdown emulator, the slowdown schedule and the step timing (no Ray)."""

from __future__ import annotations

import time

import pytest
import torch
from cpu_time import burn

from raytrain_hetero.config import SlowdownInjection
from raytrain_hetero.worker.measure.clock import ComputeClock
from raytrain_hetero.worker.measure.emulation import (
    SlowdownEmulator,
    SlowdownSchedule,
    slowdown_factor,
)
from raytrain_hetero.worker.measure.timing import StepInfo, StepTiming
from raytrain_hetero.worker.sync.ddp import batchnorm_binding


def test_emulator_sleeps_k_minus_one_times_the_compute_and_returns_k_times(one_thread):
    emulator = SlowdownEmulator(ComputeClock("cpu"))
    emulator.mark()
    burn(0.2)
    before = time.perf_counter()
    stretched = emulator.stretch(3.0)
    slept = time.perf_counter() - before
    assert 0.55 <= stretched <= 0.9  # 3 x ~0.2 s of own compute
    assert slept >= 0.95 * (stretched * 2 / 3)
    assert slept <= stretched * 2 / 3 + 0.3


def test_emulator_excludes_waits_and_can_account_without_sleeping(one_thread):
    emulator = SlowdownEmulator(ComputeClock("cpu"))
    emulator.mark()
    time.sleep(0.3)  # a wait (e.g. a collective) is not compute
    assert emulator.stretch(4.0) < 0.05
    emulator.mark()
    burn(0.1)
    before = time.perf_counter()
    stretched = emulator.stretch(4.0, sleep=False)
    assert time.perf_counter() - before < 0.05
    assert stretched >= 0.38


class ScriptedClock(ComputeClock):
    """A compute clock read from a script of readings (the emulator's clock is injected)."""

    def __init__(self) -> None:
        super().__init__("cpu")
        self.reading = 0.0

    def now(self) -> float:
        return self.reading


class OvershootingSleep:
    """Sleeps like Linux's ``time.sleep``: every call takes a fixed overshoot more than asked.
    Time is a wall clock of its own (the emulator's wall clock is injected), so the figures
    below are exact whatever the machine's load."""

    def __init__(self, overshoot_s: float) -> None:
        self.overshoot_s = overshoot_s
        self.wall_s = 0.0
        self.calls: list[float] = []

    def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)
        self.wall_s += seconds + self.overshoot_s

    def now(self) -> float:
        return self.wall_s


@pytest.mark.parametrize("factor", [2.0, 4.0])
def test_sub_millisecond_intervals_are_stretched_k_times_not_by_the_sleep_quantum(factor):
    # 400 intervals of 20 us: each interval's own stretch is far below what one sleep costs.
    clock, sleep = ScriptedClock(), OvershootingSleep(overshoot_s=60e-6)
    emulator = SlowdownEmulator(clock, min_sleep_s=0.5e-3, sleep=sleep, wall=sleep.now)
    emulator.mark()
    accounted = 0.0
    for _ in range(400):
        clock.reading += 20e-6
        accounted += emulator.stretch(factor)
    owed = 400 * 20e-6 * (factor - 1.0)
    assert accounted == pytest.approx(400 * 20e-6 * factor)
    # No sleep shorter than the quantum less one overshoot (paid back from the next one).
    assert sleep.calls and min(sleep.calls) >= 0.5e-3 - 60e-6
    # Slept (overshoots included) plus still owed is exactly the stretch owed.
    assert sleep.wall_s + emulator.owed_s == pytest.approx(owed)
    # What is still owed (or overslept) is under one quantum: never more than that behind.
    assert -60e-6 <= emulator.owed_s < 0.5e-3


def test_an_unslowed_worker_never_sleeps():
    clock, sleep = ScriptedClock(), OvershootingSleep(overshoot_s=0.0)
    emulator = SlowdownEmulator(clock, sleep=sleep, wall=sleep.now)
    emulator.mark()
    for _ in range(100):
        clock.reading += 1e-3
        assert emulator.stretch(1.0) == pytest.approx(1e-3)
    assert sleep.calls == [] and emulator.owed_s == 0.0


def test_slowdown_factor_multiplies_every_injection_that_applies():
    injections = [
        SlowdownInjection(factor=3.0, rank=0, from_step=5),
        SlowdownInjection(factor=2.0, worker="slow"),
    ]
    assert slowdown_factor(1.0, injections, worker="fast", rank=0, step=4) == 1.0
    assert slowdown_factor(2.0, injections, worker="fast", rank=0, step=5) == 6.0
    assert slowdown_factor(4.0, injections, worker="slow", rank=2, step=0) == 8.0
    # Outside training steps (-1) only the base factor applies to step-bound injections.
    assert slowdown_factor(1.0, injections[:1], worker="x", rank=0, step=-1) == 1.0


def test_schedule_live_injections_replace_each_other_and_add_to_planned():
    schedule = SlowdownSchedule(
        2.0, worker="a", rank=1, planned=[SlowdownInjection(factor=1.5, rank=1, from_step=10)]
    )
    assert schedule.factor_at(9) == 2.0
    assert schedule.factor_at(10) == 3.0
    schedule.set_live([SlowdownInjection(factor=2.0, worker="a", from_step=3)])
    assert schedule.factor_at(3) == 4.0
    assert schedule.factor_at(10) == 6.0
    schedule.set_live([])
    assert schedule.factor_at(10) == 3.0


def _step(global_step: int = 0) -> StepInfo:
    return StepInfo(global_step, 0, global_step, (3, 1), rank=0, plan_version=1)


def test_step_info_weights():
    step = _step()
    assert step.local_count == 3 and step.global_count == 4
    assert step.weight("proportional") == pytest.approx(0.75)
    assert step.weight("uniform") == pytest.approx(0.5)


def test_step_timing_accounts_compute_up_to_the_last_exchange_stretched(one_thread):
    factors = {0: 2.0}
    timing = StepTiming(ComputeClock("cpu"), lambda step: factors.get(step, 1.0))
    assert timing.current is None and timing.slowdown() == 1.0
    timing.before_collective()  # between steps: nothing happens
    timing.begin(_step(0))
    assert timing.current == _step(0) and timing.slowdown() == 2.0
    burn(0.1)
    timing.before_collective()  # stretched: sleeps ~0.1 s more
    time.sleep(0.2)  # the collective's wait
    timing.after_collective()
    burn(0.05)
    timing.before_collective()
    times = timing.end()
    assert timing.current is None
    assert 0.28 <= times.compute_s <= 0.45  # 2 x ~0.15 s
    # Busy (wall clock, so co-located load may lengthen it): own compute plus the stretch,
    # without the 0.2 s wait.
    assert times.busy_s >= 0.24
    assert times.wall_s >= times.busy_s + 0.19


def test_optional_exchanges_are_accounted_on_cpu(one_thread):
    timing = StepTiming(ComputeClock("cpu"), lambda step: 1.0)
    timing.begin(_step(3))
    burn(0.05)
    timing.before_collective(optional=True)
    assert timing.end().compute_s >= 0.04
    timing.begin(_step(4))
    timing.abandon()
    assert timing.current is None


class _CudaReportingClock(ComputeClock):
    """The clock of a CUDA rank (its device type drives the accounting rules), reading wall
    time: this machine has no GPU to synchronise."""

    def __init__(self) -> None:
        super().__init__("cpu")
        self.device = torch.device("cuda")

    def now(self) -> float:
        return time.perf_counter()


def _batchnorm_wait(device_async: bool) -> float:
    """Busy seconds of a CUDA rank's step that waits 0.2 s in one BatchNorm exchange."""
    timing = StepTiming(_CudaReportingClock(), lambda step: 1.0)
    binding = batchnorm_binding(timing, "proportional", device_async=device_async)
    timing.begin(_step(0))
    binding.before_exchange()
    time.sleep(0.2)  # waiting for a slower rank to reach the same layer
    binding.after_exchange()
    timing.before_collective()  # the gradient exchange ends the accounted part
    return timing.end().busy_s


def test_a_cuda_rank_on_gloo_does_not_count_batchnorm_waits_as_its_work():
    # A GPU rank among CPU ranks (gloo) measured the slowest rank's forward as its own and
    # was planned as slow as a CPU worker (seen on an H200 with three 4-core CPU workers).
    assert _batchnorm_wait(device_async=False) < 0.1


def test_a_cuda_rank_on_nccl_leaves_batchnorm_exchanges_unsynchronised():
    # On NCCL the exchange is queued on the stream: accounting it would synchronise the
    # device at every layer, so it is skipped (the documented trade-off).
    assert _batchnorm_wait(device_async=True) >= 0.19


def test_compute_clock_with_several_threads_reads_wall_time():
    # Summed CPU time of 4 intra-op threads would count each second four times (a 4-core CPU
    # worker then looked 4x slower than it was beside a GPU worker).
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        clock = ComputeClock("cpu")
        start = clock.now()
        time.sleep(0.1)
        assert clock.now() - start >= 0.09
    finally:
        torch.set_num_threads(previous)


def test_node_slowdown_is_the_factor_of_the_node_label_and_multiplies_across_keys():
    from raytrain_hetero.config import EmulationConfig
    from raytrain_hetero.worker.measure.emulation import node_slowdown

    factors = EmulationConfig(
        node_slowdowns={"speed": {"fast": 2, "slow": 6}, "rack": {"far": 1.5}}
    ).node_slowdowns
    assert node_slowdown(factors, {"speed": "slow"}) == 6.0
    assert node_slowdown(factors, {"speed": "fast", "rack": "far"}) == 3.0
    # No label, or a value without a factor: not slowed.
    assert node_slowdown(factors, {}) == 1.0
    assert node_slowdown(factors, {"speed": "medium", "rack": "near"}) == 1.0


def test_node_slowdowns_below_one_are_refused():
    from raytrain_hetero.config import EmulationConfig
    from raytrain_hetero.errors import ConfigError

    with pytest.raises(ConfigError):
        EmulationConfig(node_slowdowns={"speed": {"fast": 0.5}})
