"""One real Tune search, simulated from what it measured: does the simulator predict it?

The 64-trial simulation (:mod:`raytrain_hetero.sim.tune_search`) is only as good as its
model of a search: trials start, run epochs of carved steps plus a per-epoch overhead, and
under ``auto`` move at epoch ends, paying a restart and slowing the others while they restart.
This module checks that model against real searches (issue 44 item 3): given one search's
measured inputs (:class:`RecordedRun`: when Tune launched each trial, each trial's first
start, the epochs each ran (the replayed stops), its measured step cost per worker type, the
per-epoch overhead, the measured restart, contention and errors), :func:`predict_run` runs
the same policy on the same cluster and predicts the search's makespan, to be compared with
the measured one.

* ``fixed``: every trial holds its one worker from its start (the type it was measured on;
  at most the cluster's slots at once, first launched first placed);
* ``auto``: the allocator (:func:`~raytrain_hetero.core.trial_allocation.
  decide_trial_allocation` with the measured :class:`~raytrain_hetero.core.move_pricing.
  MovePrice`, the equal share while trials have not asked) decides at each trial's start,
  epoch end and end, as the real allocator does; a trial whose workers change keeps running
  its epoch on the old ones, then restarts (``restart_s``, once its new workers are free).

While any other trial starts or restarts, a running trial runs ``1 / (1 + contention * n)``
as fast (``n`` starts at once). An epoch is its steps on the holding (the carved step model,
no exchange measured) plus ``epoch_overhead_s``. The search ends ``tail_s`` (Tune's own
wind-down, measured) after its last trial. Pure: stdlib and :mod:`raytrain_hetero.core`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.move_pricing import MovePrice, equal_share_cap
from raytrain_hetero.core.trial_allocation import (
    TrialAllocationConfig,
    TrialDemand,
    WorkerSlot,
    asha_expected_epochs,
    decide_trial_allocation,
    step_seconds,
)
from raytrain_hetero.errors import HeteroError

__all__ = ["POLICIES", "RecordedRun", "RecordedTrial", "RunPrediction", "predict_run"]

POLICIES = ("fixed", "auto")


@dataclass(frozen=True)
class RecordedTrial:
    """One trial of a real search, as measured.

    Attributes:
        trial_id: The trial.
        launch_s: Seconds after the search began when Tune launched it.
        start_s: Its first fit's start, from the fit's call to its first step.
        epochs: Epochs it ran (where the trial scheduler stopped it).
        costs: Its step cost per worker type (measured; a type it never ran on: the run's).
        own_type: ``fixed``: the type of the one worker it held.
    """

    trial_id: str
    launch_s: float
    start_s: float
    epochs: int
    costs: Mapping[str, CostModel]
    own_type: str | None = None


@dataclass(frozen=True)
class RecordedRun:
    """One real search's measured inputs, and its measured makespan.

    Attributes:
        policy: ``fixed`` or ``auto``.
        makespan_s: The measured makespan (``Tuner.fit``'s wall time).
        trials: Its trials in sample order.
        slots: Worker slots per type.
        global_batch: Every trial's global batch.
        samples_per_epoch: Training samples of one epoch.
        max_epochs: The search's ``max_t``.
        grace_period: ASHA's grace period (the allocator's expectation).
        reduction_factor: ASHA's reduction factor.
        epoch_overhead_s: Seconds an epoch spends outside its steps (measured).
        restart_s: A move's restart (measured: the resumed fits' median start).
        contention: Fraction of a running trial's speed another's start takes (measured).
        step_error: The allocator's measured prediction error (its margins).
        restart_error: The measured restarts' relative error.
        tail_s: Seconds from the last trial's last report to the search's end (measured).
        max_workers_per_trial: The allocator's cap (None: none).
    """

    policy: str
    makespan_s: float
    trials: tuple[RecordedTrial, ...]
    slots: Mapping[str, int]
    global_batch: int
    samples_per_epoch: int
    max_epochs: int
    grace_period: int = 1
    reduction_factor: float = 2.0
    epoch_overhead_s: float = 0.0
    restart_s: float = 30.0
    contention: float = 0.0
    step_error: float = 0.0
    restart_error: float = 0.0
    tail_s: float = 0.0
    max_workers_per_trial: int | None = None


@dataclass(frozen=True)
class RunPrediction:
    """What the simulator predicts for a recorded search.

    Attributes:
        makespan_s: Predicted makespan.
        measured_s: The measured one.
        ends_s: Each trial's predicted end (its last epoch), in sample order.
        moves: Worker changes of running trials.
    """

    makespan_s: float
    measured_s: float
    ends_s: tuple[float, ...]
    moves: int

    @property
    def error(self) -> float:
        """``predicted / measured - 1``."""
        return self.makespan_s / self.measured_s - 1.0


@dataclass
class _Trial:
    spec: RecordedTrial
    phase: str = "pending"  # pending, waiting, starting, running, done
    slots: tuple[str, ...] = ()  # what it runs on (or restarts onto)
    ready_at: float | None = None  # its start or restart ends (None: slots not free yet)
    restart_s: float = 0.0  # the start or restart it pays once its slots are free
    work_s: float = 0.0  # the current epoch's seconds at full speed
    progress_s: float = 0.0
    epochs: int = 0
    pending: tuple[str, ...] | None = None  # auto: its next holding, from its epoch end
    end_s: float = math.nan
    history: list[tuple[str, ...]] = field(default_factory=list)


def predict_run(run: RecordedRun) -> RunPrediction:
    """Simulate ``run``'s policy on its inputs (see the module docstring).

    Raises:
        HeteroError: An unknown policy, or a search that does not finish.
    """
    if run.policy not in POLICIES:
        raise HeteroError(f"unknown policy {run.policy!r}; use one of {', '.join(POLICIES)}")
    return _Replay(run).run()


class _Replay:
    def __init__(self, run: RecordedRun) -> None:
        self.run_ = run
        self.slots = [
            WorkerSlot(f"{t}{i}/0", f"{t}{i}", t)
            for t in sorted(run.slots)
            for i in range(run.slots[t])
        ]
        self.kind = {s.slot_id: s.worker_type for s in self.slots}
        self.trials = [_Trial(spec) for spec in run.trials]
        self.now = 0.0
        self.moves = 0
        self.ended = 0
        self.registered: list[int] = []  # auto: trials that asked and did not end, in order
        self.price = MovePrice(run.contention, run.step_error, run.restart_error)

    # ------------------------------------------------------------------ the model

    def _counts(self, slots: tuple[str, ...]) -> dict[str, int]:
        counts: dict[str, int] = {}
        for sid in slots:
            counts[self.kind[sid]] = counts.get(self.kind[sid], 0) + 1
        return counts

    def _demand(self, t: _Trial, current: tuple[str, ...]) -> TrialDemand:
        run = self.run_
        left = asha_expected_epochs(
            t.epochs, run.max_epochs, run.grace_period, run.reduction_factor
        )
        return TrialDemand(
            trial_id=t.spec.trial_id,
            costs=t.spec.costs,
            global_batch=run.global_batch,
            remaining_samples=left * run.samples_per_epoch,
            restart_s=run.restart_s,
            current=current,
            fixed_s=left * run.epoch_overhead_s,
        )

    def _epoch_work(self, t: _Trial) -> float:
        run = self.run_
        if run.policy == "fixed":
            counts = {t.spec.own_type or next(iter(t.spec.costs)): 1}
        else:
            counts = self._counts(t.slots)
        steps = run.samples_per_epoch / run.global_batch
        step = step_seconds(counts, self._demand(t, ()))
        return steps * step + run.epoch_overhead_s

    def _speed(self, t: _Trial) -> float:
        starting = sum(
            1
            for o in self.trials
            if o is not t and o.phase == "starting" and o.ready_at is not None
        )
        return 1.0 / (1.0 + self.run_.contention * starting)

    # ------------------------------------------------------------------ events

    def run(self) -> RunPrediction:
        for _ in range(1_000_000):
            if all(t.phase == "done" for t in self.trials):
                break
            self._step()
        else:  # pragma: no cover - a search always ends
            raise HeteroError("the replayed search did not finish")
        ends = tuple(t.end_s for t in self.trials)
        makespan = max(ends) + self.run_.tail_s
        return RunPrediction(makespan, self.run_.makespan_s, ends, self.moves)

    def _step(self) -> None:
        candidates: list[tuple[float, int, str]] = []
        for j, t in enumerate(self.trials):
            if t.phase == "pending":
                candidates.append((max(t.spec.launch_s, self.now), j, "launch"))
            elif t.phase == "starting" and t.ready_at is not None:
                candidates.append((t.ready_at, j, "ready"))
            elif t.phase == "running":
                left = (t.work_s - t.progress_s) / self._speed(t)
                candidates.append((self.now + max(left, 0.0), j, "epoch"))
        if not candidates:
            raise HeteroError("the replayed search is stuck: trials wait for workers forever")
        when, j, what = min(candidates)
        for t in self.trials:
            if t.phase == "running":
                t.progress_s += (when - self.now) * self._speed(t)
        self.now = when
        t = self.trials[j]
        if what == "launch":
            self._launch(j)
        elif what == "ready":
            t.phase, t.progress_s = "running", 0.0
            t.work_s = self._epoch_work(t)
        else:
            self._epoch_end(j)

    def _begin(self, t: _Trial, slots: tuple[str, ...], restart_s: float) -> None:
        """``t`` (re)starts on ``slots``: once they are free, it pays ``restart_s``."""
        t.phase, t.slots, t.restart_s, t.ready_at = "starting", slots, restart_s, None
        t.history.append(slots)
        self._unblock()

    def _unblock(self) -> None:
        in_use = {
            sid
            for o in self.trials
            if o.phase in ("running",) or o.ready_at is not None
            for sid in o.slots
        }
        for t in self.trials:
            if t.phase == "starting" and t.ready_at is None:
                if self.run_.policy == "auto" and set(t.slots) & in_use:
                    continue
                t.ready_at = self.now + t.restart_s
                in_use.update(t.slots)

    def _launch(self, j: int) -> None:
        t = self.trials[j]
        if self.run_.policy == "fixed":
            busy = sum(1 for o in self.trials if o.phase in ("starting", "running"))
            if busy >= sum(self.run_.slots.values()):
                t.phase = "waiting"
                return
            self._begin(t, (), t.spec.start_s)
            return
        t.phase = "waiting"
        self.registered.append(j)
        self._decide()

    def _epoch_end(self, j: int) -> None:
        t = self.trials[j]
        t.epochs += 1
        if t.epochs >= t.spec.epochs:
            t.phase, t.end_s, t.slots, t.pending = "done", self.now, (), None
            self.ended += 1
            if self.run_.policy == "fixed":
                waiting = [o for o in self.trials if o.phase == "waiting"]
                if waiting:
                    self._begin(waiting[0], (), waiting[0].spec.start_s)
                self._unblock()
                return
            self.registered.remove(j)
            self._unblock()
            self._decide()
            return
        if self.run_.policy == "auto":
            self._decide()
        if t.pending is not None:  # its workers changed: restart on the new ones
            new, t.pending = t.pending, None
            self.moves += 1
            self._begin(t, new, self.run_.restart_s)
            return
        t.progress_s, t.work_s = 0.0, self._epoch_work(t)

    def _holding(self, t: _Trial) -> tuple[str, ...]:
        """What the allocator believes ``t`` holds: its next holding if one is pending."""
        if t.pending is not None:
            return t.pending
        return t.slots if t.phase in ("starting", "running") else ()

    def _decide(self) -> None:
        run = self.run_
        live = [self.trials[j] for j in self.registered]
        if not live:
            return
        cap = equal_share_cap(
            run.max_workers_per_trial,
            slots=len(self.slots),
            expected_trials=len(self.trials),
            ended=self.ended,
            live=len(live),
        )
        decision = decide_trial_allocation(
            self.slots,
            [self._demand(t, self._holding(t)) for t in live],
            TrialAllocationConfig(max_workers_per_trial=cap),
            self.price,
        )
        for a in decision.assignments:
            t = next(o for o in live if o.spec.trial_id == a.trial_id)
            if set(a.slots) == set(self._holding(t)):
                continue
            if t.phase == "waiting":
                self._begin(t, a.slots, t.spec.start_s)
            elif t.phase == "starting" and t.ready_at is None:
                t.slots = a.slots  # not started yet: it starts on the new slots
            else:  # at its epoch end (none if it is given back what it runs on)
                t.pending = a.slots if set(a.slots) != set(t.slots) else None
