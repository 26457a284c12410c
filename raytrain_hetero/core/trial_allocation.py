"""Which workers each live trial of a search holds, on a cluster of unequal workers.

A Tune search runs many trials at once. Each trial is a data-parallel job whose global batch is
carved exactly over whatever workers it holds (:mod:`raytrain_hetero.core.allocation`), so a
trial may span worker types and its result does not depend on which workers it held. This
module decides the holdings: a pure function of

* the worker slots the cluster offers (:func:`cluster_slots`: nodes with labels and resources,
  matched to worker types by label selector and resources);
* the live trials (:class:`TrialDemand`): per worker type the remembered cost model
  ``t(b) = alpha + beta * b`` of one step, the per-step gradient exchange, the work left
  (expected samples, e.g. :func:`asha_expected_epochs`), the measured restart cost and the
  slots held now (the model: :mod:`raytrain_hetero.core.trial_model`);
* what a move costs on this cluster beyond the restart, and how far a predicted gain is
  trusted (:class:`~raytrain_hetero.core.move_pricing.MovePrice`: the contention a restart
  inflicts on the other trials, the measured error of the predictions).

:func:`decide_trial_allocation` minimises the search's makespan (the latest completion), then
the sum of completions. A trial that held workers and holds others (a **move**) is charged its
restart and its error margin (its restart and its predicted run on the new workers inflated
by their measured relative errors), and delays every other trial by ``contention *
restart_s``. Local search on per-type counts from two starts (the current holdings, and one
best slot per trial; :mod:`raytrain_hetero.core.trial_search`), moves: add a free worker,
move one worker between trials, release a worker that slows its trial. The current holdings
are kept unless the best allocation, so charged, is better by more than ``min_gain_s``: so a
move whose predicted gain lies within the prediction's measured error is not made, and the
kept makespan is never predicted shorter than the chosen one. Counts are then mapped to
slots keeping each trial's current slots first. Deterministic: every choice is ordered by
(value, id).

Every decision and every move says, in seconds, its predicted gain, its charged cost and its
error margin (:class:`AllocationDecision`, :class:`TrialAssignment`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

from raytrain_hetero.core.move_pricing import MovePrice
from raytrain_hetero.core.trial_model import (
    EPSILON,
    ClusterNode,
    TrialDemand,
    WorkerSlot,
    WorkerType,
    asha_expected_epochs,
    cluster_slots,
    run_seconds,
    step_seconds,
    trial_completion,
    unique_ids,
)
from raytrain_hetero.core.trial_search import (
    Counts,
    SearchState,
    admit,
    better,
    local_search,
    map_to_slots,
    normal,
    plus,
    seed_one_each,
    trim,
)
from raytrain_hetero.errors import AllocationError

__all__ = [
    "AllocationDecision",
    "ClusterNode",
    "MovePrice",
    "TrialAllocationConfig",
    "TrialAssignment",
    "TrialDemand",
    "WorkerSlot",
    "WorkerType",
    "asha_expected_epochs",
    "cluster_slots",
    "decide_trial_allocation",
    "run_seconds",
    "step_seconds",
    "trial_completion",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrialAllocationConfig:
    """Settings of :func:`decide_trial_allocation`.

    Attributes:
        min_gain_s: Keep the current holdings unless the new makespan is at least this many
            seconds shorter (or equal makespan and the sum this much shorter), after every
            move's charge and error margin.
        max_workers_per_trial: Cap on one trial's workers (None: no cap).
        max_start_slowdown: A trial that holds no worker yet starts only on a free worker
            whose step is at most this many times its step on one worker of its fastest
            offered type; otherwise it waits (``waiting``) for a later decision. A trial
            started on a far slower worker than the cluster has would end last.
    """

    min_gain_s: float = 0.0
    max_workers_per_trial: int | None = None
    max_start_slowdown: float = 8.0


@dataclass(frozen=True)
class TrialAssignment:
    """What one trial holds after a decision, and why.

    Attributes:
        trial_id: The trial.
        slots: Slot ids it holds (sorted).
        counts: ``(worker_type, workers)`` pairs, sorted by type.
        step_s: Predicted seconds per step on these workers.
        completion_s: Predicted seconds until it ends (its restart when ``changed``, and the
            contention of the other trials' moves, included; no error margin).
        changed: Its slots differ from what it held (it restarts).
        reason: One line: why it holds these workers.
        gain_s: A move only (it held workers and holds others): seconds of run its new
            workers save against its old ones (negative: a donor that slows down); else None.
        cost_s: A move only: what it is charged, its restart plus the contention its restart
            inflicts, summed over the other trials.
        margin_s: A move only: its error margin, ``step_error`` of its predicted run on the
            new workers plus ``restart_error`` of its restart.
    """

    trial_id: str
    slots: tuple[str, ...]
    counts: tuple[tuple[str, int], ...]
    step_s: float
    completion_s: float
    changed: bool
    reason: str
    gain_s: float | None = None
    cost_s: float = 0.0
    margin_s: float = 0.0


@dataclass(frozen=True)
class AllocationDecision:
    """The holdings of every live trial.

    Attributes:
        assignments: One per started trial, in the order given.
        free_slots: Slots no trial holds (sorted).
        makespan_s: Latest predicted completion (no error margin).
        mean_completion_s: Mean predicted completion.
        changed: Some trial's slots changed.
        findings: Warnings about the input (a node no trial can use, ...), one line each.
        reason: One line: why this allocation (kept, or how much better).
        waiting: Trials that held no worker and still wait (no free worker fast enough for
            them, see ``max_start_slowdown``), in the order given.
        gain_s: When every trial held valid workers: the kept makespan minus the best
            allocation's (restarts and contention charged, no margin), whether or not it was
            taken; None otherwise.
        cost_s: The best allocation's moves' charges (restarts and contention), summed.
        margin_s: The best allocation's makespan with its moves' error margins, minus without.
    """

    assignments: tuple[TrialAssignment, ...]
    free_slots: tuple[str, ...]
    makespan_s: float
    mean_completion_s: float
    changed: bool
    findings: tuple[str, ...]
    reason: str
    waiting: tuple[str, ...] = ()
    gain_s: float | None = None
    cost_s: float = 0.0
    margin_s: float = 0.0

    def slots_of(self, trial_id: str) -> tuple[str, ...]:
        """The slots ``trial_id`` holds."""
        for a in self.assignments:
            if a.trial_id == trial_id:
                return a.slots
        raise KeyError(trial_id)


@dataclass(frozen=True)
class _Priced:
    """A state's figures without margins: each trial's completion, the makespan, the sum,
    the moves' charges, and the makespan with margins."""

    ends: tuple[float, ...]
    margins: tuple[float, ...]
    costs: tuple[float, ...]
    makespan: float
    total: float
    cost: float
    pessimistic: float


def _priced(state: SearchState) -> _Priced:
    n = len(state.demands)
    ends, margins, costs = [], [], []
    for j, d in enumerate(state.demands):
        moved = state.moved(j, state.counts[j])
        changed = normal(state.counts[j]) != state.current[j]
        nominal = trial_completion(state.counts[j], d, changed=changed)
        ends.append(nominal - state.own[j] + state.shift)
        margins.append(state.done[j] - nominal)
        costs.append(d.restart_s + state.own[j] * (n - 1) if moved else 0.0)
    pessimistic = state.objective()[0]
    makespan = max(ends, default=0.0)
    return _Priced(
        tuple(ends),
        tuple(margins),
        tuple(costs),
        makespan,
        sum(ends),
        sum(costs),
        pessimistic,
    )


def decide_trial_allocation(
    slots: Sequence[WorkerSlot],
    trials: Sequence[TrialDemand],
    config: TrialAllocationConfig = TrialAllocationConfig(),
    price: MovePrice | None = None,
) -> AllocationDecision:
    """Which slots each live trial holds (see the module docstring for the model).

    Args:
        slots: The cluster's worker slots (:func:`cluster_slots`).
        trials: The live trials; each needs a cost model for at least one offered type.
        config: Hysteresis and caps.
        price: What a move costs beyond its restart and how far predictions are trusted
            (measured; None: only the restart, with exact predictions).

    Returns:
        The decision; a slot type no trial can use is reported in ``findings``; trials that
        hold nothing yet and find no fast enough free worker are ``waiting``.

    Raises:
        AllocationError: A trial no offered slot can hold (one line naming it and the types
            offered), more running trials than slots, a slot held twice, or invalid numbers.
    """
    price = price or MovePrice()
    _validate(slots, trials)
    slot_by_id = {s.slot_id: s for s in slots}
    offered: Counts = {}
    for s in slots:
        offered[s.worker_type] = offered.get(s.worker_type, 0) + 1
    findings = [
        f"worker type {t!r} ({offered[t]} slot(s)) has no cost model in any live trial: "
        "those slots stay idle"
        for t in sorted(offered)
        if not any(t in d.costs for d in trials)
    ]
    for demand in trials:
        if not any(t in offered for t in demand.costs):
            raise AllocationError(
                f"trial {demand.trial_id!r} fits no node: it has cost models for "
                f"{sorted(demand.costs) or 'no type'} but the cluster offers "
                f"{sorted(offered) or 'no slot'}; measure it on an offered type or add a node"
            )
    running = [d for d in trials if d.current]
    if len(running) > len(slots):
        raise AllocationError(
            f"{len(running)} running trials but {len(slots)} worker slots: every trial needs "
            f"at least one worker; run at most {len(slots)} trials at once"
        )
    cap = config.max_workers_per_trial
    if cap is not None and cap < 1:
        raise AllocationError(f"max_workers_per_trial must be >= 1 or None, got {cap}")
    if not (math.isfinite(config.max_start_slowdown) and config.max_start_slowdown >= 1):
        raise AllocationError(
            f"max_start_slowdown must be a finite number >= 1, got {config.max_start_slowdown}"
        )
    trials, waiting = admit(slot_by_id, offered, trials, config.max_start_slowdown)

    # current holdings on slots that still exist and that the trial can use
    current: list[Counts] = []
    for demand in trials:
        holding: Counts = {}
        for sid in demand.current:
            known = slot_by_id.get(sid)
            if known is not None and known.worker_type in demand.costs:
                holding = plus(holding, known.worker_type, 1)
        current.append(holding)
    current_exact = [
        all(sid in slot_by_id and slot_by_id[sid].worker_type in d.costs for sid in d.current)
        and bool(d.current)
        for d in trials
    ]

    candidates: list[SearchState] = []
    for start in ("current", "fresh"):
        counts = [dict(c) for c in current] if start == "current" else [{} for _ in trials]
        if cap is not None:
            counts = [trim(c, cap) for c in counts]
        free = dict(offered)
        for c in counts:
            for t, n in c.items():
                free[t] -= n
        seed_one_each(trials, counts, free)
        state = SearchState(trials, counts, free, current, cap, price)
        local_search(state, EPSILON)
        candidates.append(state)
    unmargined = None
    if all(current_exact) and (price.step_error > 0 or price.restart_error > 0):
        # A margin is paid once per moved trial, so a move that pays only when taken whole
        # (a trial growing by several workers) is not reached one worker at a time: search
        # without margins, then price what it found with them.
        unmargined = _best_without_margins(trials, current, offered, cap, price)
        candidates.append(unmargined)
    best = min(candidates, key=lambda s: (s.objective(), _key(s)))
    figures = _priced(best)

    keep = all(current_exact) and (cap is None or all(len(d.current) <= cap for d in trials))
    gain: float | None = None
    if keep:
        kept_state = SearchState(trials, [dict(c) for c in current], {}, current, cap, price)
        kept = kept_state.objective()
        gain = kept[0] - figures.makespan
        if not better(best.objective(), kept, max(config.min_gain_s, EPSILON)):
            if unmargined is not None:
                # Say what the best change charged without margins would have gained.
                best, figures = unmargined, _priced(unmargined)
            return _kept(slots, trials, current, kept_state, findings, waiting, best, figures)
        reason = (
            f"makespan {kept[0]:.4g} s -> {figures.makespan:.4g} s (gain {gain:.3g} s after "
            f"charging {figures.cost:.3g} s of restarts and contention; error margin "
            f"{figures.pessimistic - figures.makespan:.3g} s), mean completion "
            f"{kept[1] / len(trials):.4g} s -> {figures.total / len(trials):.4g} s"
        )
    else:
        reason = "trials without (valid) workers placed; makespan minimised"

    chosen = map_to_slots(slots, trials, best.counts)
    assignments_list = []
    held_all: set[str] = set()
    n = len(trials)
    for j, d in enumerate(trials):
        mine = chosen[j]
        held_all.update(mine)
        changed = set(mine) != set(d.current)
        # slot-level: a trial whose slot vanished restarts on the same counts
        value = trial_completion(best.counts[j], d, changed=changed)
        value += best.shift - best.own[j]
        move = bool(d.current) and changed and bool(current[j])
        assignments_list.append(
            TrialAssignment(
                trial_id=d.trial_id,
                slots=tuple(sorted(mine)),
                counts=normal(best.counts[j]),
                step_s=step_seconds(best.counts[j], d),
                completion_s=value,
                changed=changed,
                reason=_why(best.counts[j], current[j], d, figures, j),
                gain_s=(
                    run_seconds(current[j], d) - run_seconds(best.counts[j], d) if move else None
                ),
                cost_s=d.restart_s + best.own[j] * (n - 1) if move else 0.0,
                margin_s=figures.margins[j] if move else 0.0,
            )
        )
    done = [a.completion_s for a in assignments_list]
    return AllocationDecision(
        assignments=tuple(assignments_list),
        free_slots=tuple(sorted(s.slot_id for s in slots if s.slot_id not in held_all)),
        makespan_s=max(done, default=0.0),
        mean_completion_s=sum(done) / max(len(done), 1),
        changed=any(a.changed for a in assignments_list),
        findings=tuple(findings),
        reason=reason,
        waiting=waiting,
        gain_s=gain,
        cost_s=figures.cost,
        margin_s=figures.pessimistic - figures.makespan,
    )


def _kept(
    slots: Sequence[WorkerSlot],
    trials: Sequence[TrialDemand],
    current: Sequence[Counts],
    kept_state: SearchState,
    findings: Sequence[str],
    waiting: tuple[str, ...],
    best: SearchState,
    figures: _Priced,
) -> AllocationDecision:
    """The decision that keeps every trial's holding; its reason says why the best change
    was not taken."""
    kept = kept_state.objective()
    gain = kept[0] - figures.makespan
    margin = figures.pessimistic - figures.makespan
    if all(normal(c) == s for c, s in zip(best.counts, kept_state.current)):
        why = "kept the current holdings: no change is predicted to end the search sooner"
    elif gain > 0:
        why = (
            f"kept the current holdings: the best change gains {gain:.3g} s after charging "
            f"{figures.cost:.3g} s of restarts and contention, within its error margin "
            f"{margin:.3g} s"
        )
    else:
        why = (
            f"kept the current holdings: the best change would cost {figures.cost:.3g} s of "
            f"restarts and contention for no gain ({gain:.3g} s)"
        )
    assignments = tuple(
        TrialAssignment(
            trial_id=d.trial_id,
            slots=tuple(sorted(d.current)),
            counts=normal(current[j]),
            step_s=step_seconds(current[j], d),
            completion_s=kept_state.done[j],
            changed=False,
            reason="kept: no allocation is better by more than the restart it costs",
        )
        for j, d in enumerate(trials)
    )
    in_use = {sid for d in trials for sid in d.current}
    return AllocationDecision(
        assignments=assignments,
        free_slots=tuple(sorted(s.slot_id for s in slots if s.slot_id not in in_use)),
        makespan_s=kept[0],
        mean_completion_s=kept[1] / max(len(trials), 1),
        changed=False,
        findings=tuple(findings),
        reason=why,
        waiting=waiting,
        gain_s=gain,
        cost_s=figures.cost,
        margin_s=margin,
    )


def _best_without_margins(
    trials: Sequence[TrialDemand],
    current: Sequence[Counts],
    offered: Counts,
    cap: int | None,
    price: MovePrice,
) -> SearchState:
    """The local search from the current holdings with restarts and contention charged but
    no error margins, priced with them (for the reason of a kept decision)."""
    counts = [trim(c, cap) if cap is not None else dict(c) for c in current]
    free = dict(offered)
    for c in counts:
        for t, n in c.items():
            free[t] -= n
    nominal = MovePrice(contention=price.contention)
    state = SearchState(trials, counts, free, current, cap, nominal)
    local_search(state, EPSILON)
    return SearchState(trials, state.counts, state.free, current, cap, price)


def _key(state: SearchState) -> tuple[tuple[tuple[str, int], ...], ...]:
    return tuple(normal(c) for c in state.counts)


def _why(new: Counts, old: Counts, demand: TrialDemand, figures: _Priced, j: int) -> str:
    if normal(new) == normal(old):
        return "kept its workers"
    shown = ", ".join(f"{n} {t}" for t, n in normal(new))
    if not old:
        return f"started on {shown}"
    was = ", ".join(f"{n} {t}" for t, n in normal(old))
    saved = run_seconds(old, demand) - run_seconds(new, demand)
    return (
        f"{was} -> {shown}: its run {saved:+.3g} s shorter, charged {figures.costs[j]:.3g} s "
        f"(restart {demand.restart_s:.3g} s and contention), error margin "
        f"{figures.margins[j]:.3g} s; the search ends sooner"
    )


def _validate(slots: Sequence[WorkerSlot], trials: Sequence[TrialDemand]) -> None:
    unique_ids([s.slot_id for s in slots], "slot id")
    unique_ids([d.trial_id for d in trials], "trial id")
    holder: dict[str, str] = {}
    for d in trials:
        if d.global_batch < 1:
            raise AllocationError(
                f"trial {d.trial_id!r}: global_batch must be >= 1, got {d.global_batch}"
            )
        for name, value in (
            ("remaining_samples", d.remaining_samples),
            ("sync_s", d.sync_s),
            ("restart_s", d.restart_s),
        ):
            if not (math.isfinite(value) and value >= 0):
                raise AllocationError(
                    f"trial {d.trial_id!r}: {name} must be a finite number >= 0, got {value!r}"
                )
        for sid in d.current:
            if sid in holder:
                raise AllocationError(
                    f"slot {sid!r} is held by both trial {holder[sid]!r} and {d.trial_id!r}; "
                    "a worker belongs to one trial"
                )
            holder[sid] = d.trial_id
