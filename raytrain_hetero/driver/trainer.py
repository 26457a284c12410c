"""``HeteroTrainer``: a TorchTrainer-style front over Ray Train V2 for heterogeneous workers."""

from __future__ import annotations

import inspect
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict
from typing import Any, Literal

import ray
import ray.train
from pydantic import ValidationError
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from raytrain_hetero.config import ProbeConfig, SlowdownInjection, WorkerSpec
from raytrain_hetero.core.placement import SlotDemand
from raytrain_hetero.core.policy import PolicyConfig
from raytrain_hetero.core.records import StepRecord
from raytrain_hetero.driver._ray_compat import check_ray_compat
from raytrain_hetero.driver.backend import HeteroTorchConfig, common_resources
from raytrain_hetero.driver.elastic import HeteroRayTorchTrainer
from raytrain_hetero.driver.scheduler import (
    SCHEDULER_NAMESPACE,
    create_scheduler,
    kill_scheduler,
    scheduler_actor_name,
)
from raytrain_hetero.driver.telemetry import RecordCollector
from raytrain_hetero.errors import ConfigError
from raytrain_hetero.worker.context import HeteroSetup

logger = logging.getLogger(__name__)


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
    """Validate one emulated-slowdown injection against the worker slots."""
    if isinstance(injection, SlowdownInjection):
        injection = injection.model_dump()
    allowed = {"factor", "worker", "rank", "from_step"}
    unknown = set(injection) - allowed
    if unknown:
        raise ConfigError(
            f"slowdown injection has unknown keys {sorted(unknown)}; use {sorted(allowed)}."
        )
    factor = injection.get("factor")
    if not isinstance(factor, (int, float)) or not factor >= 1.0:
        raise ConfigError(f"slowdown factor must be a number >= 1, got {factor!r}.")
    worker, rank = injection.get("worker"), injection.get("rank")
    if (worker is None) == (rank is None):
        raise ConfigError("a slowdown injection names exactly one of worker= or rank=.")
    names = [s.name for s in specs]
    if worker is not None and worker not in names:
        raise ConfigError(f"slowdown injection names worker {worker!r}; workers are {names}.")
    if rank is not None and not 0 <= int(rank) < len(specs):
        raise ConfigError(f"slowdown injection rank {rank} is outside 0..{len(specs) - 1}.")
    if int(injection.get("from_step", 0)) < 0:
        raise ConfigError("slowdown injection from_step must be >= 0.")
    return SlowdownInjection(factor=float(factor), worker=worker, rank=rank,
                             from_step=int(injection.get("from_step", 0)))


def _worker_spec(position: int, item: Mapping[str, Any]) -> WorkerSpec:
    """A WorkerSpec from a dict, with one ConfigError naming each bad field and the fix."""
    try:
        return WorkerSpec(**dict(item))
    except ValidationError as exc:
        problems = "; ".join(
            f"workers[{position}].{'.'.join(str(p) for p in err['loc'])}: {err['msg']}"
            for err in exc.errors()
        )
        raise ConfigError(
            f"{problems}. Fix the WorkerSpec fields (name, count, resources, label_selector, "
            "device, max_batch, emulated_slowdown)."
        ) from None


def expand_worker_specs(workers: Sequence[WorkerSpec | Mapping[str, Any]]) -> list[WorkerSpec]:
    """One spec per worker slot (``count`` expanded), names suffixed ``-i`` when count > 1."""
    if not workers:
        raise ConfigError("workers is empty: give at least one WorkerSpec.")
    specs: list[WorkerSpec] = []
    for position, item in enumerate(workers):
        spec = item if isinstance(item, WorkerSpec) else _worker_spec(position, item)
        if spec.count == 1:
            specs.append(spec)
            continue
        for i in range(spec.count):
            specs.append(spec.model_copy(update={"name": f"{spec.name}-{i}", "count": 1}))
    return specs


