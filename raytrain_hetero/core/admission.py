"""Admission: which workers raise the group's samples/s, and which cost more than they add.

A worker adds throughput only if the compute it takes off the others outweighs what it adds
to the gradient collective (and to the makespan, when even its minimum slice is late). For a
set S of workers and a global batch of B samples::

    samples_per_s(S) = B / (makespan(allocate(B, costs_S)) + collective(S))

:func:`decide_admission` is a deterministic greedy over the workers fastest first
(:func:`greedy_order`): add the next while it raises the prediction; the first that does not
is left out with every slower one. Only prefixes are evaluated, so the worker side measures a
real all-reduce on each prefix's group (a slow link shows in exactly the prefixes holding
it). The collective counts in full, not overlapped with backward: an upper bound.

Pure: standard library and numpy only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from raytrain_hetero.core.allocation import CostModel, allocate, makespan
from raytrain_hetero.errors import AllocationError

__all__ = [
    "AdmissionDecision",
    "WorkerAdmission",
    "decide_admission",
    "greedy_order",
    "group_samples_per_second",
    "kept_slots",
]


def greedy_order(total: int, costs: Sequence[CostModel]) -> tuple[int, ...]:
    """Ranks fastest first: by predicted seconds for the whole batch alone, ties by rank."""
    return tuple(sorted(range(len(costs)), key=lambda r: (costs[r].time(total), r)))


def group_samples_per_second(
    total: int,
    costs: Sequence[CostModel],
    *,
    collective_s: float,
    caps: Sequence[int | None] | None = None,
    min_slice: int = 1,
    quantum: int = 1,
) -> float:
    """Predicted samples/s of one group: ``total / (makespan + collective_s)``.

    Returns:
        0.0 when no plan of ``total`` samples fits the group (caps too small, or fewer
        samples than ``len(costs) * min_slice``, or, with ``quantum`` (ghost groups), fewer
        whole groups than workers).
    """
    try:
        slices = allocate(total, costs, caps=caps, min_slice=min_slice, quantum=quantum)
    except AllocationError:
        return 0.0
    step = makespan(slices, costs) + max(0.0, collective_s)
    return total / step if step > 0 else float("inf")


@dataclass(frozen=True)
class WorkerAdmission:
    """The admission verdict of one worker (rank).

    Attributes:
        rank: World rank in the measured group.
        worker: Its WorkerSpec name.
        alone_samples_per_s: Its samples/s on the whole batch alone (no collective).
        order: Its place in the greedy order (0: fastest).
        without_samples_per_s: Predicted group samples/s of the workers admitted before it.
        with_samples_per_s: Predicted group samples/s with it added to those.
        admitted: Whether it trains.
        reason: Why, in words with the numbers.
    """

    rank: int
    worker: str
    alone_samples_per_s: float
    order: int
    without_samples_per_s: float
    with_samples_per_s: float
    admitted: bool
    reason: str


@dataclass(frozen=True)
class AdmissionDecision:
    """Which workers of a measured group are worth training with.

    Attributes:
        workers: One verdict per rank, in rank order.
        collective_s: Gradient collective seconds per step of the k fastest workers, at
            index k - 1 (0 for one worker), as measured.
        all_samples_per_s: Predicted group samples/s with every worker.
        admitted_samples_per_s: Predicted group samples/s with the admitted workers.
    """

    workers: tuple[WorkerAdmission, ...]
    collective_s: tuple[float, ...]
    all_samples_per_s: float
    admitted_samples_per_s: float

    @property
    def admitted(self) -> tuple[int, ...]:
        """Ranks that train."""
        return tuple(w.rank for w in self.workers if w.admitted)

    @property
    def excluded(self) -> tuple[int, ...]:
        """Ranks left out."""
        return tuple(w.rank for w in self.workers if not w.admitted)

    def summary(self) -> str:
        """One line for logs: who is left out and the predicted gain."""
        if not self.excluded:
            return (
                f"admission: all {len(self.workers)} workers raise the group's samples/s "
                f"(predicted {self.all_samples_per_s:.1f}/s, collective "
                f"{self.collective_s[-1] * 1e3:.1f} ms)"
            )
        names = ", ".join(f"{w.worker} (rank {w.rank})" for w in self.workers if not w.admitted)
        return (
            f"admission: leave out {names}: predicted {self.admitted_samples_per_s:.1f} "
            f"samples/s without, {self.all_samples_per_s:.1f} with every worker "
            f"(collective {self.collective_s[-1] * 1e3:.1f} ms with every worker)"
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON, Ray messages)."""
        out = asdict(self)
        out["admitted"] = list(self.admitted)
        out["excluded"] = list(self.excluded)
        return out


