"""``HeteroTrainer``: a TorchTrainer-style front over Ray Train V2 for heterogeneous workers."""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import logging
import os
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

import ray
import ray.train
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from raytrain_hetero.config import (
    BackendConfig,
    BatchConfig,
    ElasticConfig,
    EmulationConfig,
    FaultInjectionConfig,
    GuardConfig,
    HeteroModel,
    ParallelConfig,
    ProbeConfig,
    SchedulerConfig,
    SlowdownInjection,
    TrackingConfig,
    WorkerSpec,
    check_fault_targets,
    check_run_settings,
    check_slowdown,
    expand_worker_specs,
    worker_groups,
)
from raytrain_hetero.core.placement import SlotDemand
from raytrain_hetero.core.plan import Plan
from raytrain_hetero.core.policy import PendingReplan
from raytrain_hetero.core.records import StepRecord
from raytrain_hetero.driver._ray_compat import (
    check_ray_compat,
    preemption_watcher_enabled,
    train_collective_timeout,
)
from raytrain_hetero.driver.backend import HeteroTorchConfig, common_resources
from raytrain_hetero.driver.data_config import HeteroDataConfig
from raytrain_hetero.driver.elastic import HeteroRayTorchTrainer, HeteroScalingConfig
from raytrain_hetero.driver.placement_check import (
    ensure_room,
    placement_wait_limit,
    start_embedded_ray,
)
from raytrain_hetero.driver.run_results import (
    LastReportKeeper,
    carry_last_report,
    with_checkpoint_retention,
)
from raytrain_hetero.driver.scheduler import (
    SCHEDULER_NAMESPACE,
    create_scheduler,
    kill_scheduler,
    scheduler_actor_name,
)
from raytrain_hetero.driver.telemetry import ProgressCallback, RecordCollector
from raytrain_hetero.driver.tracking import ReportForwarder, RunTracker, fan_out
from raytrain_hetero.errors import ConfigError
from raytrain_hetero.storage import StorageLocation, storage_location
from raytrain_hetero.worker.setup.identity import HeteroSetup

logger = logging.getLogger(__name__)

_Group = TypeVar("_Group", bound=HeteroModel)

_GROUP_CLASSES: dict[str, type[HeteroModel]] = {
    "batch": BatchConfig,
    "probe": ProbeConfig,
    "scheduler": SchedulerConfig,
    "elastic": ElasticConfig,
    "emulation": EmulationConfig,
    "backend": BackendConfig,
    "guard": GuardConfig,
    "parallel": ParallelConfig,
    "tracking": TrackingConfig,
}


