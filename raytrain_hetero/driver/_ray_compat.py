"""Every private Ray API raytrain_hetero uses, in one place, each with why and what would replace it.

Ray Train V2 has no public hook for a per-slot elastic policy, a backend that places workers
itself, or aborting a Train run from a Tune trial; those internals are reached *only* here.
Each :data:`PRIVATE_APIS` entry (listed in :mod:`._ray_compat_apis`) says why and which
public API would drop it;
:func:`check_ray_compat` fails naming the private API that moved. Upgrading Ray: bump
:data:`PINNED_RAY_VERSION`, run ``tests/unit/test_ray_compat.py`` and the integration tests
``test_elastic.py``, ``test_live_scheduler.py`` and ``test_tune.py``.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import ray

# Base class of our torch backend. Why: Ray Train's Backend plugin point is the private
# _TorchBackend (process-group setup on every worker-group start); we subclass it to place,
# lease and configure each heterogeneous worker before the process group forms.
# Public replacement: a public TorchConfig/Backend hook with per-worker setup.
from ray.train.torch.config import _TorchBackend as TorchBackendBase

# Why: Ray Train 2.60 starts a DatasetManager actor on every worker-group start, restarts
# included, even when the trainer has no datasets (a process that imports ray.train: ~2 s of
# CPU that competes with the workers' own start). Public replacement: no manager without
# datasets.
from ray.train.v2._internal.callbacks.datasets import DatasetsCallback

# Why: to hand the controller the stock failure policy while we replace the scaling policy
# (mirror of DataParallelTrainer.fit below), wrapped by HandoffFailurePolicy (its base).
# Public replacement: a TorchTrainer argument taking a scaling and a failure policy.
from ray.train.v2._internal.execution.failure_handling import (
    FailurePolicy,
    create_failure_policy,
)

# Base of HeteroElasticScalingPolicy. Why: Ray's elastic policy sizes groups from one
# resources dict and ignores label selectors; we override its private
# _get_reserved_resources/_count_possible_workers to size slot by slot.
# Public replacement: heterogeneous ScalingConfig.resources_per_worker (Ray's own TODO).
from ray.train.v2._internal.execution.scaling_policy import ElasticScalingPolicy

# Why: the controller takes the train function wrapped in this (mirror of fit below).
from ray.train.v2._internal.util import ObjectRefWrapper

from raytrain_hetero.driver._ray_compat_apis import PRIVATE_APIS, PrivateRayAPI
from raytrain_hetero.errors import HeteroError, PreemptionHandoff

logger = logging.getLogger(__name__)

__all__ = [
    "PINNED_RAY_VERSION",
    "PRIVATE_APIS",
    "ElasticScalingPolicy",
    "HandoffFailurePolicy",
    "PrivateRayAPI",
    "RayCompatError",
    "TorchBackendBase",
    "abort_train_controller",
    "autoscaler_may_add_nodes",
    "available_resources_per_node",
    "check_ray_compat",
    "drain_node_for_preemption",
    "draining_node_ids",
    "hetero_error_cause",
    "keep_loopback_node_ip",
    "machine_cpu_count",
    "mark_trainable_mixins",
    "max_cluster_resources",
    "preemption_watcher_enabled",
    "put_run_value",
    "run_backend_config",
    "run_controller_with_scaling_policy",
    "take_run_value",
    "train_collective_timeout",
    "train_env_passthrough",
    "tune_trial_actor",
    "without_idle_dataset_manager",
]

#: The Ray version every private name below was checked against.
PINNED_RAY_VERSION = "2.60.0"

#: Ray Train reads this environment variable (not a documented setting) for how often the
#: controller polls workers; every ``report`` blocks up to one interval, so tests and
#: benchmarks set it small (0.2 s) and the driver passes it on to workers.
#: Public replacement: a RunConfig/ScalingConfig field for the health-check interval.
HEALTH_CHECK_ENV_VAR = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"

#: Ray Train 2.60 reads this environment variable (not a documented setting) in the driver when
#: ``fit()`` creates the controller and propagates it to the workers: the timeout of Ray
#: Train's own collectives (the barrier inside ``ray.train.report``). Unset, they wait forever.
#: Public replacement: a RunConfig field for the collective timeout.
COLLECTIVE_TIMEOUT_ENV_VAR = "RAY_TRAIN_COLLECTIVE_TIMEOUT_S"

#: Ray Train 2.60 starts its preemption watcher (the source of ``get_preemption_info``)
#: unless this environment variable is false in the driver (default on).
#: Public replacement: a RunConfig/FailureConfig field for the watcher.
PREEMPTION_WATCHER_ENV_VAR = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"


class RayCompatError(HeteroError):
    """The installed Ray is not the pinned version, or a private Ray API we use has moved."""


def _resolve(api: PrivateRayAPI, modules: Mapping[str, Any] | None) -> Any:
    module = (modules or {}).get(api.module)
    if module is None:
        module = importlib.import_module(api.module)
    target = module
    for part in filter(None, api.attribute.split(".")):
        fields = getattr(target, "__dataclass_fields__", {})
        # A dataclass field without a default is not a class attribute: look it up as a field.
        target = fields[part] if part in fields else getattr(target, part)
    return target


def check_ray_compat(
    apis: Sequence[PrivateRayAPI] = PRIVATE_APIS,
    *,
    modules: Mapping[str, Any] | None = None,
    installed_version: str | None = None,
) -> None:
    """Check that the installed Ray is the pinned one and every private name resolves.

    ``modules`` (by name, instead of importing) and ``installed_version`` are for tests.

    Raises:
        RayCompatError: Names the installed version and every private API that is missing.
    """
    version = installed_version if installed_version is not None else ray.__version__
    problems: list[str] = []
    if version != PINNED_RAY_VERSION:
        problems.append(
            f"installed Ray is {version} but raytrain_hetero is pinned to {PINNED_RAY_VERSION}"
        )
    for api in apis:
        try:
            _resolve(api, modules)
        except (ImportError, AttributeError) as exc:
            problems.append(
                f"private Ray API {api.name} is missing ({type(exc).__name__}: {exc}); "
                f"needed for: {api.why}"
            )
    if problems:
        raise RayCompatError(
            f"Ray {version} is not compatible with raytrain_hetero: "
            + "; ".join(problems)
            + f". Fix: install ray=={PINNED_RAY_VERSION}, or port "
            "raytrain_hetero/driver/_ray_compat.py to this Ray and update PINNED_RAY_VERSION."
        )


def available_resources_per_node() -> dict[str, dict[str, float]]:
    """Available resources of every alive node, by node id (``ray._private.state``)."""
    from ray._private import state

    return state.available_resources_per_node()


@contextlib.contextmanager
def keep_loopback_node_ip() -> Iterator[None]:
    """While active, a new local Ray keeps ``_node_ip_address="127.0.0.1"`` as its node IP.

    Why: Ray 2.60's ``ray.init`` passes the node IP through
    ``services.resolve_ip_for_localhost``, which replaces 127.0.0.1 by the machine's reachable
    address unless ``ray_constants.ENABLE_RAY_CLUSTER`` is false (Ray's own mode for a
    single-machine Ray on macOS/Windows). GCS, raylet and core workers bind their gRPC servers
    to 127.0.0.1 only when the node IP *is* 127.0.0.1 (all interfaces otherwise), and the
    dashboard agent and runtime-env agent bind the node IP. After ``ray.init`` returns, Ray
    reads the node IP from the started node, so the switch is restored at once.
    """
    from ray._private import ray_constants

    saved = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = saved


def run_controller_with_scaling_policy(trainer: Any, scaling_policy: Any) -> Any:
    """``DataParallelTrainer.fit`` (Ray 2.60) with ``scaling_policy`` in place of Ray's own.

    Why: the controller's scaling policy is chosen inside ``fit`` by
    ``create_scaling_policy(scaling_config)``; no argument lets a caller pass another.

    Returns:
        Ray Train's Result. Raises the run's error like ``fit`` does.
    """
    result = trainer._initialize_and_run_controller(
        train_fn_ref=ObjectRefWrapper(trainer._get_train_func()),
        scaling_policy=scaling_policy,
        failure_policy=HandoffFailurePolicy(
            create_failure_policy(trainer.run_config.failure_config)
        ),
        train_run_context=trainer.train_run_context,
        callbacks=trainer._create_default_callbacks(),
        validation_config=trainer.validation_config,
    )
    if result.error:
        raise result.error
    return result


class HandoffFailurePolicy(FailurePolicy):
    """Ray Train's stock failure policy, plus: a worker group that ended itself with
    :class:`~raytrain_hetero.errors.PreemptionHandoff` (every failed rank) is a preemption.

    Why: in Ray 2.60 a worker group that returns ends the run, and one that raises is a
    worker failure (``max_failures``); only the controller itself raises ``PreemptionError``,
    after waiting out the deadline. Handing the stock policy a ``PreemptionError`` instead
    restarts the run at once, charged to ``FailureConfig.max_preemption_failures``.
    """

    def __init__(self, inner: Any) -> None:
        super().__init__(inner.failure_config)
        self._inner = inner

    def make_decision(self, training_failed_error: Any) -> Any:
        failures = getattr(training_failed_error, "worker_failures", None)
        if (
            isinstance(failures, Mapping)
            and failures
            and all(isinstance(error, PreemptionHandoff) for error in failures.values())
        ):
            logger.info("worker group handed off at a preemption notice: restarting at once")
            training_failed_error = ray.train.PreemptionError(
                ray.train.PreemptionInfo(
                    deadline_ms=None,
                    preempted_node_to_ranks={},
                ),
                drain_timed_out=False,
            )
        return self._inner.make_decision(training_failed_error)


def preemption_watcher_enabled(environ: Mapping[str, str]) -> bool:
    """Whether Ray Train starts its preemption watcher, read as Ray 2.60 reads it."""
    value = environ.get(PREEMPTION_WATCHER_ENV_VAR)
    return True if value is None else value.lower() in ("true", "1")


def draining_node_ids() -> set[str]:
    """Hex ids of the nodes being drained (a preemption notice among them)."""
    from ray._private import state

    return set(state.state.get_draining_nodes() or {})


def drain_node_for_preemption(gcs_address: str, node_id: str, notice_s: float) -> float:
    """Drain ``node_id`` as a spot preemption with a deadline ``notice_s`` seconds ahead
    (what ``ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION`` calls). Ray does not kill
    the node at the deadline: the caller does.

    Returns:
        The deadline (UNIX seconds) as GCS got it.

    Raises:
        RayCompatError: GCS refused the drain (its reason).
    """
    import time

    from ray.core.generated import autoscaler_pb2

    deadline_ms = time.time_ns() // 1_000_000 + int(notice_s * 1000)
    client = ray._raylet.GcsClient(address=gcs_address)  # type: ignore[attr-defined]
    accepted, why = client.drain_node(
        node_id,
        autoscaler_pb2.DrainNodeReason.Value(  # type: ignore[attr-defined]
            "DRAIN_NODE_REASON_PREEMPTION"
        ),
        "preemption notice (raytrain_hetero)",
        deadline_ms,
    )
    if not accepted:
        raise RayCompatError(f"GCS refused to drain node {node_id}: {why}")
    return deadline_ms / 1000.0


class _NoDatasetShards:
    """What a worker's train context asks for a dataset shard when the run has no datasets."""

    def get_dataset_shard(self, dataset_info: Any) -> Any:
        raise KeyError(
            f"Dataset shard for '{dataset_info.dataset_name}' not found. Please ensure that "
            "the dataset is passed through the Trainer `datasets` argument."
        )


