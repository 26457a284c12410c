"""The step in progress and its timing accounting, on the compute clock (:mod:`.clock`).

:class:`StepTiming` owns the step in progress (begun by the
loader, stretched under EMULATION around each exchange). :class:`ProbeTimer` is the one timer
of every probe (step costs, the gradient all-reduce, conv kernels, branches);
:func:`loader_bound_s` prices a step's loading beside its compute.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from raytrain_hetero.core.weighting import gradient_scale
from raytrain_hetero.errors import ProbeError
from raytrain_hetero.worker.measure.clock import ComputeClock
from raytrain_hetero.worker.measure.emulation import SlowdownEmulator

__all__ = [
    "ProbeTimer",
    "ProbeTimings",
    "StepInfo",
    "StepTimes",
    "StepTiming",
    "loader_bound_s",
]


@dataclass(frozen=True)
class StepInfo:
    """What this rank knows about the step it is running.

    Attributes:
        global_step: Optimizer steps since the run began (-1 for calibration steps).
        epoch: Epoch of the step.
        step_in_epoch: Index within the epoch.
        counts: Samples per rank this step (identical on every rank).
        plan_version: Version of the plan that carved the step.
    """

    global_step: int
    epoch: int
    step_in_epoch: int
    counts: tuple[int, ...]
    rank: int
    plan_version: int

    @property
    def local_count(self) -> int:
        """Samples this rank processes."""
        return self.counts[self.rank]

    @property
    def global_count(self) -> int:
        """Samples all ranks process together."""
        return sum(self.counts)

    def weight(self, weighting: str) -> float:
        """This rank's gradient weight in the step (n_r/N, or 1/world for "uniform")."""
        return gradient_scale(self.local_count, self.global_count, len(self.counts), weighting)


@dataclass(frozen=True)
class StepTimes:
    """Accounting of one finished step.

    Attributes:
        compute_s: Seconds of own compute up to the last exchange (stretched under EMULATION).
        busy_s: Wall seconds busy up to the last exchange, collective waits excluded.
        wall_s: Wall seconds since the step began.
    """

    compute_s: float
    busy_s: float
    wall_s: float


class StepTiming:
    """The step in progress and the accounting of its compute (one per worker process).

    Args:
        clock: This worker's compute clock.
        slowdown: EMULATION factor at a global step (1.0 = none).
    """

    def __init__(self, clock: ComputeClock, slowdown: Callable[[int], float]) -> None:
        self.clock = clock
        self._slowdown = slowdown
        self._emulator = SlowdownEmulator(clock)
        self._current: StepInfo | None = None
        self._compute_s = 0.0
        self._busy_s = 0.0
        self._busy_mark = 0.0
        self._wall_start = 0.0

    @property
    def current(self) -> StepInfo | None:
        """The step in progress, or None between steps."""
        return self._current

    def slowdown(self) -> float:
        """EMULATION factor now (at the step in progress, or -1 between steps)."""
        step = self._current.global_step if self._current is not None else -1
        return self._slowdown(step)

    def begin(self, step: StepInfo) -> None:
        """Start ``step``: accounting is zeroed and its compute starts now."""
        self._current = step
        self._compute_s = 0.0
        self._busy_s = 0.0
        self._wall_start = self._busy_mark = time.perf_counter()
        self._emulator.mark()

    def before_collective(self, *, optional: bool = False) -> None:
        """Account this worker's compute since the last mark; under EMULATION, stretch it.

        Called right before every collective of a step (BatchNorm statistics in forward and
        backward, each gradient bucket). With slowdown k the extra (k - 1)·d of an interval d
        is slept, so the rank reaches *each* synchronisation point as late as a k-times slower
        device would. Stretching only at the final gradient exchange would let a slow rank run
        fast between mid-step synchronisations and then add its whole stretch serially.

        Args:
            optional: The exchange may skip accounting (BatchNorm layers): on CUDA without
                emulation, reading the clock would synchronise the device for nothing.
        """
        if self._current is None or self._skips(optional):
            return
        self._compute_s += self._emulator.stretch(self.slowdown())
        # Wall-clock busy time: what the step really costs this rank on a shared machine
        # (preemption by co-located workers included), still excluding waits in collectives.
        wall = time.perf_counter()
        self._busy_s += wall - self._busy_mark
        self._busy_mark = wall

    def after_collective(self, *, optional: bool = False) -> None:
        """Restart accounting after a blocking collective (its wait is not compute)."""
        if self._current is None or self._skips(optional):
            return
        self._emulator.mark()
        self._busy_mark = time.perf_counter()

    def end(self) -> StepTimes:
        """Finish the step in progress and return its accounting."""
        times = StepTimes(self._compute_s, self._busy_s, time.perf_counter() - self._wall_start)
        self._current = None
        return times

    def abandon(self) -> None:
        """Forget the step in progress (the loop left the loader mid-step)."""
        self._current = None

    def _skips(self, optional: bool) -> bool:
        return optional and self.clock.device.type == "cuda" and self.slowdown() <= 1.0


