"""Properties of raytrain_hetero.core.rent: the mix to rent for a deadline or a budget."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.rent import decide_rent, pareto_front, rent_options
from raytrain_hetero.core.rent_catalog import InstanceOffer
from raytrain_hetero.core.rent_model import (
    RentExchange,
    RentJob,
    RentModel,
    RentOption,
    RentSettings,
    TypeCost,
    estimate_from_published,
)
from raytrain_hetero.errors import ConfigError

PROPERTY_SETTINGS = settings(max_examples=60, deadline=None)
TOL = 1e-9


def _option(name, market="on_demand", *, price=1.0, alpha=0.0, beta=1e-3, workers=1, loss=0.0,
            startup=60.0, cap=3):  # fmt: skip
    return RentOption(
        name, market, price, workers, CostModel(alpha, beta), loss, startup, cap, None
    )


@st.composite
def problems(draw, max_options: int = 4):
    """A few options (types x markets), a job, an exchange and planner settings."""
    n = draw(st.integers(1, max_options))
    options = []
    for i in range(n):
        spot = draw(st.booleans())
        options.append(
            _option(
                f"t{i}",
                "spot" if spot else "on_demand",
                price=draw(st.floats(0.1, 40.0)),
                alpha=draw(st.floats(0.0, 0.05)),
                beta=draw(st.floats(1e-4, 1e-2)),
                workers=draw(st.sampled_from([1, 2, 4, 8])),
                loss=draw(st.floats(0.0, 2.0)) if spot else 0.0,
                startup=draw(st.floats(0.0, 600.0)),
                cap=draw(st.integers(1, 4)),
            )
        )
    job = RentJob(samples=draw(st.floats(1e4, 1e8)), global_batch=draw(st.integers(64, 4096)))
    exchange = RentExchange(
        across_nodes_s=draw(st.floats(0.0, 0.2)),
        within_node_s=draw(st.one_of(st.none(), st.floats(0.0, 0.05))),
    )
    planner = RentSettings(
        restart_s=draw(st.floats(0.0, 300.0)),
        notice_s=draw(st.floats(0.0, 120.0)),
        max_types=draw(st.integers(1, 3)),
        shortlist=draw(st.integers(2, 4)),
        local_search_rounds=draw(st.integers(0, 5)),
    )
    return options, job, exchange, planner


def _singles(options, job, exchange, planner):
    """Every single-option plan, priced by a fresh model (the brute-force reference)."""
    model = RentModel(options, job, exchange, planner)
    plans = []
    for i, o in enumerate(options):
        for n in range(1, o.max_nodes + 1):
            p = model.plan_mix(((i, n),))
            if p is not None:
                plans.append(p)
    return plans


def _dominates(a, b):
    return (
        a.expected_time_s <= b.expected_time_s
        and a.expected_cost <= b.expected_cost
        and (a.expected_time_s < b.expected_time_s or a.expected_cost < b.expected_cost)
    )


@PROPERTY_SETTINGS
@given(problems(), st.floats(0.05, 4.0))
def test_deadline_plan_is_never_worse_than_the_best_single_option(problem, factor):
    options, job, exchange, planner = problem
    singles = _singles(options, job, exchange, planner)
    if not singles:
        return
    deadline = factor * min(p.expected_time_s for p in singles)
    decision = decide_rent(options, job, exchange, planner, deadline_s=deadline)
    within = [p for p in singles if p.expected_time_s <= deadline * (1 + TOL)]
    if within:
        best = min(p.expected_cost for p in within)
        assert decision.feasible
        assert decision.chosen.expected_time_s <= deadline * (1 + TOL)
        assert decision.chosen.expected_cost <= best * (1 + TOL)
        assert decision.best_single.expected_cost == pytest.approx(best, rel=1e-12)
        if decision.saving is not None:
            assert 0.0 <= decision.saving < 1.0
    else:
        fastest_single = min(p.expected_time_s for p in singles)
        assert decision.chosen.expected_time_s <= fastest_single * (1 + TOL)


@PROPERTY_SETTINGS
@given(problems(), st.floats(0.05, 4.0))
def test_budget_plan_is_never_slower_than_the_best_single_option(problem, factor):
    options, job, exchange, planner = problem
    singles = _singles(options, job, exchange, planner)
    if not singles:
        return
    budget = factor * min(p.expected_cost for p in singles)
    decision = decide_rent(options, job, exchange, planner, budget=budget)
    within = [p for p in singles if p.expected_cost <= budget * (1 + TOL)]
    if within:
        assert decision.feasible
        assert decision.chosen.expected_cost <= budget * (1 + TOL)
        assert decision.chosen.expected_time_s <= min(p.expected_time_s for p in within) * (1 + TOL)
    else:
        assert decision.chosen.expected_cost <= min(p.expected_cost for p in singles) * (1 + TOL)


@PROPERTY_SETTINGS
@given(problems())
def test_an_infeasible_deadline_names_the_fastest_plan(problem):
    options, job, exchange, planner = problem
    if not _singles(options, job, exchange, planner):
        return
    decision = decide_rent(options, job, exchange, planner, deadline_s=1e-6)
    assert not decision.feasible
    assert decision.saving == 0.0
    fastest = min(p.expected_time_s for p in decision.front)
    assert decision.chosen.expected_time_s == pytest.approx(fastest, rel=1e-12)
    assert decision.reason.startswith("no plan ends within")
    assert decision.chosen.describe() in decision.reason
    assert "Fix: allow at least" in decision.reason


@PROPERTY_SETTINGS
@given(problems())
def test_an_infeasible_budget_names_the_cheapest_plan(problem):
    options, job, exchange, planner = problem
    if not _singles(options, job, exchange, planner):
        return
    decision = decide_rent(options, job, exchange, planner, budget=1e-9)
    assert not decision.feasible
    cheapest = min(p.expected_cost for p in decision.front)
    assert decision.chosen.expected_cost == pytest.approx(cheapest, rel=1e-12)
    assert decision.reason.startswith("no plan costs at most")
    assert decision.chosen.describe() in decision.reason


@PROPERTY_SETTINGS
@given(problems(), st.floats(0.2, 3.0))
def test_the_front_is_non_dominated_and_holds_the_choice(problem, factor):
    options, job, exchange, planner = problem
    singles = _singles(options, job, exchange, planner)
    if not singles:
        return
    decision = decide_rent(
        options, job, exchange, planner, deadline_s=factor * min(p.expected_time_s for p in singles)
    )
    front = decision.front
    for a, b in itertools.permutations(front, 2):
        assert not _dominates(a, b)
    times = [p.expected_time_s for p in front]
    costs = [p.expected_cost for p in front]
    assert times == sorted(times)
    assert all(x > y for x, y in itertools.pairwise(costs))
    assert not any(_dominates(p, decision.chosen) for p in front)
    # every single plan is priced, so none of them beats the front either
    assert not any(_dominates(s, p) for s in singles for p in front)


@PROPERTY_SETTINGS
@given(problems(max_options=2), st.floats(0.2, 3.0))
def test_with_two_options_the_search_is_exhaustive(problem, factor):
    """Two options: singles and every pair of counts are priced, so the choice is the
    model's optimum over every mix."""
    options, job, exchange, planner = problem
    model = RentModel(options, job, exchange, planner)
    plans = [
        p
        for counts in itertools.product(*(range(o.max_nodes + 1) for o in options))
        if (p := model.plan(counts)) is not None
    ]
    if not plans:
        return
    deadline = factor * min(p.expected_time_s for p in plans)
    decision = decide_rent(options, job, exchange, planner, deadline_s=deadline)
    within = [p for p in plans if p.expected_time_s <= deadline * (1 + TOL)]
    if within:
        assert decision.chosen.expected_cost == pytest.approx(
            min(p.expected_cost for p in within), rel=1e-12
        )


