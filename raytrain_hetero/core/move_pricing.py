"""What moving a running trial costs on the cluster it runs on, and how far to trust a gain.

The trial allocator (:mod:`raytrain_hetero.core.trial_allocation`) moves a trial to other
workers only when the move pays for itself *as measured where it runs*:

* **the restart**: a moved trial stops at its epoch end and starts again on its new workers
  (Ray Train's controller, worker processes, the library's start-up, the restore); charged
  the median of the measured starts of fits that resumed a trial (:func:`restart_charge`);
* **the contention**: while a trial restarts, its process starts and imports take CPU, disk
  and network from the trials that keep running; each of them loses ``contention`` of its
  speed for the restart's length (:func:`contention_fraction`, measured from the epochs that
  overlapped another trial's start);
* **the error margin**: the gain is a prediction from cost models; a moved trial's
  predicted run on its new workers is charged its measured relative error
  (:func:`prediction_error`: how far measured epochs fell from the model's) and its restart
  the spread of the measured restarts, so a move whose predicted gain lies within the
  prediction's error is not made.

:class:`MovePrice` carries the three to the decision; the estimators here turn what a search
measured (typed records: :class:`EpochTiming`, :class:`StartWindow`) into it. Before anything
is measured each has a stated prior (the ``PRIOR_*`` constants). Pure: standard library only.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from raytrain_hetero.errors import AllocationError

__all__ = [
    "PRIOR_CONTENTION",
    "PRIOR_ERROR",
    "PRIOR_RESTART_S",
    "EpochTiming",
    "MovePrice",
    "StartWindow",
    "contention_fraction",
    "epoch_overhead_s",
    "equal_share_cap",
    "prediction_error",
    "restart_charge",
]

#: Seconds a restart is charged before any fit's start is measured.
PRIOR_RESTART_S = 30.0
#: Relative error assumed for predictions (and restarts) until enough are measured.
PRIOR_ERROR = 0.25
#: Fraction of a running trial's speed a restart is assumed to take until measured.
PRIOR_CONTENTION = 0.25
#: Measured samples an estimate needs before it replaces its prior.
MIN_SAMPLES = 3
#: The quantile of the measured relative errors taken as the margin: most predictions fall
#: within it.
ERROR_QUANTILE = 0.9
#: Newest measurements an error estimate looks at (the cluster's load changes).
ERROR_WINDOW = 32


@dataclass(frozen=True)
class MovePrice:
    """What a move is charged beyond the moved trial's own restart (measured on the cluster).

    Attributes:
        contention: Fraction of a running trial's speed that another trial's restart takes
            while it runs, in ``[0, 1]``: a move of trial ``j`` delays every other live trial
            by ``contention * restart_s(j)``.
        step_error: Relative error of a predicted step time, ``>= 0``: a moved trial's
            predicted run on its new workers is charged ``(1 + step_error)`` times.
        restart_error: Relative error of the restart charge, ``>= 0``: a moved trial's
            restart is charged ``(1 + restart_error)`` times.
    """

    contention: float = 0.0
    step_error: float = 0.0
    restart_error: float = 0.0

    def __post_init__(self) -> None:
        for name in ("contention", "step_error", "restart_error"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise AllocationError(
                    f"MovePrice.{name} must be a finite number >= 0, got {value!r}"
                )
        if self.contention > 1:
            raise AllocationError(
                f"MovePrice.contention is a fraction of a trial's speed, in [0, 1]; got "
                f"{self.contention!r}"
            )


@dataclass(frozen=True)
class EpochTiming:
    """One epoch of one trial, as its rank 0 measured it, and what the model predicted.

    Attributes:
        trial_id: The trial.
        holding: The version of the holding it ran on (epochs on one holding share a speed).
        started_at: Wall seconds when the epoch began (its fit's first step, or the previous
            epoch's end).
        ended_at: Wall seconds when it ended (before its report).
        predicted_s: The model's seconds for the epoch's steps on that holding, from measured
            cost models; None where a held type was not measured yet (no prediction).
    """

    trial_id: str
    holding: int
    started_at: float
    ended_at: float
    predicted_s: float | None = None

    @property
    def seconds(self) -> float:
        """The epoch's measured wall seconds."""
        return self.ended_at - self.started_at


@dataclass(frozen=True)
class StartWindow:
    """One fit's start, from the trial's call of the fit to its first step (wall seconds):
    while it runs, the start's processes compete with the running trials."""

    trial_id: str
    started_at: float
    ended_at: float


def _quantile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def epoch_overhead_s(epochs: Sequence[EpochTiming]) -> float:
    """Seconds an epoch spends outside the predicted steps (validation, report, checkpoint):
    the median over the predicted epochs of measured minus predicted, at least 0; 0 without
    any."""
    gaps = [e.seconds - e.predicted_s for e in epochs if e.predicted_s is not None]
    return max(0.0, statistics.median(gaps)) if gaps else 0.0


def prediction_error(
    epochs: Sequence[EpochTiming],
    *,
    overhead_s: float = 0.0,
    prior: float = PRIOR_ERROR,
    quantile: float = ERROR_QUANTILE,
    window: int = ERROR_WINDOW,
) -> float:
    """The relative error of the model's epoch predictions (steps plus ``overhead_s``): the
    ``quantile`` of ``|measured / predicted - 1|`` over the newest ``window`` predicted
    epochs; ``prior`` with fewer than :data:`MIN_SAMPLES`."""
    errors = [
        abs(e.seconds / (e.predicted_s + overhead_s) - 1.0)
        for e in sorted(epochs, key=lambda e: e.ended_at)
        if e.predicted_s is not None and e.predicted_s + overhead_s > 0 and e.seconds > 0
    ][-window:]
    if len(errors) < MIN_SAMPLES:
        return prior
    return _quantile(errors, quantile)


def restart_charge(
    resumed_s: Sequence[float],
    first_s: Sequence[float] = (),
    *,
    prior_s: float = PRIOR_RESTART_S,
    prior_error: float = PRIOR_ERROR,
) -> tuple[float, float]:
    """``(seconds, relative error)`` a restart is charged.

    The median of the measured starts of fits that resumed a trial on new workers, and the
    ``ERROR_QUANTILE`` of their relative deviations from it (``prior_error`` with fewer than
    :data:`MIN_SAMPLES`). Before any such start: the quickest measured first start of a
    trial (``first_s``: a search's first fits start all at once, on a busy cluster, so each
    is an upper estimate of one restart there), else ``prior_s``; the error is ``prior_error``.
    """
    resumed = [s for s in resumed_s if math.isfinite(s) and s >= 0]
    if resumed:
        median = statistics.median(resumed)
        if len(resumed) < MIN_SAMPLES or median <= 0:
            return median, prior_error
        spread = [abs(s / median - 1.0) for s in resumed]
        return median, _quantile(spread, ERROR_QUANTILE)
    first = [s for s in first_s if math.isfinite(s) and s >= 0]
    return (min(first) if first else prior_s), prior_error


def _overlap(start: float, end: float, windows: Sequence[tuple[float, float]]) -> float:
    """Seconds of ``[start, end]`` covered by the union of ``windows``."""
    covered, reach = 0.0, start
    for a, b in sorted(windows):
        a, b = max(a, reach), min(b, end)
        if b > a:
            covered += b - a
            reach = b
    return covered


def contention_fraction(
    epochs: Sequence[EpochTiming],
    starts: Sequence[StartWindow],
    *,
    prior: float = PRIOR_CONTENTION,
    min_overlap: float = 0.05,
) -> float:
    """The fraction of a running trial's speed that other trials' starts take, measured.

    Each epoch of a trial that overlapped other trials' starts for a fraction ``f`` of its
    length (at least ``min_overlap``) is compared with the median of the same trial's epochs
    on the same holding that overlapped none (``base``): its slowdown
    ``s = seconds / base - 1``. The fraction is the least-squares slope of ``s`` on ``f``
    through the origin (``s = c f``: during a start the trial runs ``1 / (1 + c)`` as fast,
    which is ``1 - c`` to first order), clamped to ``[0, 1]``; ``prior`` with fewer than
    :data:`MIN_SAMPLES` such epochs.
    """
    windows: dict[str, list[tuple[float, float]]] = {}
    for w in starts:
        if w.ended_at > w.started_at:
            windows.setdefault(w.trial_id, []).append((w.started_at, w.ended_at))
    fractions: dict[int, float] = {}
    for i, e in enumerate(epochs):
        if e.seconds <= 0:
            continue
        others = [span for trial, spans in windows.items() if trial != e.trial_id for span in spans]
        fractions[i] = _overlap(e.started_at, e.ended_at, others) / e.seconds
    clean: dict[tuple[str, int], list[float]] = {}
    for i, f in fractions.items():
        if f == 0:
            clean.setdefault((epochs[i].trial_id, epochs[i].holding), []).append(epochs[i].seconds)
    points = []
    for i, f in fractions.items():
        base = clean.get((epochs[i].trial_id, epochs[i].holding))
        if f >= min_overlap and base:
            points.append((f, epochs[i].seconds / statistics.median(base) - 1.0))
    if len(points) < MIN_SAMPLES:
        return prior
    slope = sum(f * s for f, s in points) / sum(f * f for f, _ in points)
    return min(1.0, max(0.0, slope))


def equal_share_cap(
    cap: int | None, *, slots: int, expected_trials: int | None, ended: int, live: int
) -> int | None:
    """The most workers one trial may hold now: ``cap`` (None: no cap), and, while some of
    the search's ``expected_trials`` have not asked yet (neither ``live`` nor ``ended``), an
    equal share of the ``slots`` (``slots // min(slots, trials not ended)``, at least 1).

    A search starts its trials one by one; without the share the first to ask would take
    every worker and the others would wait for it (moving a started trial costs a restart).
    """
    if expected_trials is None or slots == 0:
        return cap
    unstarted = expected_trials - ended - live
    if unstarted <= 0:
        return cap
    share = max(1, slots // min(slots, live + unstarted))
    return share if cap is None else min(cap, share)
