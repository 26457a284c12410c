"""Placing the branches of a multimodal model, and its fusion head, on ranks of unequal speed.

After Aspri et al. (Remote Sensing 2020). With measured costs ``cost[r][b]`` (branch ``b``'s
forward + backward on rank ``r``) and ``head_cost[r]``, a placement's step time is its busiest
rank's *stage time*::

    stage(r) = sum(cost[r][b] for b placed on r) + (head_cost[r] if the head is on r)

:func:`place_branches` minimises the largest stage time, every rank holding at least one
branch (a head-only rank would idle), except that one rank more than branches runs the head
alone. Exhaustive while the candidates are few, else greedy longest-processing-time-first;
ties go to the first candidate of a fixed order, so equal inputs give equal placements.

Pure: standard library only.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from raytrain_hetero.errors import ModelParallelError

logger = logging.getLogger(__name__)

__all__ = [
    "BranchPlacement",
    "check_branch_group",
    "costs_from_speeds",
    "place_branches",
    "placement_stage_times",
]

# Exhaustive search enumerates ranks ** (branches + 1) candidates; above this, greedy.
_MAX_EXHAUSTIVE_CANDIDATES = 200_000
# Relative margin by which a later candidate must beat the best so far: float noise in the
# costs never flips a tie, so the earliest candidate of equal makespan is kept.
_TIE_TOLERANCE = 1e-12


@dataclass(frozen=True)
class BranchPlacement:
    """Which rank runs each branch, and which runs the fusion head.

    Attributes:
        branch_ranks: ``(branch name, rank)`` pairs in the model's branch (fusion) order.
        head_rank: Rank that runs the fusion head and computes the loss.
        world_size: Number of ranks in the group.
        stage_times: Predicted seconds of work per rank (empty when no costs were given).
    """

    branch_ranks: tuple[tuple[str, int], ...]
    head_rank: int
    world_size: int
    stage_times: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        names = [name for name, _ in self.branch_ranks]
        if not names:
            raise ModelParallelError(
                "a branch placement needs at least one branch; declare the model's branches"
            )
        if len(set(names)) != len(names):
            raise ModelParallelError(f"branch names must be unique, got {names}")
        if self.world_size < 1:
            raise ModelParallelError(f"world_size must be >= 1, got {self.world_size}")
        for name, rank in self.branch_ranks:
            if not 0 <= rank < self.world_size:
                raise ModelParallelError(
                    f"branch {name!r} is placed on rank {rank}, but the group has ranks "
                    f"0..{self.world_size - 1}. Fix: place it on an existing rank or start "
                    "more workers."
                )
        if not 0 <= self.head_rank < self.world_size:
            raise ModelParallelError(
                f"the fusion head is placed on rank {self.head_rank}, but the group has ranks "
                f"0..{self.world_size - 1}"
            )
        busy = {rank for _, rank in self.branch_ranks} | {self.head_rank}
        idle = sorted(set(range(self.world_size)) - busy)
        if idle:
            raise ModelParallelError(
                f"rank(s) {idle} would hold no branch and not the head: {len(names)} branch(es) "
                f"and one head keep at most {len(names) + 1} ranks busy, the group has "
                f"{self.world_size}. Fix: use fewer workers for branch placement, or compose "
                "it with data parallelism."
            )

    @property
    def branch_names(self) -> tuple[str, ...]:
        """Branch names in fusion order."""
        return tuple(name for name, _ in self.branch_ranks)

    def rank_of(self, branch: str) -> int:
        """The rank that runs ``branch``.

        Raises:
            ModelParallelError: Unknown branch name (the message lists the known ones).
        """
        for name, rank in self.branch_ranks:
            if name == branch:
                return rank
        raise ModelParallelError(
            f"unknown branch {branch!r}; the placement has {list(self.branch_names)}"
        )

    def branches_on(self, rank: int) -> tuple[str, ...]:
        """Names of the branches that ``rank`` runs, in fusion order."""
        return tuple(name for name, r in self.branch_ranks if r == rank)

    @classmethod
    def explicit(
        cls, branch_ranks: Mapping[str, int], branch_names: Sequence[str], head_rank: int,
        world_size: int,
    ) -> BranchPlacement:  # fmt: skip
        """A placement given by hand, checked against the model's branch names.

        Raises:
            ModelParallelError: A name the model does not declare, a branch left unplaced, or
                a rank outside the group / left idle.
        """
        unknown = sorted(set(branch_ranks) - set(branch_names))
        if unknown:
            raise ModelParallelError(
                f"the placement names unknown branch(es) {unknown}; the model declares "
                f"{list(branch_names)}"
            )
        missing = [name for name in branch_names if name not in branch_ranks]
        if missing:
            raise ModelParallelError(
                f"the placement leaves branch(es) {missing} without a rank; place every one of "
                f"{list(branch_names)}"
            )
        return cls(
            tuple((name, int(branch_ranks[name])) for name in branch_names),
            int(head_rank),
            int(world_size),
        )


def check_branch_group(branch_names: Sequence[str], group_size: int) -> None:
    """Refuse a group that cannot hold the branches: one rank per branch, the head on one of
    them, or one rank more (the head alone).

    Raises:
        ModelParallelError: Naming the branches and the group sizes that fit.
    """
    fits = (len(branch_names), len(branch_names) + 1)
    if group_size not in fits:
        raise ModelParallelError(
            f"a branches group of {group_size} rank(s) does not fit the {fits[0]} declared "
            f"branch(es) {list(branch_names)}: a group has one rank per branch (the head on one "
            f"of them) or one more (the head alone); set parallel.group_size to {fits[0]} or "
            f"{fits[1]}"
        )


def costs_from_speeds(
    branch_costs: Sequence[float], rank_speeds: Sequence[float]
) -> tuple[tuple[float, ...], ...]:
    """Per-rank cost matrix from costs on a reference device and relative rank speeds.

    ``cost[r][b] = branch_costs[b] / rank_speeds[r]`` (a rank of speed 0.5 takes twice as
    long).

    Raises:
        ModelParallelError: Non-finite or non-positive speeds, negative costs.
    """
    _check_costs("branch cost", branch_costs, allow_zero=True)
    _check_costs("rank speed", rank_speeds, allow_zero=False)
    return tuple(tuple(c / s for c in branch_costs) for s in rank_speeds)


def placement_stage_times(
    branch_of_rank: Sequence[int],
    head_rank: int,
    costs: Sequence[Sequence[float]],
    head_costs: Sequence[float],
) -> tuple[float, ...]:
    """Predicted seconds of work per rank for one placement (see module docstring)."""
    stage = [0.0] * len(costs)
    for branch, rank in enumerate(branch_of_rank):
        stage[rank] += costs[rank][branch]
    stage[head_rank] += head_costs[head_rank]
    return tuple(stage)


def place_branches(
    branch_names: Sequence[str],
    costs: Sequence[Sequence[float]],
    head_costs: Sequence[float] | None = None,
) -> BranchPlacement:
    """The placement of branches and head minimising the largest per-rank stage time.

    ``costs[r][b]`` is branch ``b``'s seconds on rank ``r``; ``head_costs`` default to zero
    (the head then goes where it balances best, ties to the lowest rank). Every rank gets a
    branch (with ``branches + 1`` ranks, all but the head's, which runs the head alone).

    Raises:
        ModelParallelError: Mis-shaped or invalid costs, or more ranks than branches + 1.
    """
    names = tuple(branch_names)
    world = len(costs)
    if not names:
        raise ModelParallelError("place_branches needs at least one branch name")
    if world < 1:
        raise ModelParallelError("place_branches needs the costs of at least one rank")
    if world > len(names) + 1:
        raise ModelParallelError(
            f"{world} ranks but only {len(names)} branch(es) and one head: rank(s) would be "
            f"idle. Fix: place on at most {len(names) + 1} workers, or compose branch placement "
            "with data parallelism."
        )
    for r, row in enumerate(costs):
        if len(row) != len(names):
            raise ModelParallelError(
                f"costs[{r}] has {len(row)} entries, expected one per branch {list(names)}"
            )
        _check_costs(f"cost on rank {r}", row, allow_zero=True)
    heads = tuple(head_costs) if head_costs is not None else (0.0,) * world
    if len(heads) != world:
        raise ModelParallelError(f"head_costs has {len(heads)} entries, expected {world}")
    _check_costs("head cost", heads, allow_zero=True)

    if world ** (len(names) + 1) <= _MAX_EXHAUSTIVE_CANDIDATES:
        best = _exhaustive(len(names), costs, heads)
    else:
        best = _greedy(len(names), costs, heads)
    assignment, head_rank = best
    stage = placement_stage_times(assignment, head_rank, costs, heads)
    logger.debug("branch placement %s head %d stage times %s", assignment, head_rank, stage)
    return BranchPlacement(tuple(zip(names, assignment, strict=True)), head_rank, world, stage)


def _spread(assignment: Sequence[int], world: int) -> bool:
    """Whether branches cover every rank (all but the head's when there is one rank more)."""
    return len(set(assignment)) == min(world, len(assignment))


def _exhaustive(
    n_branches: int, costs: Sequence[Sequence[float]], heads: Sequence[float]
) -> tuple[tuple[int, ...], int]:
    world = len(costs)
    best: tuple[tuple[int, ...], int] | None = None
    best_time = math.inf
    for head_rank in range(world):
        for assignment in itertools.product(range(world), repeat=n_branches):
            if not _spread(assignment, world) or (
                len(assignment) < world and head_rank in assignment
            ):
                continue
            span = max(placement_stage_times(assignment, head_rank, costs, heads))
            if best is None or span < best_time * (1.0 - _TIE_TOLERANCE):
                best, best_time = (assignment, head_rank), span
    if best is None:  # pragma: no cover - world <= branches + 1 always has a busy candidate
        raise ModelParallelError("no placement keeps every rank busy")
    return best


def _greedy(
    n_branches: int, costs: Sequence[Sequence[float]], heads: Sequence[float]
) -> tuple[tuple[int, ...], int]:
    """Longest branch first onto the rank where it finishes earliest; head likewise last."""
    world = len(costs)
    stage = [0.0] * world
    holds: set[int] = set()
    assignment = [0] * n_branches
    order = sorted(range(n_branches), key=lambda b: (-min(row[b] for row in costs), b))
    for position, branch in enumerate(order):
        remaining = n_branches - position
        idle = [r for r in range(world) if r not in holds]
        # Every rank gets a branch (one more rank than branches: all but the head's): while
        # as many ranks are idle as branches remain, the branch must go to an idle rank.
        candidates = idle if len(idle) >= remaining else range(world)
        rank = min(candidates, key=lambda r: (stage[r] + costs[r][branch], r))
        assignment[branch] = rank
        stage[rank] += costs[rank][branch]
        holds.add(rank)
    empty = [r for r in range(world) if r not in holds]
    head_rank = empty[0] if empty else min(range(world), key=lambda r: (stage[r] + heads[r], r))
    return tuple(assignment), head_rank


def _check_costs(what: str, values: Sequence[float], *, allow_zero: bool) -> None:
    for value in values:
        v = float(value)
        if not math.isfinite(v) or v < 0.0 or (v == 0.0 and not allow_zero):
            bound = ">= 0" if allow_zero else "> 0"
            raise ModelParallelError(
                f"every {what} must be a finite number {bound}, got {list(values)}"
            )
