"""EMULATION: the one way a worker is made k times slower than its hardware.

For CPU-only testing and demos, every place that emulates slowdown (steps, BatchNorm
exchanges, probes, benchmarks, inference) uses :class:`SlowdownEmulator`: it measures the
worker's *own* compute since a mark (thread or process CPU time, so co-located workers do not
compound the stretch) and for an interval d sleeps (k - 1)·d, reaching the next
synchronisation point as late as the slower device would without taking CPU from others.
Real clusters use k = 1. :func:`slowdown_factor` is the one rule for the factor at a step.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from raytrain_hetero.config import SlowdownInjection
    from raytrain_hetero.worker.measure.clock import ComputeClock

__all__ = [
    "MIN_SLEEP_S",
    "SlowdownEmulator",
    "SlowdownSchedule",
    "current_node_labels",
    "emulate_collective_delay",
    "node_slowdown",
    "noise_multiplier",
    "slowdown_factor",
]


def emulate_collective_delay(seconds: float) -> None:
    """EMULATION of a worker behind a slow link: sleep before joining a gradient collective.

    Every other rank then waits that long inside the collective, as behind a slow link.
    Used by the gradient all-reduce hook and by the probe's timed all-reduce alike
    (``WorkerSpec.emulated_collective_delay_s``; 0 on real clusters).
    """
    if seconds > 0.0:
        time.sleep(seconds)


def slowdown_factor(
    base: float,
    injections: Iterable[SlowdownInjection],
    *,
    worker: str,
    rank: int,
    step: int,
) -> float:
    """EMULATION factor of ``worker``/``rank`` at global ``step`` (-1: probes, calibration):
    ``base`` (``emulated_slowdown``) times the factor of every injection that applies."""
    factor = float(base)
    for injection in injections:
        if injection.applies_to(worker, rank, step):
            factor *= float(injection.factor)
    return factor


def node_slowdown(
    node_slowdowns: Mapping[str, Mapping[str, float]], labels: Mapping[str, str]
) -> float:
    """EMULATION factor of a node from its ``labels``: the product, over each label key of
    ``node_slowdowns`` (``{key: {value: factor}}``), of the factor of the node's value (1 for
    a node without the label or with another value). ``EmulationConfig.node_slowdowns``."""
    factor = 1.0
    for key, factors in node_slowdowns.items():
        value = labels.get(key)
        if value is not None:
            factor *= float(factors.get(value, 1.0))
    return factor


def current_node_labels() -> dict[str, str]:
    """The labels of the Ray node this process runs on ({} outside Ray)."""
    import ray

    if not ray.is_initialized():
        return {}
    return dict(ray.get_runtime_context().get_node_labels() or {})


def noise_multiplier(noise: float, *, worker: str, step: int) -> float:
    """EMULATION per-step noise: a draw uniform in ``[1 - noise, 1 + noise]``.

    Deterministic in (``worker``, ``step``): every call within a step (the step's stretch,
    its BatchNorm exchanges) sees the same draw, and a re-run sees the same sequence.
    Outside training steps (``step < 0``: probes, calibration) there is no noise.
    """
    if noise <= 0.0 or step < 0:
        return 1.0
    # crc32, not hash(): Python salts str hashes per process, and ranks must agree run to run.
    unit = zlib.crc32(f"{worker}/{step}".encode()) / 0xFFFFFFFF
    return 1.0 + noise * (2.0 * unit - 1.0)


#: Owed stretch below this many seconds is carried, not slept. ``time.sleep`` overshoots by a
#: fixed ~60 us on Linux (timer slack and wake-up), so sleeping each sub-millisecond interval's
#: stretch would slow a worker of small steps far more than k (a 4x emulation measured 92x).
MIN_SLEEP_S = 0.5e-3


class SlowdownEmulator:
    """Stretches this worker's compute intervals by a factor (EMULATION).

    The extra ``(k - 1)·d`` of each interval is owed; the debt is slept once it reaches
    ``min_sleep_s``, and what a sleep really took (its overshoot included) is paid off it, so
    over a run the worker sleeps ``(k - 1)`` times its compute to within one ``min_sleep_s``,
    whatever the size of its intervals. A synchronisation point is then reached at most
    ``min_sleep_s`` early or late.

    Args:
        clock: Reads this worker's own compute seconds.
        min_sleep_s: The smallest sleep (owed stretch below it is carried).
        sleep: Sleeps for a number of seconds (``time.sleep``).
        wall: Reads the wall clock a sleep is measured on (``time.perf_counter``).
    """

    def __init__(
        self,
        clock: ComputeClock,
        *,
        min_sleep_s: float = MIN_SLEEP_S,
        sleep: Callable[[float], None] = time.sleep,
        wall: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.clock = clock
        self.min_sleep_s = float(min_sleep_s)
        self._sleep = sleep
        self._wall = wall
        self._owed = 0.0
        self._mark = clock.now()

    @property
    def owed_s(self) -> float:
        """Stretch owed and not yet slept (negative: a sleep overshot, credited)."""
        return self._owed

    def mark(self) -> float:
        """A compute interval starts now (waits before it are not compute); returns the reading."""
        self._mark = self.clock.now()
        return self._mark

    def stretch(self, factor: float, *, sleep: bool = True) -> float:
        """End the interval d since the last mark and return k·d (k = ``factor``); a new one
        starts. ``sleep`` owes the extra (k - 1)·d and sleeps the debt once it is worth a
        sleep (a step); False only accounts it (a probe)."""
        interval = max(0.0, self.clock.now() - self._mark)
        if sleep and factor > 1.0 and interval > 0.0:
            self._owed += interval * (factor - 1.0)
            if self._owed >= self.min_sleep_s:
                started = self._wall()
                self._sleep(self._owed)
                self._owed -= self._wall() - started
        self._mark = self.clock.now()
        return interval * float(factor)


class SlowdownSchedule:
    """EMULATION factors of one worker over the run: its base factor and every injection.

    ``planned`` injections are fixed; live ones are replaced as a whole by the scheduler sync
    (their one writer). ``noise``: per-step amplitude (:func:`noise_multiplier`), factor >= 1.
    """

    def __init__(
        self,
        base: float,
        *,
        worker: str,
        rank: int,
        planned: Iterable[SlowdownInjection] = (),
        noise: float = 0.0,
    ) -> None:
        self.base = float(base)
        self.noise = float(noise)
        self.worker = worker
        self.rank = rank
        self._planned = tuple(planned)
        self._live: tuple[SlowdownInjection, ...] = ()

    def set_live(self, injections: Iterable[SlowdownInjection]) -> None:
        """Replace the injections received from the scheduler during the run."""
        self._live = tuple(injections)

    @property
    def live(self) -> tuple[SlowdownInjection, ...]:
        """The injections received from the scheduler so far."""
        return self._live

    def factor_at(self, step: int) -> float:
        """The factor at global ``step`` (-1 outside training steps), noise included."""
        factor = slowdown_factor(
            self.base, (*self._planned, *self._live), worker=self.worker, rank=self.rank, step=step
        )
        if self.noise <= 0.0:
            return factor
        # Emulation can only slow down: a draw below 1 on an unslowed worker is clipped.
        return max(1.0, factor * noise_multiplier(self.noise, worker=self.worker, step=step))
