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
  slots held now.

A trial on ``n_t`` workers of each type ``t`` takes, per step of ``B`` samples carved for the
smallest makespan (continuous relaxation of the integer carving), the level ``T`` with
``sum_t n_t * max(0, T - alpha_t) / beta_t = B``, plus ``sync_s * 2 (N - 1) / N`` for its ``N``
workers (a ring all-reduce; nothing on one worker). So a slow worker adds little speed but a
full share of the exchange: adding it can make a trial slower, and the search never does so.
A trial completes ``restart_s`` (only if its slots change) plus
``remaining_samples / B`` steps from now.

:func:`decide_trial_allocation` minimises the search's makespan (the latest completion), then
the mean completion, charging the restart cost to every trial whose slots change, keeping
at least one worker per live trial. Local search on per-type counts from two starts (the
current holdings, and one best slot per trial), moves: add a free worker, move one worker
between trials, release a worker that slows its trial. The best of the candidates and of the
current holdings wins; the current holdings are kept unless the best is better by more than
``min_gain_s``. Counts are then mapped to slots keeping each trial's current slots first.
Deterministic: every choice is ordered by (value, id).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.placement import selector_matches
from raytrain_hetero.errors import AllocationError

__all__ = [
    "AllocationDecision",
    "ClusterNode",
    "TrialAllocationConfig",
    "TrialAssignment",
    "TrialDemand",
    "WorkerSlot",
    "WorkerType",
    "asha_expected_epochs",
    "cluster_slots",
    "decide_trial_allocation",
    "step_seconds",
    "trial_completion",
]

logger = logging.getLogger(__name__)

# Float resources (fractional CPUs) and objective comparisons use this slack.
_EPSILON = 1e-9


@dataclass(frozen=True)
class WorkerType:
    """A kind of worker: what one needs and which nodes may hold it.

    Attributes:
        name: The type's name (the key of each trial's cost models), e.g. ``"v100"``.
        resources: What one worker of this type takes from its node, e.g. ``{"GPU": 1}``.
        label_selector: Node labels a node needs to hold it (Ray's selector syntax).
    """

    name: str
    resources: Mapping[str, float]
    label_selector: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterNode:
    """One node: its id, labels and the resources the search may use."""

    node_id: str
    resources: Mapping[str, float]
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkerSlot:
    """A place for one worker: ``slot_id`` is ``"<node_id>/<i>"``."""

    slot_id: str
    node_id: str
    worker_type: str


@dataclass(frozen=True)
class TrialDemand:
    """One live trial as the allocator sees it.

    Attributes:
        trial_id: Unique id.
        costs: Per worker type its one-step cost model (the remembered ``cost_models`` entry of
            the trial's model on that type); a type absent here is one the trial cannot use.
        global_batch: Samples per step (``B``), carved over the trial's workers.
        remaining_samples: Samples the trial is expected still to process (>= 0).
        sync_s: Seconds of one full gradient exchange per step (the ring's ``2(N-1)/N`` of it
            is paid on ``N > 1`` workers).
        restart_s: Seconds a change of the trial's workers costs it (checkpoint, new worker
            group, restore), measured.
        current: Slot ids the trial holds now (empty: not started).
    """

    trial_id: str
    costs: Mapping[str, CostModel]
    global_batch: int
    remaining_samples: float
    sync_s: float = 0.0
    restart_s: float = 0.0
    current: tuple[str, ...] = ()


@dataclass(frozen=True)
class TrialAllocationConfig:
    """Settings of :func:`decide_trial_allocation`.

    Attributes:
        min_gain_s: Keep the current holdings unless the new makespan is at least this many
            seconds shorter (or equal makespan and the mean this much shorter).
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
        completion_s: Predicted seconds until it ends (restart included when ``changed``).
        changed: Its slots differ from what it held (it restarts).
        reason: One line: why it holds these workers.
    """

    trial_id: str
    slots: tuple[str, ...]
    counts: tuple[tuple[str, int], ...]
    step_s: float
    completion_s: float
    changed: bool
    reason: str