class _DatasetsCallbackWithoutDatasets(DatasetsCallback):
    """Ray's DatasetsCallback for a run without datasets: the DataContext still reaches the
    workers, but no DatasetManager actor starts with each worker group."""

    def before_init_train_context(self, workers: list[Any]) -> dict[str, list[Any]]:
        return {"dataset_shard_provider": [_NoDatasetShards()] * len(workers)}


def without_idle_dataset_manager(callbacks: list[Any], trainer: Any) -> list[Any]:
    """``callbacks`` (``trainer``'s default ones) without the DatasetManager actor Ray Train
    starts with every worker group, when ``trainer`` has no datasets."""
    if trainer.datasets:
        return callbacks
    run_context = trainer.train_run_context
    return [
        _DatasetsCallbackWithoutDatasets(run_context, {}) if type(cb) is DatasetsCallback else cb
        for cb in callbacks
    ]


def run_backend_config(run_context: Any) -> Any:
    """The run's backend config (our ``HeteroTorchConfig``) from a Train callback's context."""
    return getattr(run_context, "backend_config", None)


def abort_train_controller(controller: Any, timeout_s: float) -> None:
    """Abort a Train run through its controller actor (removes its placement group at once).

    Ends the controller actor: the ``RayActorError`` that follows is the expected outcome.
    """
    with contextlib.suppress(ray.exceptions.RayActorError):
        ray.get(controller.abort.remote(), timeout=timeout_s)