class HeteroTrainer:
    """Data-parallel trainer whose global batch is carved by measured worker speed.

    Built on Ray Train V2 (``TorchTrainer`` with a custom backend), so Ray Train's
    checkpointing, failure handling, elasticity and Tune integration apply unchanged.

    Args:
        train_loop_per_worker: The loop run on every worker; uses ``prepare_model``,
            ``prepare_data_loader`` and ``report`` from :mod:`raytrain_hetero`.
        train_loop_config: Dict passed to the loop if it takes one argument.
        workers: Worker groups; each WorkerSpec may have ``count`` identical workers.
        global_batch_size: Samples per optimizer step across all workers.
        weighting: "proportional" weights each rank's gradient by its sample count (exact);
            "uniform" averages them (the seed papers' HDP baseline, for comparisons only).
        fixed_shares: One share per worker slot (counts expanded, in order); skips probing.
        run_config: Ray Train RunConfig (name, storage, failure handling, callbacks).
        min_slice: Smallest per-worker slice per step (>= 1).
        probe: Probe settings (batch sizes, warm-up, repeats).
        seed: Seed of the per-epoch permutations.
        torch_backend: Force "gloo" or "nccl"; default gloo if any worker is on CPU.
        flush_every: Steps between pushes of per-step measurements to the scheduler actor.
        live: Re-plan live from measured step times (default: True, unless fixed_shares).
        policy: Live re-planning policy (PolicyConfig or its fields as a dict).
        plan_sync_every: Steps between the ranks' agreement on the scheduler's pending plan.
        slowdown_schedule: EMULATION: slowdowns injected at given steps, each a dict
            ``{"factor": k, "worker": name | "rank": r, "from_step": s}``.
        min_workers: Enables Ray Train V2 elastic scaling between ``min_workers`` and the
            number of worker slots; slots are filled in order, so list essential workers first.
        elastic_resize_monitor_interval_s: How often Ray Train checks for room to grow.
        collective_timeout_s: torch process-group timeout: a rank stuck this long fails the
            group, which Ray Train restarts (``RunConfig(failure_config=...)``).
    """

    def __init__(
        self,
        train_loop_per_worker: Callable[..., Any],
        *,
        train_loop_config: dict[str, Any] | None = None,
        workers: Sequence[WorkerSpec | Mapping[str, Any]],
        global_batch_size: int,
        weighting: Literal["proportional", "uniform"] = "proportional",
        fixed_shares: Sequence[float] | None = None,
        run_config: RunConfig | None = None,
        min_slice: int = 1,
        probe: ProbeConfig | None = None,
        seed: int = 0,
        torch_backend: str | None = None,
        flush_every: int = 5,
        live: bool | None = None,
        policy: PolicyConfig | Mapping[str, Any] | None = None,
        plan_sync_every: int = 5,
        slowdown_schedule: Sequence[Mapping[str, Any]] = (),
        min_workers: int | None = None,
        elastic_resize_monitor_interval_s: float = 5.0,
        collective_timeout_s: int = 1800,
    ) -> None:
        self.specs = expand_worker_specs(workers)
        n = len(self.specs)
        if weighting not in ("proportional", "uniform"):
            raise ConfigError(
                f"weighting={weighting!r} is not valid: use 'proportional' (exact) or "
                "'uniform' (HDP baseline)."
            )
        if not isinstance(global_batch_size, int) or global_batch_size < 1:
            raise ConfigError(f"global_batch_size must be a positive int, got {global_batch_size!r}.")
        if min_slice < 1:
            raise ConfigError(f"min_slice must be >= 1, got {min_slice}: no worker may idle.")
        if global_batch_size < n * min_slice:
            raise ConfigError(
                f"global_batch_size={global_batch_size} cannot give {n} workers at least "
                f"min_slice={min_slice} each: raise it to >= {n * min_slice}."
            )
        if fixed_shares is not None:
            shares = [float(s) for s in fixed_shares]
            if len(shares) != n:
                raise ConfigError(
                    f"fixed_shares has {len(shares)} entries but there are {n} workers "
                    "(counts expanded): give one share per worker, in worker order."
                )
            if any(not s > 0 for s in shares):
                raise ConfigError(f"fixed_shares must all be > 0, got {shares}.")
        caps = [s.max_batch for s in self.specs]
        if all(c is not None for c in caps) and sum(caps) < global_batch_size:
            raise ConfigError(
                f"The workers' max_batch caps add up to {sum(caps)} < global_batch_size="
                f"{global_batch_size}: raise max_batch or lower the global batch."
            )
        if flush_every < 1:
            raise ConfigError(f"flush_every must be >= 1, got {flush_every}.")
        if plan_sync_every < 0:
            raise ConfigError(f"plan_sync_every must be >= 0 (0 disables), got {plan_sync_every}.")
        if min_workers is not None and not 1 <= min_workers <= n:
            raise ConfigError(
                f"min_workers={min_workers} must be between 1 and the {n} worker slots."
            )
        self.slowdown_schedule = tuple(_check_injection(i, self.specs) for i in slowdown_schedule)
        self.train_loop_per_worker = train_loop_per_worker
        self._entry = _WorkerEntry(train_loop_per_worker)
        self.train_loop_config = dict(train_loop_config or {})
        self.global_batch_size = global_batch_size
        self.weighting = weighting
        self.fixed_shares = tuple(float(s) for s in fixed_shares) if fixed_shares else None
        self.run_config = run_config or RunConfig()
        self.min_slice = min_slice
        self.probe = probe or ProbeConfig()
        self.seed = seed
        self.flush_every = flush_every
        self.live = (fixed_shares is None) if live is None else bool(live)
        if isinstance(policy, PolicyConfig):
            policy = asdict(policy)
        self.policy = dict(policy or {})
        PolicyConfig(**self.policy)  # validates, naming the bad field
        self.plan_sync_every = plan_sync_every
        self.min_workers = min_workers
        self.elastic_resize_monitor_interval_s = elastic_resize_monitor_interval_s
        self.collective_timeout_s = collective_timeout_s
        self._scheduler: Any = None
        devices = {s.resolved_device() for s in self.specs}
        self.torch_backend = torch_backend or ("nccl" if devices == {"cuda"} else "gloo")
        self.run_id = uuid.uuid4().hex[:12]
        self.step_records: list[StepRecord] = []
        self.plans: list[dict[str, Any]] = []
        self.decisions: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ Ray Train wiring

    def scaling_config(self) -> ScalingConfig:
        """The ScalingConfig: common resources, one label selector per worker slot."""
        common = common_resources([dict(s.resources) for s in self.specs])
        selectors = [dict(s.label_selector or {}) for s in self.specs]
        n = len(self.specs)
        elastic = self.min_workers is not None and self.min_workers < n
        return ScalingConfig(
            num_workers=(self.min_workers, n) if elastic else n,
            resources_per_worker=common,
            use_gpu=common.get("GPU", 0) > 0,
            label_selector=selectors if any(selectors) else None,
            elastic_resize_monitor_interval_s=self.elastic_resize_monitor_interval_s,
        )

    def setup(self) -> HeteroSetup:
        """Run-wide settings shipped to every worker."""
        return HeteroSetup(
            run_id=self.run_id,
            specs=tuple(self.specs),
            global_batch_size=self.global_batch_size,
            weighting=self.weighting,
            fixed_shares=self.fixed_shares,
            min_slice=self.min_slice,
            max_world_size=len(self.specs),
            probe=self.probe,
            seed=self.seed,
            scheduler_name=scheduler_actor_name(self.run_id),
            scheduler_namespace=SCHEDULER_NAMESPACE,
            flush_every=self.flush_every,
            live=self.live,
            policy=self.policy,
            plan_sync_every=self.plan_sync_every,
            slowdown_schedule=self.slowdown_schedule,
        )

    def torch_trainer(self) -> TorchTrainer:
        """The underlying Ray Train V2 TorchTrainer (elastic sizing per worker slot)."""
        return HeteroRayTorchTrainer(
            self._entry,
            train_loop_config=self.train_loop_config,
            torch_config=HeteroTorchConfig(
                backend=self.torch_backend,
                setup=self.setup(),
                timeout_s=self.collective_timeout_s,
            ),
            scaling_config=self.scaling_config(),
            run_config=self.run_config,
            slots=[
                SlotDemand(dict(s.resources), dict(s.label_selector or {})) for s in self.specs
            ],
        )

    # ------------------------------------------------------------------ running

    def fit(
        self,
        *,
        progress: Callable[[dict[str, Any]], None] | None = None,
        poll_interval_s: float = 1.0,
    ) -> ray.train.Result:
        """Train; returns Ray Train's Result.

        Creates the run's scheduler actor (this driver is its only owner), trains, and kills
        the actor at the end. While training, the step records of every rank are drained from
        the actor into ``self.step_records`` (:class:`StepRecord`, each once) and the plan
        history into ``self.plans``.

        Args:
            progress: Called on the calling thread with ``{"records": new records,
                "plans": all plans}`` after each drain that brought something.
            poll_interval_s: Seconds between drains of the scheduler actor.

        Raises:
            RayCompatError: The installed Ray is not the one raytrain_hetero is pinned to.
        """
        check_ray_compat()
        if not ray.is_initialized():
            ray.init(address="local")  # a new local Ray, not a cluster left running
        scheduler = create_scheduler(
            self.run_id,
            ray.get_runtime_context().get_node_id(),
            policy=self.policy,
            live=self.live,
        )
        self._scheduler = scheduler
        collector = RecordCollector(scheduler, progress)
        self.step_records, self.plans, self.decisions = (
            collector.records, collector.plans, collector.decisions
        )
        try:
            return collector.run_draining(self.torch_trainer().fit, poll_interval_s)
        finally:
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
            raise ConfigError("inject_slowdown works while fit() runs; use slowdown_schedule before.")
        ray.get(self._scheduler.inject_slowdown.remote(injection))