@dataclass(frozen=True)
class ProbeTimings:
    """The timed calls of one probed piece of work, warm-up excluded.

    Attributes:
        seconds: Seconds of each timed call in order: its compute stretched by the EMULATION
            factor, plus its setup (unstretched) when the timer counts setup.
        setup: Seconds of each call's setup (building its batch), counted or not.
    """

    seconds: tuple[float, ...]
    setup: tuple[float, ...] = ()

    @property
    def median(self) -> float:
        """The median call (robust to one slow outlier)."""
        return statistics.median(self.seconds)

    @property
    def best(self) -> float:
        """The fastest call (interference from co-located work only ever adds time)."""
        return min(self.seconds)


class ProbeTimer:
    """Times probe calls: warm-up, interleaved repeats, one clock, EMULATION accounted.

    A call's compute is read on ``clock`` and stretched by ``slowdown`` through the one
    :class:`~raytrain_hetero.worker.measure.emulation.SlowdownEmulator`, accounted, not slept. A call
    may end its setup with :meth:`setup_done` (after building a batch, or a barrier): the
    setup counts unstretched when ``count_setup`` (a slower accelerator does not read data
    more slowly), else not at all. The setup is read on the wall clock whatever ``clock``
    is: reading data or waiting at a barrier is a wait, which a thread's CPU time (the
    one-thread CPU compute clock) would not see.

    ``clock`` is a :class:`~.clock.ComputeClock` (own compute) or a :class:`~.clock.WallClock`.

    Raises:
        ProbeError: A slowdown that is not > 0.
    """

    def __init__(
        self, clock: ComputeClock, *, slowdown: float = 1.0, count_setup: bool = False
    ) -> None:
        if not slowdown > 0:
            raise ProbeError(f"the probe's slowdown factor must be > 0, got {slowdown}")
        self.slowdown = float(slowdown)
        self.count_setup = count_setup
        self._emulator = SlowdownEmulator(clock)
        self._start = self._setup_s = 0.0

    def setup_done(self) -> None:
        """Inside a timed call: its setup ends here, its compute starts."""
        wall = time.perf_counter()
        self._setup_s += wall - self._start
        self._emulator.mark()  # the compute is read from here on ``clock``
        self._start = wall

    def time_call(self, call: Callable[[], object]) -> float:
        """Seconds of one call (setup counted as configured, compute stretched); the call's
        setup alone is :attr:`last_setup_s`."""
        self._setup_s = 0.0
        self._emulator.mark()
        self._start = time.perf_counter()
        call()
        compute = self._emulator.stretch(self.slowdown, sleep=False)
        return compute + (self._setup_s if self.count_setup else 0.0)

    @property
    def last_setup_s(self) -> float:
        """Seconds of the last timed call's setup (unstretched)."""
        return self._setup_s

    def run(
        self,
        calls: Sequence[Callable[[], object]],
        *,
        repeats: int,
        warmup: int = 1,
        warm: Sequence[Callable[[], object]] | None = None,
        cleanup: Callable[[], object] | None = None,
    ) -> tuple[ProbeTimings, ...]:
        """Warm up, then time ``repeats`` interleaved rounds of ``calls``.

        A round times every call once, in order, so a drift of the machine (a co-located
        worker starting, clock boost) hits every call alike. First, ``warmup`` untimed calls
        of each of ``warm`` (default: every call) allocate memory and pick kernels;
        ``cleanup`` runs untimed after every call. Returns one :class:`ProbeTimings` per call.

        Raises:
            ProbeError: ``repeats`` < 1 or ``warmup`` < 0.
        """
        if repeats < 1 or warmup < 0:
            raise ProbeError(f"a probe needs repeats >= 1 and warmup >= 0, got {repeats}, {warmup}")
        for call in warm if warm is not None else calls:
            for _ in range(warmup):
                call()
                if cleanup is not None:
                    cleanup()
        seconds: list[list[float]] = [[] for _ in calls]
        setups: list[list[float]] = [[] for _ in calls]
        for _ in range(repeats):
            for call, times, setup in zip(calls, seconds, setups, strict=True):
                times.append(self.time_call(call))
                setup.append(self.last_setup_s)
                if cleanup is not None:
                    cleanup()
        return tuple(ProbeTimings(tuple(t), tuple(u)) for t, u in zip(seconds, setups, strict=True))


def loader_bound_s(compute_s: float, load_s: float, loader_processes: int) -> float:
    """A step's loader-bound price from its compute and its loading, timed apart.

    Without DataLoader processes (``loader_processes`` 0) the step reads its slice itself,
    before its compute: it pays both. With ``k`` processes reading ahead in parallel with the
    step, it waits only for what they cannot keep up with: ``max(compute, load / k)``
    (``load`` as one process takes it; the processes are assumed to have cores of their own).
    """
    if loader_processes <= 0:
        return compute_s + load_s
    return max(compute_s, load_s / loader_processes)
