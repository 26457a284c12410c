"""The search's allocator (``tune.allocation: auto``): which workers each live trial holds.

One :class:`TrialAllocator` per search owns the allocation state, like the run's scheduler
actor owns the live plan (:mod:`raytrain_hetero.driver.scheduler`): a plain class (tested as
an object, clock and node source injected) that :func:`start_allocator` wraps with
``ray.remote``. It knows the cluster's worker slots (the alive nodes of ``ray.nodes()``, their
resources and labels, less each trial driver's CPUs, matched to the job's worker *types*), each
trial's remaining budget (ASHA's rungs, :func:`~raytrain_hetero.core.trial_allocation.
asha_expected_epochs`) and its step cost per worker type (what the trial's own plans measured,
the remembered cost models; an unmeasured type is assumed as fast as the trial's measured ones),
and calls :func:`~raytrain_hetero.core.trial_allocation.decide_trial_allocation` on every
event: a trial asks for workers, ends or is stopped, reaches an epoch end, or the nodes change
(re-read at each event).

A trial (:func:`allocated_worker_specs`) pins each of its workers to the node of its slot
through a per-worker label selector (``ray.io/node-id``, Ray's own node label) and hands the
holding's version to its loop; at each epoch end, before its report, the loop tells the
allocator what the epoch measured (the newest cost models per worker type and, once per fit,
the fit's start) and asks it (:func:`epoch_end_moves`, one collective so every rank agrees); when
the holding changed it
ends the fit after its checkpoint: the trial then resumes its Train run (same name, so from
that checkpoint and data cursor) on its new workers. Exact carving and weighted gradients
keep its trajectory what it would have been on any worker set.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from raytrain_hetero.config import WorkerSpec
from raytrain_hetero.config.allocation import TrialAllocatorConfig
from raytrain_hetero.config.specs import NODE_ID_LABEL
from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.trial_allocation import (
    ClusterNode,
    TrialAllocationConfig,
    TrialDemand,
    WorkerSlot,
    WorkerType,
    asha_expected_epochs,
    cluster_slots,
    decide_trial_allocation,
)
from raytrain_hetero.errors import AllocationError, ConfigError

__all__ = [
    "ALLOCATOR_NAMESPACE",
    "NODE_ID_LABEL",
    "AllocationEvent",
    "FitStart",
    "TrialAllocator",
    "TrialHolding",
    "allocated_worker_specs",
    "allocator_actor_name",
    "epoch_end_moves",
    "live_cluster_nodes",
    "lookup_allocator",
    "start_allocator",
    "type_costs",
    "wait_for_holding",
    "worker_types",
]

logger = logging.getLogger(__name__)

ALLOCATOR_NAMESPACE = "raytrain_hetero"
# Seconds per sample assumed for a type no trial has measured yet (only ratios matter then).
_PRIOR_BETA = 1e-3
# Seconds a change is charged under a measured restart cost until a fit start is in.
_PRIOR_RESTART_S = 30.0


@dataclass(frozen=True)
class FitStart:
    """Where one fit's start went, measured by its rank 0 (seconds).

    Attributes:
        total_s: From the trial's call of the fit to the worker group's first step.
        library_s: Of it, from the group's start on the workers (the backend's set-up) to
            the first step: this library's part (data, model, restore, the first plan);
            ``None`` when not measured.
    """

    total_s: float
    library_s: float | None = None

    @property
    def ray_train_s(self) -> float | None:
        """The rest: Ray Train's controller, the placement group, the worker processes and
        their imports, the process group."""
        return None if self.library_s is None else self.total_s - self.library_s


def allocator_actor_name(experiment: str) -> str:
    """Ray actor name of the allocator of the search ``experiment``."""
    return f"raytrain_hetero_allocator:{experiment}"


@dataclass(frozen=True)
class TrialHolding:
    """The workers one trial holds now.

    Attributes:
        trial_id: The trial.
        version: Bumped each time its workers change (1: its first holding).
        workers: Its workers, sorted by slot.
        reason: Why (the allocator's one line).
    """

    trial_id: str
    version: int
    workers: tuple[WorkerSlot, ...]
    reason: str

    @property
    def nodes(self) -> tuple[str, ...]:
        """The node of each worker."""
        return tuple(w.node_id for w in self.workers)


@dataclass(frozen=True)
class AllocationEvent:
    """One change of one trial's holding (the allocation history).

    Attributes:
        time_s: Allocator clock seconds since the search's allocator started.
        trial_id: The trial.
        version: Its holding's version after the change (0: released).
        slots: The slots it holds from now on (empty: released).
        nodes: The node of each slot.
        cause: The event that made the decision (``"trial started"``, ``"epoch 2 ended"``,
            ``"trial ended"``, ``"nodes changed"``...).
        reason: The allocator's line for this trial.
    """

    time_s: float
    trial_id: str
    version: int
    slots: tuple[str, ...]
    nodes: tuple[str, ...]
    cause: str
    reason: str


@dataclass
class _Trial:
    global_batch: int
    epochs_done: int = 0
    driver_node: str | None = None
    costs: dict[str, CostModel] | None = None
    holding: TrialHolding | None = None


def worker_types(workers: Sequence[WorkerSpec]) -> tuple[WorkerType, ...]:
    """The allocator's worker types: one per ``workers:`` entry (its count is ignored).

    Raises:
        ConfigError: Two entries share a name.
    """
    names = [w.name for w in workers]
    if len(set(names)) != len(names):
        raise ConfigError(
            f"tune.allocation: auto reads workers: as worker types, but names repeat ({names}). "
            "Fix: give each type one entry with a unique name."
        )
    return tuple(
        WorkerType(w.name, dict(w.resources), dict(w.label_selector or {})) for w in workers
    )


class TrialAllocator:
    """Owns the search's allocation: registers trials, decides on each event, keeps history.

    Args:
        types: The worker types (:func:`worker_types`).
        nodes: Returns the alive nodes (:func:`live_cluster_nodes` in the actor).
        max_epochs: Every trial's epochs (``train.epochs``).
        samples_per_epoch: Training samples of one epoch (the dataset's train split).
        asha: ``(grace_period, reduction_factor)`` of the search's ASHA, None for FIFO.
        config: The allocator's settings.
        driver_cpus: CPUs each trial's driver reserves on its node (``tune.trial_cpus``).
        clock: Seconds (injected; ``time.monotonic``).
        expected_trials: The search's trial count (None: unknown). While some of them have
            not asked yet, no trial holds more than an equal share of the worker slots
            (``slots // min(slots, trials not ended)``): Tune starts its trials one by one, and
            without the share the first to ask would take every worker (the allocator knows
            no one else yet, and moving a started trial costs a restart), leaving the others
            to wait; ASHA then has no peers to compare the first trial with. Once every trial
            has asked, the configured cap applies and survivors grow into what ASHA frees.
    """

    def __init__(
        self,
        types: Sequence[WorkerType],
        nodes: Callable[[], Sequence[ClusterNode]],
        *,
        max_epochs: int,
        samples_per_epoch: int,
        asha: tuple[int, float] | None = None,
        config: TrialAllocatorConfig | None = None,
        driver_cpus: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        expected_trials: int | None = None,
    ) -> None:
        self._types = tuple(types)
        self._nodes = nodes
        self._max_epochs = max_epochs
        self._samples_per_epoch = samples_per_epoch
        self._asha = asha
        self._config = config or TrialAllocatorConfig()
        self._driver_cpus = driver_cpus
        self._clock = clock
        self._start = clock()
        self._trials: dict[str, _Trial] = {}  # in registration order (Tune's)
        self._history: list[AllocationEvent] = []
        self._measured: dict[str, CostModel] = {}  # per type, the latest any trial measured
        self._slot_set: tuple[str, ...] = ()
        self._expected_trials = expected_trials
        self._ended = 0  # trials released (ended or stopped)
        self._starts: dict[str, list[FitStart]] = {}  # per trial, its fits' measured starts
        self._restarts: list[float] = []  # the measured starts of fits that resumed a trial

    # ------------------------------------------------------------------ events

    def request(
        self,
        trial_id: str,
        *,
        global_batch: int,
        driver_node: str | None = None,
    ) -> TrialHolding | None:
        """A trial asks for its workers (registering it on its first call): its holding, or
        None while it waits for a free worker fast enough.

        Raises:
            AllocationError: No worker slot of the cluster can hold the trial (one line).
        """
        if trial_id not in self._trials:
            self._trials[trial_id] = _Trial(global_batch=global_batch, driver_node=driver_node)
            try:
                self._decide("trial started")
            except AllocationError:
                del self._trials[trial_id]
                raise
        elif self._trials[trial_id].holding is None:
            self.refresh()  # a waiting trial's poll: a node may have joined since
        return self._trials[trial_id].holding

    def epoch_ended(
        self,
        trial_id: str,
        epochs_done: int,
        *,
        costs: Mapping[str, tuple[float, float]] | None = None,
        start_s: float | None = None,
        library_s: float | None = None,
        resumed: bool = False,
    ) -> TrialHolding | None:
        """A trial finished ``epochs_done`` epochs: its budget shrinks (and under ASHA its
        expected remaining work jumps at a rung); returns its holding after the re-decision.

        Args:
            trial_id: The trial.
            epochs_done: Epochs it has finished.
            costs: Its newest measured cost models, per worker type (as :meth:`measured`).
            start_s: Its fit's start, from the fit's call to the first step (sent once per
                fit): a measured change cost (:meth:`restart_s`).
            library_s: Of ``start_s``, the library's part (:class:`FitStart`).
            resumed: The fit resumed the trial on new workers (a change's real cost; a
                search's first fits start all at once, on a busier cluster).
        """
        if start_s is not None and math.isfinite(start_s) and start_s >= 0:
            part = library_s if library_s is not None and 0 <= library_s <= start_s else None
            self._starts.setdefault(trial_id, []).append(FitStart(float(start_s), part))
            if resumed:
                self._restarts.append(float(start_s))
        if costs:
            self.measured(trial_id, costs)
        trial = self._trials.get(trial_id)
        if trial is None:
            return None
        trial.epochs_done = max(trial.epochs_done, epochs_done)
        self._decide(f"{trial_id} ended epoch {epochs_done}")
        return trial.holding

    def measured(self, trial_id: str, costs: Mapping[str, tuple[float, float]]) -> None:
        """The trial's step cost per worker type, ``{type: (alpha, beta)}`` (its plans'
        calibrated cost models); shared with the trials that have not measured that type."""
        models = {t: CostModel(float(a), float(b)) for t, (a, b) in costs.items()}
        self._measured.update(models)
        trial = self._trials.get(trial_id)
        if trial is not None:
            trial.costs = {**(trial.costs or {}), **models}

    def release(self, trial_id: str, cause: str = "trial ended") -> None:
        """The trial ended or was stopped: its workers go back to the others."""
        trial = self._trials.pop(trial_id, None)
        if trial is None:
            return
        self._ended += 1
        if trial.holding is not None:
            self._record(trial_id, 0, (), (), cause, "released its workers")
        if self._trials:
            self._decide(f"{trial_id}: {cause}")

    def refresh(self) -> bool:
        """Re-read the nodes; re-decide if the worker slots changed. True if they did."""
        before = self._slot_set
        slots, _ = self._slots()
        if tuple(s.slot_id for s in slots) == before:
            return False
        self._decide("nodes changed")
        return True

    # ------------------------------------------------------------------ queries

    def holding(self, trial_id: str) -> TrialHolding | None:
        """The trial's holding now (None: unknown or waiting)."""
        trial = self._trials.get(trial_id)
        return trial.holding if trial is not None else None

    def holdings(self) -> tuple[TrialHolding, ...]:
        """What every live trial holds now (trials still waiting left out), in the order
        they registered: the live progress view's source."""
        return tuple(t.holding for t in self._trials.values() if t.holding is not None)

    def restart_s(self) -> float:
        """Seconds a change of a trial's workers is charged: the configured ``restart_s``,
        or when that is None the median of the measured starts of the fits that resumed a
        trial on new workers (the search's own model, cluster and Ray), 30 s before one is
        in. A search's first fits are not used: they all start at once, on a cluster busy
        with every trial's start (up to ~10x a later move's start on a 2-core machine), and
        charging that would keep every trial where it started."""
        if self._config.restart_s is not None:
            return self._config.restart_s
        return statistics.median(self._restarts) if self._restarts else _PRIOR_RESTART_S

    def wait_poll_s(self) -> float:
        """Seconds between a waiting trial's requests."""
        return self._config.wait_poll_s

    def fit_starts(self) -> dict[str, tuple[FitStart, ...]]:
        """Per trial, the measured start of each of its fits, in order: what each (re)start
        cost it, and where it went."""
        return {t: tuple(starts) for t, starts in self._starts.items()}

    def history(self) -> tuple[AllocationEvent, ...]:
        """Every change of every trial's holding, in order."""
        return tuple(self._history)

    # ------------------------------------------------------------------ internals

    def _slots(self) -> tuple[tuple[Any, ...], tuple[str, ...]]:
        nodes = list(self._nodes())
        reserved: dict[str, float] = {}
        for trial in self._trials.values():
            if trial.driver_node is not None:
                reserved[trial.driver_node] = reserved.get(trial.driver_node, 0.0) + (
                    self._driver_cpus
                )
        usable = [
            ClusterNode(
                n.node_id,
                {
                    k: v - (reserved.get(n.node_id, 0.0) if k == "CPU" else 0.0)
                    for k, v in n.resources.items()
                },
                n.labels,
            )
            for n in nodes
        ]
        return cluster_slots(usable, self._types)

    def _remaining_epochs(self, trial: _Trial) -> float:
        if self._asha is None:
            return float(max(self._max_epochs - trial.epochs_done, 0))
        grace, eta = self._asha
        return asha_expected_epochs(trial.epochs_done, self._max_epochs, grace, eta)

    def _costs(self, trial: _Trial) -> dict[str, CostModel]:
        known = {**self._measured, **(trial.costs or {})}
        # A type nobody measured: assumed as fast per sample as the mean of the measured ones
        # (before any measurement, all types alike); a measurement replaces it.
        betas = [c.beta for c in known.values()]
        prior = CostModel(0.0, sum(betas) / len(betas) if betas else _PRIOR_BETA)
        return {t.name: known.get(t.name, prior) for t in self._types}

    def _cap(self, slot_count: int) -> int | None:
        """Most workers one trial may hold now: the configured cap, and the equal share while
        trials of the search have not asked yet (see ``expected_trials``)."""
        cap = self._config.max_workers_per_trial
        if self._expected_trials is None or slot_count == 0:
            return cap
        unstarted = self._expected_trials - self._ended - len(self._trials)
        if unstarted <= 0:
            return cap
        share = max(1, slot_count // min(slot_count, len(self._trials) + unstarted))
        return share if cap is None else min(cap, share)

    def _decide(self, cause: str) -> None:
        slots, findings = self._slots()
        self._slot_set = tuple(s.slot_id for s in slots)
        existing = set(self._slot_set)
        restart_s = self.restart_s()
        demands = [
            TrialDemand(
                trial_id=trial_id,
                costs=self._costs(trial),
                global_batch=trial.global_batch,
                remaining_samples=self._remaining_epochs(trial) * self._samples_per_epoch,
                restart_s=restart_s,
                current=tuple(
                    w.slot_id
                    for w in (trial.holding.workers if trial.holding is not None else ())
                    if w.slot_id in existing
                ),
            )
            for trial_id, trial in self._trials.items()
        ]
        decision = decide_trial_allocation(
            slots,
            demands,
            TrialAllocationConfig(
                min_gain_s=self._config.min_gain_s,
                max_workers_per_trial=self._cap(len(slots)),
                max_start_slowdown=self._config.max_start_slowdown,
            ),
        )
        for finding in findings + decision.findings:
            logger.debug("allocation: %s", finding)
        by_slot = {s.slot_id: s for s in slots}
        for assignment in decision.assignments:
            trial = self._trials[assignment.trial_id]
            old = trial.holding
            if old is not None and tuple(w.slot_id for w in old.workers) == assignment.slots:
                continue
            workers = tuple(by_slot[s] for s in assignment.slots)
            version = (old.version if old is not None else 0) + 1
            trial.holding = TrialHolding(assignment.trial_id, version, workers, assignment.reason)
            self._record(
                assignment.trial_id,
                version,
                assignment.slots,
                tuple(w.node_id for w in workers),
                cause,
                assignment.reason,
            )

    def _record(
        self,
        trial_id: str,
        version: int,
        slots: tuple[str, ...],
        nodes: tuple[str, ...],
        cause: str,
        reason: str,
    ) -> None:
        now = self._clock() - self._start
        self._history.append(AllocationEvent(now, trial_id, version, slots, nodes, cause, reason))
        logger.info("allocation: %s v%d %s (%s: %s)", trial_id, version, slots, cause, reason)


# ---------------------------------------------------------------------------- Ray side


def live_cluster_nodes() -> list[ClusterNode]:
    """The alive nodes of the connected Ray cluster (id, resources, labels)."""
    import ray

    return [
        ClusterNode(str(n["NodeID"]), dict(n.get("Resources") or {}), dict(n.get("Labels") or {}))
        for n in ray.nodes()
        if n.get("Alive")
    ]


def start_allocator(experiment: str, **kwargs: Any) -> Any:
    """Start the allocator actor of the search ``experiment`` (keyword arguments: those of
    :class:`TrialAllocator` but ``nodes``, which is :func:`live_cluster_nodes`). The search's
    driver owns it and kills it at the end."""
    import ray

    actor = ray.remote(num_cpus=0)(TrialAllocator)
    return actor.options(
        name=allocator_actor_name(experiment), namespace=ALLOCATOR_NAMESPACE
    ).remote(nodes=live_cluster_nodes, **kwargs)


def lookup_allocator(experiment: str) -> Any:
    """The allocator actor of ``experiment``."""
    import ray

    return ray.get_actor(allocator_actor_name(experiment), namespace=ALLOCATOR_NAMESPACE)


def wait_for_holding(
    allocator: Any,
    trial_id: str,
    *,
    global_batch: int,
    driver_node: str | None,
    poll_s: float,
) -> TrialHolding:
    """Ask the allocator for the trial's workers until it has some (a waiting trial polls)."""
    import ray

    while True:
        holding = ray.get(
            allocator.request.remote(trial_id, global_batch=global_batch, driver_node=driver_node)
        )
        if holding is not None:
            return holding
        time.sleep(poll_s)


def allocated_worker_specs(
    holding: TrialHolding, types: Mapping[str, WorkerSpec]
) -> list[WorkerSpec]:
    """One worker spec per held worker: its type's spec (``count`` 1), named ``<type>-<k>``,
    pinned to its slot's node (the type's label selector plus ``ray.io/node-id``)."""
    specs: list[WorkerSpec] = []
    seen: dict[str, int] = {}
    for worker in holding.workers:
        base = types[worker.worker_type]
        k = seen.get(worker.worker_type, 0)
        seen[worker.worker_type] = k + 1
        selector = {**(base.label_selector or {}), NODE_ID_LABEL: worker.node_id}
        specs.append(
            base.model_copy(
                update={"name": f"{base.name}-{k}", "count": 1, "label_selector": selector}
            )
        )
    return specs


def type_costs(costs: Sequence[Any], worker_types: Sequence[str]) -> dict[str, tuple[float, float]]:
    """Per worker type the mean ``(alpha, beta)`` of a plan's per-rank cost models (rank
    ``i`` is of type ``worker_types[i]``)."""
    sums: dict[str, list[float]] = {}
    for cost, worker_type in zip(costs, worker_types):
        acc = sums.setdefault(worker_type, [0.0, 0.0, 0.0])
        acc[0] += cost.alpha
        acc[1] += cost.beta
        acc[2] += 1
    return {t: (a / n, b / n) for t, (a, b, n) in sums.items()}


def epoch_end_moves(
    allocation: Mapping[str, Any] | None,
    epochs_done: int,
    *,
    final: bool = False,
    fit_start_s: float | None = None,
) -> bool:
    """On every rank at an epoch end, before its report: whether the trial's holding changed
    (it should end this fit after the report and resume on its new workers).

    Rank 0 tells the allocator the epoch ended, with what the fit measured: the newest cost
    models per worker type (``newest_costs``) (so the allocator knows the types' speeds while trials run, and
    ASHA's stopped trials have told it too) and, at the fit's first epoch end, the fit's
    start (its call to the first step, and the library's part of it). It compares the holding's version; one all-reduce
    makes every rank agree. ``allocation`` is the loop config's ``"allocation"`` entry (None:
    fixed, never moves); ``final``: the trial's last epoch (measurements only, no move);
    ``fit_start_s``: the fit's call to its first step, as the loop reports it
    (``hetero/fit_start_s``; None: no start is sent).
    """
    if not allocation:
        return False
    import ray

    from raytrain_hetero.worker.api import (
        first_step_time,
        get_rank_info,
        group_start_time,
        newest_costs,
        sum_across_ranks,
    )

    moved = 0
    if get_rank_info()["rank"] == 0:
        # The newest, not the plan's: a one-worker trial's plan never takes measured costs.
        measured = newest_costs()
        costs = type_costs(measured, allocation["worker_types"]) if measured else {}
        first_step = first_step_time()
        resumed_epochs = allocation["resumed_epochs"]
        start_s = library_s = None
        first_epoch = epochs_done == resumed_epochs + 1  # the start is sent once per fit
        if first_step is not None and fit_start_s is not None and first_epoch:
            start_s = fit_start_s
            library_s = first_step - group_start_time()
        actor = ray.get_actor(allocation["actor"], namespace=ALLOCATOR_NAMESPACE)
        holding = ray.get(
            actor.epoch_ended.remote(
                allocation["trial_id"],
                epochs_done,
                costs=costs or None,
                start_s=start_s,
                library_s=library_s,
                resumed=resumed_epochs > 0,
            )
        )
        moved = int(holding is None or holding.version != allocation["version"])
    if final:  # every rank knows it is the last epoch: no collective needed
        return False
    (total,) = sum_across_ranks(moved)
    return total > 0
