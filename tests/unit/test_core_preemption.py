"""Properties of raytrain_hetero.core.preemption: the last step that fits before a deadline."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytrain_hetero.core.preemption import last_step_before_deadline
from raytrain_hetero.errors import ConfigError

seconds = st.floats(min_value=0.0, max_value=300.0, allow_nan=False)
positive = st.floats(min_value=1e-3, max_value=60.0, allow_nan=False)


@st.composite
def notices(draw):
    now = draw(st.floats(min_value=0.0, max_value=2e9, allow_nan=False))
    next_step = draw(st.integers(min_value=0, max_value=100_000))
    return {
        "now_s": now,
        "deadline_s": now + draw(st.floats(min_value=-10.0, max_value=600.0)),
        "next_step": next_step,
        "max_step": next_step + draw(st.integers(min_value=0, max_value=5_000)),
        "step_s": draw(positive),
        "checkpoint_s": draw(seconds),
        "margin_s": draw(seconds),
    }


def finish(n, step_s, checkpoint_s, now_s):
    """When n steps and a checkpoint end, starting now."""
    return now_s + n * step_s + checkpoint_s


@settings(max_examples=500, deadline=None)
@given(notices())
def test_the_decision_is_in_range_and_trains_at_least_one_step(notice):
    decision = last_step_before_deadline(**notice)
    assert notice["next_step"] <= decision.last_step <= notice["max_step"]


@settings(max_examples=500, deadline=None)
@given(notices())
def test_a_fitting_decision_ends_before_the_deadline_with_its_margin(notice):
    decision = last_step_before_deadline(**notice)
    steps = decision.last_step - notice["next_step"] + 1
    end = finish(steps, notice["step_s"], notice["checkpoint_s"], notice["now_s"])
    tolerance = 1e-9 * max(1.0, abs(notice["now_s"]))  # float sums of UNIX-size times
    if decision.fits:
        assert end + notice["margin_s"] <= notice["deadline_s"] + tolerance
    else:  # too short: one step and the checkpoint already overshoot
        assert decision.last_step == notice["next_step"]
        assert end + notice["margin_s"] > notice["deadline_s"] - tolerance


@settings(max_examples=500, deadline=None)
@given(notices())
def test_the_decision_uses_the_whole_notice(notice):
    """One more step would not fit, unless the step cap stopped it."""
    decision = last_step_before_deadline(**notice)
    if decision.fits and decision.last_step < notice["max_step"]:
        steps = decision.last_step - notice["next_step"] + 2
        end = finish(steps, notice["step_s"], notice["checkpoint_s"], notice["now_s"])
        tolerance = 1e-9 * max(1.0, abs(notice["now_s"]))
        assert end + notice["margin_s"] > notice["deadline_s"] - tolerance


@settings(max_examples=300, deadline=None)
@given(notices(), st.floats(min_value=0.0, max_value=600.0))
def test_a_later_deadline_never_stops_earlier(notice, extra):
    early = last_step_before_deadline(**notice)
    later = last_step_before_deadline(**{**notice, "deadline_s": notice["deadline_s"] + extra})
    assert later.last_step >= early.last_step
    assert later.fits or not early.fits


@settings(max_examples=200, deadline=None)
@given(notices())
def test_without_a_deadline_the_group_checkpoints_at_the_next_step(notice):
    decision = last_step_before_deadline(**{**notice, "deadline_s": None})
    assert decision.last_step == notice["next_step"] and decision.fits
    assert decision.slack_s == math.inf


def test_a_two_minute_notice():
    # 120 s, 0.5 s steps, a 10 s checkpoint, a 5 s margin: 210 steps, 5 s to spare.
    decision = last_step_before_deadline(
        now_s=1000.0,
        deadline_s=1120.0,
        next_step=40,
        max_step=10_000,
        step_s=0.5,
        checkpoint_s=10.0,
        margin_s=5.0,
    )
    assert decision.last_step == 40 + 210 - 1 and decision.fits
    assert decision.done_in_s == pytest.approx(115.0)
    assert decision.slack_s == pytest.approx(5.0)


@pytest.mark.parametrize(
    ("field", "value"),
    [("step_s", 0.0), ("step_s", math.nan), ("checkpoint_s", -1.0), ("margin_s", math.inf)],
)
def test_bad_times_are_refused_naming_the_field(field, value):
    args = {
        "now_s": 0.0,
        "deadline_s": 10.0,
        "next_step": 0,
        "max_step": 5,
        "step_s": 1.0,
        "checkpoint_s": 1.0,
        "margin_s": 1.0,
    }
    with pytest.raises(ConfigError, match=field):
        last_step_before_deadline(**{**args, field: value})


def test_a_step_chosen_to_fit_is_called_fitting_on_a_tie():
    """Six 1 ms steps end exactly at the deadline less a subnormal margin: the step count is
    chosen by ``steps * step_s <= budget`` and ``fits`` must agree with it (hypothesis found
    the deadline-side formula rounding to a 5e-324 shortfall: 6 steps, yet "too short")."""
    decision = last_step_before_deadline(
        now_s=0.0,
        deadline_s=0.006,
        next_step=0,
        max_step=10,
        step_s=0.001,
        checkpoint_s=0.0,
        margin_s=5e-324,
    )
    assert (decision.last_step, decision.fits) == (5, True)
