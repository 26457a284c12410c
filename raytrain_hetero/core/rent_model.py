"""What renting a mix of instances for one data-parallel job takes: expected time and cost.

The model of :mod:`raytrain_hetero.core.rent` (the search over mixes), pure (stdlib + numpy).
A *mix* is a count of nodes per :class:`RentOption` (an instance type in one market, spot or
on-demand). For the job's ``samples`` at ``global_batch`` samples per step:

* **step**: the global batch carved over the mix's workers for the smallest makespan, plus
  the ring all-reduce's ``2 (N - 1) / N`` of one full gradient exchange among the ``N``
  workers (:func:`raytrain_hetero.core.trial_allocation.step_seconds`, the model the Tune
  allocator uses). Each worker costs ``t(b) = alpha + beta * b`` (:class:`TypeCost`); the
  exchange's seconds depend on the group (:class:`RentExchange`: within one node, or across
  nodes, where the slowest type's network sets the pace);
* **expected time** ``T = startup + train / (1 - L * (restart + notice))``: the slowest
  start-up of the types launched, the ``samples / global_batch`` steps, and each expected
  spot loss (``L`` losses per second: the spot nodes' loss rates summed) costing the measured
  group restart plus the notice handling (checkpointing at the last step that fits). A mix
  whose losses would eat all its time (``L * (restart + notice) >= 1``) never finishes and is
  not a candidate;
* **expected cost**: every node's price for ``T`` (nodes are billed from launch).

Assumptions (what it does not price) are listed in ``docs/concepts/renting.md``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.trial_allocation import TrialDemand, step_seconds
from raytrain_hetero.errors import ConfigError

__all__ = [
    "MARKETS",
    "Market",
    "Mix",
    "NodeCount",
    "RentExchange",
    "RentJob",
    "RentModel",
    "RentOption",
    "RentPlan",
    "RentSettings",
    "TypeCost",
    "estimate_from_published",
    "mix_of",
]

Market = Literal["on_demand", "spot"]
MARKETS: tuple[Market, ...] = ("on_demand", "spot")


def _check(ok: bool, what: str) -> None:
    if not ok:
        raise ConfigError(what)


def _finite_at_least(value: float, low: float) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value >= low


@dataclass(frozen=True)
class TypeCost:
    """The job's step on one instance type, per worker.

    Attributes:
        instance_type: The catalog's ``InstanceType``.
        cost: ``t(b) = alpha + beta * b`` seconds for one worker's slice of ``b`` samples
            (a remembered cost model, a probe's, or :func:`estimate_from_published`).
        workers_per_node: Workers one node holds; None: its accelerators (1 if it has none).
        estimate: None when measured; else the published figure it was priced from (every
            table flags the plans that use it).
        startup_s: Seconds from asking for a node to its worker training; None: the
            settings' ``startup_s``.
    """

    instance_type: str
    cost: CostModel
    workers_per_node: int | None = None
    estimate: str | None = None
    startup_s: float | None = None


def estimate_from_published(
    instance_type: str,
    samples_per_s: float,
    source: str,
    reference: TypeCost | None = None,
    reference_samples_per_s: float | None = None,
) -> TypeCost:
    """A type never measured, priced from a published per-worker throughput.

    With a measured ``reference`` type and its figure from the same table, the reference's
    cost model is scaled by the figures' ratio (its fixed cost too); without one, the
    figure alone: ``t(b) = b / samples_per_s``.

    Raises:
        ConfigError: A figure that is not a positive number.
    """
    _check(
        _finite_at_least(samples_per_s, 0.0) and samples_per_s > 0,
        f"published figure for {instance_type}: {samples_per_s!r} samples/s. Fix: give a "
        "positive throughput per worker.",
    )
    if reference is None:
        return TypeCost(instance_type, CostModel(0.0, 1.0 / samples_per_s), estimate=source)
    ref = reference_samples_per_s
    _check(
        ref is not None and _finite_at_least(ref, 0.0) and ref > 0,
        f"published figure for the reference {reference.instance_type}: {ref!r}. Fix: give "
        "its throughput from the same table.",
    )
    assert ref is not None
    ratio = ref / samples_per_s
    cost = CostModel(reference.cost.alpha * ratio, reference.cost.beta * ratio)
    return TypeCost(
        instance_type,
        cost,
        estimate=f"{source} (scaled from measured {reference.instance_type})",
    )


@dataclass(frozen=True)
class RentExchange:
    """Seconds of one full gradient exchange per step, by where the group runs.

    A group of ``N`` workers pays ``2 (N - 1) / N`` of it (a ring all-reduce).

    Attributes:
        across_nodes_s: A group on several nodes (the measured exchange of the model).
        within_node_s: A group on one node (NVLink / PCIe); None: ``across_nodes_s``.
        per_type_s: Across-node seconds when a given instance type is in the group (its
            network sets a ring's pace); the group pays the largest of its types'.
    """

    across_nodes_s: float = 0.0
    within_node_s: float | None = None
    per_type_s: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        values = [self.across_nodes_s, *self.per_type_s.values()]
        if self.within_node_s is not None:
            values.append(self.within_node_s)
        _check(
            all(_finite_at_least(v, 0.0) for v in values),
            f"exchange seconds must be finite and >= 0, got {values}. Fix: give measured seconds.",
        )

    def for_group(self, instance_types: Collection[str], nodes: int) -> float:
        """One full exchange of a group on ``nodes`` nodes of ``instance_types``."""
        if nodes <= 1:
            return self.across_nodes_s if self.within_node_s is None else self.within_node_s
        return max(self.per_type_s.get(t, self.across_nodes_s) for t in instance_types)


@dataclass(frozen=True)
class RentJob:
    """The work: ``samples`` (samples per epoch x epochs) at ``global_batch`` per step."""

    samples: float
    global_batch: int

    def __post_init__(self) -> None:
        _check(
            _finite_at_least(self.samples, 0.0) and self.samples > 0,
            f"the job's samples must be > 0, got {self.samples!r}. Fix: give samples per "
            "epoch x epochs.",
        )
        _check(
            isinstance(self.global_batch, int) and self.global_batch >= 1,
            f"global_batch must be an integer >= 1, got {self.global_batch!r}.",
        )


@dataclass(frozen=True)
class RentSettings:
    """Knobs of the rent planner (the library config :class:`~raytrain_hetero.config.rent.RentConfig`
    holds one of these as ``planner``).

    Attributes:
        startup_s: Seconds from asking for a node to its worker training (per type in
            :class:`TypeCost`).
        restart_s: Seconds a worker-group restart costs (checkpoint restore, new group),
            measured; charged per spot loss and once when a held mix changes.
        notice_s: Seconds of a preemption notice's handling (training up to the last step
            that fits, checkpointing); charged per spot loss.
        max_nodes_per_type: Most nodes of one instance type in one market.
        max_nodes: Per ``"<type>"`` or ``"<type>:<market>"`` a lower or higher cap (quota,
            spot capacity); the more specific key wins.
        markets: The markets to rent in.
        default_spot_loss_per_hour: Loss rate of a spot type with no rate of its own; None:
            such a type is offered on demand only.
        max_types: Most options (type and market) in one mix: each is a node type the
            autoscaler must know.
        shortlist: Options the pair search combines (the most samples per dollar, the
            fastest and the cheapest nodes).
        local_search_rounds: Rounds of one-node moves around the best mixes.
    """

    startup_s: float = 300.0
    restart_s: float = 60.0
    notice_s: float = 30.0
    max_nodes_per_type: int = 8
    max_nodes: Mapping[str, int] = field(default_factory=dict)
    markets: tuple[Market, ...] = MARKETS
    default_spot_loss_per_hour: float | None = None
    max_types: int = 3
    shortlist: int = 10
    local_search_rounds: int = 20

    def __post_init__(self) -> None:
        seconds = "finite seconds >= 0"
        checks = {
            "startup_s": (_finite_at_least(self.startup_s, 0.0), seconds),
            "restart_s": (_finite_at_least(self.restart_s, 0.0), seconds),
            "notice_s": (_finite_at_least(self.notice_s, 0.0), seconds),
            "max_nodes_per_type": (
                isinstance(self.max_nodes_per_type, int) and self.max_nodes_per_type >= 1,
                "an integer >= 1",
            ),
            "max_nodes": (
                all(isinstance(v, int) and v >= 0 for v in self.max_nodes.values()),
                "integers >= 0 by type or type:market",
            ),
            "markets": (
                bool(self.markets) and all(m in MARKETS for m in self.markets),
                f"some of {list(MARKETS)}",
            ),
            "default_spot_loss_per_hour": (
                self.default_spot_loss_per_hour is None
                or _finite_at_least(self.default_spot_loss_per_hour, 0.0),
                "losses per node-hour >= 0, or null",
            ),
            "max_types": (
                isinstance(self.max_types, int) and self.max_types >= 1,
                "an integer >= 1",
            ),
            "shortlist": (
                isinstance(self.shortlist, int) and self.shortlist >= 2,
                "an integer >= 2",
            ),
            "local_search_rounds": (
                isinstance(self.local_search_rounds, int) and self.local_search_rounds >= 0,
                "an integer >= 0",
            ),
        }
        bad = [
            f"{n}={getattr(self, n)!r} (use {valid})" for n, (ok, valid) in checks.items() if not ok
        ]
        _check(not bad, f"Invalid RentSettings values: {'; '.join(bad)}.")

    def cap(self, instance_type: str, market: str) -> int:
        """Most nodes of ``instance_type`` in ``market``."""
        specific = self.max_nodes.get(f"{instance_type}:{market}")
        if specific is not None:
            return specific
        return self.max_nodes.get(instance_type, self.max_nodes_per_type)


@dataclass(frozen=True)
class RentOption:
    """One instance type in one market, as the search sees it.

    Attributes:
        instance_type: The type. market: ``"spot"`` or ``"on_demand"``.
        price_per_h: Dollars per node-hour in that market.
        workers_per_node: Workers one node holds.
        cost: One worker's step cost model.
        loss_per_h: Expected losses per node-hour (0 on demand).
        startup_s: Seconds to a training worker after asking.
        max_nodes: Most nodes of it.
        estimate: The published figure its cost model comes from, or None (measured).
    """

    instance_type: str
    market: Market
    price_per_h: float
    workers_per_node: int
    cost: CostModel
    loss_per_h: float
    startup_s: float
    max_nodes: int
    estimate: str | None = None

    @property
    def key(self) -> str:
        """``"<type>:<market>"``."""
        return f"{self.instance_type}:{self.market}"

    @property
    def label(self) -> str:
        """``"<type> spot"`` / ``"<type> on-demand"``."""
        return f"{self.instance_type} {'spot' if self.market == 'spot' else 'on-demand'}"

    def samples_per_s(self, slice_samples: float) -> float:
        """One node's samples/s at ``slice_samples`` per worker, no exchange."""
        return self.workers_per_node * slice_samples / self.cost.time(slice_samples)


@dataclass(frozen=True)
class NodeCount:
    """Nodes of one option in a plan.

    Attributes:
        instance_type, market: The option. nodes: How many. workers: Their workers.
        price_per_h: Dollars per node-hour. estimate: Published figure used, or None.
    """

    instance_type: str
    market: Market
    nodes: int
    workers: int
    price_per_h: float
    estimate: str | None = None

    @property
    def label(self) -> str:
        """``"3 x g5.xlarge spot"``."""
        market = "spot" if self.market == "spot" else "on-demand"
        return f"{self.nodes} x {self.instance_type} {market}"


@dataclass(frozen=True)
class RentPlan:
    """One mix with its expected time and cost.

    Attributes:
        nodes: Per option its nodes (sorted by type, then market).
        expected_time_s: Start-up + training + expected loss handling (+ a restart when a
            held mix changes).
        expected_cost: Dollars: the mix's hourly price for the expected time.
        step_s: Seconds per step (carved compute + exchange).
        exchange_s: The exchange's part of a step.
        train_s: Seconds of the steps alone.
        startup_s: Seconds before training starts (the slowest type launched).
        expected_losses: Expected spot losses over the run.
        price_per_h: Dollars per hour of the whole mix.
    """

    nodes: tuple[NodeCount, ...]
    expected_time_s: float
    expected_cost: float
    step_s: float
    exchange_s: float
    train_s: float
    startup_s: float
    expected_losses: float
    price_per_h: float

    @property
    def total_nodes(self) -> int:
        """Nodes in the mix."""
        return sum(n.nodes for n in self.nodes)

    @property
    def workers(self) -> int:
        """Workers in the mix."""
        return sum(n.workers for n in self.nodes)

    @property
    def is_single(self) -> bool:
        """One instance type in one market."""
        return len(self.nodes) == 1

    @property
    def estimates(self) -> tuple[str, ...]:
        """Instance types of the plan priced from published figures."""
        return tuple(sorted({n.instance_type for n in self.nodes if n.estimate}))

    @functools.cached_property
    def description(self) -> str:
        """``"2 x p3.8xlarge spot + 3 x g5.xlarge on-demand"`` (estimates marked ``*``)."""
        return " + ".join(n.label + ("*" if n.estimate else "") for n in self.nodes)

    def describe(self) -> str:
        """:attr:`description`."""
        return self.description


#: A mix: ``(option index, nodes)`` pairs, ascending by index, every count > 0.
Mix = tuple[tuple[int, int], ...]


def mix_of(counts: Sequence[int]) -> Mix:
    """The mix of dense ``counts`` (one per option, in the model's order)."""
    return tuple((i, int(n)) for i, n in enumerate(counts) if n)


class RentModel:
    """Expected time and cost of mixes over ``options`` (:data:`Mix`: node counts by option
    index).

    Args:
        options: The options, in a fixed order.
        job: The work.
        exchange: The exchange cost per group.
        settings: Restart and notice seconds.
        held: Nodes per option key the job holds now (a re-plan): they need no start-up,
            and a plan other than them pays one restart.
    """

    def __init__(
        self,
        options: Sequence[RentOption],
        job: RentJob,
        exchange: RentExchange,
        settings: RentSettings,
        held: Mapping[str, int] | None = None,
    ) -> None:
        self.options = tuple(options)
        self.job = job
        self.exchange = exchange
        self.settings = settings
        keys = [o.key for o in self.options]
        _check(len(set(keys)) == len(keys), f"duplicate rent options in {keys}")
        self.held: Mix = mix_of([(held or {}).get(k, 0) for k in keys])
        self._held = dict(self.held)
        self._costs = {o.key: o.cost for o in self.options}
        self._penalty_s = settings.restart_s + settings.notice_s
        self._memo: dict[Mix, RentPlan | None] = {}

    def priced(self) -> dict[Mix, RentPlan]:
        """Every mix priced so far that can run the job."""
        return {c: p for c, p in self._memo.items() if p is not None}

    @property
    def evaluated(self) -> int:
        """Distinct mixes priced so far."""
        return len(self._memo)

    def plan(self, counts: Sequence[int]) -> RentPlan | None:
        """The plan of dense ``counts`` (nodes per option); see :meth:`plan_mix`."""
        return self.plan_mix(mix_of(counts))

    def plan_mix(self, mix: Mix) -> RentPlan | None:
        """The plan of ``mix``; None when it cannot run the job (no node, more options than
        ``max_types``, more workers than samples per step, a cap exceeded, or spot losses
        that would never let it finish)."""
        if mix not in self._memo:
            self._memo[mix] = self._plan(mix)
        return self._memo[mix]

    def _plan(self, mix: Mix) -> RentPlan | None:
        options, held = self.options, self._held
        if not mix or len(mix) > self.settings.max_types:
            return None
        workers = nodes = 0
        losses_per_h = price = startup = 0.0
        per_key: dict[str, int] = {}
        types: set[str] = set()
        for i, n in mix:
            o = options[i]
            if n < 0 or n > o.max_nodes:
                return None
            workers += o.workers_per_node * n
            nodes += n
            losses_per_h += o.loss_per_h * n
            price += o.price_per_h * n
            if n > held.get(i, 0) and o.startup_s > startup:
                startup = o.startup_s
            per_key[o.key] = o.workers_per_node * n
            types.add(o.instance_type)
        if workers > self.job.global_batch:
            return None
        exchange = self.exchange.for_group(types, nodes)
        demand = TrialDemand(
            trial_id="rent",
            costs=self._costs,
            global_batch=self.job.global_batch,
            remaining_samples=self.job.samples,
            sync_s=exchange,
        )
        step = step_seconds(per_key, demand)
        lost = losses_per_h / 3600.0 * self._penalty_s
        if lost >= 1.0 or not math.isfinite(step):
            return None
        train = self.job.samples / self.job.global_batch * step
        reshape = self.settings.restart_s if self.held and mix != self.held else 0.0
        running = train / (1.0 - lost)
        total = startup + reshape + running
        ring = 2.0 * (workers - 1) / workers if workers > 1 else 0.0
        return RentPlan(
            nodes=tuple(
                NodeCount(
                    o.instance_type, o.market, n, o.workers_per_node * n, o.price_per_h, o.estimate
                )
                for o, n in sorted(
                    ((options[i], n) for i, n in mix),
                    key=lambda x: (x[0].instance_type, x[0].market),
                )
            ),
            expected_time_s=total,
            expected_cost=price * total / 3600.0,
            step_s=step,
            exchange_s=exchange * ring,
            train_s=train,
            startup_s=startup,
            expected_losses=losses_per_h / 3600.0 * running,
            price_per_h=price,
        )
