"""Ray Train V2 backend for heterogeneous worker groups (the only module using Ray privates).

Ray Train 2.60 reserves one resources dict for every worker (``ScalingConfig.
resources_per_worker``) but accepts one label selector per worker. The heterogeneous scheme:

1. ``HeteroTrainer`` reserves the per-key *minimum* of all WorkerSpecs' resources in Ray
   Train's placement group (one bundle per worker slot, bundle i carrying slot i's label
   selector), so every worker lands on a node of its own type.
2. On every worker-group (re)start, :class:`HeteroTorchBackend` maps each worker to its slot
   by its placement-group bundle index (ranks are re-sorted by node, bundles are not), then
   reserves each worker's remaining resources (e.g. its GPU, extra CPUs) with a *lease actor*
   pinned to the worker's node. Ray gives the lease its GPU ids, so the worker computes on
   exactly the GPU Ray reserved for it and no two workers share one.
3. It installs the per-worker context (slot, rank, device, torch threads) in each worker
   process, then sets up the torch process group (gloo if any rank is on CPU, else NCCL).

Leases are released when the worker group shuts down.

4. Elastic groups are sized by :class:`HeteroElasticScalingPolicy`: slot by slot, with each
   slot's full resources and label selector, from the live per-node view (a joining node is
   used at the next monitor check instead of the autoscaling coordinator's 20 s tick).
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray._private import state as ray_state
from ray.train import ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer
from ray.train.torch.config import _TorchBackend
from ray.train.v2._internal.execution.failure_handling import create_failure_policy
from ray.train.v2._internal.execution.scaling_policy import ElasticScalingPolicy
from ray.train.v2._internal.util import ObjectRefWrapper
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raytrain_hetero.core.placement import NodeCapacity, SlotDemand, count_placeable_prefix
from raytrain_hetero.errors import PlacementError
from raytrain_hetero.worker.context import HeteroSetup

logger = logging.getLogger(__name__)

LEASE_TIMEOUT_S = float(os.environ.get("RAYTRAIN_HETERO_LEASE_TIMEOUT_S", "60"))


def common_resources(resources: list[dict[str, float]]) -> dict[str, float]:
    """Per-key minimum over worker resource dicts (a key missing anywhere counts as 0)."""
    keys = set().union(*resources) if resources else set()
    common = {k: min(r.get(k, 0.0) for r in resources) for k in keys}
    return {k: v for k, v in common.items() if v > 0}


def extra_resources(resources: dict[str, float], common: dict[str, float]) -> dict[str, float]:
    """What a worker needs beyond the common reservation."""
    extra = {k: v - common.get(k, 0.0) for k, v in resources.items()}
    return {k: v for k, v in extra.items() if v > 1e-9}


@ray.remote(num_cpus=0)
class ResourceLease:
    """Holds a worker's resources beyond the common reservation on the worker's node."""

    def gpu_ids(self) -> list[str]:
        """GPU ids Ray assigned to this lease (as strings)."""
        return [str(g) for g in ray.get_gpu_ids()]


@dataclass
class HeteroTorchConfig(TorchConfig):
    """TorchConfig carrying the heterogeneous setup to the backend.

    Attributes:
        setup: Run-wide settings for every worker.
    """

    setup: HeteroSetup | None = None

    @property
    def backend_cls(self) -> type:
        return HeteroTorchBackend


def _install_on_worker(
    setup: HeteroSetup,
    spec_index: int,
    rank: int,
    world_size: int,
    gpu_ids: list[str],
    group_id: str,
) -> str:
    """Runs in each worker process: choose its device, threads and install its runtime."""
    import torch

    from raytrain_hetero.worker.context import WorkerRuntime, install_runtime
    from raytrain_hetero.worker.identity import RankIdentity

    spec = setup.specs[spec_index]
    device = "cpu"
    if spec.resolved_device() == "cuda":
        if not gpu_ids:
            raise PlacementError(f"Worker '{spec.name}' wants CUDA but was leased no GPU.")
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpu = gpu_ids[0]
        if visible:
            order = [v.strip() for v in visible.split(",")]
            if gpu not in order:
                raise PlacementError(
                    f"GPU {gpu} leased to worker '{spec.name}' is not in this process's "
                    f"CUDA_VISIBLE_DEVICES={visible}."
                )
            index = order.index(gpu)
        else:
            index = int(gpu)
        device = f"cuda:{index}"
        torch.cuda.set_device(index)
    threads = max(1, int(spec.resources.get("CPU", 1)))
    torch.set_num_threads(threads)
    identity = RankIdentity(
        setup=setup,
        slot=spec_index,
        rank=rank,
        world_size=world_size,
        device=device,
        group_id=group_id,
    )
    install_runtime(WorkerRuntime.start(identity))
    return device


class HeteroTorchBackend(_TorchBackend):
    """Ray Train torch backend that places, leases and configures heterogeneous workers."""

    def __init__(self) -> None:
        super().__init__()
        self._leases: list[Any] = []

    def on_start(self, worker_group: Any, backend_config: HeteroTorchConfig) -> None:
        setup = backend_config.setup
        if setup is None:
            raise PlacementError("HeteroTorchConfig.setup is missing; build it via HeteroTrainer.")
        self._release_leases()
        workers = worker_group.get_workers()
        world_size = len(workers)
        common = common_resources([dict(s.resources) for s in setup.specs])
        slots = [self._slot_of(w, i) for i, w in enumerate(workers)]
        if len(set(slots)) != len(slots) or max(slots) >= len(setup.specs):
            raise PlacementError(
                f"Workers map to slots {slots} but the run has {len(setup.specs)} slots."
            )
        gpu_ids = self._lease_extra_resources(workers, slots, setup, common)
        group_id = uuid.uuid4().hex[:12]
        futures = [
            worker_group.execute_single_async(
                rank,
                _install_on_worker,
                setup,
                slots[rank],
                rank,
                world_size,
                gpu_ids[rank],
                group_id,
            )
            for rank in range(world_size)
        ]
        devices = ray.get(futures)
        for rank, (slot, device) in enumerate(zip(slots, devices)):
            logger.info(
                "rank %d -> worker '%s' on node %s, device %s",
                rank,
                setup.specs[slot].name,
                workers[rank].metadata.node_id[:12],
                device,
            )
        if setup.scheduler_name is not None:
            from raytrain_hetero.driver.scheduler import get_or_create_scheduler

            scheduler = get_or_create_scheduler(
                setup.run_id,
                ray.get_runtime_context().get_node_id(),
                policy=setup.policy,
                live=setup.live,
                detached=True,
            )
            scheduler.register_group.remote(group_id, world_size)
        super().on_start(worker_group, backend_config)

    def on_shutdown(self, worker_group: Any, backend_config: Any) -> None:
        try:
            super().on_shutdown(worker_group, backend_config)
        finally:
            self._release_leases()

    @staticmethod
    def _slot_of(worker: Any, rank: int) -> int:
        index = getattr(worker, "placement_group_bundle_index", None)
        return rank if index is None else int(index)

    def _lease_extra_resources(
        self,
        workers: list[Any],
        slots: list[int],
        setup: HeteroSetup,
        common: dict[str, float],
    ) -> list[list[str]]:
        pending: list[tuple[int, Any]] = []
        for rank, (worker, slot) in enumerate(zip(workers, slots)):
            extra = extra_resources(dict(setup.specs[slot].resources), common)
            if not extra:
                continue
            options: dict[str, Any] = {
                "num_cpus": extra.pop("CPU", 0.0),
                "num_gpus": extra.pop("GPU", 0.0),
                "scheduling_strategy": NodeAffinitySchedulingStrategy(
                    worker.metadata.node_id, soft=False
                ),
            }
            if "memory" in extra:
                options["memory"] = extra.pop("memory")
            if extra:
                options["resources"] = extra
            lease = ResourceLease.options(**options).remote()
            self._leases.append(lease)
            pending.append((rank, lease))
        gpu_ids: list[list[str]] = [[] for _ in workers]
        for rank, lease in pending:
            slot = slots[rank]
            try:
                gpu_ids[rank] = ray.get(lease.gpu_ids.remote(), timeout=LEASE_TIMEOUT_S)
            except (ray.exceptions.GetTimeoutError, ray.exceptions.RayError) as exc:
                spec = setup.specs[slot]
                self._release_leases()
                why = (
                    f"within {LEASE_TIMEOUT_S:.0f}s"
                    if isinstance(exc, ray.exceptions.GetTimeoutError)
                    else f"({type(exc).__name__}: {str(exc).splitlines()[0]})"
                )
                raise PlacementError(
                    f"Worker '{spec.name}' (rank {rank}) needs {dict(spec.resources)} but its "
                    f"node {workers[rank].metadata.node_id[:12]} could not grant "
                    f"{extra_resources(dict(spec.resources), common)} beyond the common "
                    f"reservation {common} {why}. Start that node type with enough resources "
                    "(ray start --num-gpus/--resources) or lower the WorkerSpec's resources."
                ) from exc
        return gpu_ids

    def _release_leases(self) -> None:
        for lease in self._leases:
            try:
                ray.kill(lease)
            except Exception:  # noqa: BLE001 - a dead lease is already released
                pass
        self._leases = []


# --------------------------------------------------------------------------- elastic sizing


class HeteroElasticScalingPolicy(ElasticScalingPolicy):
    """Ray Train's elastic policy, sized by what each worker slot really needs and where.

    Ray's own policy counts workers from the autoscaling coordinator's reservations, which
    (a) use one ``resources_per_worker`` for all and ignore label selectors, so a node no
    slot may use counts as room, and (b) refresh on the coordinator's 20 s tick, so a node
    that joins waits up to 20 s before anyone sees it. This policy keeps Ray's behaviour for
    everything else (the resource requests that drive the autoscaler, the monitor interval,
    min/max workers) and answers "how many workers fit" from the live per-node view: each
    node's *available* resources plus what this run's own group holds there, matched slot by
    slot (full resources and label selector) with :func:`count_placeable_prefix`.
    """

    NODE_VIEW_INTERVAL_S = 1.0

    def __init__(self, scaling_config: ScalingConfig, slots: Sequence[SlotDemand]) -> None:
        super().__init__(scaling_config)
        self._slots = tuple(slots)
        self._held: dict[str, dict[str, float]] = {}
        self._held_placement_group: Any = None
        self._view_time = float("-inf")
        self._view: dict[str, NodeCapacity] | None = None

    def make_decision_for_running_worker_group(
        self, worker_group_state: Any, worker_group_status: Any
    ) -> Any:
        self._held = self._holdings(worker_group_state)
        handle = worker_group_state.placement_group_handle
        self._held_placement_group = getattr(handle, "placement_group", None)
        return super().make_decision_for_running_worker_group(
            worker_group_state, worker_group_status
        )

    def make_decision_for_non_running_worker_group(self) -> Any:
        # After a failure Ray Train decides the new size *before* it tears the old group down,
        # so the old group's resources still count as ours until its placement group is gone.
        if self._held and not self._old_group_still_holds():
            self._held = {}
            self._held_placement_group = None
            self._view = None
        return super().make_decision_for_non_running_worker_group()

    def _old_group_still_holds(self) -> bool:
        if self._held_placement_group is None:
            return False
        try:
            table = ray.util.placement_group_table(self._held_placement_group)
        except Exception:  # noqa: BLE001 - unknown: assume it is gone, count afresh
            return False
        return table.get("state") not in (None, "REMOVED")

    def _holdings(self, worker_group_state: Any) -> dict[str, dict[str, float]]:
        """Resources this run's workers hold, per node (placement bundle plus lease)."""
        held: dict[str, dict[str, float]] = {}
        for rank, worker in enumerate(worker_group_state.workers):
            index = worker.placement_group_bundle_index
            slot = self._slots[index if index is not None else rank]
            node = held.setdefault(worker.metadata.node_id, {})
            for key, amount in slot.resources.items():
                node[key] = node.get(key, 0.0) + amount
        return held

    def _get_reserved_resources(self) -> Any:
        now = time.monotonic()
        if now - self._view_time < self.NODE_VIEW_INTERVAL_S and self._view is not None:
            return self._view
        self._view_time = now
        try:
            available = ray_state.available_resources_per_node()
            labels = {n["NodeID"]: dict(n.get("Labels") or {}) for n in ray.nodes() if n["Alive"]}
        except Exception:  # noqa: BLE001 - a GCS hiccup must not stop training
            logger.warning("Could not read per-node resources; keeping the group size.",
                           exc_info=True)
            self._view = None
            return None
        view: dict[str, NodeCapacity] = {}
        for node_id, node_labels in labels.items():
            resources = dict(available.get(node_id, {}))
            for key, amount in self._held.get(node_id, {}).items():
                resources[key] = resources.get(key, 0.0) + amount
            view[node_id] = NodeCapacity(resources=resources, labels=node_labels)
        self._view = view
        return view

    def _count_possible_workers(self, reserved_resources: Any) -> int:
        return count_placeable_prefix(
            self._slots, reserved_resources, self.scaling_config.max_workers
        )


class HeteroRayTorchTrainer(TorchTrainer):
    """Ray Train V2 ``TorchTrainer`` whose elastic sizing is :class:`HeteroElasticScalingPolicy`.

    Only ``fit`` differs from the parent: it hands the controller this policy where Ray's
    ``create_scaling_policy`` would give the stock one (fixed-size groups keep Ray's).
    """

    def __init__(self, *args: Any, slots: Sequence[SlotDemand], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._hetero_slots = tuple(slots)

    def fit(self) -> Any:
        if self.running_in_local_mode or not self.scaling_config.elasticity_enabled:
            return super().fit()
        train_fn_ref = ObjectRefWrapper(self._get_train_func())
        result = self._initialize_and_run_controller(
            train_fn_ref=train_fn_ref,
            scaling_policy=HeteroElasticScalingPolicy(self.scaling_config, self._hetero_slots),
            failure_policy=create_failure_policy(self.run_config.failure_config),
            train_run_context=self.train_run_context,
            callbacks=self._create_default_callbacks(),
            validation_config=self.validation_config,
        )
        if result.error:
            raise result.error
        return result