# ---------------------------------------------------------------------------- the model


def test_expected_time_and_cost_of_one_mix_by_hand():
    a = _option("a", price=3.0, alpha=0.0, beta=0.01, workers=1, startup=100.0)
    b = _option("b", "spot", price=1.0, alpha=0.0, beta=0.02, workers=2, loss=0.36, startup=50.0)
    job = RentJob(samples=1000 * 40.0, global_batch=40)
    planner = RentSettings(restart_s=60.0, notice_s=40.0)
    model = RentModel([a, b], job, RentExchange(across_nodes_s=0.3), planner)
    plan = model.plan([1, 1])
    # rates 100 + 2 x 50 = 200 samples/s: level 40 / 200 = 0.2 s; ring 2 x 2/3 x 0.3 = 0.4 s
    assert plan.step_s == pytest.approx(0.6)
    assert plan.exchange_s == pytest.approx(0.4)
    assert plan.train_s == pytest.approx(600.0)
    # 0.36 losses per node-hour = 1e-4 per s; each costs 100 s: 600 / (1 - 0.01)
    running = 600.0 / 0.99
    assert plan.startup_s == 100.0
    assert plan.expected_time_s == pytest.approx(100.0 + running)
    assert plan.expected_losses == pytest.approx(1e-4 * running)
    assert plan.price_per_h == 4.0
    assert plan.expected_cost == pytest.approx(4.0 * (100.0 + running) / 3600.0)
    assert plan.describe() == "1 x a on-demand + 1 x b spot"


