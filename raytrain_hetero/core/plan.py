"""Versioned shard plans and the schedule that says which plan governs each global step.

A :class:`Plan` fixes how one global batch is split across ranks. Plans change over a run
(probing, re-planning, elastic restarts), so every plan carries a version and the global step
from which it applies; :class:`PlanSchedule` answers "which plan carves step s" identically on
every rank, which is what keeps the carving exactly-once and the gradient weights agreed.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from raytrain_hetero.core.allocation import CostModel, allocate, proportional_slices
from raytrain_hetero.errors import AllocationError, HeteroError


@dataclass(frozen=True)
class Plan:
    """How every global batch is split across the ranks of one worker group.

    Exactly one of ``shares`` (fixed proportional split) or ``costs`` (affine cost models,
    makespan-optimal split) is set; it decides how steps of a different size than the global
    batch (the short last step of an epoch) are split, so every rank derives the same slices.

    Attributes:
        version: Monotonically increasing plan number within a run (1 is the first plan).
        effective_step: First global step (optimizer steps since the run began) it governs.
        slices: Samples per rank for a full global batch; ``sum(slices)`` is the global batch.
        shares: Relative shares per rank when the plan is a fixed proportional split.
        costs: Per-rank affine cost models when the plan minimises the step makespan.
        caps: Per-rank maximum slice (memory), ``None`` for no cap.
        min_slice: Smallest slice any rank may receive (>= 1: no rank is ever idle).
        reason: Human-readable reason this plan was made.
        quantum: Samples every slice is a multiple of (ghost BatchNorm's group size; 1:
            any). A step that is not a whole number of groups (an epoch's short last step)
            gives its remainder to the last rank, so the groups of the step, cut from its
            first sample, are the groups of the slices.
    """

    version: int
    effective_step: int
    slices: tuple[int, ...]
    shares: tuple[float, ...] | None = None
    costs: tuple[CostModel, ...] | None = None
    caps: tuple[int | None, ...] | None = None
    min_slice: int = 1
    reason: str = ""
    quantum: int = 1

    def __post_init__(self) -> None:
        if (self.shares is None) == (self.costs is None):
            raise HeteroError("Plan needs exactly one of shares= or costs=.")
        n_per_rank = len(self.shares) if self.shares is not None else len(self.costs or ())
        if n_per_rank != len(self.slices):
            raise HeteroError(
                f"Plan has {len(self.slices)} slices but {n_per_rank} shares/costs; "
                "give one per rank."
            )
        if self.caps is not None and len(self.caps) != len(self.slices):
            raise HeteroError(f"Plan has {len(self.slices)} slices but {len(self.caps)} caps.")
        if min(self.slices) < self.min_slice:
            raise HeteroError(
                f"Plan slice {min(self.slices)} is below min_slice={self.min_slice}: "
                "every rank must receive at least min_slice samples per step."
            )
        if self.quantum < 1 or any(b % self.quantum for b in self.slices):
            raise HeteroError(
                f"Plan slices {list(self.slices)} are not whole groups of quantum="
                f"{self.quantum} samples: ghost BatchNorm needs every slice in whole groups."
            )

    @property
    def world_size(self) -> int:
        """Number of ranks the plan splits over."""
        return len(self.slices)

    @property
    def global_batch_size(self) -> int:
        """Samples in a full step."""
        return sum(self.slices)

    def split(self, total: int) -> tuple[int, ...]:
        """Per-rank slices (each >= ``min_slice``) of a step of ``total`` samples (the global
        batch, or a short/merged last step) under this plan.

        Raises:
            AllocationError: When ``total`` cannot be split within caps and ``min_slice``.
        """
        if total == self.global_batch_size:
            return self.slices
        if self.shares is not None:
            return proportional_slices(
                total, self.shares, caps=self.caps, min_slice=self.min_slice, quantum=self.quantum
            )
        assert self.costs is not None  # __post_init__: exactly one of shares/costs is set
        return allocate(
            total, self.costs, caps=self.caps, min_slice=self.min_slice, quantum=self.quantum
        )

    @classmethod
    def from_shares(
        cls,
        global_batch_size: int,
        shares: Sequence[float],
        *,
        version: int = 1,
        effective_step: int = 0,
        caps: Sequence[int | None] | None = None,
        min_slice: int = 1,
        reason: str = "fixed shares",
        quantum: int = 1,
    ) -> Plan:
        """Plan that splits every step in proportion to ``shares`` (largest remainder)."""
        if any(not math.isfinite(s) or s <= 0 for s in shares):
            raise AllocationError(f"shares must be finite and > 0, got {list(shares)}.")
        caps_t = tuple(caps) if caps is not None else None
        slices = proportional_slices(
            global_batch_size, shares, caps=caps_t, min_slice=min_slice, quantum=quantum
        )
        return cls(
            version=version,
            effective_step=effective_step,
            slices=slices,
            shares=tuple(float(s) for s in shares),
            caps=caps_t,
            min_slice=min_slice,
            reason=reason,
            quantum=quantum,
        )

    @classmethod
    def from_costs(
        cls,
        global_batch_size: int,
        costs: Sequence[CostModel],
        *,
        version: int = 1,
        effective_step: int = 0,
        caps: Sequence[int | None] | None = None,
        min_slice: int = 1,
        reason: str = "probe",
        quantum: int = 1,
    ) -> Plan:
        """Plan that minimises the predicted step makespan under affine cost models."""
        caps_t = tuple(caps) if caps is not None else None
        slices = allocate(
            global_batch_size, tuple(costs), caps=caps_t, min_slice=min_slice, quantum=quantum
        )
        return cls(
            version=version,
            effective_step=effective_step,
            slices=slices,
            costs=tuple(costs),
            caps=caps_t,
            min_slice=min_slice,
            reason=reason,
            quantum=quantum,
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, for checkpoints, summaries and logs (``world_size`` for readers;
        :meth:`from_dict` derives it from the slices)."""
        return {
            "version": self.version,
            "effective_step": self.effective_step,
            "world_size": self.world_size,
            "slices": list(self.slices),
            "shares": list(self.shares) if self.shares is not None else None,
            "costs": ([[c.alpha, c.beta] for c in self.costs] if self.costs is not None else None),
            "caps": list(self.caps) if self.caps is not None else None,
            "min_slice": self.min_slice,
            "reason": self.reason,
            "quantum": self.quantum,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        """Inverse of :meth:`to_dict`."""
        costs = data.get("costs")
        shares = data.get("shares")
        caps = data.get("caps")
        return cls(
            version=int(data["version"]),
            effective_step=int(data["effective_step"]),
            slices=tuple(int(b) for b in data["slices"]),
            shares=tuple(float(s) for s in shares) if shares is not None else None,
            costs=tuple(CostModel(float(a), float(b)) for a, b in costs) if costs else None,
            caps=tuple(caps) if caps is not None else None,
            min_slice=int(data.get("min_slice", 1)),
            reason=str(data.get("reason", "")),
            quantum=int(data.get("quantum", 1)),
        )


@dataclass
class PlanSchedule:
    """Ordered plans of one worker group; answers which plan governs a global step.

    Plans may only be added for steps nobody has carved yet: ``add`` refuses an effective
    step at or below ``carved_through`` (the highest step any consumer has already split), so
    no rank can ever have used a stale plan for a step.
    """

    plans: list[Plan] = field(default_factory=list)
    carved_through: int = -1

    def add(self, plan: Plan) -> None:
        """Append ``plan``; it must be newer and start after every carved step.

        Raises:
            HeteroError: If the version does not increase, the effective step goes back, the
                step was already carved, or the world size differs from the current plan.
        """
        if self.plans:
            last = self.plans[-1]
            if plan.version <= last.version:
                raise HeteroError(
                    f"Plan version {plan.version} is not newer than current {last.version}."
                )
            if plan.effective_step < last.effective_step:
                raise HeteroError(
                    f"Plan v{plan.version} starts at step {plan.effective_step}, before the "
                    f"current plan's step {last.effective_step}."
                )
            if plan.quantum != last.quantum:
                raise HeteroError(
                    f"Plan v{plan.version} cuts groups of {plan.quantum} samples but the "
                    f"current plan {last.quantum}: the group size is fixed for a run."
                )
            if plan.world_size != last.world_size:
                raise HeteroError(
                    f"Plan v{plan.version} has {plan.world_size} ranks but the group has "
                    f"{last.world_size}; a resize starts a new schedule."
                )
        if plan.effective_step <= self.carved_through:
            raise HeteroError(
                f"Plan v{plan.version} would take effect at step {plan.effective_step}, but "
                f"steps through {self.carved_through} are already carved; pick a later step."
            )
        self.plans.append(plan)

    def plan_for(self, step: int) -> Plan:
        """The plan that governs global ``step`` (the newest with effective_step <= step)."""
        if not self.plans:
            raise HeteroError("No plan yet: the workers have not been probed or given shares.")
        starts = [p.effective_step for p in self.plans]
        index = bisect.bisect_right(starts, step) - 1
        if index < 0:
            raise HeteroError(f"Step {step} precedes the first plan (effective at {starts[0]}).")
        return self.plans[index]

    def mark_carved(self, step: int) -> None:
        """Record that ``step`` has been split by some consumer (sampler or weighting)."""
        self.carved_through = max(self.carved_through, step)

    @property
    def current(self) -> Plan | None:
        """The newest plan, or None before the first one."""
        return self.plans[-1] if self.plans else None