@dataclass(frozen=True)
class AllocationDecision:
    """The holdings of every live trial.

    Attributes:
        assignments: One per started trial, in the order given.
        free_slots: Slots no trial holds (sorted).
        makespan_s: Latest predicted completion.
        mean_completion_s: Mean predicted completion.
        changed: Some trial's slots changed.
        findings: Warnings about the input (a node no trial can use, ...), one line each.
        reason: One line: why this allocation (kept, or how much better).
        waiting: Trials that held no worker and still wait (no free worker fast enough for
            them, see ``max_start_slowdown``), in the order given.
    """

    assignments: tuple[TrialAssignment, ...]
    free_slots: tuple[str, ...]
    makespan_s: float
    mean_completion_s: float
    changed: bool
    findings: tuple[str, ...]
    reason: str
    waiting: tuple[str, ...] = ()

    def slots_of(self, trial_id: str) -> tuple[str, ...]:
        """The slots ``trial_id`` holds."""
        for a in self.assignments:
            if a.trial_id == trial_id:
                return a.slots
        raise KeyError(trial_id)


# ----------------------------------------------------------------------------- the model


def asha_expected_epochs(
    done: int, max_t: int, grace_period: int, reduction_factor: float
) -> float:
    """Expected epochs still to run of a trial that has run ``done`` under ASHA.

    The epochs up to the next rung are certain; each later segment counts with the probability
    of being promoted at every rung before it, ``1 / reduction_factor`` per rung (ASHA keeps
    the top ``1/eta`` of each rung).
    """
    if done >= max_t:
        return 0.0
    rungs = []
    rung = float(grace_period)
    while rung < max_t:
        rungs.append(rung)
        rung *= reduction_factor
    rungs.append(float(max_t))
    expected, position, weight = 0.0, float(done), 1.0
    for milestone in rungs:
        if milestone <= position:
            continue
        expected += weight * (milestone - position)
        position = milestone
        weight /= reduction_factor
    return expected


def _level(counts: Mapping[str, int], costs: Mapping[str, CostModel], batch: int) -> float:
    """The carved step's compute level ``T``: ``sum n_t max(0, T - a_t) / b_t = batch``."""
    items = sorted(
        ((costs[t].alpha, costs[t].beta, n) for t, n in counts.items() if n > 0),
        key=lambda x: x[0],
    )
    if not items:
        return math.inf
    rate = 0.0  # sum n / beta of the types active below the level
    offset = 0.0  # sum n * alpha / beta
    for i, (alpha, beta, n) in enumerate(items):
        rate += n / beta
        offset += n * alpha / beta
        level = (batch + offset) / rate
        upper = items[i + 1][0] if i + 1 < len(items) else math.inf
        if level <= upper:
            return level
    return (batch + offset) / rate  # pragma: no cover - the last type has no upper bound


def step_seconds(counts: Mapping[str, int], demand: TrialDemand) -> float:
    """Predicted seconds of one step of ``demand`` on ``counts`` workers per type."""
    workers = sum(n for n in counts.values() if n > 0)
    if workers == 0:
        return math.inf
    sync = demand.sync_s * 2.0 * (workers - 1) / workers
    return _level(counts, demand.costs, demand.global_batch) + sync


def trial_completion(counts: Mapping[str, int], demand: TrialDemand, *, changed: bool) -> float:
    """Predicted seconds until ``demand`` ends on ``counts`` (plus its restart if ``changed``)."""
    if demand.remaining_samples <= 0:
        return demand.restart_s if changed else 0.0
    steps = demand.remaining_samples / demand.global_batch
    return (demand.restart_s if changed else 0.0) + steps * step_seconds(counts, demand)


# ----------------------------------------------------------------------------- the cluster


