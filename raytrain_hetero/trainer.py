"""``HeteroTrainer``: a TorchTrainer-style front over Ray Train V2 for heterogeneous workers."""

from __future__ import annotations

import inspect
import logging
import threading
import time
import uuid
from typing import Any, Callable, Literal, Mapping, Sequence

import ray
import ray.train
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer

from raytrain_hetero.backend import HeteroTorchConfig, common_resources
from raytrain_hetero.config import ProbeConfig, WorkerSpec
from raytrain_hetero.context import HeteroSetup
from raytrain_hetero.errors import ConfigError
from raytrain_hetero.scheduler import (
    SCHEDULER_NAMESPACE,
    get_or_create_scheduler,
    scheduler_actor_name,
)

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


def expand_worker_specs(workers: Sequence[WorkerSpec | Mapping[str, Any]]) -> list[WorkerSpec]:
    """One spec per worker slot (``count`` expanded), names suffixed ``-i`` when count > 1."""
    if not workers:
        raise ConfigError("workers is empty: give at least one WorkerSpec.")
    specs: list[WorkerSpec] = []
    for item in workers:
        spec = item if isinstance(item, WorkerSpec) else WorkerSpec(**dict(item))
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
        devices = {s.resolved_device() for s in self.specs}
        self.torch_backend = torch_backend or ("nccl" if devices == {"cuda"} else "gloo")
        self.run_id = uuid.uuid4().hex[:12]
        self.step_records: list[dict[str, Any]] = []
        self.plans: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ Ray Train wiring

    def scaling_config(self) -> ScalingConfig:
        """The ScalingConfig: common resources, one label selector per worker slot."""
        common = common_resources([dict(s.resources) for s in self.specs])
        selectors = [dict(s.label_selector or {}) for s in self.specs]
        return ScalingConfig(
            num_workers=len(self.specs),
            resources_per_worker=common,
            use_gpu=common.get("GPU", 0) > 0,
            label_selector=selectors if any(selectors) else None,
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
        )

    def torch_trainer(self) -> TorchTrainer:
        """The underlying Ray Train V2 TorchTrainer."""
        return TorchTrainer(
            self._entry,
            train_loop_config=self.train_loop_config,
            torch_config=HeteroTorchConfig(backend=self.torch_backend, setup=self.setup()),
            scaling_config=self.scaling_config(),
            run_config=self.run_config,
        )

    # ------------------------------------------------------------------ running

    def fit(
        self,
        *,
        progress: Callable[[dict[str, Any]], None] | None = None,
        poll_interval_s: float = 1.0,
    ) -> ray.train.Result:
        """Train; returns Ray Train's Result.

        Per-step measurements of every rank land in ``self.step_records`` and the plan
        history in ``self.plans``.

        Args:
            progress: Called from the driver with ``{"records": new records, "plans": all
                plans}`` every ``poll_interval_s`` while training runs.
            poll_interval_s: Seconds between progress polls.
        """
        if not ray.is_initialized():
            ray.init()
        scheduler = get_or_create_scheduler(self.run_id, ray.get_runtime_context().get_node_id())
        trainer = self.torch_trainer()
        seen = 0
        try:
            if progress is None:
                result = trainer.fit()
            else:
                result_box: dict[str, Any] = {}

                def run() -> None:
                    try:
                        result_box["result"] = trainer.fit()
                    except BaseException as exc:  # noqa: BLE001 - re-raised in the caller
                        result_box["error"] = exc

                thread = threading.Thread(target=run, name="hetero-fit", daemon=True)
                thread.start()
                while thread.is_alive():
                    thread.join(poll_interval_s)
                    seen = self._poll(scheduler, seen, progress)
                if "error" in result_box:
                    raise result_box["error"]
                result = result_box["result"]
            seen = self._poll(scheduler, seen, progress)
            return result
        finally:
            try:
                ray.kill(scheduler)
            except Exception:  # noqa: BLE001 - already gone
                pass

    def _poll(
        self,
        scheduler: Any,
        seen: int,
        progress: Callable[[dict[str, Any]], None] | None,
    ) -> int:
        # Workers push asynchronously: give the final pushes a moment to land.
        try:
            snapshot = ray.get(scheduler.snapshot.remote(seen), timeout=30)
        except Exception as exc:  # noqa: BLE001 - progress is best effort
            logger.warning("could not poll the scheduler: %s", exc)
            return seen
        new = snapshot["records"]
        self.step_records.extend(new)
        self.plans = snapshot["plans"]
        if progress is not None and (new or snapshot["plans"]):
            progress({"records": new, "plans": snapshot["plans"]})
        time.sleep(0)
        return seen + len(new)
