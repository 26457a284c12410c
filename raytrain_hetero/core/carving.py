"""Epoch carving: one seeded permutation per epoch, cut into global steps, split per rank.

Step boundaries depend only on the dataset size, the global batch and ``min_step_size`` (the
largest world the run may reach times the minimum slice), never on the current world size or
plan. So a global step number maps to the same samples before and after a re-plan or an
elastic restart, and the cursor ``(epoch, step_in_epoch)`` pins the resume point exactly.

Ragged tail rule: an epoch of ``L`` samples has ``L // B`` full steps and a remainder ``r``.
If ``r >= min_step_size`` the remainder is its own short step; otherwise it is merged into the
previous step (which then has ``B + r`` samples), so no rank is ever handed an empty slice.

Under ghost BatchNorm (a plan with ``quantum`` g, ``min_step_size`` at least the largest world
times one group) a step's groups are cut from its first position: ``size // g`` groups, a
remainder of fewer than g samples joining the last group. The plan gives every rank whole
groups and the remainder to the last rank (:meth:`~raytrain_hetero.core.plan.Plan.split`), in
position order, so each slice holds exactly the step's groups and each step, the short or
merged last one included, is normalised as one device would normalise it, whatever the split.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from raytrain_hetero.core.plan import Plan
from raytrain_hetero.errors import ConfigError, HeteroError


@dataclass(frozen=True)
class Cursor:
    """Position in the sample stream: the next step to run.

    Attributes:
        epoch: Epoch of the next step.
        step_in_epoch: Index of the next step within that epoch.
    """

    epoch: int = 0
    step_in_epoch: int = 0


@dataclass(frozen=True)
class EpochCarver:
    """Pure carving of a dataset into global steps and per-rank slices.

    Attributes:
        min_step_size: Smallest step allowed (max world size x min slice).
        shuffle: If False the permutation is the identity (for evaluation or debugging).
    """

    dataset_size: int
    global_batch_size: int
    seed: int = 0
    min_step_size: int = 1
    shuffle: bool = True

    def __post_init__(self) -> None:
        if self.global_batch_size < 1:
            raise ConfigError(f"global_batch_size must be >= 1, got {self.global_batch_size}.")
        if self.min_step_size < 1:
            raise ConfigError(f"min_step_size must be >= 1, got {self.min_step_size}.")
        if self.global_batch_size < self.min_step_size:
            raise ConfigError(
                f"global_batch_size={self.global_batch_size} is smaller than "
                f"workers x min_slice = {self.min_step_size}: raise the global batch or use "
                "fewer workers."
            )
        if self.dataset_size < self.min_step_size:
            raise ConfigError(
                f"The dataset has {self.dataset_size} samples, fewer than workers x min_slice "
                f"= {self.min_step_size}: every worker needs at least one sample per step. "
                "Use a larger dataset or fewer workers."
            )

    @property
    def steps_per_epoch(self) -> int:
        """Global steps in every epoch (the ragged tail merged when too small)."""
        full, rest = divmod(self.dataset_size, self.global_batch_size)
        if rest == 0:
            return full
        if rest >= self.min_step_size or full == 0:
            return full + 1
        return full

    def step_bounds(self, step_in_epoch: int) -> tuple[int, int]:
        """Positions ``[start, stop)`` of the permutation taken by a step."""
        steps = self.steps_per_epoch
        if not 0 <= step_in_epoch < steps:
            raise HeteroError(
                f"step_in_epoch={step_in_epoch} is outside the epoch's {steps} steps."
            )
        start = step_in_epoch * self.global_batch_size
        stop = self.dataset_size if step_in_epoch == steps - 1 else start + self.global_batch_size
        return start, stop

    def step_size(self, step_in_epoch: int) -> int:
        """Samples in a step (``B`` except possibly the last step of an epoch)."""
        start, stop = self.step_bounds(step_in_epoch)
        return stop - start

    def permutation(self, epoch: int) -> np.ndarray:
        """The epoch's sample order: a seeded permutation of ``range(dataset_size)``."""
        if not self.shuffle:
            return np.arange(self.dataset_size, dtype=np.int64)
        rng = np.random.default_rng([self.seed, epoch])
        return rng.permutation(self.dataset_size).astype(np.int64)

    def global_step(self, cursor: Cursor) -> int:
        """Global step number of ``cursor`` (optimizer steps since the run began)."""
        return cursor.epoch * self.steps_per_epoch + cursor.step_in_epoch

    def cursor_of(self, global_step: int) -> Cursor:
        """Inverse of :meth:`global_step`."""
        epoch, step = divmod(global_step, self.steps_per_epoch)
        return Cursor(epoch=epoch, step_in_epoch=step)

    def step_counts(self, step_in_epoch: int, plan: Plan) -> tuple[int, ...]:
        """Per-rank sample counts of a step under ``plan``."""
        return plan.split(self.step_size(step_in_epoch))

    def rank_positions(self, step_in_epoch: int, plan: Plan, rank: int) -> tuple[int, int]:
        """Positions ``[start, stop)`` of the permutation that ``rank`` takes in a step."""
        if not 0 <= rank < plan.world_size:
            raise HeteroError(f"rank={rank} is outside the plan's {plan.world_size} ranks.")
        start, _ = self.step_bounds(step_in_epoch)
        counts = self.step_counts(step_in_epoch, plan)
        offset = start + sum(counts[:rank])
        return offset, offset + counts[rank]

    def rank_indices(
        self,
        epoch: int,
        step_in_epoch: int,
        plan: Plan,
        rank: int,
        permutation: np.ndarray | None = None,
    ) -> np.ndarray:
        """Dataset indices ``rank`` processes in a step (``permutation``: the epoch's, if the
        caller has it already)."""
        perm = self.permutation(epoch) if permutation is None else permutation
        lo, hi = self.rank_positions(step_in_epoch, plan, rank)
        return perm[lo:hi]