def test_one_node_pays_the_within_node_exchange_and_a_slow_type_sets_the_pace():
    exchange = RentExchange(across_nodes_s=0.1, within_node_s=0.01, per_type_s={"slow": 0.5})
    assert exchange.for_group({"fast"}, 1) == 0.01
    assert exchange.for_group({"fast"}, 2) == 0.1
    assert exchange.for_group({"fast", "slow"}, 3) == 0.5


def test_losses_that_eat_all_the_time_make_a_mix_impossible():
    spot = _option("s", "spot", loss=3600.0 / 100.0)  # one loss per 100 s, each costs 100 s
    model = RentModel(
        [spot], RentJob(1e4, 64), RentExchange(), RentSettings(restart_s=100, notice_s=0)
    )
    assert model.plan([1]) is None


def test_held_nodes_need_no_start_up_and_a_change_pays_one_restart():
    a = _option("a", startup=300.0)
    planner = RentSettings(restart_s=60.0, notice_s=0.0)
    job = RentJob(1e4, 64)
    fresh = RentModel([a], job, RentExchange(), planner).plan([2])
    held = RentModel([a], job, RentExchange(), planner, held={"a:on_demand": 2})
    same, grown = held.plan([2]), held.plan([3])
    assert same.expected_time_s == pytest.approx(fresh.expected_time_s - 300.0)
    assert grown.startup_s == 300.0
    assert grown.expected_time_s == pytest.approx(300.0 + 60.0 + grown.train_s)


def test_mixes_over_max_types_or_batch_or_caps_are_not_plans():
    opts = [_option("a", cap=2), _option("b", cap=2), _option("c", workers=8, cap=2)]
    model = RentModel(opts, RentJob(1e4, 10), RentExchange(), RentSettings(max_types=2))
    assert model.plan([1, 1, 1]) is None  # three types
    assert model.plan([0, 0, 2]) is None  # 16 workers for a batch of 10
    assert model.plan([3, 0, 0]) is None  # over the cap
    assert model.plan([0, 0, 0]) is None
    assert model.plan([1, 1, 0]) is not None


def test_pareto_front_keeps_one_of_equal_points():
    p = RentModel([_option("a", cap=4)], RentJob(1e4, 64), RentExchange(), RentSettings())
    plans = [p.plan([1]), p.plan([1]), p.plan([2])]
    front = pareto_front(plans)
    assert len({(x.expected_time_s, x.expected_cost) for x in front}) == len(front)


