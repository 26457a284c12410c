"""The admission decision: a worker that costs more than it adds is left out (pure core)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytrain_hetero.core.admission import (
    decide_admission,
    greedy_order,
    group_samples_per_second,
    kept_slots,
)
from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.errors import AllocationError

B = 48
FAST = CostModel(alpha=0.002, beta=0.001)  # 1000 samples/s


def test_a_very_slow_worker_behind_a_delayed_collective_is_left_out():
    costs = [FAST, FAST, CostModel(alpha=0.002, beta=0.02)]  # the third: 20x slower
    # Measured all-reduce of the k fastest: 2 ms for the two fast ones, 300 ms with the slow link.
    decision = decide_admission(B, costs, collective_s=[0.0, 0.002, 0.302], names=["a", "b", "c"])
    assert decision.admitted == (0, 1) and decision.excluded == (2,)
    slow = decision.workers[2]
    assert not slow.admitted and slow.order == 2
    assert slow.with_samples_per_s < slow.without_samples_per_s
    assert "would lower the group" in slow.reason
    assert decision.admitted_samples_per_s > decision.all_samples_per_s
    # The numbers are the model's: B / (makespan + collective).
    assert decision.admitted_samples_per_s == pytest.approx(B / (0.002 + 0.001 * 24 + 0.002))
    assert "leave out c (rank 2)" in decision.summary()


def test_a_merely_slow_worker_is_kept():
    costs = [FAST, FAST, CostModel(alpha=0.002, beta=0.002)]  # half speed
    decision = decide_admission(B, costs, collective_s=[0.0, 0.002, 0.003])
    assert decision.excluded == ()
    half = decision.workers[2]
    assert half.admitted and half.with_samples_per_s > half.without_samples_per_s


def test_equal_workers_are_all_kept():
    decision = decide_admission(B, [FAST] * 4, collective_s=[0.0, 0.002, 0.003, 0.003])
    assert decision.excluded == () and decision.admitted == (0, 1, 2, 3)
    assert [w.order for w in decision.workers] == [0, 1, 2, 3]  # ties by rank
    assert "all 4 workers" in decision.summary()


def test_a_collective_that_dwarfs_compute_leaves_even_an_equal_worker_out():
    decision = decide_admission(B, [FAST, FAST], collective_s=[0.0, 0.1])
    assert decision.admitted == (0,)


def test_a_worker_needed_for_the_batch_to_fit_is_admitted():
    # The fast worker alone may hold 20 samples: without the slow one no plan of 48 fits.
    costs = [FAST, CostModel(alpha=0.0, beta=0.05)]
    assert group_samples_per_second(B, [FAST], collective_s=0.0, caps=[20]) == 0.0
    decision = decide_admission(B, costs, collective_s=[0.0, 0.5], caps=[20, None])
    assert decision.admitted == (0, 1)
    # A capped worker's speed alone is at its cap, not at the whole batch it cannot hold.
    fast = next(w for w in decision.workers if w.rank == 0)
    assert fast.alone_samples_per_s == pytest.approx(20 / FAST.time(20))


def test_order_is_fastest_first_and_slower_ones_follow_an_exclusion():
    costs = [CostModel(0.0, 0.05), FAST, CostModel(0.0, 0.04), FAST]
    assert greedy_order(B, costs) == (1, 3, 2, 0)
    decision = decide_admission(B, costs, collective_s=[0.0, 0.001, 0.3, 0.3])
    assert decision.admitted == (1, 3)
    assert decision.workers[0].reason == "slower than a worker already left out"


def test_bad_lengths_are_refused():
    with pytest.raises(AllocationError, match="collective times"):
        decide_admission(B, [FAST, FAST], collective_s=[0.0])
    with pytest.raises(AllocationError):
        decide_admission(B, [], collective_s=[])


def test_a_left_out_slot_is_dropped_wherever_it_is_listed():
    assert kept_slots((1, 2), (1, 2, 0)) == (1, 2)  # the slow worker listed first
    assert kept_slots((0, 2), (2, 0, 1)) == (0, 2)  # ... or in the middle
    assert kept_slots((0, 1), (0, 1, 2)) == (0, 1)  # ... or last
    # min_workers keeps the best of the left-out slots, after the admitted ones.
    assert kept_slots((2,), (2, 1, 0), min_workers=2) == (2, 1)
    assert kept_slots((), (1, 0), min_workers=0) == (1,)  # never an empty group
    with pytest.raises(AllocationError, match="every slot once"):
        kept_slots((0, 3), (0, 1, 2))


@settings(max_examples=200, deadline=None)
@given(
    order=st.integers(1, 8).flatmap(lambda n: st.permutations(range(n))),
    data=st.data(),
)
def test_kept_slots_are_the_admitted_then_the_best_left_out(order, data):
    n = len(order)
    admitted = data.draw(st.sets(st.sampled_from(order), min_size=1), label="admitted")
    min_workers = data.draw(st.integers(0, n), label="min_workers")
    kept = kept_slots(sorted(admitted, reverse=True), order, min_workers=min_workers)
    assert len(set(kept)) == len(kept) == max(len(admitted), min_workers, 1)
    assert kept[: len(admitted)] == tuple(sorted(admitted))  # every admitted slot, in list order
    extra = kept[len(admitted) :]
    assert extra == tuple(s for s in order if s not in admitted)[: len(extra)]
    if min_workers <= len(admitted):  # a left-out slot trains nowhere, wherever it is listed
        assert set(kept) == admitted


def test_the_slow_worker_is_left_out_whether_listed_first_middle_or_last():
    slow = CostModel(alpha=0.002, beta=0.02)
    for where in range(3):
        costs = [FAST, FAST]
        costs.insert(where, slow)
        decision = decide_admission(B, costs, collective_s=[0.0, 0.002, 0.302])
        ranked = sorted(decision.workers, key=lambda w: w.order)
        kept = kept_slots(decision.admitted, [w.rank for w in ranked])
        assert where not in kept and len(kept) == 2


costs_st = st.lists(
    st.builds(
        CostModel,
        alpha=st.floats(0.0, 0.01),
        beta=st.floats(1e-4, 0.05),
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=200, deadline=None)
@given(costs=costs_st, data=st.data())
def test_the_greedy_is_a_prefix_of_the_order_and_each_admission_improves(costs, data):
    n = len(costs)
    collective = [0.0] + [
        data.draw(st.floats(0.0, 0.2), label=f"collective{k}") for k in range(2, n + 1)
    ]
    decision = decide_admission(B, costs, collective_s=collective)
    again = decide_admission(B, costs, collective_s=collective)
    assert decision == again  # deterministic
    order = greedy_order(B, costs)
    admitted = decision.admitted
    assert set(admitted) == set(order[: len(admitted)])  # a prefix of fastest first
    assert order[0] in admitted
    for worker in decision.workers:
        if worker.admitted and worker.order > 0:
            assert worker.with_samples_per_s > worker.without_samples_per_s
    k = len(admitted)
    expected = group_samples_per_second(
        B, [costs[r] for r in order[:k]], collective_s=collective[k - 1]
    )
    assert decision.admitted_samples_per_s == pytest.approx(expected)
    if k < n:  # the first left out would not have raised the prediction
        first_out = next(w for w in decision.workers if w.order == k)
        assert first_out.with_samples_per_s <= first_out.without_samples_per_s