def cluster_slots(
    nodes: Sequence[ClusterNode], types: Sequence[WorkerType]
) -> tuple[tuple[WorkerSlot, ...], tuple[str, ...]]:
    """The worker slots ``nodes`` offer, and findings about unusable nodes.

    A node holds workers of the first type in ``types`` whose label selector it matches and
    whose resources it has, as many as its resources allow (``"<node_id>/<i>"``).

    Raises:
        AllocationError: Duplicate node ids or type names, or a type asking for nothing.
    """
    _unique([n.node_id for n in nodes], "node id")
    _unique([t.name for t in types], "worker type name")
    for t in types:
        if not any(v > 0 for v in t.resources.values()):
            raise AllocationError(
                f"worker type {t.name!r} asks for no resources ({dict(t.resources)}); give it "
                "what one worker takes, e.g. {'GPU': 1}"
            )
    slots: list[WorkerSlot] = []
    findings: list[str] = []
    for node in sorted(nodes, key=lambda n: n.node_id):
        for t in types:
            if not selector_matches(t.label_selector, node.labels):
                continue
            count = min(
                math.floor((node.resources.get(k, 0.0) + _EPSILON) / v)
                for k, v in t.resources.items()
                if v > 0
            )
            if count >= 1:
                slots.extend(
                    WorkerSlot(f"{node.node_id}/{i}", node.node_id, t.name) for i in range(count)
                )
                break
        else:
            findings.append(
                f"node {node.node_id} (labels {dict(node.labels)}, resources "
                f"{dict(node.resources)}) holds no worker type: it stays idle"
            )
    return tuple(slots), tuple(findings)


def _unique(ids: Iterable[str], what: str) -> None:
    seen: set[str] = set()
    for i in ids:
        if i in seen:
            raise AllocationError(f"duplicate {what} {i!r}; every {what} must be unique")
        seen.add(i)


# ----------------------------------------------------------------------------- the search


Counts = dict[str, int]


class _State:
    """Per-type counts of every trial, the free pool and each trial's completion."""

    def __init__(
        self,
        demands: Sequence[TrialDemand],
        counts: list[Counts],
        free: Counts,
        current: list[Counts],
        cap: int | None,
    ) -> None:
        self.demands = demands
        self.counts = counts
        self.free = free
        self.current = current
        self.cap = cap
        self.done = [self._completion(j, counts[j]) for j in range(len(demands))]

    def _completion(self, j: int, counts: Counts) -> float:
        changed = _normal(counts) != _normal(self.current[j])
        return trial_completion(counts, self.demands[j], changed=changed)

    def objective(self) -> tuple[float, float]:
        return (max(self.done, default=0.0), sum(self.done))

    def with_counts(self, j: int, counts: Counts) -> float:
        return self._completion(j, counts)

    def apply(self, j: int, counts: Counts, value: float) -> None:
        self.counts[j] = counts
        self.done[j] = value


def _normal(counts: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted((t, n) for t, n in counts.items() if n > 0))


def _better(a: tuple[float, float], b: tuple[float, float], slack: float) -> bool:
    """``a`` beats ``b`` lexicographically by more than ``slack`` (makespan, then sum)."""
    if a[0] < b[0] - slack:
        return True
    return abs(a[0] - b[0]) <= slack and a[1] < b[1] - slack


def _plus(counts: Counts, t: str, d: int) -> Counts:
    out = dict(counts)
    out[t] = out.get(t, 0) + d
    if out[t] == 0:
        del out[t]
    return out


def _usable(demand: TrialDemand, t: str) -> bool:
    return t in demand.costs


def _local_search(state: _State, slack: float) -> None:
    """Apply improving moves until none is left (each lowers (makespan, sum) by > slack)."""
    n = len(state.demands)
    order = range(n)
    for _ in range(100_000):  # a safety bound; every move strictly improves
        worst = max(order, key=lambda j: (state.done[j], -j))
        if _improve_trial(state, worst, slack, bottleneck=True):
            continue
        improved = False
        for j in sorted(order, key=lambda j: (-state.done[j], j)):
            if _improve_trial(state, j, slack, bottleneck=False):
                improved = True
                break
        if not improved:
            return


