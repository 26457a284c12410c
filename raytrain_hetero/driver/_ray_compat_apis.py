"""The registry of every private Ray API raytrain_hetero uses: each name, why, and its public
replacement. Data only (no Ray import): :mod:`raytrain_hetero.driver._ray_compat` reaches the
names and :func:`~raytrain_hetero.driver._ray_compat.check_ray_compat` checks this list.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PRIVATE_APIS", "PrivateRayAPI"]


@dataclass(frozen=True)
class PrivateRayAPI:
    """One private Ray name the package depends on: ``attribute`` (a dotted path, empty for
    the module itself) of ``module``, ``why`` it is needed and its public ``replacement``."""

    module: str
    attribute: str
    why: str
    replacement: str

    @property
    def name(self) -> str:
        """Fully dotted name, as an error message shows it."""
        return f"{self.module}.{self.attribute}" if self.attribute else self.module


_CONTROLLER = "ray.train.v2._internal.execution.controller.controller"
_DATASETS = "ray.train.v2._internal.callbacks.datasets"
_RAY_CONSTANTS = "ray._private.ray_constants"
_TRAINER = "ray.train.v2.api.data_parallel_trainer"
_SCALING = "ray.train.v2._internal.execution.scaling_policy"

#: Every private Ray API the package uses (checked by :func:`check_ray_compat`).
PRIVATE_APIS: tuple[PrivateRayAPI, ...] = (
    PrivateRayAPI(
        "ray.train.v2.api.config",
        "ScalingConfig._label_selector_per_worker",
        "overridden by HeteroScalingConfig: worker j gets the label selector of the slot it "
        "hosts once admission has reordered the slots",
        "per-worker placement that a scaling decision can order",
    ),
    PrivateRayAPI(
        "ray._private.state",
        "available_resources_per_node",
        "live per-node available resources for slot-by-slot elastic sizing",
        "a public per-node available-resources call (ray.available_resources is cluster-wide)",
    ),
    PrivateRayAPI(
        _RAY_CONSTANTS,
        "ENABLE_RAY_CLUSTER",
        "switched off while the embedded Ray starts, so ray.init keeps the node IP 127.0.0.1 "
        "(it otherwise swaps 127.0.0.1 for the machine's reachable address, and every gRPC "
        "server of the node then listens on all interfaces)",
        "a ray.init argument that binds the local node to loopback (newer Ray binds the node IP)",
    ),
    PrivateRayAPI(
        "ray._private.services",
        "resolve_ip_for_localhost",
        "the function whose swap keep_loopback_node_ip prevents; checked so a change is noticed",
        "as above",
    ),
    PrivateRayAPI(
        "ray.train.torch.config",
        "_TorchBackend.on_start",
        "base of HeteroTorchBackend, whose on_start replaces it: per-worker placement, leases "
        "and context, then a process group whose store listens on one address only",
        "a public per-worker Backend hook",
    ),
    PrivateRayAPI(
        "ray.train.torch.config",
        "_TorchBackend.on_shutdown",
        "HeteroTorchBackend releases its resource leases there",
        "a public Backend hook",
    ),
    PrivateRayAPI(
        _SCALING,
        "ElasticScalingPolicy._get_reserved_resources",
        "overridden: read the live per-node view instead of the coordinator's 20 s tick",
        "heterogeneous ScalingConfig.resources_per_worker",
    ),
    PrivateRayAPI(
        _SCALING,
        "ElasticScalingPolicy._count_possible_workers",
        "overridden: count the placeable slot prefix (resources + label selectors)",
        "heterogeneous ScalingConfig.resources_per_worker",
    ),
    PrivateRayAPI(
        _SCALING,
        "ElasticScalingPolicy.make_decision_for_running_worker_group",
        "overridden: remember what the running group holds per node",
        "as above",
    ),
    PrivateRayAPI(
        _SCALING,
        "ElasticScalingPolicy.make_decision_for_non_running_worker_group",
        "overridden: keep counting the old group until its placement group is gone",
        "as above",
    ),
    PrivateRayAPI(
        "ray.train.v2._internal.execution.failure_handling",
        "create_failure_policy",
        "the stock failure policy for the controller we start ourselves",
        "a TorchTrainer argument taking a scaling policy",
    ),
    PrivateRayAPI(
        "ray.train.v2._internal.execution.failure_handling",
        "FailurePolicy.make_decision",
        "HandoffFailurePolicy wraps the stock policy: a worker group that ended itself at a "
        "preemption notice's agreed step (PreemptionHandoff) is retried as a preemption "
        "(max_preemption_failures), not charged to max_failures",
        "a public failure-policy hook, or a way for a worker group to end for a preemption",
    ),
    PrivateRayAPI(
        "ray._private.state",
        "GlobalState.get_draining_nodes",
        "the elastic policy leaves draining nodes out of its view (Ray schedules nothing "
        "there, so a group sized with them would wait for placement until the node is gone); "
        "Ray Train's own preemption watcher reads the same call",
        "a public per-node drain state (ray.nodes() has none in 2.60)",
    ),
    PrivateRayAPI(
        "ray._raylet",
        "InnerGcsClient.drain_node",
        "drain_node_for_preemption: tests and benchmarks deliver a preemption notice as the "
        "autoscaler does (what the hidden `ray drain-node` CLI calls, through GcsClient, "
        "which forwards it to this class)",
        "a public drain API",
    ),
    PrivateRayAPI(
        "ray.core.generated.autoscaler_pb2",
        "DrainNodeReason",
        "the PREEMPTION reason of drain_node_for_preemption",
        "as above",
    ),
    PrivateRayAPI(
        "ray.train.v2._internal.constants",
        "ENABLE_PREEMPTION_WATCHER_ENV_VAR",
        "preemption_watcher_enabled: the library skips reading notices when Ray Train's "
        "watcher is off (no notice can come; each read is a collective)",
        "a RunConfig/FailureConfig field for the watcher",
    ),
    PrivateRayAPI(
        "ray.train.v2._internal.util",
        "ObjectRefWrapper",
        "wraps the train function for the controller we start ourselves",
        "as above",
    ),
    PrivateRayAPI(
        _TRAINER,
        "DataParallelTrainer._initialize_and_run_controller",
        "mirror of DataParallelTrainer.fit with our scaling policy",
        "as above",
    ),
    PrivateRayAPI(
        _TRAINER,
        "DataParallelTrainer._get_train_func",
        "mirror of DataParallelTrainer.fit",
        "as above",
    ),
    PrivateRayAPI(
        _TRAINER,
        "DataParallelTrainer._create_default_callbacks",
        "mirror of DataParallelTrainer.fit",
        "as above",
    ),
    PrivateRayAPI(
        _DATASETS,
        "DatasetsCallback.before_init_train_context",
        "overridden for a trainer without datasets: no DatasetManager actor per group start",
        "Ray Train skipping the DatasetManager when there are no datasets",
    ),
    PrivateRayAPI(
        _DATASETS,
        "DatasetsCallback.after_worker_group_start",
        "kept: it still hands the driver's DataContext to the workers",
        "as above",
    ),
    PrivateRayAPI(
        _CONTROLLER,
        "TrainController.abort",
        "a Tune trial stopped early (ASHA) aborts its Train run so its placement group is "
        "removed at once",
        "Tune/Train integration that aborts the run on trial stop",
    ),
    PrivateRayAPI(
        "ray.tune.trainable.function_trainable",
        "wrap_function",
        "reads a function trainable's __mixins__ (our cleanup mixin aborts the Train run)",
        "a public cleanup hook for function trainables",
    ),
    PrivateRayAPI(
        "ray.tune.experiment.trial",
        "_TemporaryTrialState",
        "tune_trial_actor reads a Tune trial's actor handle (temporary_state.ray_actor), so the "
        "driver can have a stopped trial end its Train run before Tune kills the trial",
        "a Tune callback hook that runs inside the trial before its actor is stopped",
    ),
    PrivateRayAPI(
        "ray.train.v2._internal.execution.context",
        "TrainRunContext.backend_config",
        "callbacks read run_context.backend_config (our setup, naming the scheduler actor)",
        "public run metadata on TuneReportCallback",
    ),
    PrivateRayAPI(
        "ray.train.v2._internal.exceptions",
        "UserExceptionWithTraceback",
        "hetero_error_cause reads the worker's original exception from its private _base_exc "
        "(its str() is the traceback), to show the CLI user the one-line HeteroError",
        "a public attribute holding the original exception of a worker failure",
    ),
    PrivateRayAPI(
        "ray.train.v2._internal.constants",
        "COLLECTIVE_TIMEOUT_S_ENV_VAR",
        "train_collective_timeout sets this variable so Ray Train's report barrier times out "
        "with BackendConfig.collective_timeout_s (it has no timeout by default)",
        "a RunConfig field for Ray Train's collective timeout",
    ),
    PrivateRayAPI(
        "ray._private.utils",
        "get_num_cpus",
        "machine_cpu_count: the CPUs a new local Ray counts when num_cpus is not given (cgroup "
        "quotas included), so the embedded Ray is sized up only when the workers need more",
        "a public call for the CPUs ray.init would detect",
    ),
    PrivateRayAPI(
        "ray.autoscaler.v2.sdk",
        "get_cluster_status",
        "autoscaler_may_add_nodes: an autoscaler v2 reporting its state (a non-zero "
        "autoscaler_version) serves the cluster, so a group that does not fit yet may",
        "a public 'does this cluster autoscale' call",
    ),
    PrivateRayAPI(
        _RAY_CONSTANTS,
        "DEBUG_AUTOSCALING_STATUS",
        "autoscaler_may_add_nodes: the internal-KV key where autoscaler v1 writes its report",
        "as above",
    ),
    PrivateRayAPI(
        "ray.experimental.internal_kv",
        "_internal_kv_get",
        "autoscaler_may_add_nodes reads autoscaler v1's report; take_run_value reads the last "
        "report a run's controller left for the driver",
        "as above; Result.metrics from the last report, checkpoint or not",
    ),
    PrivateRayAPI(
        "ray.experimental.internal_kv",
        "_internal_kv_put",
        "put_run_value: the Train controller leaves each report's rank-0 metrics for the "
        "driver (one key per run, overwritten), so fit()'s Result carries the last report",
        "Result.metrics from the last report, checkpoint or not",
    ),
    PrivateRayAPI(
        "ray.experimental.internal_kv",
        "_internal_kv_del",
        "take_run_value removes the run's key once read",
        "as above",
    ),
    PrivateRayAPI(
        "ray._private.state",
        "GlobalState.get_max_resources_from_cluster_config",
        "max_cluster_resources: what an autoscaling cluster may ever offer (when its cluster "
        "config is published), so a resource no node type has fails before any wait; Ray "
        "Train's own worker-group check reads the same call",
        "a public cluster-config call",
    ),
)
