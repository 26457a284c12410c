"""A move pays for itself (issue 44 item 1): raytrain_hetero.core.move_pricing's estimators and
the priced decision of raytrain_hetero.core.trial_allocation."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.move_pricing import (
    PRIOR_CONTENTION,
    PRIOR_ERROR,
    PRIOR_RESTART_S,
    EpochTiming,
    MovePrice,
    StartWindow,
    contention_fraction,
    epoch_overhead_s,
    equal_share_cap,
    prediction_error,
    restart_charge,
)
from raytrain_hetero.core.trial_allocation import (
    TrialDemand,
    WorkerSlot,
    decide_trial_allocation,
    run_seconds,
    trial_completion,
)
from raytrain_hetero.errors import AllocationError
from tests.unit.test_core_trial_allocation import counts_of, holding, problems

PROPERTY_SETTINGS = settings(max_examples=120, deadline=None)

prices = st.builds(
    MovePrice,
    contention=st.floats(0.0, 1.0),
    step_error=st.floats(0.0, 1.0),
    restart_error=st.floats(0.0, 1.0),
)


def _advanced(trials, decision):
    """The holdings ``decision`` gave, with the work left changed so a new split may pay."""
    return [
        replace(t, remaining_samples=t.remaining_samples * (1 + j % 3))
        for j, t in enumerate(holding(trials, decision))
    ]


@PROPERTY_SETTINGS
@given(problems(), prices)
def test_a_move_is_made_only_when_its_gain_exceeds_its_error_margin(problem, price):
    """Every trial holds workers: a decision that moves some predicts a makespan at least its
    error margin shorter than keeping them (restarts and contention charged), and never a
    longer one; a decision that keeps them says what the best change would have gained."""
    slots, trials = problem
    held = _advanced(trials, decide_trial_allocation(slots, trials))
    decision = decide_trial_allocation(slots, held, price=price)
    keep = max(trial_completion(counts_of(t.current, slots), t, changed=False) for t in held)
    assert decision.gain_s is not None
    if decision.changed:
        assert decision.gain_s >= decision.margin_s - 1e-6
        assert decision.makespan_s + decision.margin_s <= keep + 1e-6
    else:
        assert decision.makespan_s == pytest.approx(keep)


@PROPERTY_SETTINGS
@given(problems(), prices)
def test_each_move_reports_its_gain_charge_and_margin(problem, price):
    slots, trials = problem
    held = _advanced(trials, decide_trial_allocation(slots, trials))
    decision = decide_trial_allocation(slots, held, price=price)
    by_id = {t.trial_id: t for t in held}
    moved = [a for a in decision.assignments if a.changed]
    inflicted = sum(price.contention * by_id[a.trial_id].restart_s for a in moved)
    others = len(decision.assignments) - 1
    for a in decision.assignments:
        t = by_id[a.trial_id]
        old, new = counts_of(t.current, slots), counts_of(a.slots, slots)
        own = price.contention * t.restart_s if a.changed else 0.0
        # its completion: the model's, plus what the other moves' restarts take from it
        expected = trial_completion(new, t, changed=a.changed) + inflicted - own
        assert a.completion_s == pytest.approx(expected, abs=1e-6)
        if not a.changed:
            assert a.gain_s is None and a.cost_s == 0.0 and a.margin_s == 0.0
            continue
        assert a.gain_s == pytest.approx(run_seconds(old, t) - run_seconds(new, t))
        assert a.cost_s == pytest.approx(t.restart_s + own * others)
        margin = price.step_error * run_seconds(new, t) + price.restart_error * t.restart_s
        assert a.margin_s == pytest.approx(margin, abs=1e-6)


@PROPERTY_SETTINGS
@given(problems())
def test_the_default_price_is_the_restart_alone(problem):
    slots, trials = problem
    assert decide_trial_allocation(slots, trials) == decide_trial_allocation(
        slots, trials, price=MovePrice()
    )


def _growth_case():
    """One trial on one of two workers; a second halves its remaining 100 s of steps."""
    cost = CostModel(0.0, 0.01)
    slots = [WorkerSlot(f"n{i}/0", f"n{i}", "gpu") for i in range(2)]
    trial = TrialDemand("a", {"gpu": cost}, 10, 1e4, restart_s=20.0, current=("n0/0",))
    return slots, trial


def test_a_gain_within_the_measured_error_is_not_taken():
    slots, trial = _growth_case()
    # 100 s -> 50 s + 20 s restart: a 30 s gain
    assert decide_trial_allocation(slots, [trial]).changed
    # a 50 % error on the new run's 50 s and the restart's 20 s: 35 s of margin > 30 s
    doubtful = MovePrice(step_error=0.5, restart_error=0.5)
    decision = decide_trial_allocation(slots, [trial], price=doubtful)
    assert not decision.changed
    assert decision.gain_s == pytest.approx(30.0) and decision.margin_s == pytest.approx(35.0)
    assert "within its error margin 35 s" in decision.reason
    # measured better (10 % on each: 7 s of margin): the move is made, with its figures
    sure = decide_trial_allocation(slots, [trial], price=MovePrice(0.0, 0.1, 0.1))
    (a,) = sure.assignments
    assert sure.changed and a.gain_s == pytest.approx(50.0) and a.cost_s == 20.0
    assert a.margin_s == pytest.approx(7.0) and "error margin 7 s" in a.reason


def test_contention_on_the_bottleneck_holds_back_a_move_that_only_helps_another_trial():
    cost = CostModel(0.0, 0.01)
    slots = [WorkerSlot(f"n{i}/0", f"n{i}", "gpu") for i in range(3)]
    # "long" ends last whatever happens (it cannot use a second worker: capped at 1 by its
    # type); "short" could grow into the free worker and end sooner.
    long = TrialDemand("long", {"gpu": cost}, 10, 3e4, restart_s=10.0, current=("n0/0",))
    short = TrialDemand("short", {"gpu": cost}, 10, 1e4, restart_s=10.0, current=("n1/0",))
    from raytrain_hetero.core.trial_allocation import TrialAllocationConfig

    cap = TrialAllocationConfig(max_workers_per_trial=2)
    free = decide_trial_allocation(slots, [long, short], cap)
    assert free.changed  # without contention the long trial grows
    # the long trial grows (300 s -> 150 s + 10 s); with every move delaying the others by
    # 0.9 x 10 s the decision still pays, and says what the move costs the others
    priced = decide_trial_allocation(slots, [long, short], cap, MovePrice(contention=0.9))
    moved = [a for a in priced.assignments if a.changed]
    assert moved and all(a.cost_s == pytest.approx(10.0 + 9.0) for a in moved)


def test_restart_charge_is_measured_where_it_runs():
    assert restart_charge([]) == (PRIOR_RESTART_S, PRIOR_ERROR)
    # before a move is measured: the quickest first start of the search
    assert restart_charge([], [120.0, 95.0, 140.0]) == (95.0, PRIOR_ERROR)
    # one or two resumed fits: their median, the error still the prior
    assert restart_charge([40.0, 60.0], [120.0]) == (50.0, PRIOR_ERROR)
    seconds, error = restart_charge([40.0, 50.0, 60.0, 50.0])
    assert seconds == 50.0 and error == pytest.approx(0.2)


def _epoch(trial, holding, start, seconds, predicted=None):
    return EpochTiming(trial, holding, start, start + seconds, predicted)


def test_prediction_error_is_a_high_quantile_of_the_relative_misses():
    assert prediction_error([]) == PRIOR_ERROR
    epochs = [_epoch("a", 1, 10.0 * i, s, 10.0) for i, s in enumerate([11, 9, 10, 12, 10])]
    # relative misses 0.1, 0.1, 0, 0.2, 0: the 90th percentile
    assert prediction_error(epochs) == pytest.approx(0.16)
    # the measured overhead is part of the prediction
    assert epoch_overhead_s([_epoch("a", 1, 0, 15, 10.0), _epoch("b", 1, 0, 13, 10.0)]) == 4.0
    late = [_epoch("a", 1, 0, 14, 10.0)] * 3
    assert prediction_error(late, overhead_s=4.0) == pytest.approx(0.0)
    assert epoch_overhead_s([_epoch("a", 1, 0, 5)]) == 0.0  # nothing predicted


def test_contention_is_the_slowdown_per_overlapped_fraction():
    starts = [StartWindow("mover", 100.0, 150.0), StartWindow("mover", 300.0, 320.0)]
    c = 0.4
    epochs = [_epoch("a", 1, 20.0 * i - 100, 20.0) for i in range(3)]  # clean: 20 s each
    # epochs overlapping the others' starts for a fraction f of their length run 20 (1 + c f)
    for f, window_end, inside in ((1.0, 150.0, True), (0.5, 312.0, False), (0.25, 150.0, False)):
        seconds = 20.0 * (1 + c * f)
        # ends at the window's end (f of it inside), or lies wholly inside
        start = 100.0 if inside else window_end - f * seconds
        if window_end == 312.0:
            start = 300.0 - seconds * (1 - f)
        epochs.append(_epoch("a", 1, start, seconds))
    assert contention_fraction(epochs, starts) == pytest.approx(c)
    # its own starts do not count; without overlapped epochs: the prior
    assert contention_fraction(epochs, [StartWindow("a", 100.0, 150.0)]) == PRIOR_CONTENTION
    assert contention_fraction([], starts, prior=0.1) == 0.1
    # a clamp: a trial that ran faster during the others' starts takes none
    quick = [*epochs[:3], *(_epoch("a", 1, 100.0 + 10 * i, 10.0) for i in range(3))]
    assert contention_fraction(quick, starts) == 0.0


def test_equal_share_while_trials_have_not_asked():
    assert equal_share_cap(None, slots=8, expected_trials=8, ended=0, live=1) == 1
    assert equal_share_cap(3, slots=8, expected_trials=4, ended=0, live=2) == 2
    assert equal_share_cap(3, slots=8, expected_trials=4, ended=1, live=3) == 3  # all asked
    assert equal_share_cap(None, slots=8, expected_trials=None, ended=0, live=1) is None


def test_bad_prices_are_refused():
    with pytest.raises(AllocationError, match="contention is a fraction"):
        MovePrice(contention=1.5)
    with pytest.raises(AllocationError, match="step_error must be a finite number >= 0"):
        MovePrice(step_error=float("nan"))