def _improve_trial(state: _State, j: int, slack: float, *, bottleneck: bool) -> bool:
    """One improving move for trial ``j``: add a free worker, take one from another trial,
    or release one; the best such move that improves the objective. True if one applied."""
    demand = state.demands[j]
    counts = state.counts[j]
    total = sum(counts.values())
    base = state.objective()
    best: tuple[tuple[float, float], int, str, int, Counts, float, Counts | None, float] | None = (
        None
    )
    others_max = max((state.done[k] for k in range(len(state.demands)) if k != j), default=0.0)
    others_sum = base[1] - state.done[j]
    types = sorted(demand.costs)
    if state.cap is None or total < state.cap:
        for t in types:
            grown = _plus(counts, t, 1)
            value = state.with_counts(j, grown)
            if value >= state.done[j] - _EPSILON:
                continue
            if state.free.get(t, 0) > 0:
                obj = (max(others_max, value), others_sum + value)
                if _better(obj, base, slack) and (best is None or obj < best[0]):
                    best = (obj, j, t, -1, grown, value, None, 0.0)
            elif bottleneck:
                # take one worker of type t from a donor that keeps >= 1 and stays faster
                top = sorted(range(len(state.demands)), key=lambda i: -state.done[i])[:3]
                for k in range(len(state.demands)):
                    have = state.counts[k].get(t, 0)
                    if k == j or have == 0 or sum(state.counts[k].values()) <= 1:
                        continue
                    shrunk = _plus(state.counts[k], t, -1)
                    donor = state.with_counts(k, shrunk)
                    rest = next((state.done[i] for i in top if i not in (j, k)), 0.0)
                    obj = (
                        max(value, donor, rest),
                        base[1] - state.done[j] - state.done[k] + value + donor,
                    )
                    if _better(obj, base, slack) and (best is None or obj < best[0]):
                        best = (obj, j, t, k, grown, value, shrunk, donor)
    if total > 1:
        for t in sorted(counts):
            shrunk = _plus(counts, t, -1)
            value = state.with_counts(j, shrunk)
            obj = (max(others_max, value), others_sum + value)
            if _better(obj, base, slack) and (best is None or obj < best[0]):
                best = (obj, j, t, -2, shrunk, value, None, 0.0)
    if best is None:
        return False
    _, _, t, donor_index, new_counts, value, donor_counts, donor_value = best
    state.apply(j, new_counts, value)
    if donor_index == -1:
        state.free[t] -= 1
    elif donor_index == -2:
        state.free[t] = state.free.get(t, 0) + 1
    else:
        assert donor_counts is not None
        state.apply(donor_index, donor_counts, donor_value)
    return True


def _seed_one_each(
    demands: Sequence[TrialDemand], counts: list[Counts], free: Counts, current: list[Counts]
) -> None:
    """Give every trial without a worker one: its best free type, else one taken from the
    trial with the most workers of a usable type (the largest trials first)."""
    order = sorted(
        range(len(demands)), key=lambda j: (-demands[j].remaining_samples, demands[j].trial_id)
    )
    for j in order:
        if sum(counts[j].values()) > 0:
            continue
        options = sorted(
            (
                trial_completion({t: 1}, demands[j], changed=True),
                t,
            )
            for t in demands[j].costs
            if free.get(t, 0) > 0
        )
        if options:
            t = options[0][1]
            free[t] -= 1
            counts[j] = {t: 1}
            continue
        donors = sorted(
            (
                -sum(counts[k].values()),
                demands[k].trial_id,
                k,
                t,
            )
            for k in range(len(demands))
            for t in sorted(counts[k])
            if t in demands[j].costs and sum(counts[k].values()) > 1
        )
        if not donors:
            raise AllocationError(
                f"trial {demands[j].trial_id!r} gets no worker: every slot of the types it can "
                f"use ({', '.join(sorted(demands[j].costs))}) is the only worker of another "
                "trial; start fewer trials at once"
            )
        _, _, k, t = donors[0]
        counts[k] = _plus(counts[k], t, -1)
        counts[j] = {t: 1}


