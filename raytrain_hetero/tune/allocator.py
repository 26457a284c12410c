"""The search's allocator (``tune.allocation: auto``): which workers each live trial holds.

One :class:`TrialAllocator` per search owns the allocation state, like the run's scheduler
actor owns the live plan (:mod:`raytrain_hetero.driver.scheduler`): a plain class (tested as
an object, clocks and node source injected) that :func:`start_allocator` wraps with
``ray.remote``. It knows the cluster's worker slots (the alive nodes of ``ray.nodes()``, their
resources and labels, less each trial driver's CPUs, matched to the job's worker *types*), each
trial's remaining budget (ASHA's rungs, :func:`~raytrain_hetero.core.trial_allocation.
asha_expected_epochs`) and its step cost per worker type (what the trial's own plans measured,
the remembered cost models; an unmeasured type is assumed as fast as the trial's measured ones),
and calls :func:`~raytrain_hetero.core.trial_allocation.decide_trial_allocation` on every
event: a trial asks for workers, ends or is stopped, reaches an epoch end, or the nodes change
(re-read at each event).

A move is charged what it costs on this cluster, as measured here
(:mod:`raytrain_hetero.core.move_pricing`): the restart (the measured starts of fits that
resumed a trial; before one, the quickest first start), the contention a start inflicts on the
trials running beside it (their epochs that overlapped another trial's start against those
that did not), and an error margin (how far the measured epochs fell from the model's
predictions, and the restarts from their median); a per-epoch overhead outside the steps
(validation, report, checkpoint) is measured too. Every move in the history carries its
predicted gain, charged cost and error margin, every decision its own
(:meth:`TrialAllocator.decisions`).

The trial's side (asking for workers, pinning them, the loop's epoch-end call) is
:mod:`raytrain_hetero.tune.allocator_client`; the records, :mod:`raytrain_hetero.tune.
allocation_records`. Both are re-exported here.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from raytrain_hetero.config import WorkerSpec
from raytrain_hetero.config.allocation import TrialAllocatorConfig
from raytrain_hetero.config.specs import NODE_ID_LABEL
from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.move_pricing import (
    EpochTiming,
    MovePrice,
    StartWindow,
    contention_fraction,
    epoch_overhead_s,
    equal_share_cap,
    prediction_error,
    restart_charge,
)
from raytrain_hetero.core.trial_allocation import (
    ClusterNode,
    TrialAllocationConfig,
    TrialDemand,
    WorkerSlot,
    WorkerType,
    asha_expected_epochs,
    cluster_slots,
    decide_trial_allocation,
    step_seconds,
)
from raytrain_hetero.errors import AllocationError, ConfigError
from raytrain_hetero.tune.allocation_records import (
    ALLOCATOR_NAMESPACE,
    AllocationEvent,
    DecisionRecord,
    FitStart,
    MeasuredPrices,
    TrialHolding,
    allocator_actor_name,
)
from raytrain_hetero.tune.allocator_client import (
    allocated_worker_specs,
    epoch_end_moves,
    lookup_allocator,
    type_costs,
    wait_for_holding,
)

__all__ = [
    "ALLOCATOR_NAMESPACE",
    "NODE_ID_LABEL",
    "AllocationEvent",
    "DecisionRecord",
    "FitStart",
    "MeasuredPrices",
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

# Seconds per sample assumed for a type no trial has measured yet (only ratios matter then).
_PRIOR_BETA = 1e-3


@dataclass
class _Trial:
    global_batch: int
    epochs_done: int = 0
    driver_node: str | None = None
    costs: dict[str, CostModel] | None = None
    holding: TrialHolding | None = None
    versions: dict[int, tuple[WorkerSlot, ...]] = field(default_factory=dict)


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
        wall_clock: Unix seconds (injected; ``time.time``): the trials measure their
            epochs and starts in it, and the log says when the allocator started in it.
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
        wall_clock: Callable[[], float] = time.time,
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
        self._first_starts: list[float] = []  # the measured starts of trials' first fits
        self._epochs: list[EpochTiming] = []  # every measured epoch, with its prediction
        self._windows: list[StartWindow] = []  # every measured fit start's span
        self._decisions: list[DecisionRecord] = []
        self._wall_start = wall_clock()

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
        version: int | None = None,
        epoch_window: tuple[float, float] | None = None,
        start_window: tuple[float, float] | None = None,
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
            version: The version of the holding the epoch ran on (None: the current one).
            epoch_window: The epoch's wall-clock span, unix seconds (the prediction's error
                and the contention of other trials' starts are measured on it).
            start_window: The fit's start span, unix seconds (sent with ``start_s``).
        """
        if start_s is not None and math.isfinite(start_s) and start_s >= 0:
            part = library_s if library_s is not None and 0 <= library_s <= start_s else None
            self._starts.setdefault(trial_id, []).append(FitStart(float(start_s), part))
            (self._restarts if resumed else self._first_starts).append(float(start_s))
        if start_window is not None and _span(start_window):
            self._windows.append(StartWindow(trial_id, *map(float, start_window)))
        if costs:
            self.measured(trial_id, costs)
        trial = self._trials.get(trial_id)
        if trial is None:
            return None
        if epoch_window is not None and _span(epoch_window):
            self._measure_epoch(trial_id, trial, version, epoch_window)
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
        trial on new workers (the search's own model, cluster and Ray); before one is in,
        the quickest measured first start of a trial (the search's first fits start all at
        once, on a cluster busy with every trial's start, so each is an upper estimate of a
        restart there), 30 s before any (:func:`~raytrain_hetero.core.move_pricing.
        restart_charge`)."""
        if self._config.restart_s is not None:
            return self._config.restart_s
        return restart_charge(self._restarts, self._first_starts)[0]

    def prices(self) -> MeasuredPrices:
        """What a move is charged now, as measured on this cluster (priors until measured;
        a configured ``restart_s`` is trusted: no error on it)."""
        overhead = epoch_overhead_s(self._epochs)
        restart_error = restart_charge(self._restarts, self._first_starts)[1]
        return MeasuredPrices(
            restart_s=self.restart_s(),
            restart_error=0.0 if self._config.restart_s is not None else restart_error,
            contention=contention_fraction(self._epochs, self._windows),
            step_error=prediction_error(self._epochs, overhead_s=overhead),
            epoch_overhead_s=overhead,
            restarts=len(self._restarts),
            first_starts=len(self._first_starts),
            epochs=sum(1 for e in self._epochs if e.predicted_s is not None),
            starts=len(self._windows),
        )

    def decisions(self) -> tuple[DecisionRecord, ...]:
        """Every decision, in order, with its predicted gain, charged cost and error margin
        (also the kept ones: why nothing moved)."""
        return tuple(self._decisions)

    def wall_start(self) -> float:
        """Unix seconds when the allocator started: the origin of the history's times."""
        return self._wall_start

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
        return equal_share_cap(
            self._config.max_workers_per_trial,
            slots=slot_count,
            expected_trials=self._expected_trials,
            ended=self._ended,
            live=len(self._trials),
        )

    def _measure_epoch(
        self, trial_id: str, trial: _Trial, version: int | None, window: tuple[float, float]
    ) -> None:
        """Keep one measured epoch with the model's prediction for it: its steps on the
        holding it ran on, from the costs measured of every type it held (None if one was
        not measured yet: a prior predicts nothing)."""
        holding = (
            version if version is not None else (trial.holding.version if trial.holding else 0)
        )
        workers = trial.versions.get(holding, ())
        counts: dict[str, int] = {}
        for w in workers:
            counts[w.worker_type] = counts.get(w.worker_type, 0) + 1
        known = {**self._measured, **(trial.costs or {})}
        predicted = None
        if counts and all(t in known for t in counts):
            demand = TrialDemand(trial_id, known, trial.global_batch, 0.0)
            steps = self._samples_per_epoch / trial.global_batch
            predicted = steps * step_seconds(counts, demand)
        start, end = map(float, window)
        self._epochs.append(EpochTiming(trial_id, holding, start, end, predicted))

    def _decide(self, cause: str) -> None:
        slots, findings = self._slots()
        self._slot_set = tuple(s.slot_id for s in slots)
        existing = set(self._slot_set)
        prices = self.prices()
        restart_s = prices.restart_s
        demands = [
            TrialDemand(
                trial_id=trial_id,
                costs=self._costs(trial),
                global_batch=trial.global_batch,
                remaining_samples=self._remaining_epochs(trial) * self._samples_per_epoch,
                restart_s=restart_s,
                fixed_s=self._remaining_epochs(trial) * prices.epoch_overhead_s,
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
            MovePrice(prices.contention, prices.step_error, prices.restart_error),
        )
        self._decisions.append(
            DecisionRecord(
                self._clock() - self._start,
                cause,
                decision.changed,
                decision.makespan_s,
                decision.gain_s,
                decision.cost_s,
                decision.margin_s,
                decision.reason,
            )
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
            trial.versions[version] = workers
            self._record(
                assignment.trial_id,
                version,
                assignment.slots,
                tuple(w.node_id for w in workers),
                cause,
                assignment.reason,
                (assignment.gain_s, assignment.cost_s, assignment.margin_s),
            )

    def _record(
        self,
        trial_id: str,
        version: int,
        slots: tuple[str, ...],
        nodes: tuple[str, ...],
        cause: str,
        reason: str,
        priced: tuple[float | None, float, float] = (None, 0.0, 0.0),
    ) -> None:
        now = self._clock() - self._start
        self._history.append(
            AllocationEvent(now, trial_id, version, slots, nodes, cause, reason, *priced)
        )
        logger.info("allocation: %s v%d %s (%s: %s)", trial_id, version, slots, cause, reason)


def _span(window: tuple[float, float]) -> bool:
    """A usable wall-clock span: two finite times, the second later."""
    start, end = window
    return math.isfinite(start) and math.isfinite(end) and end > start


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
