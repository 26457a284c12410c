"""Node roles: whether a CPU worker adds more samples/s training or feeding the trainers.

A data-parallel group trains no faster than its input pipeline delivers samples. With fast
trainers that are loader-bound (decoding is the bottleneck of GPU training in remote sensing),
a CPU node adds little as one more (slow) trainer and may add much as one more node for the
Ray Data preprocessing (decode, augment) that feeds the others. In the spirit of admission
(:mod:`raytrain_hetero.core.admission`), the prediction for a set F of feeders is

    samples_per_s(F) = min(compute(trainers not in F), delivery + sum of feed_k over F)

where ``compute`` is admission's :func:`~raytrain_hetero.core.admission.group_samples_per_second`
of the trainers' compute-bound cost models, ``delivery`` the samples/s the input pipeline
delivers while every worker trains, and ``feed_k`` what the pipeline delivers more with
worker k's resources released for it (both measured by :mod:`raytrain_hetero.driver.roles`).
:func:`decide_roles` picks the set of feeders that maximises it (every subset of the
candidates up to :data:`EXACT_UP_TO` of them; beyond, the best prefix of the candidates by
feed/train ratio); a tie keeps the worker training (the stock role). Under ghost BatchNorm
(``quantum`` g) the trainers' compute is predicted from plans in whole groups, as the run's
plans are: a set of trainers with fewer whole groups than workers (or than their minimum
slices) trains at 0 samples/s.

Pure: standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from itertools import combinations
from typing import Any, Literal

from raytrain_hetero.core.admission import group_samples_per_second
from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.errors import AllocationError

__all__ = ["EXACT_UP_TO", "NodeRole", "RolesDecision", "decide_roles"]

#: Candidates searched exhaustively (2**n subsets); more are searched by ratio prefixes.
EXACT_UP_TO = 12


@dataclass(frozen=True)
class NodeRole:
    """The role of one worker (rank).

    Attributes:
        rank: Rank in the measured group.
        worker: Its WorkerSpec name.
        role: ``"train"`` or ``"feed"`` (does not train; its CPUs run Ray Data's preprocessing).
        candidate: Whether it could feed (a CPU worker, not the fastest).
        train_samples_per_s: Its compute-bound samples/s on the whole batch alone.
        feed_samples_per_s: The pipeline's measured delivery gain with its resources
            released (0.0: not measured, or no gain).
    """

    rank: int
    worker: str
    role: Literal["train", "feed"]
    candidate: bool
    train_samples_per_s: float
    feed_samples_per_s: float


@dataclass(frozen=True)
class RolesDecision:
    """Which workers train and which feed, with the predicted samples/s each way.

    Attributes:
        workers: One role per rank, in rank order.
        delivery_samples_per_s: Measured input-pipeline samples/s while every worker trains.
        all_train_compute_samples_per_s: Compute-bound samples/s with every worker training
            (above ``delivery_samples_per_s``: the group is loader-bound).
        all_train_samples_per_s: Predicted group samples/s with every worker training.
        chosen_samples_per_s: Predicted group samples/s with the chosen roles.
        compute_samples_per_s: Compute-bound samples/s of the chosen trainers.
    """

    workers: tuple[NodeRole, ...]
    delivery_samples_per_s: float
    all_train_compute_samples_per_s: float
    all_train_samples_per_s: float
    chosen_samples_per_s: float
    compute_samples_per_s: float

    @property
    def feeders(self) -> tuple[int, ...]:
        """Ranks that feed instead of training."""
        return tuple(w.rank for w in self.workers if w.role == "feed")

    def summary(self) -> str:
        """One line for logs, with the numbers."""
        loader = (
            "loader-bound"
            if self.delivery_samples_per_s < self.all_train_compute_samples_per_s
            else "compute-bound"
        )
        head = (
            f"roles: input pipeline {self.delivery_samples_per_s:.1f} samples/s with every "
            f"worker training ({loader}); predicted {self.all_train_samples_per_s:.1f} samples/s"
        )
        if not self.feeders:
            return f"{head}; every worker trains"
        names = ", ".join(f"{w.worker} (rank {w.rank})" for w in self.workers if w.role == "feed")
        return (
            f"{head} all training, {self.chosen_samples_per_s:.1f} with {names} feeding "
            f"instead (trainers' compute {self.compute_samples_per_s:.1f} samples/s)"
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON, summary.json)."""
        return dict(asdict(self), feeders=list(self.feeders), summary=self.summary())


def decide_roles(
    total: int,
    costs: Sequence[CostModel],
    *,
    candidates: Sequence[bool],
    feed_samples_per_s: Sequence[float],
    delivery_samples_per_s: float,
    names: Sequence[str] | None = None,
    collective_s: float = 0.0,
    min_slice: int = 1,
    quantum: int = 1,
) -> RolesDecision:
    """Feeders that maximise the predicted group samples/s (see the module).

    Args:
        total: Global batch size B.
        costs: One compute-bound cost model per rank (the probe's or the passive timing's).
        candidates: Per rank, whether it may feed (CPU workers). The fastest worker always
            trains, whatever this says.
        feed_samples_per_s: Per rank, samples/s it adds to the delivery by feeding (ignored
            where not a candidate).
        delivery_samples_per_s: Measured samples/s of the input pipeline while every worker
            trains (``inf``: not loader-bound at all).
        names: Worker names per rank (default ``rank<i>``).
        collective_s: Gradient collective seconds per step (counted as admission does).
        min_slice: Smallest slice of any trainer.
        quantum: Samples every slice is a multiple of (``ghost_size`` under ghost BatchNorm,
            else 1): the trainers' compute comes from plans in whole groups.

    Raises:
        AllocationError: Empty ``costs``, or per-rank inputs of another length.
    """
    n = len(costs)
    names = tuple(names) if names is not None else tuple(f"rank{r}" for r in range(n))
    if n == 0 or not len(candidates) == len(feed_samples_per_s) == len(names) == n:
        raise AllocationError(
            f"decide_roles: {n} cost models, {len(candidates)} candidate flags, "
            f"{len(feed_samples_per_s)} feed rates and {len(names)} names (need one each, n > 0)"
        )
    fastest = min(range(n), key=lambda r: (costs[r].time(total), r))
    pool = [r for r in range(n) if candidates[r] and r != fastest]
    feed = {r: max(0.0, float(feed_samples_per_s[r])) if r in pool else 0.0 for r in range(n)}
    delivery = max(0.0, float(delivery_samples_per_s))

    def compute(feeders: frozenset[int]) -> float:
        trainers = [costs[r] for r in range(n) if r not in feeders]
        return group_samples_per_second(
            total,
            trainers,
            collective_s=collective_s if len(trainers) > 1 else 0.0,
            min_slice=min_slice,
            quantum=quantum,
        )

    def predict(feeders: frozenset[int]) -> float:
        return min(compute(feeders), delivery + sum(feed[r] for r in feeders))

    if len(pool) <= EXACT_UP_TO:
        options = [frozenset(c) for k in range(len(pool) + 1) for c in combinations(pool, k)]
    else:
        ranked = sorted(pool, key=lambda r: (-feed[r] * costs[r].time(total) / total, r))
        options = [frozenset(ranked[:k]) for k in range(len(pool) + 1)]
    # Fewest feeders first, so a tie keeps workers training; max() keeps the first best.
    best = max(options, key=predict)
    return RolesDecision(
        workers=tuple(
            NodeRole(
                rank=r,
                worker=names[r],
                role="feed" if r in best else "train",
                candidate=r in pool,
                train_samples_per_s=total / costs[r].time(total),
                feed_samples_per_s=feed[r],
            )
            for r in range(n)
        ),
        delivery_samples_per_s=delivery,
        all_train_compute_samples_per_s=compute(frozenset()),
        all_train_samples_per_s=predict(frozenset()),
        chosen_samples_per_s=predict(best),
        compute_samples_per_s=compute(best),
    )