def decide_trial_allocation(
    slots: Sequence[WorkerSlot],
    trials: Sequence[TrialDemand],
    config: TrialAllocationConfig = TrialAllocationConfig(),
) -> AllocationDecision:
    """Which slots each live trial holds (see the module docstring for the model).

    Args:
        slots: The cluster's worker slots (:func:`cluster_slots`).
        trials: The live trials; each needs a cost model for at least one offered type.
        config: Hysteresis and caps.

    Returns:
        The decision; a slot type no trial can use is reported in ``findings``; trials that
        hold nothing yet and find no fast enough free worker are ``waiting``.

    Raises:
        AllocationError: A trial no offered slot can hold (one line naming it and the types
            offered), more running trials than slots, a slot held twice, or invalid numbers.
    """
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
    trials, waiting = _admit(slot_by_id, offered, trials, config.max_start_slowdown)

    # current holdings on slots that still exist and that the trial can use
    current: list[Counts] = []
    for demand in trials:
        holding: Counts = {}
        for sid in demand.current:
            known = slot_by_id.get(sid)
            if known is not None and known.worker_type in demand.costs:
                holding = _plus(holding, known.worker_type, 1)
        current.append(holding)
    current_exact = [
        all(sid in slot_by_id and slot_by_id[sid].worker_type in d.costs for sid in d.current)
        and bool(d.current)
        for d in trials
    ]

    candidates: list[_State] = []
    for start in ("current", "fresh"):
        counts = [dict(c) for c in current] if start == "current" else [{} for _ in trials]
        if cap is not None:
            counts = [_trim(c, cap) for c in counts]
        free = dict(offered)
        for c in counts:
            for t, n in c.items():
                free[t] -= n
        _seed_one_each(trials, counts, free, current)
        state = _State(trials, counts, free, current, cap)
        _local_search(state, _EPSILON)
        candidates.append(state)
    best = min(candidates, key=lambda s: (s.objective(), _key(s)))

    keep = all(current_exact) and (cap is None or all(len(d.current) <= cap for d in trials))
    if keep:
        kept_state = _State(trials, [dict(c) for c in current], {}, current, cap)
        kept = kept_state.objective()
        if not _better(best.objective(), kept, max(config.min_gain_s, _EPSILON)):
            assignments = tuple(
                TrialAssignment(
                    trial_id=d.trial_id,
                    slots=tuple(sorted(d.current)),
                    counts=_normal(current[j]),
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
                reason="kept the current holdings",
                waiting=waiting,
            )
        reason = (
            f"makespan {kept[0]:.4g} s -> {best.objective()[0]:.4g} s, mean completion "
            f"{kept[1] / len(trials):.4g} s -> {best.objective()[1] / len(trials):.4g} s "
            "(restarts charged)"
        )
    else:
        reason = "trials without (valid) workers placed; makespan minimised"

    chosen = _map_to_slots(slots, trials, best.counts)
    assignments_list = []
    held_all: set[str] = set()
    for j, d in enumerate(trials):
        mine = chosen[j]
        held_all.update(mine)
        changed = set(mine) != set(d.current)
        value = trial_completion(best.counts[j], d, changed=changed)
        assignments_list.append(
            TrialAssignment(
                trial_id=d.trial_id,
                slots=tuple(sorted(mine)),
                counts=_normal(best.counts[j]),
                step_s=step_seconds(best.counts[j], d),
                completion_s=value,
                changed=changed,
                reason=_why(best.counts[j], current[j], d),
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
    )


def _admit(
    slot_by_id: Mapping[str, WorkerSlot],
    offered: Counts,
    trials: Sequence[TrialDemand],
    max_slowdown: float,
) -> tuple[list[TrialDemand], tuple[str, ...]]:
    """The trials to place (every running one, and the new ones that get a fast enough free
    worker, in the order given) and the new ones that wait."""
    free = dict(offered)
    for d in trials:
        for sid in d.current:
            known = slot_by_id.get(sid)
            if known is not None and known.worker_type in d.costs:
                free[known.worker_type] -= 1
    placed: list[TrialDemand] = []
    waiting: list[str] = []
    for d in trials:
        if d.current:
            placed.append(d)
            continue
        usable = sorted((step_seconds({t: 1}, d), t) for t in d.costs if t in offered)
        fastest = usable[0][0]
        options = [(step, t) for step, t in usable if free.get(t, 0) > 0]
        if options and options[0][0] <= max_slowdown * fastest * (1 + _EPSILON):
            free[options[0][1]] -= 1
            placed.append(d)
        else:
            waiting.append(d.trial_id)
    return placed, tuple(waiting)


def _key(state: _State) -> tuple[tuple[tuple[str, int], ...], ...]:
    return tuple(_normal(c) for c in state.counts)


def _trim(counts: Counts, cap: int) -> Counts:
    out: Counts = {}
    left = cap
    for t in sorted(counts):
        take = min(counts[t], left)
        if take:
            out[t] = take
        left -= take
    return out


def _why(new: Counts, old: Counts, demand: TrialDemand) -> str:
    if _normal(new) == _normal(old):
        return "kept its workers"
    shown = ", ".join(f"{n} {t}" for t, n in _normal(new))
    if not old:
        return f"started on {shown}"
    was = ", ".join(f"{n} {t}" for t, n in _normal(old))
    return f"{was} -> {shown}: ends sooner by more than its restart ({demand.restart_s:.3g} s)"


def _map_to_slots(
    slots: Sequence[WorkerSlot], trials: Sequence[TrialDemand], counts: Sequence[Counts]
) -> list[list[str]]:
    """Concrete slots for per-type counts: each trial keeps its current slots first, then
    takes free ones on nodes it already uses, then on the nodes with the most free slots."""
    slot_by_id = {s.slot_id: s for s in slots}
    taken: set[str] = set()
    chosen: list[list[str]] = [[] for _ in trials]
    need: list[Counts] = [dict(c) for c in counts]
    for j, d in enumerate(trials):
        for sid in sorted(d.current):
            s = slot_by_id.get(sid)
            if s is None or sid in taken or need[j].get(s.worker_type, 0) <= 0:
                continue
            chosen[j].append(sid)
            taken.add(sid)
            need[j][s.worker_type] -= 1
    by_node: dict[str, list[str]] = {}
    for s in sorted(slots, key=lambda s: s.slot_id):
        if s.slot_id not in taken:
            by_node.setdefault(s.node_id, []).append(s.slot_id)
    for j in sorted(range(len(trials)), key=lambda j: trials[j].trial_id):
        for t in sorted(need[j]):
            while need[j][t] > 0:
                mine = {slot_by_id[sid].node_id for sid in chosen[j]}
                nodes = [
                    n
                    for n, free in by_node.items()
                    if free and slot_by_id[free[0]].worker_type == t
                ]
                node = min(nodes, key=lambda n: (n not in mine, -len(by_node[n]), n))
                sid = by_node[node].pop(0)
                chosen[j].append(sid)
                taken.add(sid)
                need[j][t] -= 1
    return chosen


def _validate(slots: Sequence[WorkerSlot], trials: Sequence[TrialDemand]) -> None:
    _unique([s.slot_id for s in slots], "slot id")
    _unique([d.trial_id for d in trials], "trial id")
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
