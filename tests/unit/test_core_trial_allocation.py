"""Properties of raytrain_hetero.core.trial_allocation: the holdings of a search's live trials."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.trial_allocation import (
    ClusterNode,
    TrialAllocationConfig,
    TrialDemand,
    WorkerSlot,
    WorkerType,
    asha_expected_epochs,
    cluster_slots,
    decide_trial_allocation,
    step_seconds,
    trial_completion,
)
from raytrain_hetero.errors import AllocationError

PROPERTY_SETTINGS = settings(max_examples=120, deadline=None)
TYPES = ("fast", "mid", "slow")


@st.composite
def problems(draw, max_slots_per_type: int = 4, max_trials: int = 6):
    """Slots of up to three types on a few nodes, and live trials, some already holding slots."""
    slots = []
    for t in TYPES:
        for i in range(draw(st.integers(0, max_slots_per_type))):
            node = f"{t}-node{i // 2}"
            slots.append(WorkerSlot(f"{node}/{i % 2}", node, t))
    if not slots:
        slots.append(WorkerSlot("fast-node0/0", "fast-node0", "fast"))
    n_trials = draw(st.integers(1, min(max_trials, len(slots))))
    free = [s.slot_id for s in slots]
    trials = []
    for j in range(n_trials):
        costs = {
            t: CostModel(
                draw(st.floats(0.0, 0.05)), draw(st.floats(1e-4, 1e-2)) * (1 + 3 * TYPES.index(t))
            )
            for t in TYPES
        }
        held: tuple[str, ...] = ()
        if free and draw(st.booleans()):
            k = draw(st.integers(1, max(1, min(3, len(free) - (n_trials - j - 1)))))
            held, free = tuple(free[:k]), free[k:]
        trials.append(
            TrialDemand(
                trial_id=f"t{j}",
                costs=costs,
                global_batch=draw(st.integers(8, 512)),
                remaining_samples=draw(st.floats(0.0, 1e6)),
                sync_s=draw(st.floats(0.0, 0.05)),
                restart_s=draw(st.floats(0.0, 60.0)),
                current=held,
            )
        )
    return slots, trials


def held_by(decision):
    return {a.trial_id: set(a.slots) for a in decision.assignments}


def holding(trials, decision):
    """The started trials of ``decision`` with ``current`` set to what it gave them."""
    given = {a.trial_id: a.slots for a in decision.assignments}
    return [replace(t, current=given[t.trial_id]) for t in trials if t.trial_id in given]


def counts_of(slot_ids, slots):
    kinds = {s.slot_id: s.worker_type for s in slots}
    out: dict[str, int] = {}
    for sid in slot_ids:
        out[kinds[sid]] = out.get(kinds[sid], 0) + 1
    return out


@PROPERTY_SETTINGS
@given(problems())
def test_each_worker_one_trial_each_trial_one_worker(problem):
    slots, trials = problem
    decision = decide_trial_allocation(slots, trials)
    seen: set[str] = set()
    ids = {s.slot_id for s in slots}
    for a in decision.assignments:
        assert a.slots, f"{a.trial_id} holds no worker"
        assert set(a.slots) <= ids
        assert not seen & set(a.slots), "a worker held by two trials"
        seen |= set(a.slots)
    assert set(decision.free_slots) == ids - seen
    started = [a.trial_id for a in decision.assignments]
    assert sorted(started + list(decision.waiting)) == sorted(t.trial_id for t in trials)
    assert started == [t.trial_id for t in trials if t.trial_id in set(started)]
    # only trials that held nothing may wait
    assert all(not t.current for t in trials if t.trial_id in decision.waiting)


@PROPERTY_SETTINGS
@given(problems())
def test_deterministic(problem):
    slots, trials = problem
    assert decide_trial_allocation(slots, trials) == decide_trial_allocation(slots, trials)


@PROPERTY_SETTINGS
@given(problems())
def test_nothing_changed_nothing_moves(problem):
    """Decide, then decide again on the holdings it chose: the same holdings, no restart."""
    slots, trials = problem
    first = decide_trial_allocation(slots, trials)
    second = decide_trial_allocation(slots, holding(trials, first))
    assert not second.changed
    assert held_by(second) == held_by(first)


@PROPERTY_SETTINGS
@given(problems())
def test_never_worse_than_the_current_holdings(problem):
    """When every trial holds workers, the decision's makespan (restarts charged) is at most
    that of keeping them."""
    slots, trials = problem
    first = decide_trial_allocation(slots, trials)
    held = holding(trials, first)
    # perturb: the work left changes (some trials advanced), so a new split may pay off
    moved = [
        replace(t, remaining_samples=t.remaining_samples * (1 + j % 3)) for j, t in enumerate(held)
    ]
    decision = decide_trial_allocation(slots, moved)
    keep = max(trial_completion(counts_of(t.current, slots), t, changed=False) for t in moved)
    assert decision.makespan_s <= keep + 1e-9


@PROPERTY_SETTINGS
@given(problems())
def test_never_worse_than_one_best_worker_each(problem):
    """Fresh start (nobody holds anything): at most the makespan of giving each trial, largest
    first, its best free worker (a fixed split of one worker per trial)."""
    slots, trials = problem
    fresh = [replace(t, current=()) for t in trials]
    everyone = TrialAllocationConfig(max_start_slowdown=1e12)  # no trial waits
    decision = decide_trial_allocation(slots, fresh, everyone)
    assert not decision.waiting
    free = {t: sum(1 for s in slots if s.worker_type == t) for t in TYPES}
    worst = 0.0
    for t in sorted(fresh, key=lambda d: (-d.remaining_samples, d.trial_id)):
        best = min(
            (trial_completion({k: 1}, t, changed=True), k) for k in TYPES if free.get(k, 0) > 0
        )
        free[best[1]] -= 1
        worst = max(worst, best[0])
    assert decision.makespan_s <= worst + 1e-9


@PROPERTY_SETTINGS
@given(problems())
def test_reported_figures_are_the_model(problem):
    slots, trials = problem
    decision = decide_trial_allocation(slots, trials)
    by_id = {t.trial_id: t for t in trials}
    for a in decision.assignments:
        t = by_id[a.trial_id]
        counts = counts_of(a.slots, slots)
        assert dict(a.counts) == counts
        assert a.changed == (set(a.slots) != set(t.current))
        assert a.completion_s == pytest.approx(trial_completion(counts, t, changed=a.changed))
    assert decision.makespan_s == pytest.approx(max(a.completion_s for a in decision.assignments))


@PROPERTY_SETTINGS
@given(problems(), st.integers(1, 3))
def test_cap_respected(problem, cap):
    slots, trials = problem
    decision = decide_trial_allocation(
        slots, trials, TrialAllocationConfig(max_workers_per_trial=cap)
    )
    assert all(1 <= len(a.slots) <= cap for a in decision.assignments)


def test_step_model_carves_and_pays_the_exchange():
    fast, slow = CostModel(0.01, 0.001), CostModel(0.01, 0.004)
    t = TrialDemand("a", {"fast": fast, "slow": slow}, 100, 1e4, sync_s=0.05)
    assert step_seconds({"fast": 1}, t) == pytest.approx(0.11)
    # two workers: level T with (T - .01)/.001 + (T - .01)/.004 = 100 -> T = .09, + 0.05
    assert step_seconds({"fast": 1, "slow": 1}, t) == pytest.approx(0.09 + 0.05)
    # a slow worker whose exchange costs more than it adds is not taken
    slots = [WorkerSlot("f/0", "f", "fast"), WorkerSlot("s/0", "s", "slow")]
    decision = decide_trial_allocation(slots, [t])
    assert decision.assignments[0].slots == ("f/0",)


def test_freed_workers_go_to_the_trial_that_needs_them():
    cost = CostModel(0.0, 0.001)
    slots = [WorkerSlot(f"n{i}/0", f"n{i}", "gpu") for i in range(4)]
    big = TrialDemand("big", {"gpu": cost}, 64, 1e6, restart_s=1.0, current=("n0/0",))
    small = TrialDemand("small", {"gpu": cost}, 64, 1e3, restart_s=1.0, current=("n1/0",))
    decision = decide_trial_allocation(slots, [big, small])
    assert decision.slots_of("big") == ("n0/0", "n2/0", "n3/0")
    assert decision.slots_of("small") == ("n1/0",)
    assert not decision.assignments[1].changed


def test_restart_cost_holds_back_a_small_gain():
    cost = CostModel(0.0, 0.001)
    slots = [WorkerSlot(f"n{i}/0", f"n{i}", "gpu") for i in range(2)]
    # one more worker saves half of 0.1 s; the restart costs 10 s: kept
    trial = TrialDemand("a", {"gpu": cost}, 10, 1000, restart_s=10.0, current=("n0/0",))
    decision = decide_trial_allocation(slots, [trial])
    assert not decision.changed and decision.reason.startswith("kept the current holdings")
    # no change pays its restart: the search found none, and says so
    assert decision.gain_s == 0.0 and decision.cost_s == 0.0
    cheap = replace(trial, restart_s=0.01)
    assert decide_trial_allocation(slots, [cheap]).changed


def test_trial_that_fits_no_node_is_one_clear_line():
    slots = [WorkerSlot("n0/0", "n0", "v100")]
    trial = TrialDemand("cpu-only", {"cpu": CostModel(0.0, 0.01)}, 8, 100.0)
    with pytest.raises(AllocationError, match="trial 'cpu-only' fits no node") as info:
        decide_trial_allocation(slots, [trial])
    assert "\n" not in str(info.value)


def test_unusable_worker_type_is_a_finding_not_an_error():
    slots = [WorkerSlot("g/0", "g", "v100"), WorkerSlot("c/0", "c", "cpu")]
    trial = TrialDemand("a", {"v100": CostModel(0.0, 0.001)}, 8, 100.0)
    decision = decide_trial_allocation(slots, [trial])
    assert decision.free_slots == ("c/0",)
    assert len(decision.findings) == 1 and "'cpu'" in decision.findings[0]


def test_bad_input_is_refused():
    slot = WorkerSlot("n0/0", "n0", "gpu")
    cost = {"gpu": CostModel(0.0, 0.001)}
    with pytest.raises(AllocationError, match="2 running trials but 1 worker slots"):
        decide_trial_allocation(
            [slot],
            [
                TrialDemand("a", cost, 8, 1, current=("gone/0",)),
                TrialDemand("b", cost, 8, 1, current=("gone/1",)),
            ],
        )
    with pytest.raises(AllocationError, match="max_start_slowdown"):
        decide_trial_allocation(
            [slot], [TrialDemand("a", cost, 8, 1)], TrialAllocationConfig(max_start_slowdown=0.5)
        )
    with pytest.raises(AllocationError, match="held by both"):
        decide_trial_allocation(
            [slot, WorkerSlot("n1/0", "n1", "gpu")],
            [
                TrialDemand("a", cost, 8, 1, current=("n0/0",)),
                TrialDemand("b", cost, 8, 1, current=("n0/0",)),
            ],
        )
    with pytest.raises(AllocationError, match="remaining_samples"):
        decide_trial_allocation([slot], [TrialDemand("a", cost, 8, math.nan)])
    with pytest.raises(AllocationError, match="duplicate trial id"):
        decide_trial_allocation(
            [slot, WorkerSlot("n1/0", "n1", "gpu")],
            [TrialDemand("a", cost, 8, 1), TrialDemand("a", cost, 8, 1)],
        )


def test_a_node_that_left_frees_its_trial_to_move():
    cost = {"gpu": CostModel(0.0, 0.001)}
    slots = [WorkerSlot("n1/0", "n1", "gpu")]
    trial = TrialDemand("a", cost, 8, 100.0, restart_s=5.0, current=("n0/0",))  # n0 left
    decision = decide_trial_allocation(slots, [trial])
    assert decision.slots_of("a") == ("n1/0",) and decision.changed


def test_cluster_slots_from_labels_and_resources():
    types = [
        WorkerType("v100", {"GPU": 1}, {"accelerator": "v100"}),
        WorkerType("cpu", {"CPU": 8}, {"accelerator": "!v100"}),
    ]
    nodes = [
        ClusterNode("b", {"CPU": 16, "GPU": 0}, {"accelerator": "none"}),
        ClusterNode("a", {"CPU": 32, "GPU": 4}, {"accelerator": "v100"}),
        ClusterNode("c", {"CPU": 4}, {"accelerator": "none"}),
    ]
    slots, findings = cluster_slots(nodes, types)
    assert [s.slot_id for s in slots] == ["a/0", "a/1", "a/2", "a/3", "b/0", "b/1"]
    assert {s.worker_type for s in slots[:4]} == {"v100"}
    assert len(findings) == 1 and findings[0].startswith("node c ")
    with pytest.raises(AllocationError, match="duplicate node id"):
        cluster_slots([nodes[0], nodes[0]], types)


def test_asha_expected_epochs():
    # rungs 1, 3, 9 and max_t 27, eta 3: from 0: 1 + 2/3 + 6/9 + 18/27
    assert asha_expected_epochs(0, 27, 1, 3) == pytest.approx(1 + 2 / 3 + 6 / 9 + 18 / 27)
    assert asha_expected_epochs(3, 27, 1, 3) == pytest.approx(6 + 18 / 3)
    assert asha_expected_epochs(27, 27, 1, 3) == 0.0


def test_a_new_trial_waits_rather_than_start_on_a_far_slower_worker():
    fast, slow = CostModel(0.0, 0.001), CostModel(0.0, 0.02)  # 20x slower
    slots = [WorkerSlot("g/0", "g", "gpu"), WorkerSlot("c/0", "c", "cpu")]
    costs = {"gpu": fast, "cpu": slow}
    running = TrialDemand("a", costs, 8, 1e5, current=("g/0",))
    new = TrialDemand("b", costs, 8, 1e5)
    decision = decide_trial_allocation(slots, [running, new])
    assert decision.waiting == ("b",) and [a.trial_id for a in decision.assignments] == ["a"]
    # more new trials than slots: the extra ones wait (no error)
    many = [TrialDemand(f"n{i}", {"gpu": fast}, 8, 1e5) for i in range(3)]
    decision = decide_trial_allocation(slots, many)
    assert decision.waiting == ("n1", "n2")
    lenient = TrialAllocationConfig(max_start_slowdown=25.0)
    assert decide_trial_allocation(slots, [running, new], lenient).waiting == ()


@st.composite
def clusters(draw):
    kinds = ("a100", "v100", "none")
    types = [
        WorkerType("a100", {"GPU": 1, "CPU": draw(st.integers(1, 4))}, {"acc": "a100"}),
        WorkerType("v100", {"GPU": draw(st.sampled_from([0.5, 1, 2]))}, {"acc": "v100"}),
        WorkerType("cpu", {"CPU": draw(st.integers(1, 16))}, {}),
    ]
    nodes = [
        ClusterNode(
            f"n{i}",
            {"CPU": draw(st.integers(0, 64)), "GPU": draw(st.integers(0, 8))},
            {"acc": draw(st.sampled_from(kinds))},
        )
        for i in range(draw(st.integers(1, 8)))
    ]
    return nodes, types


@PROPERTY_SETTINGS
@given(clusters())
def test_cluster_slots_respect_resources_and_labels(cluster):
    nodes, types = cluster
    slots, findings = cluster_slots(nodes, types)
    by_type = {t.name: t for t in types}
    for node in nodes:
        mine = [s for s in slots if s.node_id == node.node_id]
        assert len({s.worker_type for s in mine}) <= 1  # one type per node
        if not mine:
            assert any(f.startswith(f"node {node.node_id} ") for f in findings)
            continue
        kind = by_type[mine[0].worker_type]
        assert all(v == node.labels.get(k) for k, v in kind.label_selector.items())
        for resource, need in kind.resources.items():
            assert len(mine) * need <= node.resources.get(resource, 0) + 1e-9
    assert len({s.slot_id for s in slots}) == len(slots)


@PROPERTY_SETTINGS
@given(problems())
def test_a_trial_whose_counts_stay_keeps_its_slots(problem):
    """Whatever else moves, a trial given as many workers of each type as it holds keeps
    exactly the slots it holds (no needless restart)."""
    slots, trials = problem
    decision = decide_trial_allocation(slots, trials)
    by_id = {t.trial_id: t for t in trials}
    for a in decision.assignments:
        current = by_id[a.trial_id].current
        if current and dict(a.counts) == counts_of(current, slots):
            assert set(a.slots) == set(current) and not a.changed
