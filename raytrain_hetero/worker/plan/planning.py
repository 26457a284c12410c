"""Plan state of a worker and the ONE way plans are built and switched.

Every plan of a run (the first one, a manual :func:`~raytrain_hetero.worker.api.update_plan`,
a live re-plan from the scheduler) is built by :func:`build_plan` and installed by
:func:`install_plan`; a switch during training takes effect at :func:`next_free_step`, the
first step no rank has carved yet, so every rank switches at the same step (a collective).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.plan import Plan, PlanSchedule
from raytrain_hetero.core.policy import StepSample
from raytrain_hetero.errors import ConfigError
from raytrain_hetero.worker.measure.probe import CostKey
from raytrain_hetero.worker.setup.identity import HeteroSetup, RankIdentity, all_gather

logger = logging.getLogger(__name__)

__all__ = [
    "PassiveWindow",
    "PlanState",
    "allocation_caps",
    "build_plan",
    "gather_rank_slots",
    "install_plan",
    "next_free_step",
    "slice_caps",
]


@dataclass
class PassiveWindow:
    """Training steps ``first..last`` of the prior plan ``version``, timed as they run.

    Attributes:
        version: The prior plan whose steps are timed.
        first: First timed global step (the group's first step sets DDP up: not timed).
        last: Last timed step; at its end the group agrees on the measured plan.
        samples: This rank's timings so far.
    """

    version: int
    first: int
    last: int
    samples: list[StepSample] = field(default_factory=list)


@dataclass
class PlanState:
    """Plans of this worker (written only through :func:`install_plan` and :meth:`restore`).

    Attributes:
        history: Every plan of the run so far (restored from checkpoints too).
        restored_slot_costs: Cost model by worker slot, of the group that wrote the
            checkpoint this group resumed from; those slots may skip the probe.
        pass_caps: Samples one forward+backward pass of each rank may hold (memory; None:
            no cap), once gathered.
        passive: The steps timed for the first measured plan of a group that started on a
            prior (``ProbeConfig.mode="passive"``), until it is decided.
        started_at: When this worker group started; with ``first_step_at`` its start-up.
        measured_costs: Every rank's cost model as this group's passive window measured
            it, kept when the prior plan stayed (a plan carries costs only when adopted).
        largest_step: Samples of the largest step the carved data gives, when it is fewer
            than one global batch (a dataset smaller than the batch), else None: plans then
            split that many, never slices the data cannot give.
    """

    schedule: PlanSchedule = field(default_factory=PlanSchedule)
    history: list[Plan] = field(default_factory=list)
    rank_slots: tuple[int, ...] | None = None
    restored_slot_costs: dict[int, CostModel] = field(default_factory=dict)
    pass_caps: tuple[int | None, ...] | None = None
    passive: PassiveWindow | None = None
    cost_key: CostKey | None = None
    started_at: float = field(default_factory=time.time)
    first_step_at: float | None = None
    measured_costs: tuple[CostModel, ...] | None = None
    largest_step: int | None = None

    @property
    def current(self) -> Plan | None:
        """The newest plan of this worker group."""
        return self.schedule.current

    def newest_costs(self) -> tuple[CostModel, ...] | None:
        """Every rank's newest cost model: the current plan's when it has them (measured
        or remembered), else what the passive window measured; None before either."""
        plan = self.current
        if plan is not None and plan.costs is not None:
            return tuple(plan.costs)
        return self.measured_costs

    def restore(self, history: Sequence[Plan], slot_costs: dict[int, CostModel]) -> None:
        """Adopt the plan history and slot costs of the checkpoint this group resumes from."""
        self.history = list(history)
        self.restored_slot_costs = dict(slot_costs)

    def next_version(self) -> int:
        """Version number of the next plan of the run."""
        return max((p.version for p in self.history), default=0) + 1


def gather_rank_slots(identity: RankIdentity, plans: PlanState) -> tuple[int, ...]:
    """Worker slot of every rank (a collective the first time, then remembered)."""
    if plans.rank_slots is None:
        gathered = all_gather(identity.slot)
        plans.rank_slots = tuple(int(s) for s in gathered)
    return plans.rank_slots


def allocation_caps(
    setup: HeteroSetup,
    rank_slots: Sequence[int],
    pass_caps: Sequence[int | None] | None,
) -> tuple[int | None, ...]:
    """Per-rank slice caps of the allocation: ``WorkerSpec.max_batch``, and under
    ``memory_cap_mode="slice"`` also each rank's per-pass memory cap (the smaller binds)."""
    caps = [setup.specs[slot].max_batch for slot in rank_slots]
    if setup.batch.memory_cap_mode == "slice" and pass_caps is not None:
        caps = [c if p is None else p if c is None else min(c, p) for c, p in zip(caps, pass_caps)]
    return tuple(caps)


def slice_caps(identity: RankIdentity, plans: PlanState) -> tuple[int | None, ...]:
    """:func:`allocation_caps` of this worker group's ranks (gathers the rank slots once)."""
    return allocation_caps(identity.setup, gather_rank_slots(identity, plans), plans.pass_caps)


def build_plan(
    identity: RankIdentity,
    plans: PlanState,
    *,
    shares: Sequence[float] | None = None,
    costs: Sequence[CostModel] | None = None,
    slices: Sequence[int] | None = None,
    effective_step: int,
    reason: str,
) -> Plan:
    """The next plan of the run, for the ranks of this worker group.

    Exactly one of ``shares`` (fixed shares per rank) and ``costs`` (cost models per rank,
    with ``slices`` already decided from them by a live re-plan, or None to allocate) is
    given, else ConfigError. The plan is versioned after every plan of the run so far.
    """
    if (shares is None) == (costs is None):
        raise ConfigError("A plan needs exactly one of shares= or costs=.")
    setup = identity.setup
    caps = slice_caps(identity, plans)
    common: dict[str, Any] = {
        "version": plans.next_version(),
        "effective_step": effective_step,
        "caps": caps,
        "min_slice": setup.batch.min_slice,
        "reason": reason,
        "quantum": setup.batch.slice_quantum,
    }
    total = setup.batch.global_batch_size
    if plans.largest_step is not None:
        total = min(total, plans.largest_step)
    if shares is not None:
        return Plan.from_shares(total, list(shares), **common)
    costs = tuple(costs)
    if slices is None:
        return Plan.from_costs(total, costs, **common)
    return Plan(slices=tuple(int(b) for b in slices), costs=costs, **common)


def next_free_step(plans: PlanState) -> int:
    """First global step no rank has carved yet (a collective: call it on every rank)."""
    carved = torch.tensor([plans.schedule.carved_through], dtype=torch.int64)
    dist.all_reduce(carved, op=dist.ReduceOp.MAX)
    return int(carved.item()) + 1


def install_plan(
    plans: PlanState, plan: Plan, *, announce: Callable[[Plan], None] | None = None
) -> Plan:
    """Make ``plan`` govern its steps on this rank, remember it, tell ``announce``; return it."""
    plans.schedule.add(plan)
    plans.history.append(plan)
    logger.info(
        "plan v%d from step %d: slices %s (%s)",
        plan.version,
        plan.effective_step,
        list(plan.slices),
        plan.reason,
    )
    if announce is not None:
        announce(plan)
    return plan
