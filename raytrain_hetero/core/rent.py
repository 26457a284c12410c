"""Rent the mix: which instance types, how many of each, spot or on-demand, for one job.

Pure (stdlib + numpy). Given the job's step cost per instance type (remembered cost models, a
probe's, or a published figure flagged as an estimate), the exchange cost, a price catalog
(:mod:`raytrain_hetero.core.rent_catalog`), spot loss rates and a deadline or a budget,
:func:`decide_rent` returns the Pareto front of (expected time, expected cost) over the mixes
it priced, the chosen mix and why (:class:`RentDecision`). The model of one mix is
:class:`~raytrain_hetero.core.rent_model.RentModel`.

The search, deterministic:

1. **Every single option** (one instance type in one market) at every count up to its cap.
2. **Every pair** of a shortlist (``shortlist`` options: the most samples per dollar, the
   fastest nodes, the cheapest nodes; a node's throughput taken at a quarter of the batch
   per worker, spot losses discounted) at every pair of counts.
3. **One-node moves** (add any option, remove one, or swap one for a shortlisted option's)
   from the best plans for the objective and the best single option, while they improve
   it, at most ``local_search_rounds`` rounds: mixes of up to ``max_types`` options.

Every candidate is priced by the same model, and every single option is a candidate, so the
chosen mix is never worse than the best single option on the planner's own model. With a
deadline the cheapest plan within it wins; with a budget the soonest within it. When none
fits, the decision says so and names the nearest plan that does something: the fastest
(deadline) or the cheapest (budget).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from raytrain_hetero.core.rent_catalog import InstanceOffer
from raytrain_hetero.core.rent_model import (
    Mix,
    RentExchange,
    RentJob,
    RentModel,
    RentOption,
    RentPlan,
    RentSettings,
    TypeCost,
)
from raytrain_hetero.errors import ConfigError

__all__ = [
    "RentDecision",
    "decide_rent",
    "format_cost",
    "format_duration",
    "pareto_front",
    "rent_options",
]

Objective = Literal["deadline", "budget"]
_TOL = 1e-9


def format_duration(seconds: float) -> str:
    """``"9.6 h"``, ``"42 min"`` or ``"30 s"``."""
    if not math.isfinite(seconds):
        return "never"
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 600:
        return f"{seconds / 60:.0f} min"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"


def format_cost(dollars: float) -> str:
    """``"$1,234.50"``; below a dollar, four decimals (``"$0.0123"``)."""
    return f"${dollars:,.2f}" if abs(dollars) >= 1 else f"${dollars:.4f}"


def rent_options(
    offers: Mapping[str, InstanceOffer],
    costs: Sequence[TypeCost],
    settings: RentSettings,
    spot_loss_per_hour: Mapping[str, float] | None = None,
    instance_types: Collection[str] | None = None,
) -> tuple[tuple[RentOption, ...], tuple[str, ...]]:
    """The options to rent (per instance type with a cost model: on demand, and spot where
    the catalog quotes it and a loss rate is known), and findings about the input.

    Args:
        offers: Per instance type what it costs (:meth:`PriceCatalog.offers`).
        costs: The job's step cost per instance type.
        settings: Caps, markets, start-up, default loss rate.
        spot_loss_per_hour: Losses per node-hour per instance type (e.g.
            :func:`~raytrain_hetero.core.rent_catalog.loss_rate_from_trace`).
        instance_types: Only these types (each needs a cost model); None: every costed type.

    Raises:
        ConfigError: A type asked for with no cost model, a cost model for a type the
            offers lack, two cost models for one type, or a bad loss rate (one line each).
    """
    by_type: dict[str, TypeCost] = {}
    for c in costs:
        if c.instance_type in by_type:
            raise ConfigError(
                f"two cost models for instance type {c.instance_type!r}. Fix: keep one."
            )
        by_type[c.instance_type] = c
    wanted = sorted(by_type) if instance_types is None else sorted(set(instance_types))
    for name in wanted:
        if name not in by_type:
            raise ConfigError(
                f"instance type {name!r} has no cost model. Fix: measure it (raytrain-hetero "
                "probe on one node of it, remembered with probe.remember) or price it from a "
                "published figure (an estimate), or leave it out."
            )
        if name not in offers:
            raise ConfigError(
                f"instance type {name!r} has a cost model but no price. Fix: add its catalog "
                "row, or leave it out."
            )
    losses: dict[str, float | None] = dict(spot_loss_per_hour or {})
    for name, rate in losses.items():
        if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate >= 0):
            raise ConfigError(
                f"spot loss rate of {name!r} is {rate!r}. Fix: give losses per node-hour >= 0."
            )
    findings = [
        f"spot loss rate given for {name}, which has no cost model: ignored"
        for name in sorted(set(losses) - set(by_type))
    ]
    options: list[RentOption] = []
    for name in wanted:
        tc, offer = by_type[name], offers[name]
        workers = tc.workers_per_node or max(1, round(offer.accelerator_count))
        startup = settings.startup_s if tc.startup_s is None else tc.startup_s
        if "on_demand" in settings.markets and settings.cap(name, "on_demand") > 0:
            options.append(
                RentOption(
                    name,
                    "on_demand",
                    offer.price,
                    workers,
                    tc.cost,
                    0.0,
                    startup,
                    settings.cap(name, "on_demand"),
                    tc.estimate,
                )
            )
        if "spot" in settings.markets and settings.cap(name, "spot") > 0:
            loss = losses.get(name, settings.default_spot_loss_per_hour)
            if offer.spot_price is None:
                findings.append(f"{name}: the catalog quotes no spot price: on demand only")
            elif loss is None:
                findings.append(f"{name}: no spot loss rate known: on demand only")
            else:
                options.append(
                    RentOption(
                        name,
                        "spot",
                        offer.spot_price,
                        workers,
                        tc.cost,
                        float(loss),
                        startup,
                        settings.cap(name, "spot"),
                        tc.estimate,
                    )
                )
        if tc.estimate:
            findings.append(f"{name}: priced from a published figure ({tc.estimate}): an estimate")
    return tuple(options), tuple(findings)


@dataclass(frozen=True)
class RentDecision:
    """The planner's answer.

    Attributes:
        objective: ``"deadline"`` (cheapest within it) or ``"budget"`` (soonest within it).
        limit: The deadline in seconds or the budget in dollars.
        chosen: The plan to rent (when infeasible: the nearest, see ``feasible``).
        feasible: Whether ``chosen`` keeps the limit.
        best_single: The best plan of one option under the same rule.
        saving: ``1 - chosen / best_single`` in cost (deadline) or time (budget); 0 when
            a single option is chosen or nothing fits; None when a mix fits and no single
            option does (nothing to compare with).
        front: The Pareto front of (expected time, expected cost) over every plan priced,
            fastest first.
        reason: Why ``chosen``, in one line with the numbers.
        findings: Remarks about the input (estimates used, options left out).
        evaluated: Distinct mixes priced.
    """

    objective: Objective
    limit: float
    chosen: RentPlan
    feasible: bool
    best_single: RentPlan
    saving: float | None
    front: tuple[RentPlan, ...]
    reason: str
    findings: tuple[str, ...]
    evaluated: int


def pareto_front(plans: Collection[RentPlan]) -> tuple[RentPlan, ...]:
    """The plans no other plan beats in both expected time and expected cost (ties: one
    kept, the one with fewer nodes), fastest first."""
    ordered = sorted(
        plans, key=lambda p: (p.expected_time_s, p.expected_cost, p.total_nodes, p.describe())
    )
    front: list[RentPlan] = []
    for p in ordered:
        if not front or p.expected_cost < front[-1].expected_cost * (1 - _TOL) - _TOL:
            front.append(p)
    return tuple(front)


def _shortlist(model: RentModel, size: int) -> list[int]:
    """Options worth combining, by index: the most samples per dollar, then the fastest
    nodes and the cheapest nodes (fillers), ``size`` in all (a node's samples/s taken at a
    quarter of the batch per worker, losses discounted)."""
    batch = model.job.global_batch
    penalty_h = (model.settings.restart_s + model.settings.notice_s) / 3600.0
    speed = [
        o.samples_per_s(max(1.0, batch / (4.0 * o.workers_per_node)))
        * max(0.0, 1.0 - o.loss_per_h * penalty_h)
        for o in model.options
    ]
    order = range(len(model.options))
    ranked = [
        sorted(order, key=lambda i: (-speed[i] / model.options[i].price_per_h, i)),
        sorted(order, key=lambda i: (-speed[i], i)),
        sorted(order, key=lambda i: (model.options[i].price_per_h, i)),
    ]
    quotas = (max(1, size - 2 * (size // 4)), size // 4, size // 4)
    chosen: list[int] = []
    for ranking, quota in zip(ranked, quotas):
        taken = 0
        for i in ranking:
            if taken >= quota:
                break
            if i not in chosen:
                chosen.append(i)
                taken += 1
    return chosen


def _neighbours(mix: Mix, caps: Sequence[int], swaps: Sequence[int]) -> Iterator[Mix]:
    """Mixes one node away: one added (any option), one removed, or one swapped for a node
    of ``swaps`` (or of the mix)."""
    counts = dict(mix)

    def moved(remove: int | None, add: int | None) -> Mix | None:
        new = dict(counts)
        if remove is not None:
            new[remove] -= 1
        if add is not None:
            new[add] = new.get(add, 0) + 1
            if new[add] > caps[add]:
                return None
        out = tuple(sorted((i, n) for i, n in new.items() if n > 0))
        return out or None

    candidates = [moved(None, j) for j in range(len(caps))]
    targets = sorted(set(swaps) | set(counts))
    for i in counts:
        candidates.append(moved(i, None))
        candidates.extend(moved(i, j) for j in targets if j != i)
    yield from (c for c in candidates if c is not None)


def _improve(
    model: RentModel,
    start: Mix,
    key: Callable[[RentPlan], tuple[float, ...]],
    rounds: int,
    swaps: Sequence[int],
) -> None:
    """One-node moves from ``start`` while ``key`` improves (every mix met is priced)."""
    caps = [o.max_nodes for o in model.options]
    current, plan = start, model.plan_mix(start)
    if plan is None:
        return
    for _ in range(rounds):
        best: tuple[tuple[float, ...], Mix] | None = None
        for mix in _neighbours(current, caps, swaps):
            p = model.plan_mix(mix)
            if p is not None and (best is None or key(p) < best[0]):
                best = (key(p), mix)
        if best is None or best[0] >= key(plan):
            return
        current = best[1]
        found = model.plan_mix(current)
        assert found is not None
        plan = found


def decide_rent(
    options: Sequence[RentOption],
    job: RentJob,
    exchange: RentExchange,
    settings: RentSettings,
    *,
    deadline_s: float | None = None,
    budget: float | None = None,
    held: Mapping[str, int] | None = None,
    findings: Sequence[str] = (),
) -> RentDecision:
    """The mix to rent for ``job``: the cheapest within ``deadline_s``, or the soonest within
    ``budget`` (exactly one of them).

    Args:
        options: What can be rented (:func:`rent_options`).
        job: The work (samples x epochs, global batch).
        exchange: The exchange cost per group.
        settings: Restart, notice, search width.
        deadline_s: Seconds from now the job must end by.
        budget: Dollars the run may cost.
        held: Nodes per option key held now (a re-plan after a loss or a notice: the
            remaining work, the time left): they start at once; a change costs a restart.
        findings: Remarks to carry into the decision (from :func:`rent_options`).

    Raises:
        ConfigError: Neither or both limits, a limit that is not a positive number (a
            negative budget), or no option at all (one line, naming it and the fix).
    """
    if (deadline_s is None) == (budget is None):
        raise ConfigError(
            "give exactly one of a deadline or a budget. Fix: set deadline_h (the cheapest "
            "plan within it) or budget (the soonest plan within it)."
        )
    objective: Objective = "deadline" if deadline_s is not None else "budget"
    limit = float(deadline_s if deadline_s is not None else budget)  # type: ignore[arg-type]
    if not (math.isfinite(limit) and limit > 0):
        what = "deadline" if objective == "deadline" else "budget"
        unit = "hours" if objective == "deadline" else "dollars"
        raise ConfigError(
            f"the {what} is {limit!r}{' (negative)' if limit < 0 else ''}. Fix: give a "
            f"positive number of {unit}."
        )
    if not options:
        raise ConfigError(
            "nothing to rent: no instance type has both a cost model and a price in the chosen "
            "region and markets. Fix: add cost models or catalog rows, or allow another market."
        )
    model = RentModel(options, job, exchange, settings, held)

    def fits(p: RentPlan) -> bool:
        value = p.expected_time_s if objective == "deadline" else p.expected_cost
        return value <= limit * (1 + _TOL)

    def key(p: RentPlan) -> tuple[float, ...]:
        time_s, cost = p.expected_time_s, p.expected_cost
        if fits(p):  # within the limit: cheapest (deadline) or soonest (budget)
            ranked = (cost, time_s) if objective == "deadline" else (time_s, cost)
            return (0.0, *ranked, float(p.total_nodes))
        # Outside it, after every plan within: the nearest to it, the fastest (deadline)
        # or the cheapest (budget).
        ranked = (time_s, cost) if objective == "deadline" else (cost, time_s)
        return (1.0, *ranked, float(p.total_nodes))

    for i, o in enumerate(model.options):
        for n in range(1, o.max_nodes + 1):
            model.plan_mix(((i, n),))
    shortlist = _shortlist(model, settings.shortlist)
    if settings.max_types >= 2:
        for a, b in itertools.combinations(sorted(shortlist), 2):
            for na in range(1, model.options[a].max_nodes + 1):
                for nb in range(1, model.options[b].max_nodes + 1):
                    model.plan_mix(((a, na), (b, nb)))
    priced = model.priced()
    if not priced:
        raise ConfigError(
            "no mix can run the job: every option has more workers per node than the global "
            f"batch ({job.global_batch}) or loses spot nodes faster than it can restart. Fix: "
            "raise the global batch, or allow on-demand nodes."
        )
    starts = sorted(priced, key=lambda c: key(priced[c]))[:3]
    starts.append(
        min((c for c in priced if sum(1 for n in c if n) == 1), key=lambda c: key(priced[c]))
    )
    for start in dict.fromkeys(starts):
        _improve(model, start, key, settings.local_search_rounds, shortlist)
    plans = list(model.priced().values())
    chosen = min(plans, key=lambda p: (key(p), p.describe()))
    best_single = min((p for p in plans if p.is_single), key=lambda p: (key(p), p.describe()))
    feasible = fits(chosen)
    saving: float | None = 0.0
    if feasible and not chosen.is_single:
        mine, theirs = (
            (chosen.expected_cost, best_single.expected_cost)
            if objective == "deadline"
            else (chosen.expected_time_s, best_single.expected_time_s)
        )
        saving = 1.0 - mine / theirs if fits(best_single) else None
    return RentDecision(
        objective=objective,
        limit=limit,
        chosen=chosen,
        feasible=feasible,
        best_single=best_single,
        saving=saving,
        front=pareto_front(plans),
        reason=_reason(objective, limit, chosen, best_single, feasible, saving),
        findings=tuple(findings),
        evaluated=model.evaluated,
    )


def _reason(
    objective: Objective,
    limit: float,
    chosen: RentPlan,
    single: RentPlan,
    feasible: bool,
    saving: float | None,
) -> str:
    what = (
        f"{chosen.describe()}: {format_duration(chosen.expected_time_s)}, "
        f"{format_cost(chosen.expected_cost)} expected"
    )
    estimate = (
        f"; {', '.join(chosen.estimates)} priced from published figures (estimates)"
        if chosen.estimates
        else ""
    )
    if objective == "deadline":
        if not feasible:
            return (
                f"no plan ends within {format_duration(limit)}; the fastest is {what}. Fix: "
                f"allow at least {format_duration(chosen.expected_time_s)}, or more nodes "
                f"(max_nodes){estimate}"
            )
        head = f"the cheapest plan within {format_duration(limit)} is {what}"
        if chosen.is_single:
            return f"{head}; no mix is cheaper{estimate}"
        if saving is None:
            return f"{head}; no single type ends within the deadline{estimate}"
        return (
            f"{head}; {saving:.0%} cheaper than the best single type ({single.describe()}, "
            f"{format_cost(single.expected_cost)}){estimate}"
        )
    if not feasible:
        return (
            f"no plan costs at most {format_cost(limit)}; the cheapest is {what}. Fix: allow at "
            f"least {format_cost(chosen.expected_cost)}{estimate}"
        )
    head = f"the soonest plan within {format_cost(limit)} is {what}"
    if chosen.is_single:
        return f"{head}; no mix is sooner{estimate}"
    if saving is None:
        return f"{head}; no single type fits the budget{estimate}"
    return (
        f"{head}; {saving:.0%} sooner than the best single type ({single.describe()}, "
        f"{format_duration(single.expected_time_s)}){estimate}"
    )