def decide_admission(
    total: int,
    costs: Sequence[CostModel],
    *,
    collective_s: Sequence[float],
    names: Sequence[str] | None = None,
    caps: Sequence[int | None] | None = None,
    min_slice: int = 1,
    quantum: int = 1,
) -> AdmissionDecision:
    """Greedy admission, fastest first, while the predicted group samples/s rises.

    ``collective_s[k - 1]`` is the gradient collective's seconds per step of the first k
    workers of :func:`greedy_order` (index 0 ignored: one worker has no collective). A worker
    whose cap is needed for the batch to fit at all is admitted (a group that cannot hold the
    batch is worth 0 samples/s). With ``quantum`` g (ghost BatchNorm) slices are whole
    groups: a worker whose best slice would be under one group must still take a whole one,
    which lengthens every step if it is slow, so the same prediction leaves it out; a worker
    for which no group is left at all makes the prediction 0 and is left out likewise.

    Raises:
        AllocationError: If ``costs`` is empty or ``collective_s``/``names``/``caps`` have
            another length.
    """
    n = len(costs)
    if n == 0:
        raise AllocationError("decide_admission needs at least one cost model")
    names = tuple(names) if names is not None else tuple(f"rank{r}" for r in range(n))
    caps = tuple(caps) if caps is not None else (None,) * n
    collective = (0.0, *(max(0.0, float(c)) for c in tuple(collective_s)[1:]))
    if len(names) != n or len(caps) != n or len(collective_s) != n:
        raise AllocationError(
            f"decide_admission: {n} cost models but {len(collective_s)} collective times, "
            f"{len(names)} names and {len(caps)} caps"
        )

    def alone(rank: int) -> float:
        batch = total if caps[rank] is None else min(total, int(caps[rank] or total))
        return batch / costs[rank].time(batch)

    def predict(ranks: Sequence[int]) -> float:
        return group_samples_per_second(
            total,
            [costs[r] for r in ranks],
            collective_s=collective[len(ranks) - 1],
            caps=[caps[r] for r in ranks],
            min_slice=min_slice,
            quantum=quantum,
        )

    order = greedy_order(total, costs)
    chosen: list[int] = []
    current = 0.0
    verdicts: dict[int, WorkerAdmission] = {}
    stopped = False
    for place, rank in enumerate(order):
        with_it = predict([*chosen, rank])
        admit = not stopped and (not chosen or with_it > current)
        if admit:
            reason = (
                "fastest worker"
                if not chosen
                else f"raises the group from {current:.1f} to {with_it:.1f} samples/s"
            )
        elif stopped:
            reason = "slower than a worker already left out"
        else:
            reason = (
                f"would lower the group from {current:.1f} to {with_it:.1f} samples/s "
                f"(adds {alone(rank):.1f} samples/s of compute but lengthens every step)"
            )
        verdicts[rank] = WorkerAdmission(
            rank=rank,
            worker=names[rank],
            alone_samples_per_s=alone(rank),
            order=place,
            without_samples_per_s=current,
            with_samples_per_s=with_it,
            admitted=admit,
            reason=reason,
        )
        if admit:
            chosen.append(rank)
            current = with_it
        else:
            stopped = True
    return AdmissionDecision(
        workers=tuple(verdicts[r] for r in range(n)),
        collective_s=collective,
        all_samples_per_s=predict(order),
        admitted_samples_per_s=current,
    )


def kept_slots(
    admitted_slots: Sequence[int], preference: Sequence[int], *, min_workers: int = 1
) -> tuple[int, ...]:
    """The worker slots a group keeps after admission, in the order Ray Train fills them.

    Ray Train fills a group of k workers from its first k placement slots; the trainer owns
    which worker slot (WorkerSpec) each of those hosts, so a left-out slot is dropped
    wherever it is listed: the admitted slots come first, in their listed order, then, only
    as far as ``min_workers`` asks (at least one), left-out slots in ``preference`` order
    (every slot, fastest first). Entry j of the result is the slot Ray Train's j-th worker
    hosts.

    Raises:
        AllocationError: ``preference`` repeats a slot or misses an admitted one.
    """
    admitted = sorted(set(admitted_slots))
    if len(set(preference)) != len(preference) or not set(admitted) <= set(preference):
        raise AllocationError(
            f"kept_slots: preference {list(preference)} must list every slot once, "
            f"admitted {admitted} among them"
        )
    rest = [slot for slot in preference if slot not in set(admitted)]
    extra = max(int(min_workers), 1, len(admitted)) - len(admitted)
    return (*admitted, *rest[:extra])
