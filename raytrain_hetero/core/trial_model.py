"""The model under the trial allocation: worker types, slots, a trial's demand and its time.

A trial on ``n_t`` workers of each type ``t`` takes, per step of ``B`` samples carved for the
smallest makespan (continuous relaxation of the integer carving of
:mod:`raytrain_hetero.core.allocation`), the level ``T`` with
``sum_t n_t * max(0, T - alpha_t) / beta_t = B``, plus ``sync_s * 2 (N - 1) / N`` for its ``N``
workers (a ring all-reduce; nothing on one worker). So a slow worker adds little speed but a
full share of the exchange: adding it can make a trial slower. A trial completes
``restart_s`` (only if its slots change) plus ``fixed_s`` plus ``remaining_samples / B``
steps from now. :func:`cluster_slots` turns nodes (labels, resources) into worker slots.

Pure (stdlib); the decision over these is :mod:`raytrain_hetero.core.trial_allocation`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.placement import selector_matches
from raytrain_hetero.errors import AllocationError

__all__ = [
    "EPSILON",
    "ClusterNode",
    "TrialDemand",
    "WorkerSlot",
    "WorkerType",
    "asha_expected_epochs",
    "cluster_slots",
    "run_seconds",
    "step_seconds",
    "trial_completion",
    "unique_ids",
]

#: Slack of float resources (fractional CPUs) and of objective comparisons.
EPSILON = 1e-9


@dataclass(frozen=True)
class WorkerType:
    """A kind of worker: what one needs and which nodes may hold it.

    Attributes:
        name: The type's name (the key of each trial's cost models), e.g. ``"v100"``.
        resources: What one worker of this type takes from its node, e.g. ``{"GPU": 1}``.
        label_selector: Node labels a node needs to hold it (Ray's selector syntax).
    """

    name: str
    resources: Mapping[str, float]
    label_selector: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterNode:
    """One node: its id, labels and the resources the search may use."""

    node_id: str
    resources: Mapping[str, float]
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class WorkerSlot:
    """A place for one worker: ``slot_id`` is ``"<node_id>/<i>"``."""

    slot_id: str
    node_id: str
    worker_type: str


@dataclass(frozen=True)
class TrialDemand:
    """One live trial as the allocator sees it.

    Attributes:
        trial_id: Unique id.
        costs: Per worker type its one-step cost model (the remembered ``cost_models`` entry of
            the trial's model on that type); a type absent here is one the trial cannot use.
        global_batch: Samples per step (``B``), carved over the trial's workers.
        remaining_samples: Samples the trial is expected still to process (>= 0).
        sync_s: Seconds of one full gradient exchange per step (the ring's ``2(N-1)/N`` of it
            is paid on ``N > 1`` workers).
        restart_s: Seconds a change of the trial's workers costs it (checkpoint, new worker
            group, restore), measured.
        current: Slot ids the trial holds now (empty: not started).
        fixed_s: Seconds the trial still spends outside its steps whatever its workers (its
            remaining epochs' validation, reports and checkpoints, measured): added to its
            completion, so that the search's bottleneck is the trial that really ends last.
    """

    trial_id: str
    costs: Mapping[str, CostModel]
    global_batch: int
    remaining_samples: float
    sync_s: float = 0.0
    restart_s: float = 0.0
    current: tuple[str, ...] = ()
    fixed_s: float = 0.0


def asha_expected_epochs(
    done: int, max_t: int, grace_period: int, reduction_factor: float
) -> float:
    """Expected epochs still to run of a trial that has run ``done`` under ASHA.

    The epochs up to the next rung are certain; each later segment counts with the probability
    of being promoted at every rung before it, ``1 / reduction_factor`` per rung (ASHA keeps
    the top ``1/eta`` of each rung).
    """
    if done >= max_t:
        return 0.0
    rungs = []
    rung = float(grace_period)
    while rung < max_t:
        rungs.append(rung)
        rung *= reduction_factor
    rungs.append(float(max_t))
    expected, position, weight = 0.0, float(done), 1.0
    for milestone in rungs:
        if milestone <= position:
            continue
        expected += weight * (milestone - position)
        position = milestone
        weight /= reduction_factor
    return expected


def _level(counts: Mapping[str, int], costs: Mapping[str, CostModel], batch: int) -> float:
    """The carved step's compute level ``T``: ``sum n_t max(0, T - a_t) / b_t = batch``."""
    items = sorted(
        ((costs[t].alpha, costs[t].beta, n) for t, n in counts.items() if n > 0),
        key=lambda x: x[0],
    )
    if not items:
        return math.inf
    rate = 0.0  # sum n / beta of the types active below the level
    offset = 0.0  # sum n * alpha / beta
    for i, (alpha, beta, n) in enumerate(items):
        rate += n / beta
        offset += n * alpha / beta
        level = (batch + offset) / rate
        upper = items[i + 1][0] if i + 1 < len(items) else math.inf
        if level <= upper:
            return level
    return (batch + offset) / rate  # pragma: no cover - the last type has no upper bound


def step_seconds(counts: Mapping[str, int], demand: TrialDemand) -> float:
    """Predicted seconds of one step of ``demand`` on ``counts`` workers per type."""
    workers = sum(n for n in counts.values() if n > 0)
    if workers == 0:
        return math.inf
    sync = demand.sync_s * 2.0 * (workers - 1) / workers
    return _level(counts, demand.costs, demand.global_batch) + sync


def run_seconds(counts: Mapping[str, int], demand: TrialDemand) -> float:
    """Predicted seconds of ``demand``'s remaining steps on ``counts`` (no restart, no
    ``fixed_s``): the part of its completion that its workers decide."""
    if demand.remaining_samples <= 0:
        return 0.0
    steps = demand.remaining_samples / demand.global_batch
    return steps * step_seconds(counts, demand)


def trial_completion(counts: Mapping[str, int], demand: TrialDemand, *, changed: bool) -> float:
    """Predicted seconds until ``demand`` ends on ``counts``: its remaining steps, its
    ``fixed_s``, plus its restart if ``changed``."""
    restart = demand.restart_s if changed else 0.0
    return restart + demand.fixed_s + run_seconds(counts, demand)


def cluster_slots(
    nodes: Sequence[ClusterNode], types: Sequence[WorkerType]
) -> tuple[tuple[WorkerSlot, ...], tuple[str, ...]]:
    """The worker slots ``nodes`` offer, and findings about unusable nodes.

    A node holds workers of the first type in ``types`` whose label selector it matches and
    whose resources it has, as many as its resources allow (``"<node_id>/<i>"``).

    Raises:
        AllocationError: Duplicate node ids or type names, or a type asking for nothing.
    """
    unique_ids([n.node_id for n in nodes], "node id")
    unique_ids([t.name for t in types], "worker type name")
    for t in types:
        if not any(v > 0 for v in t.resources.values()):
            raise AllocationError(
                f"worker type {t.name!r} asks for no resources ({dict(t.resources)}); give it "
                "what one worker takes, e.g. {'GPU': 1}"
            )
    slots: list[WorkerSlot] = []
    findings: list[str] = []
    for node in sorted(nodes, key=lambda n: n.node_id):
        for t in types:
            if not selector_matches(t.label_selector, node.labels):
                continue
            count = min(
                math.floor((node.resources.get(k, 0.0) + EPSILON) / v)
                for k, v in t.resources.items()
                if v > 0
            )
            if count >= 1:
                slots.extend(
                    WorkerSlot(f"{node.node_id}/{i}", node.node_id, t.name) for i in range(count)
                )
                break
        else:
            findings.append(
                f"node {node.node_id} (labels {dict(node.labels)}, resources "
                f"{dict(node.resources)}) holds no worker type: it stays idle"
            )
    return tuple(slots), tuple(findings)


def unique_ids(ids: Iterable[str], what: str) -> None:
    """Raise :class:`AllocationError` naming the first id of ``ids`` that repeats."""
    seen: set[str] = set()
    for i in ids:
        if i in seen:
            raise AllocationError(f"duplicate {what} {i!r}; every {what} must be unique")
        seen.add(i)