class _WorkerEntry:
    """Picklable wrapper that calls the user's loop with or without its config."""

    def __init__(self, train_loop_per_worker: Callable[..., Any]) -> None:
        self.train_loop_per_worker = train_loop_per_worker
        params = [
            p
            for p in inspect.signature(train_loop_per_worker).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if len(params) > 1:
            raise ConfigError(
                "train_loop_per_worker must take zero arguments or one (the config dict); "
                f"it takes {len(params)}."
            )
        self.takes_config = len(params) == 1

    def __call__(self, config: dict[str, Any]) -> Any:
        if self.takes_config:
            return self.train_loop_per_worker(config)
        return self.train_loop_per_worker()


def _check_injection(
    injection: SlowdownInjection | Mapping[str, Any], specs: Sequence[WorkerSpec]
) -> SlowdownInjection:
    """A validated injection that targets one of the worker slots ``specs``."""
    if not isinstance(injection, SlowdownInjection):
        injection = SlowdownInjection(**dict(injection))
    return check_slowdown(injection, specs)


def _group(name: str, value: Any, cls: type[_Group]) -> _Group:
    """``value`` as the config group ``cls`` (an instance, a mapping of its fields, or None)."""
    if isinstance(value, cls):
        return value
    if value is None:
        return cls()
    if isinstance(value, Mapping):
        return cls(**dict(value))
    raise ConfigError(
        f"HeteroTrainer: {name}: expected a {cls.__name__} (or a mapping of its fields), got "
        f"{type(value).__name__}. Fix: pass {name}={cls.__name__}(...)."
    )


def _unknown_keywords(unknown: Sequence[str]) -> TypeError:
    """A TypeError naming each unknown keyword and, where one exists, the group field it
    resembles (``global_batch_size`` -> ``batch=BatchConfig(global_batch_size=...)``)."""
    fields = {
        field: f"{group}={cls.__name__}({field}=...)"
        for group, cls in _GROUP_CLASSES.items()
        for field in cls.model_fields
    }
    fields.update({group: f"{group}={cls.__name__}(...)" for group, cls in _GROUP_CLASSES.items()})
    hints = []
    for keyword in unknown:
        close = difflib.get_close_matches(keyword, list(fields), n=1)
        where = f": did you mean {fields[close[0]]}?" if close else ""
        hints.append(f"{keyword!r}{where}")
    return TypeError(
        "HeteroTrainer() got unexpected keyword argument(s) "
        + "; ".join(hints)
        + ". Settings live in their config groups (batch=, scheduler=, elastic=, ...)."
    )


class HeteroTrainer:
    """Data-parallel trainer whose global batch is carved by measured worker speed.

    Built on Ray Train V2 (``TorchTrainer`` with a custom backend), so Ray Train's
    checkpointing, failure handling, elasticity and Tune integration apply unchanged.
    Settings come in groups, like Ray's ``ScalingConfig``/``RunConfig``; each group is a
    frozen object from :mod:`raytrain_hetero.config`, validated when it is built.

    Args:
        train_loop_per_worker: The loop run on every worker; uses ``prepare_model``,
            ``prepare_data_loader`` and ``report`` from :mod:`raytrain_hetero`.
        train_loop_config: Dict passed to the loop if it takes one argument.
        workers: Worker groups; each WorkerSpec may have ``count`` identical workers.
        batch: Global batch size, minimum slice, gradient weighting, fixed shares, seed
            (a :class:`~raytrain_hetero.config.BatchConfig`; required).
        probe: Throughput probing before training, and admission (``auto``: workers that
            would lower the group's samples/s are left out by an elastic re-size).
        scheduler: Live re-planning: on/off, policy, plan agreement and flush spacing.
        elastic: Ray Train V2 elastic scaling between ``min_workers`` and all worker slots;
            slots are filled in order, so list essential workers first.
        emulation: EMULATION: slowdowns injected at given steps (CPU-only tests, demos).
        backend: torch process-group backend and collective timeout.
        faults: FAULT INJECTION (test/ops tooling, off by default): faults fired at phase
            points of the workers, each once per run (:mod:`raytrain_hetero.worker.setup.faults`).
        guard: The step guard of ``prepare_optimizer`` (non-finite steps skipped, then stop).
        parallel: Model parallelism (:class:`~raytrain_hetero.config.ParallelConfig`): mode
            ``data`` (default), ``conv_split`` or ``branches``, in groups of ``group_size``
            ranks; the loop then calls ``prepare_model_parallel`` instead of ``prepare_model``.
        tracking: Experiment tracking (:class:`~raytrain_hetero.config.TrackingConfig`):
            TensorBoard event files and an MLflow run per ``fit`` (off by default).
        datasets: Ray Data datasets by name, as Ray Train's ``datasets=``; the loop reads
            them with :func:`raytrain_hetero.get_dataset_shard` (docs/how-to/ray-data.md).
        dataset_config: How they are fed (default :class:`HeteroDataConfig`: ``"train"``
            carved by the plan, the others split unevenly, every row once).
        run_config: Ray Train RunConfig (name, storage, failure handling, callbacks). Its
            ``checkpoint_config.num_to_keep`` unset, the latest checkpoint is kept (what
            resume needs); ``CheckpointConfig(num_to_keep=N)`` keeps more.

    Raises:
        ConfigError: Any bad or inconsistent setting, naming the field and the fix.
        TypeError: An unknown keyword, naming the config group field it resembles.
    """

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        workers: Sequence[WorkerSpec | Mapping[str, Any]],
        batch: BatchConfig | Mapping[str, Any] | None = None,
        probe: ProbeConfig | Mapping[str, Any] | None = None,
        scheduler: SchedulerConfig | Mapping[str, Any] | None = None,
        elastic: ElasticConfig | Mapping[str, Any] | None = None,
        emulation: EmulationConfig | Mapping[str, Any] | None = None,
        backend: BackendConfig | Mapping[str, Any] | None = None,
        faults: FaultInjectionConfig | Mapping[str, Any] | None = None,
        guard: GuardConfig | Mapping[str, Any] | None = None,
        parallel: ParallelConfig | Mapping[str, Any] | None = None,
        tracking: TrackingConfig | Mapping[str, Any] | None = None,
        datasets: Mapping[str, Any] | None = None,
        dataset_config: ray.train.DataConfig | None = None,
        run_config: RunConfig | None = None,
        **unknown: Any,
    ) -> None:
        if unknown:
            raise _unknown_keywords(sorted(unknown))
        if batch is None:
            raise ConfigError(
                "HeteroTrainer: batch is missing. Fix: pass batch=BatchConfig("
                "global_batch_size=...)."
            )
        self.workers = worker_groups(workers)
        self.specs = expand_worker_specs(self.workers)
        self.batch = _group("batch", batch, BatchConfig)
        self.probe = _group("probe", probe, ProbeConfig)
        self.scheduler = _group("scheduler", scheduler, SchedulerConfig)
        self.elastic = _group("elastic", elastic, ElasticConfig)
        self.emulation = _group("emulation", emulation, EmulationConfig)
        self.backend = _group("backend", backend, BackendConfig)
        self.guard = _group("guard", guard, GuardConfig)
        self.parallel = _group("parallel", parallel, ParallelConfig)
        self.tracking = _group("tracking", tracking, TrackingConfig)
        self.tracking.check_installed()  # before any worker starts
        check_run_settings(
            self.workers, self.batch, self.elastic, self.emulation, parallel=self.parallel
        )
        self.faults = check_fault_targets(
            _group("faults", faults, FaultInjectionConfig), self.specs
        )
        self.train_loop_per_worker = train_loop_per_worker
        self._entry = _WorkerEntry(train_loop_per_worker)
        self.train_loop_config = dict(train_loop_config or {})
        self.run_config = with_checkpoint_retention(run_config or RunConfig())
        self.datasets = dict(datasets or {})
        self.dataset_config = dataset_config or HeteroDataConfig()
        self._scheduler: Any = None
        devices = {s.resolved_device() for s in self.specs}
        self.torch_backend = self.backend.torch_backend or (
            "nccl" if devices == {"cuda"} else "gloo"
        )
        self.run_id = uuid.uuid4().hex[:12]
        self.step_records: list[StepRecord] = []
        self.plans: list[Plan] = []
        self.decisions: list[PendingReplan] = []
        self.admission: dict[str, Any] | None = None

    @property
    def admission_auto(self) -> bool:
        """Whether the group decision may leave workers out (``probe.group`` ``train`` or
        ``auto``, probing)."""
        return self.probe.group != "all" and self.batch.fixed_shares is None

    @property
    def resolved_min_workers(self) -> int:
        """Smallest group: ``elastic.min_workers``; unset, all slots (fixed size), or 1 with
        ``admission: auto``, whose re-sizing needs an elastic group."""
        if self.elastic.min_workers is not None:
            return self.elastic.min_workers
        return 1 if self.admission_auto else len(self.specs)

    def scaling_config(self) -> ScalingConfig:
        """The ScalingConfig: common resources, one label selector per worker slot."""
        common = common_resources([dict(s.resources) for s in self.specs])
        selectors = [dict(s.label_selector or {}) for s in self.specs]
        n = len(self.specs)
        min_workers = self.resolved_min_workers
        elastic = min_workers < n
        return HeteroScalingConfig(
            num_workers=(min_workers, n) if elastic else n,
            resources_per_worker=common,
            use_gpu=common.get("GPU", 0) > 0,
            label_selector=selectors if any(selectors) else None,
            elastic_resize_monitor_interval_s=self.elastic.resize_monitor_interval_s,
            admission_run_id=self.run_id if self.admission_auto else None,
        )

    def setup(self) -> HeteroSetup:
        """Run-wide settings shipped to every worker."""
        return HeteroSetup(
            run_id=self.run_id,
            specs=tuple(self.specs),
            batch=self.batch,
            probe=self.probe,
            scheduler=self.scheduler,
            emulation=self.emulation,
            backend=self.backend,
            guard=self.guard,
            elastic=self.elastic,
            parallel=self.parallel,
            faults=self.faults if self.faults.active else None,
            min_workers=self.resolved_min_workers,
            scheduler_name=scheduler_actor_name(self.run_id),
            scheduler_namespace=SCHEDULER_NAMESPACE,
            storage=self._storage() if self.probe.remember else None,
            preemption_watcher=preemption_watcher_enabled(os.environ),
        )

    def _storage(self) -> StorageLocation | None:
        """The runs' storage of ``run_config`` (where remembered cost models live)."""
        path, filesystem = self.run_config.storage_path, self.run_config.storage_filesystem
        if path is None:
            return None
        if filesystem is None:
            return storage_location(path)
        remote = type(filesystem).__name__ != "LocalFileSystem"
        return StorageLocation(str(path), filesystem, str(path).rstrip("/"), remote=remote)

    def tracked_params(self) -> dict[str, Any]:
        """The resolved settings an experiment tracker logs (MLflow params, flattened)."""
        groups = {name: getattr(self, name) for name in _GROUP_CLASSES if name != "tracking"}
        return {
            "workers": [w.model_dump(mode="json") for w in self.workers],
            **{name: group.model_dump(mode="json") for name, group in groups.items()},
            "train_loop_config": self.train_loop_config,
        }

    def torch_trainer(self, run_config: RunConfig | None = None) -> TorchTrainer:
        """The underlying Ray Train V2 TorchTrainer (elastic sizing per worker slot).

        Args:
            run_config: In place of ``self.run_config`` (``fit`` adds its tracking callback).
        """
        return HeteroRayTorchTrainer(
            self._entry,
            train_loop_config=self.train_loop_config,
            torch_config=HeteroTorchConfig(
                backend=self.torch_backend,
                setup=self.setup(),
                timeout_s=self.backend.collective_timeout_s,
            ),
            scaling_config=self.scaling_config(),
            run_config=run_config or self.run_config,
            datasets=self.datasets or None,
            dataset_config=self.dataset_config,
            slots=[SlotDemand(dict(s.resources), dict(s.label_selector or {})) for s in self.specs],
            admission_run_id=self.run_id if self.admission_auto else None,
        )

    def fit(
        self,
        *,
        progress: ProgressCallback | None = None,
        poll_interval_s: float = 1.0,
        tracker: RunTracker | None = None,
    ) -> ray.train.Result:
        """Train; returns Ray Train's Result, whose ``metrics`` are the last report's (rank
        0's), with a checkpoint or without (Ray Train V2 alone keeps the last report *with* a
        checkpoint); ``checkpoint`` is the latest checkpoint.

        Before Ray Train is asked for a worker group, the group is checked against the
        cluster (:func:`~raytrain_hetero.driver.placement_check.ensure_room`): one no node
        could hold fails at once naming the worker, the resource and the fix; one the
        cluster may yet hold (an autoscaler, busy resources) is waited for with progress
        lines, at most ``elastic.placement_timeout_s`` (inside a Tune trial without limit:
        it waits for the search's other trials to give workers back). Without a running Ray, an embedded
        local Ray starts, with as many logical CPUs as the workers declare if the machine
        has fewer (a warning says so).

        Creates the run's scheduler actor (this driver is its only owner), trains, and kills
        the actor at the end. While training, the step records of every rank are drained from
        the actor into ``self.step_records`` (:class:`StepRecord`, each once), the plan
        history into ``self.plans`` (:class:`~raytrain_hetero.core.plan.Plan`) and the live
        re-plans decided into ``self.decisions``; with ``probe.admission: auto``, the admission decision
        (which workers were left out, with the predicted samples/s) into ``self.admission``.

        With ``tracking`` on, the run's TensorBoard directory and MLflow run are opened here,
        fed while it trains (step records, plans, rank 0's epoch reports) and closed at the
        end; pass your own open ``tracker`` instead to log more (plots) before closing it.

        Args:
            progress: Called on the calling thread with a
                :class:`~raytrain_hetero.driver.telemetry.FitProgress` (new records, all
                plans, the admission decision, new epoch reports when tracking) after each
                drain that brought something.
            poll_interval_s: Seconds between drains of the scheduler actor.
            tracker: An open :class:`~raytrain_hetero.driver.tracking.RunTracker` to feed
                (the caller closes it); ``None``: one from ``tracking`` if it is on.

        Raises:
            RayCompatError: The installed Ray is not the one raytrain_hetero is pinned to.
            PlacementError: The cluster cannot hold the group (no room within
                ``elastic.placement_timeout_s`` where it may yet).
        """
        check_ray_compat()
        embedded = not ray.is_initialized()
        if embedded:  # a new local Ray bound to 127.0.0.1, not a cluster left running
            start_embedded_ray(
                self.specs, min_workers=self.resolved_min_workers, datasets=bool(self.datasets)
            )
        ensure_room(
            self.specs,
            min_workers=self.resolved_min_workers,
            timeout_s=placement_wait_limit(self.elastic.placement_timeout_s),
            embedded=embedded,
            datasets=bool(self.datasets),
            strategy=self.scaling_config().placement_strategy,
        )
        scheduler = create_scheduler(
            self.run_id,
            ray.get_runtime_context().get_node_id(),
            policy=self.scheduler.policy,
            live=self.scheduler.resolved_live(self.batch),
        )
        self._scheduler = scheduler
        owned = None
        if tracker is None and self.tracking.active:
            name = self.run_config.name or f"hetero-{self.run_id}"
            owned = tracker = RunTracker(
                self.tracking, run_name=name, params=self.tracked_params()
            ).open()
        # Ours first, so a report is kept (and forwarded) before Tune's callback acts on it
        # (a stop): the Result carries the last report, the tracker gets it too.
        callbacks = [LastReportKeeper(self.run_id), *(self.run_config.callbacks or [])]
        if tracker is not None:
            # Rank 0's epoch reports reach the tracker through the scheduler actor's drain.
            callbacks.insert(1, ReportForwarder(self.run_id))
        run_config = dataclasses.replace(self.run_config, callbacks=callbacks)
        collector = RecordCollector(scheduler, fan_out(progress, tracker))
        if tracker is not None:
            tracker.attach_source(collector.drain)
        self.step_records, self.plans, self.decisions = (
            collector.records,
            collector.plans,
            collector.decisions,
        )
        failed = True
        try:
            # Bounds Ray Train's report barrier as well as the package's process groups.
            with train_collective_timeout(self.backend.collective_timeout_s):
                result = collector.run_draining(self.torch_trainer(run_config).fit, poll_interval_s)
            failed = result.error is not None
            return carry_last_report(result, self.run_id)
        finally:
            carry_last_report(None, self.run_id)  # a run that raised leaves no key behind
            if tracker is not None:
                tracker.attach_source(None)
            if owned is not None:
                owned.close(failed=failed)
            self.admission = collector.admission
            self._scheduler = None
            kill_scheduler(scheduler, self.run_id)

    def inject_slowdown(
        self,
        factor: float,
        *,
        worker: str | None = None,
        rank: int | None = None,
        from_step: int = 0,
    ) -> None:
        """EMULATION: make a worker (WorkerSpec name) or rank ``factor`` times slower.

        Call it from another thread while :meth:`fit` runs (e.g. a progress callback); the
        workers apply it at their next plan synchronisation at or after ``from_step``.
        """
        injection = _check_injection(
            {"factor": factor, "worker": worker, "rank": rank, "from_step": from_step}, self.specs
        )
        if self._scheduler is None:
            raise ConfigError(
                "inject_slowdown works while fit() runs; pass emulation=EmulationConfig(slowdowns=[...]) before."
            )
        ray.get(self._scheduler.inject_slowdown.remote(injection))