def tune_trial_actor(trial: Any) -> Any:
    """The actor handle of a running Tune trial (``Trial.temporary_state.ray_actor``), or
    ``None`` when it has none (not started, or already stopped)."""
    state = getattr(trial, "temporary_state", None)
    return getattr(state, "ray_actor", None)


def mark_trainable_mixins(trainable: Callable[..., Any], *mixins: type) -> None:
    """Mix ``mixins`` into the class Tune wraps a function trainable in (``__mixins__``).

    Why: Tune ends a stopped trial's actor without a hook in the function trainable; a mixin
    overriding ``cleanup`` is the only place to act first.
    """
    trainable.__mixins__ = tuple(mixins)  # type: ignore[attr-defined]


def train_env_passthrough(environ: Mapping[str, str]) -> dict[str, str]:
    """The undocumented Ray Train settings (env vars) of ``environ`` to pass to workers."""
    return (
        {HEALTH_CHECK_ENV_VAR: environ[HEALTH_CHECK_ENV_VAR]}
        if (HEALTH_CHECK_ENV_VAR in environ)
        else {}
    )


@contextlib.contextmanager
def train_collective_timeout(
    timeout_s: float, environ: dict[str, str] | None = None
) -> Iterator[None]:
    """Ray Train's own collectives time out after ``timeout_s`` while the block runs.

    Why: a rank that hangs between the package's collectives and ``ray.train.report`` leaves
    the other ranks in Ray Train's report barrier, which has no timeout unless
    :data:`COLLECTIVE_TIMEOUT_ENV_VAR` is set in the driver when the controller starts (Ray then
    propagates it to every worker). Setting it for the duration of ``fit()`` makes
    ``BackendConfig.collective_timeout_s`` bound that barrier too. A value the user exported
    wins and is left untouched. ``environ`` is ``os.environ`` (a dict in tests).
    """
    import os

    env = os.environ if environ is None else environ
    if COLLECTIVE_TIMEOUT_ENV_VAR in env:
        yield
        return
    env[COLLECTIVE_TIMEOUT_ENV_VAR] = str(float(timeout_s))
    try:
        yield
    finally:
        env.pop(COLLECTIVE_TIMEOUT_ENV_VAR, None)


