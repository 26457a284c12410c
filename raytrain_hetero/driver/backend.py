"""Ray Train V2 backend for heterogeneous worker groups (Ray privates via ``_ray_compat``).

Ray Train reserves one resources dict for every worker but accepts one label selector per
worker. So ``HeteroTrainer`` reserves the per-key *minimum* of all WorkerSpecs' resources (one
bundle per slot, each with its slot's label selector), and on every (re)start
:class:`HeteroTorchBackend` maps each worker to its slot by bundle index (ranks are re-sorted
by node, bundles are not) and reserves the rest (a GPU, extra CPUs) with a *lease actor*
pinned to the worker's node, so the worker computes on exactly the GPU Ray gave the lease.

It then installs the per-worker context and the torch process group (gloo if any rank is on
CPU, else NCCL) around a rendezvous store listening on one address only
(:func:`rendezvous_host`): Ray Train's own ``env://`` setup makes ``TCPStore`` listen on every
interface, unauthenticated; here rank 0 binds the socket and hands it over
(``master_listen_fd``).
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import ray
from ray.train.torch import TorchConfig
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from raytrain_hetero.driver._ray_compat import TorchBackendBase
from raytrain_hetero.driver.elastic import kept_slot_order, slot_of_bundle
from raytrain_hetero.errors import PlacementError
from raytrain_hetero.worker.setup.identity import HeteroSetup

logger = logging.getLogger(__name__)

LEASE_TIMEOUT_S = float(os.environ.get("RAYTRAIN_HETERO_LEASE_TIMEOUT_S", "60"))

_master_store: list[Any] = []  # worker side: rank 0's store until init_process_group


def rendezvous_host(node_ips: list[str]) -> str:
    """Where the process group listens: loopback if every rank is on one machine, else rank
    0's node IP (never every interface)."""
    return "127.0.0.1" if len(set(node_ips)) == 1 else node_ips[0]


def _open_rendezvous(host: str, timeout_s: float) -> int:
    """Rank 0: a TCPStore server on a socket bound to ``host`` only; returns its port."""
    import torch.distributed as dist

    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listener.bind((host, 0))
    listener.listen(128)
    port = int(listener.getsockname()[1])
    timeout = timedelta(seconds=timeout_s)
    fd = listener.detach()  # the store owns the bound socket from here
    store = dist.TCPStore(
        host,
        port,
        is_master=True,
        wait_for_workers=False,
        timeout=timeout,
        master_listen_fd=fd,
        use_libuv=True,
    )
    _master_store[:] = [store]
    return port


def _join_process_group(
    backend: str, host: str, port: int, rank: int, world_size: int, timeout_s: float
) -> None:
    """Every rank: the torch process group over rank 0's store."""
    import ray.train
    import torch.distributed as dist

    context = ray.train.get_context()  # the variables Ray Train sets, for libraries reading them
    os.environ.update(
        MASTER_ADDR=host,
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(context.get_local_rank()),
        LOCAL_WORLD_SIZE=str(context.get_local_world_size()),
        NODE_RANK=str(context.get_node_rank()),
    )
    if host == "127.0.0.1":  # gloo and NCCL would listen on the hostname's address
        loopback = "lo" if "lo" in {name for _, name in socket.if_nameindex()} else "lo0"
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", loopback)
    if backend == "nccl":  # as Ray Train: a timed-out collective fails the worker
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    timeout = timedelta(seconds=timeout_s)
    store = (
        _master_store.pop()
        if rank == 0
        else dist.TCPStore(host, port, is_master=False, timeout=timeout, use_libuv=True)
    )
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)


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

    from raytrain_hetero.worker.runtime.registry import WorkerRuntime, install_runtime
    from raytrain_hetero.worker.setup.identity import RankIdentity

    spec = setup.specs[spec_index]
    device = "cpu"
    if spec.resolved_device() == "cuda":
        # A GPU every worker asks for is in the common reservation: Ray Train's own bundle
        # holds it (use_gpu), not a lease.
        gpu_ids = gpu_ids or [str(g) for g in ray.get_gpu_ids()]
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


class HeteroTorchBackend(TorchBackendBase):
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
        kept = None  # after admission: the slots Ray Train's workers host, in bundle order
        if setup.probe.group != "all" and setup.scheduler_name is not None:
            kept = kept_slot_order(setup.run_id)
        slots = [slot_of_bundle(self._slot_of(w, i), kept) for i, w in enumerate(workers)]
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
            from raytrain_hetero.driver.scheduler import lookup_scheduler

            # The driver owns the actor; a worker group only announces itself to it.
            scheduler = lookup_scheduler(setup.run_id)
            if scheduler is not None:
                scheduler.register_group.remote(group_id, world_size)
        self._start_process_group(worker_group, backend_config, workers)

    @staticmethod
    def _start_process_group(
        worker_group: Any, backend_config: HeteroTorchConfig, workers: list[Any]
    ) -> None:
        backend = backend_config.backend
        if backend is None:
            gpus = worker_group.get_resources_per_worker().get("GPU", 0)
            backend = "nccl" if gpus > 0 else "gloo"
        host = rendezvous_host([w.metadata.node_ip for w in workers])
        timeout_s = float(backend_config.timeout_s)
        port = worker_group.execute_single(0, _open_rendezvous, host, timeout_s)
        ray.get(
            [
                worker_group.execute_single_async(
                    rank, _join_process_group, backend, host, port, rank, len(workers), timeout_s
                )
                for rank in range(len(workers))
            ]
        )
        logger.info("process group (%s) rendezvous on %s:%d", backend, host, port)

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
            except Exception as exc:  # noqa: BLE001 - a dead lease is already released
                logger.debug("lease already gone: %s", exc)
        self._leases = []