def test_a_mix_beats_single_types_when_caps_bind():
    """The cheap efficient type is capped (quota): a deadline only a fast type meets alone is
    met cheaper by the capped type plus a little of another."""
    cheap = _option("cheap", price=1.0, beta=1e-3, cap=2, startup=0.0)  # 1000/s for $1/h
    fast = _option("fast", price=16.0, beta=1.25e-4, cap=2, startup=0.0)  # 8000/s for $16/h
    mid = _option("mid", price=4.0, beta=5e-4, cap=4, startup=0.0)  # 2000/s for $4/h
    # 3000/s needed: alone, 2 x mid or 1 x fast ($6); 2 x cheap + 1 x mid: $4.50
    job = RentJob(samples=3000.0 * 3600, global_batch=4096)
    decision = decide_rent(
        [cheap, fast, mid], job, RentExchange(), RentSettings(), deadline_s=3600.0
    )
    assert decision.feasible and not decision.chosen.is_single
    assert decision.chosen.describe() == "2 x cheap on-demand + 1 x mid on-demand"
    assert decision.saving == pytest.approx(0.25)
    assert decision.chosen.expected_cost < decision.best_single.expected_cost
    assert "cheaper than the best single type" in decision.reason


# ---------------------------------------------------------------------------- inputs


def _offer(name, price=1.0, spot=0.4, gpus=1.0):
    return InstanceOffer(name, "r", "G", gpus, 8.0, price, spot, ("z",))


def test_rent_options_offers_spot_only_with_a_loss_rate_and_a_spot_price():
    offers = {"a": _offer("a"), "b": _offer("b", spot=None), "c": _offer("c", gpus=4.0)}
    costs = [TypeCost(n, CostModel(0.0, 1e-3)) for n in ("a", "b", "c")]
    options, findings = rent_options(
        offers, costs, RentSettings(max_nodes={"a:spot": 5, "c": 2}), {"a": 0.5, "zz": 1.0}
    )
    keys = {o.key: o for o in options}
    assert set(keys) == {"a:on_demand", "a:spot", "b:on_demand", "c:on_demand"}
    assert keys["a:spot"].max_nodes == 5 and keys["a:on_demand"].max_nodes == 8
    assert keys["c:on_demand"].workers_per_node == 4 and keys["c:on_demand"].max_nodes == 2
    assert any("zz" in f and "ignored" in f for f in findings)
    assert any(f.startswith("b: the catalog quotes no spot price") for f in findings)
    assert any(f.startswith("c: no spot loss rate known") for f in findings)


def test_a_type_without_a_cost_model_is_one_line_naming_it():
    with pytest.raises(ConfigError, match=r"instance type 'p5.48xlarge' has no cost model\. Fix"):
        rent_options({"a": _offer("a")}, [TypeCost("a", CostModel(0, 1e-3))], RentSettings(),
                     instance_types=["a", "p5.48xlarge"])  # fmt: skip


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"budget": -5.0}, r"the budget is -5\.0 \(negative\)\. Fix: give a positive number"),
        ({"deadline_s": 0.0}, r"the deadline is 0\.0\. Fix"),
        ({}, r"exactly one of a deadline or a budget"),
        ({"budget": 1.0, "deadline_s": 1.0}, r"exactly one of a deadline or a budget"),
    ],
)
def test_bad_limits_are_one_line(kwargs, message):
    with pytest.raises(ConfigError, match=message) as info:
        decide_rent([_option("a")], RentJob(1e4, 64), RentExchange(), RentSettings(), **kwargs)
    assert "\n" not in str(info.value)


def test_settings_refuse_bad_values():
    with pytest.raises(ConfigError, match="max_nodes_per_type=0"):
        RentSettings(max_nodes_per_type=0)
    with pytest.raises(ConfigError, match="markets"):
        RentSettings(markets=("reserved",))  # type: ignore[arg-type]


def test_published_estimates_scale_a_measured_reference():
    ref = TypeCost("v100", CostModel(0.02, 1e-3))
    est = estimate_from_published("a10", 638.0, "lambda-resnet50-amp/A10", ref, 833.0)
    assert est.cost.beta == pytest.approx(1e-3 * 833 / 638)
    assert est.cost.alpha == pytest.approx(0.02 * 833 / 638)
    assert "scaled from measured v100" in est.estimate
    alone = estimate_from_published("h100", 2616.0, "lambda")
    assert alone.cost.alpha == 0.0 and alone.cost.beta == pytest.approx(1 / 2616.0)
    with pytest.raises(ConfigError, match="positive throughput"):
        estimate_from_published("x", -1.0, "s")
    assert math.isfinite(alone.cost.time(10))