def hetero_error_cause(error: BaseException) -> HeteroError | None:
    """The first :class:`HeteroError` behind a failed Ray run, or ``None``.

    A worker's ``DataError`` reaches the driver wrapped: Ray Train V2 raises a
    ``WorkerGroupError`` (``worker_failures``: rank -> ``UserExceptionWithTraceback``,
    whose private ``_base_exc`` is the original), a ``ControllerError``
    (``controller_failure``), or a ``RayTaskError`` (``cause``); every wrapper's ``str()`` is
    a traceback. This walks those links (and ``__cause__``/``__context__``), lowest rank
    first, and returns the original exception, whose message is the one-line cause and fix.
    """
    from ray.exceptions import RayTaskError

    pending: list[BaseException] = [error]
    seen: set[int] = set()
    while pending:
        exc = pending.pop(0)
        if id(exc) in seen:
            continue
        seen.add(id(exc))
        # A RayTaskError may also subclass the cause's type (as_instanceof_cause): the
        # original is its ``cause``, with the plain message.
        if isinstance(exc, HeteroError) and not isinstance(exc, RayTaskError):
            return exc
        nested: list[object] = []
        failures = getattr(exc, "worker_failures", None)
        if isinstance(failures, Mapping):
            nested.extend(failures[rank] for rank in sorted(failures))
        nested.extend(
            getattr(exc, name, None) for name in ("_base_exc", "controller_failure", "cause")
        )
        nested.extend((exc.__cause__, exc.__context__))
        pending.extend(e for e in nested if isinstance(e, BaseException))
    return None


