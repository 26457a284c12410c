"""The local search under :func:`~raytrain_hetero.core.trial_allocation.decide_trial_allocation`.

Per-type worker counts of every live trial, the free pool and each trial's predicted
completion (:class:`SearchState`); moves (add a free worker, take one from another trial,
release one) applied while they lower the search's (makespan, sum of completions) by more
than a slack (:func:`local_search`); giving trials without a worker one
(:func:`seed_one_each`); which new trials start (:func:`admit`); counts to concrete slots
(:func:`map_to_slots`).

A move is priced as :class:`~raytrain_hetero.core.move_pricing.MovePrice` says: a trial that
held workers and holds others pays its restart and has its predicted run charged its error
margin (``(1 + restart_error)`` and ``(1 + step_error)`` times), and delays every other trial
by ``contention * restart_s`` (its restart's processes slow them). The objective is kept in
O(1) per evaluated move: each trial's key ``done - own`` (its completion less the
contention it inflicts) plus the sum of what every moved trial inflicts.
Pure (stdlib); deterministic: every choice is ordered by (value, index).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

from raytrain_hetero.core.move_pricing import MovePrice
from raytrain_hetero.core.trial_model import (
    EPSILON,
    TrialDemand,
    WorkerSlot,
    run_seconds,
    step_seconds,
    trial_completion,
)
from raytrain_hetero.errors import AllocationError

__all__ = [
    "Counts",
    "SearchState",
    "admit",
    "better",
    "local_search",
    "map_to_slots",
    "normal",
    "plus",
    "seed_one_each",
    "trim",
]

Counts = dict[str, int]


def normal(counts: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """``counts`` as sorted ``(type, n)`` pairs without zeros (comparable, hashable)."""
    return tuple(sorted((t, n) for t, n in counts.items() if n > 0))


def better(a: tuple[float, float], b: tuple[float, float], slack: float) -> bool:
    """``a`` beats ``b`` lexicographically by more than ``slack`` (makespan, then sum)."""
    if a[0] < b[0] - slack:
        return True
    return abs(a[0] - b[0]) <= slack and a[1] < b[1] - slack


def plus(counts: Mapping[str, int], t: str, d: int) -> Counts:
    """``counts`` with ``d`` more workers of type ``t`` (a zero count dropped)."""
    out = dict(counts)
    out[t] = out.get(t, 0) + d
    if out[t] == 0:
        del out[t]
    return out


def trim(counts: Mapping[str, int], cap: int) -> Counts:
    """At most ``cap`` workers of ``counts``, types in name order."""
    out: Counts = {}
    left = cap
    for t in sorted(counts):
        take = min(counts[t], left)
        if take:
            out[t] = take
        left -= take
    return out


class SearchState:
    """Per-type counts of every trial, the free pool, and each trial's priced completion.

    ``done[j]``: trial ``j``'s own predicted completion, a move's restart and error margin
    charged; ``own[j]``: the delay its move inflicts on each other trial (``contention *
    restart_s``, 0 unless it moved). Trial ``j`` ends at ``done[j] - own[j] + shift`` with
    ``shift`` the sum of ``own``.
    """

    def __init__(
        self,
        demands: Sequence[TrialDemand],
        counts: list[Counts],
        free: Counts,
        current: Sequence[Mapping[str, int]],
        cap: int | None,
        price: MovePrice | None = None,
    ) -> None:
        self.demands = demands
        self.counts = counts
        self.free = free
        self.current = [normal(c) for c in current]
        self.cap = cap
        self.price = price or MovePrice()
        self.done: list[float] = []
        self.own: list[float] = []
        for j in range(len(demands)):
            value, own = self.evaluate(j, counts[j])
            self.done.append(value)
            self.own.append(own)
        self._refresh()

    def moved(self, j: int, counts: Mapping[str, int]) -> bool:
        """Trial ``j`` held workers and would hold others (a move, not a start)."""
        return bool(self.current[j]) and normal(counts) != self.current[j]

    def evaluate(self, j: int, counts: Mapping[str, int]) -> tuple[float, float]:
        """``(done, own)`` of trial ``j`` on ``counts`` (see the class docstring)."""
        demand = self.demands[j]
        if not self.moved(j, counts):
            changed = normal(counts) != self.current[j]
            return trial_completion(counts, demand, changed=changed), 0.0
        p = self.price
        value = (
            demand.restart_s * (1.0 + p.restart_error)
            + demand.fixed_s
            + run_seconds(counts, demand) * (1.0 + p.step_error)
        )
        return value, p.contention * demand.restart_s

    def _refresh(self) -> None:
        keys = [(self.done[j] - self.own[j], -j) for j in range(len(self.demands))]
        self.top = [(k, -i) for k, i in heapq.nlargest(3, keys)]
        self.shift = sum(self.own)
        self.key_sum = sum(k for k, _ in keys)

    def objective(self) -> tuple[float, float]:
        """``(makespan, sum of completions)``."""
        return self.objective_if(())

    def objective_if(self, changes: Sequence[tuple[int, float, float]]) -> tuple[float, float]:
        """The objective if each ``(j, done, own)`` of ``changes`` (at most two) applied."""
        n = len(self.demands)
        if n == 0:
            return (0.0, 0.0)
        changed = {j for j, _, _ in changes}
        shift = self.shift + sum(o - self.own[j] for j, _, o in changes)
        latest = next((k for k, i in self.top if i not in changed), -float("inf"))
        for _, value, own in changes:
            latest = max(latest, value - own)
        key_sum = self.key_sum + sum((v - o) - (self.done[j] - self.own[j]) for j, v, o in changes)
        return (latest + shift, key_sum + n * shift)

    def end(self, j: int) -> float:
        """Trial ``j``'s completion, the other moves' contention included."""
        return self.done[j] - self.own[j] + self.shift

    def apply(self, j: int, counts: Counts, value: float, own: float) -> None:
        """Trial ``j`` holds ``counts`` now (``value``, ``own`` from :meth:`evaluate`)."""
        self.counts[j] = counts
        self.done[j] = value
        self.own[j] = own
        self._refresh()


def local_search(state: SearchState, slack: float) -> None:
    """Apply improving moves until none is left (each lowers (makespan, sum) by > slack)."""
    order = range(len(state.demands))
    for _ in range(100_000):  # a safety bound; every move strictly improves
        worst = max(order, key=lambda j: (state.end(j), -j))
        if _improve_trial(state, worst, slack, bottleneck=True):
            continue
        improved = False
        for j in sorted(order, key=lambda j: (-state.end(j), j)):
            if _improve_trial(state, j, slack, bottleneck=False):
                improved = True
                break
        if not improved:
            return


_Move = tuple[tuple[float, float], str, int, Counts, float, float, Counts | None, float, float]


def _improve_trial(state: SearchState, j: int, slack: float, *, bottleneck: bool) -> bool:
    """One improving move for trial ``j``: add a free worker, take one from another trial,
    or release one; the best such move that improves the objective. True if one applied."""
    demand = state.demands[j]
    counts = state.counts[j]
    total = sum(counts.values())
    base = state.objective()
    # (objective, type, donor index (-1: from the free pool, -2: released), counts, done,
    # own, the donor's counts, done and own)
    best: _Move | None = None
    if state.cap is None or total < state.cap:
        for t in sorted(demand.costs):
            grown = plus(counts, t, 1)
            value, own = state.evaluate(j, grown)
            if value >= state.done[j] - EPSILON:
                continue
            if state.free.get(t, 0) > 0:
                obj = state.objective_if(((j, value, own),))
                if better(obj, base, slack) and (best is None or obj < best[0]):
                    best = (obj, t, -1, grown, value, own, None, 0.0, 0.0)
            elif bottleneck:
                # take one worker of type t from a donor that keeps >= 1
                for k in range(len(state.demands)):
                    have = state.counts[k].get(t, 0)
                    if k == j or have == 0 or sum(state.counts[k].values()) <= 1:
                        continue
                    shrunk = plus(state.counts[k], t, -1)
                    donor, donor_own = state.evaluate(k, shrunk)
                    obj = state.objective_if(((j, value, own), (k, donor, donor_own)))
                    if better(obj, base, slack) and (best is None or obj < best[0]):
                        best = (obj, t, k, grown, value, own, shrunk, donor, donor_own)
    if total > 1:
        for t in sorted(counts):
            shrunk = plus(counts, t, -1)
            value, own = state.evaluate(j, shrunk)
            obj = state.objective_if(((j, value, own),))
            if better(obj, base, slack) and (best is None or obj < best[0]):
                best = (obj, t, -2, shrunk, value, own, None, 0.0, 0.0)
    if best is None:
        return False
    _, t, donor_index, new_counts, value, own, donor_counts, donor_value, donor_own = best
    state.apply(j, new_counts, value, own)
    if donor_index == -1:
        state.free[t] -= 1
    elif donor_index == -2:
        state.free[t] = state.free.get(t, 0) + 1
    else:
        assert donor_counts is not None
        state.apply(donor_index, donor_counts, donor_value, donor_own)
    return True


def seed_one_each(demands: Sequence[TrialDemand], counts: list[Counts], free: Counts) -> None:
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
        counts[k] = plus(counts[k], t, -1)
        counts[j] = {t: 1}


def admit(
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
        if options and options[0][0] <= max_slowdown * fastest * (1 + EPSILON):
            free[options[0][1]] -= 1
            placed.append(d)
        else:
            waiting.append(d.trial_id)
    return placed, tuple(waiting)


def map_to_slots(
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
