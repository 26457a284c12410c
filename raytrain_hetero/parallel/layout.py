"""Process groups and layout records of a model-parallel run (R replicas x G-way groups).

Group ``i`` of ``G`` consecutive ranks is data-parallel replica ``i``; a rank's *position* is
its index in its group. The *split* group of a replica carries the conv split's and branch
pipeline's traffic; the *peer* group of a position (its rank in every replica) holds the same
parameters, since every replica splits alike, and all-reduces their gradients weighted by
each replica's samples (exact). Every rank creates every group in the same order (torch
requires it), each with the run's collective timeout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from raytrain_hetero.config.parallel import ParallelConfig, ParallelMode

__all__ = [
    "ParallelGroups",
    "ParallelLayout",
    "RankLayout",
    "build_groups",
    "reduce_across_replicas",
]


@dataclass(frozen=True)
class ParallelGroups:
    """This rank's place in the layout and its two process groups.

    Attributes:
        groups: The model-parallel groups (world ranks), one per replica.
        replica: Index of this rank's group.
        position: This rank's index within its group.
        split: Process group of this rank's replica.
        peers: Process group of this rank's position across replicas (None with one replica).
    """

    groups: tuple[tuple[int, ...], ...]
    replica: int
    position: int
    split: Any
    peers: Any

    @property
    def replicas(self) -> int:
        """Number of data-parallel replicas R."""
        return len(self.groups)

    @property
    def group_size(self) -> int:
        """Ranks per model-parallel group G."""
        return len(self.groups[0])

    def members(self) -> tuple[int, ...]:
        """World ranks of this rank's replica."""
        return self.groups[self.replica]


def build_groups(
    config: ParallelConfig, rank: int, world_size: int, timeout_s: float | None
) -> ParallelGroups:
    """Create every split and peer group (a collective: every rank, same order).

    Raises:
        ConfigError: ``group_size`` does not cut the world into groups of >= 2 ranks.
    """
    groups = config.groups(world_size)
    timeout = None if timeout_s is None else timedelta(seconds=timeout_s)
    backend = dist.get_backend()
    split = peers = None
    for index, members in enumerate(groups):
        created = dist.new_group(list(members), timeout=timeout, backend=backend)
        if rank in members:
            split, replica, position = created, index, members.index(rank)
    if len(groups) > 1:
        for pos in range(len(groups[0])):
            ranks = [members[pos] for members in groups]
            created = dist.new_group(ranks, timeout=timeout, backend=backend)
            if rank in ranks:
                peers = created
    return ParallelGroups(groups, replica, position, split, peers)


def reduce_across_replicas(
    parameters: Sequence[torch.nn.Parameter],
    loss: torch.Tensor,
    weight: float,
    peers: Any,
) -> float:
    """Weighted sum over the replicas of every gradient and of the loss (one all-reduce).

    ``sum_i (n_i / N) * grad_i`` of the replicas' mean-loss gradients is exactly the global
    batch's gradient; the loss rides in the same buffer, so the global batch's mean loss is
    returned. ``weight`` is ``n_i / N`` of this rank's replica; ``peers`` None: one replica.
    """
    if peers is None:
        return float(loss.detach())
    grads = [p.grad for p in parameters if p.grad is not None]
    dtype = grads[0].dtype if grads else torch.float64
    device = grads[0].device if grads else loss.device
    flat = torch.cat(
        [g.reshape(-1) for g in grads] + [loss.detach().reshape(1).to(device, dtype)]
    ).mul_(weight)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=peers)
    offset = 0
    for grad in grads:
        grad.copy_(flat[offset : offset + grad.numel()].view_as(grad))
        offset += grad.numel()
    return float(flat[-1])


@dataclass(frozen=True)
class RankLayout:
    """What one world rank holds.

    Attributes:
        replica: Its model-parallel group (data-parallel replica).
        position: Its index within the group.
        kernels: ``conv_split``: ``(layer, kernels)`` it owns, in layer order.
        branches: ``branches``: the branches it runs, in fusion order.
        head: ``branches``: whether it runs the fusion head.
    """

    rank: int
    replica: int
    position: int
    kernels: tuple[tuple[str, int], ...] = ()
    branches: tuple[str, ...] = ()
    head: bool = False

    @property
    def text(self) -> str:
        """Short description for a progress table: ``"conv1:120 conv2:360"``, ``"s2+head"``."""
        if self.kernels:
            return " ".join(f"{name}:{k}" for name, k in self.kernels)
        return "+".join([*self.branches, *(["head"] if self.head else [])])


@dataclass(frozen=True)
class ParallelLayout:
    """The layout of a model-parallel run: the same split or placement in every replica.

    Attributes:
        groups: The model-parallel groups (world ranks), one per replica.
        kernels: ``conv_split``: ``(layer, kernels per position)`` in layer order.
        branch_ranks: ``branches``: ``(branch, position)`` in fusion order.
        head_position: ``branches``: position of the head rank in each group (-1 otherwise).
    """

    mode: ParallelMode
    groups: tuple[tuple[int, ...], ...]
    ranks: tuple[RankLayout, ...]
    kernels: tuple[tuple[str, tuple[int, ...]], ...] = ()
    branch_ranks: tuple[tuple[str, int], ...] = ()
    head_position: int = -1

    def text(self, rank: int) -> str:
        """The short description of world ``rank``."""
        return self.ranks[rank].text

    @classmethod
    def build(
        cls,
        mode: ParallelMode,
        groups: tuple[tuple[int, ...], ...],
        *,
        kernels: Sequence[tuple[str, tuple[int, ...]]] = (),
        branch_ranks: Sequence[tuple[str, int]] = (),
        head_position: int = -1,
    ) -> ParallelLayout:
        """The layout from the per-position split or placement, the same in every replica."""
        ranks = []
        for replica, members in enumerate(groups):
            for position, rank in enumerate(members):
                ranks.append(
                    RankLayout(
                        rank=rank,
                        replica=replica,
                        position=position,
                        kernels=tuple((name, split[position]) for name, split in kernels),
                        branches=tuple(b for b, p in branch_ranks if p == position),
                        head=mode == "branches" and position == head_position,
                    )
                )
        ranks.sort(key=lambda r: r.rank)
        return cls(
            mode=mode,
            groups=groups,
            ranks=tuple(ranks),
            kernels=tuple(kernels),
            branch_ranks=tuple(branch_ranks),
            head_position=head_position,
        )