#: Internal-KV namespace of the values a run's controller leaves for its driver.
_KV_NAMESPACE = "raytrain_hetero"


def put_run_value(key: str, value: bytes) -> None:
    """Store ``value`` under ``key`` in Ray's internal KV (overwriting), from any process of
    the cluster (the Train controller).

    Why: Ray Train V2 builds ``Result.metrics`` from the last report *with a checkpoint*; the
    driver needs the last report, and one overwritten key carries it without an actor.
    """
    from ray.experimental.internal_kv import _internal_kv_put

    _internal_kv_put(key, value, overwrite=True, namespace=_KV_NAMESPACE)


def take_run_value(key: str) -> bytes | None:
    """The value :func:`put_run_value` stored under ``key`` (then removed), or ``None``."""
    from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_get

    value = _internal_kv_get(key, namespace=_KV_NAMESPACE)
    if value is not None:
        _internal_kv_del(key, namespace=_KV_NAMESPACE)
    return value


def machine_cpu_count() -> int:
    """The CPUs a new local Ray counts on this machine when ``ray.init`` gets no ``num_cpus``
    (Ray's own count: cgroup quotas included, which ``os.cpu_count()`` ignores)."""
    from ray._private import utils

    return int(utils.get_num_cpus())


def max_cluster_resources() -> dict[str, float] | None:
    """What the connected cluster may ever offer, by resource, from the cluster config an
    autoscaler publishes (``None``: no config published, e.g. a cluster started by hand)."""
    from ray._private import state

    found = state.state.get_max_resources_from_cluster_config()
    return {str(k): float(v) for k, v in found.items()} if found else None


def autoscaler_may_add_nodes() -> bool | None:
    """Whether an autoscaler serves the connected cluster, so that nodes may still join;
    ``None`` when it cannot be told (a Ray Client connection, an unreadable status).

    Why: Ray 2.60 has no public call for it. An autoscaler v2 reports its state to GCS
    (``get_cluster_status``: a non-zero ``autoscaler_version``). Autoscaler v1's monitor
    writes a report to the internal KV; a cluster started by hand (and every local Ray) runs
    it with a read-only provider whose node types are ``node_<id>``, which launches nothing.
    """
    import json

    try:
        from ray._private import ray_constants
        from ray.autoscaler.v2.sdk import get_cluster_status
        from ray.experimental.internal_kv import _internal_kv_get

        status = get_cluster_status(ray.get_runtime_context().gcs_address)
        if str(status.stats.autoscaler_version) not in ("", "0"):
            return True
        raw = _internal_kv_get(ray_constants.DEBUG_AUTOSCALING_STATUS)
        report = json.loads(raw).get("autoscaler_report") if raw else None
    except Exception:  # unknown, and the caller says so
        logger.debug("could not tell whether an autoscaler serves the cluster", exc_info=True)
        return None
    if not report:
        return False
    if report.get("pending_launches"):
        return True
    types = {*(report.get("active_nodes") or {}), *(report.get("idle_nodes") or {})}
    types.update(str(pending[1]) for pending in report.get("pending_nodes") or ())
    return any(not str(node_type).startswith("node_") for node_type in types)
