"""Before Ray Train is asked for a worker group: can the cluster hold it? No silent wait.

Ray Train waits for a worker group the cluster cannot place and retries forever ("worker
group startup timed out after 60.0 seconds", error count N of max inf), a message seen only in
Ray's session logs. :func:`ensure_room` checks the group first, against the cluster it will run
on (the nodes' resources and labels, as :func:`~raytrain_hetero.core.placement.first_shortfall`
places the slots):

* a group no node could ever hold (a label no node carries, a resource no node offers or more
  of it than any node has, more of a resource than the nodes have in all) fails at once with
  a :class:`~raytrain_hetero.errors.PlacementError` of one line naming the worker, the resource
  and the fix; a resource name that looks like a typo of a known one (``GPUS``) is named with
  the one it resembles;
* a group the cluster may yet hold (an autoscaler may add nodes, or other work holds the
  resources now) is waited for, at most ``ElasticConfig.placement_timeout_s``, with a progress
  line every :data:`PROGRESS_EVERY_S` seconds naming what it waits for. A placement group of
  the slots' own bundles and label selectors is the demand the autoscaler sees; it is removed
  as soon as it is placed, and Ray Train places its own;
* an elastic group needs only its first ``min_workers`` slots; a later slot no node could ever
  hold is named in a warning (the group trains without it);
* inside a Ray Tune trial the wait has no limit (:func:`placement_wait_limit`): the room is
  held by the search's other trials, and Tune (or the search's allocator) decided that this
  trial runs now, so it only waits its turn, as a stock Ray Train trial would.

:func:`start_embedded_ray` starts the embedded local Ray that ``fit()`` starts when no Ray
runs, sized by :func:`size_embedded_ray`: to Ray a CPU is a logical count, so workers that
declare more CPUs than the machine has share its cores (slower, still exact: the plan follows
their measured speeds) instead of waiting forever. GPUs, other resources and labels cannot be
made up: a custom resource or label is refused before Ray starts, GPUs once it runs.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import ray

from raytrain_hetero.config import WorkerSpec
from raytrain_hetero.core.placement import NodeCapacity, Shortfall, SlotDemand, first_shortfall
from raytrain_hetero.driver._ray_compat import (
    autoscaler_may_add_nodes,
    available_resources_per_node,
    draining_node_ids,
    machine_cpu_count,
    max_cluster_resources,
)
from raytrain_hetero.errors import PlacementError

logger = logging.getLogger(__name__)

__all__ = [
    "PROGRESS_EVERY_S",
    "ClusterView",
    "embedded_num_cpus",
    "ensure_room",
    "in_tune_trial",
    "placement_wait_limit",
    "read_cluster_view",
    "size_embedded_ray",
]

#: Seconds between the progress lines of a wait for room.
PROGRESS_EVERY_S = 30.0

#: Resource names every Ray cluster knows: typo suggestions besides those the nodes offer.
RAY_RESOURCES = ("CPU", "GPU", "memory", "object_store_memory")

#: Where the timeout is set, as the messages name it.
TIMEOUT_SETTING = "elastic.placement_timeout_s"

# Resources Ray derives from placement groups (``CPU_group_<pg id>``,
# ``CPU_group_0_<pg id>``, ``bundle_group_<pg id>``): not a node's own.
_GROUP_RESOURCE = re.compile(r"_group_(\d+_)?[0-9a-f]{16,}$")

_EPSILON = 1e-9


@dataclass(frozen=True)
class ClusterView:
    """What the check sees of the cluster a run will use.

    Attributes:
        totals: Every alive node's own resources (totals) and labels, by node id.
        free: The same nodes' available resources now (a draining node: none); ``None`` when
            Ray would not say.
        may_grow: Whether nodes may still join: an autoscaler serves the cluster (``None``:
            it could not be told).
        ever: What an autoscaling cluster may ever offer, by resource, from the cluster
            config its autoscaler publishes (``None``: none published).
        embedded: The embedded local Ray that ``fit()`` started (one node, no autoscaler).
    """

    totals: Mapping[str, NodeCapacity]
    free: Mapping[str, NodeCapacity] | None
    may_grow: bool | None
    ever: Mapping[str, float] | None = None
    embedded: bool = False


def in_tune_trial() -> bool:
    """Whether this process runs a Ray Tune trial (its function trainable calls ``fit()``)."""
    import warnings

    from ray import tune

    with warnings.catch_warnings():  # outside a trial Ray warns, then says None
        warnings.simplefilter("ignore")
        return tune.get_context().get_trial_id() is not None


def placement_wait_limit(timeout_s: float) -> float | None:
    """The pre-check's longest wait for room: ``timeout_s`` (``elastic.placement_timeout_s``),
    or no limit (``None``) inside a Ray Tune trial, where a timeout would fail a trial that
    only had to wait for the workers the search's other trials are giving back."""
    return None if in_tune_trial() else timeout_s


def _own(resources: Mapping[str, float]) -> dict[str, float]:
    return {k: float(v) for k, v in resources.items() if not _GROUP_RESOURCE.search(k)}


def read_cluster_view(*, embedded: bool) -> ClusterView:
    """The connected cluster as the check sees it (``ray.nodes()`` and live availability)."""
    alive = [node for node in ray.nodes() if node.get("Alive")]
    totals = {
        node["NodeID"]: NodeCapacity(
            _own(node.get("Resources") or {}), dict(node.get("Labels") or {})
        )
        for node in alive
    }
    free: dict[str, NodeCapacity] | None
    try:
        available, draining = available_resources_per_node(), draining_node_ids()
        free = {
            node_id: NodeCapacity(
                {} if node_id in draining else _own(available.get(node_id, {})), node.labels
            )
            for node_id, node in totals.items()
        }
    except Exception:  # then only the totals decide, and a wait may follow
        logger.debug("per-node available resources not readable", exc_info=True)
        free = None
    if embedded:
        return ClusterView(totals, free, may_grow=False, embedded=True)
    ever = None
    try:
        ever = max_cluster_resources()
    except Exception:  # no published config: the nodes decide
        logger.debug("cluster config not readable", exc_info=True)
    return ClusterView(totals, free, autoscaler_may_add_nodes(), ever)


#: Resources a new local Ray may detect by itself (known once it runs); any other is one the
#: embedded Ray cannot have, as ``fit()`` starts it with no custom resources.
_DETECTED = frozenset({"GPU", "TPU", "neuron_cores", "HPU", "NPU", "memory", "object_store_memory"})
_DETECTED_PREFIXES = ("accelerator_type:", "node:", "TPU-")


def start_embedded_ray(specs: Sequence[WorkerSpec], *, min_workers: int, datasets: bool) -> None:
    """Start the embedded local Ray for ``specs``: sized by :func:`size_embedded_ray`, after
    refusing (without starting Ray) a group it could never hold for a reason known before it
    runs: a custom resource, a label its node will not carry. GPUs and the like are known
    once it runs (:func:`ensure_room` checks them then).

    Raises:
        PlacementError: One line naming the worker, the resource or labels and the fix.
    """
    from raytrain_hetero.driver.session import init_ray

    num_cpus = size_embedded_ray(specs, datasets=datasets)
    slots = [_slot(spec, known_later=True) for spec in specs]
    offered: dict[str, float] = {"CPU": float(num_cpus or machine_cpu_count())}
    for slot in slots:
        for key in slot.resources:
            if key in _DETECTED or key.startswith(_DETECTED_PREFIXES):
                offered[key] = math.inf  # known once Ray runs
    view = ClusterView({"local": NodeCapacity(offered)}, None, may_grow=False, embedded=True)
    short = first_shortfall(slots[:min_workers], view.totals, RAY_RESOURCES)
    if short is not None and short.proven:
        raise PlacementError(describe_shortfall(short, [s.name for s in specs], slots, view))
    init_ray(num_cpus=embedded_num_cpus(specs, datasets=datasets))


def _slot(spec: WorkerSpec, *, known_later: bool = False) -> SlotDemand:
    """A WorkerSpec's demand; ``known_later``: without the selector entries on Ray's own
    labels (``ray.io/...``), which only a running node carries."""
    selector = dict(spec.label_selector or {})
    if known_later:
        selector = {k: v for k, v in selector.items() if not k.startswith("ray.io/")}
    return SlotDemand(dict(spec.resources), selector)


def size_embedded_ray(specs: Sequence[WorkerSpec], *, datasets: bool) -> int | None:
    """The ``num_cpus`` for the embedded local Ray ``fit()`` starts when the workers declare
    more CPUs than this machine has (plus one for Ray Data's tasks when the run has
    datasets); ``None`` (Ray counts the machine's) otherwise."""
    declared = sum(float(spec.resources.get("CPU", 0.0)) for spec in specs)
    need = math.ceil(declared - _EPSILON) + (1 if datasets else 0)
    return need if need > machine_cpu_count() else None


def embedded_num_cpus(specs: Sequence[WorkerSpec], *, datasets: bool) -> int | None:
    """:func:`size_embedded_ray`'s ``num_cpus``, with a warning saying so when it is not
    ``None`` (for any caller that starts an embedded Ray for ``specs``: ``fit()``, a job)."""
    num_cpus = size_embedded_ray(specs, datasets=datasets)
    if num_cpus is not None:
        declared = sum(float(spec.resources.get("CPU", 0.0)) for spec in specs)
        logger.warning(
            "HeteroTrainer: %d workers declare %g CPUs in all%s but this machine has %d: "
            "starting the embedded local Ray with %d logical CPUs, so the workers share the "
            "cores (slower; the plan follows their measured speeds). To choose: "
            "ray.init(num_cpus=...) before fit(), or lower WorkerSpec resources.",
            len(specs),
            declared,
            " (+1 for Ray Data's tasks)" if datasets else "",
            machine_cpu_count(),
            num_cpus,
        )
    return num_cpus


def _selector_text(selector: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in selector.items())


def _node_labels(view: ClusterView) -> str:
    own = sorted(
        {
            f"{k}={v}"
            for node in view.totals.values()
            for k, v in node.labels.items()
            if not k.startswith("ray.io/")
        }
    )
    return ", ".join(own) if own else "no labels of their own"


def _more_cpus_fix(amount: float, view: ClusterView) -> str:
    n = math.ceil(amount - _EPSILON)
    if view.embedded or len(view.totals) == 1:
        return (
            f"give the local Ray {n} CPUs (ray.init(num_cpus={n}) before fit(); a YAML job: "
            f"ray.num_cpus: {n})"
        )
    return f"add nodes with CPUs (the cluster needs {n} for these workers)"


def describe_shortfall(
    short: Shortfall, names: Sequence[str], slots: Sequence[SlotDemand], view: ClusterView
) -> str:
    """One line: the worker that cannot be placed, the resource or labels missing, the fix."""
    worker, slot = names[short.slot], slots[short.slot]
    where = "the embedded local Ray" if view.embedded else "this cluster"
    head = f"HeteroTrainer: worker {worker!r} cannot be placed"
    if short.reason == "labels":
        selector = _selector_text(slot.label_selector)
        fix = (
            "connect to the cluster whose nodes carry them (ray.init(address=...) before "
            "fit()), or drop the WorkerSpec's label_selector to run locally"
            if view.embedded
            else "start nodes with those labels (ray start --labels), or correct the "
            "WorkerSpec's label_selector"
        )
        return (
            f"{head}: no node of {where} has the labels {selector} (its nodes carry "
            f"{_node_labels(view)}). Fix: {fix}."
        )
    key = short.resource or "?"
    asks = f"it asks for {key}: {short.needed:g}"
    if short.reason == "resource" and short.suggestion:
        fixed = {short.suggestion if k == key else k: v for k, v in slot.resources.items()}
        return (
            f"{head}: {asks}, a resource no node of {where} offers; did you mean "
            f"{short.suggestion!r}? Fix: WorkerSpec(name={worker!r}, resources={fixed})."
        )
    if short.reason == "resource" and short.offered <= _EPSILON:
        if key == "GPU":
            fix = (
                "connect to a cluster with GPU nodes (ray.init(address=...) before fit()), or "
                "drop GPU from the WorkerSpec's resources to train on CPU"
                if view.embedded
                else "add GPU nodes (or correct the label_selector), or drop GPU from the "
                "WorkerSpec's resources"
            )
        else:
            fix = (
                f"start Ray with it (ray.init(resources={{{key!r}: {short.needed:g}}}) before "
                "fit()), or drop it from the WorkerSpec's resources"
                if view.embedded
                else f'start nodes that offer it (ray start --resources=\'{{"{key}": '
                f"{short.needed:g}}}'), or drop it from the WorkerSpec's resources"
            )
        nodes = f"nodes with {_selector_text(slot.label_selector)}" if slot.label_selector else ""
        offered_by = f"no {nodes or 'node'} of {where} offers {key}"
        return f"{head}: {asks} but {offered_by}. Fix: {fix}."
    if short.reason == "resource":
        fix = _more_cpus_fix(short.needed, view) if key == "CPU" else f"add a node with {key}"
        return (
            f"{head}: {asks} but the most any node of {where} it may use offers is "
            f"{short.offered:g}. Fix: lower the WorkerSpec's {key} to <= {short.offered:g}, or "
            f"{fix}."
        )
    # room: the slots before it take what its nodes offer.
    others = short.sharing - 1
    fix = _more_cpus_fix(short.needed, view) if key == "CPU" else f"add nodes with {key}"
    return (
        f"{head}: it and the {others} worker(s) before it need {key}: {short.needed:g} in all, "
        f"but the nodes of {where} they may use offer {short.offered:g}. Fix: {fix}, lower the "
        f"workers' {key}, or train with fewer workers (elastic.min_workers)."
    )


def _may_still_come(short: Shortfall, view: ClusterView) -> bool:
    """Whether a shortfall on today's nodes may end by itself (an autoscaler adding nodes)."""
    if view.may_grow is False:
        return False
    if short.reason == "resource" and view.ever is not None and short.resource is not None:
        return view.ever.get(short.resource, 0.0) + _EPSILON >= short.needed
    return True


def _waiting_for(
    short: Shortfall | None, names: Sequence[str], slots: Sequence[SlotDemand], view: ClusterView
) -> str:
    """What the wait is for, in words (no shortfall on the totals: other work holds room)."""
    if short is None:
        return (
            f"room for {len(slots)} worker(s) ({', '.join(names[: len(slots)])}): the nodes "
            "could hold them, but other work holds the resources now"
        )
    slot = slots[short.slot]
    needs = dict(slot.resources)
    labels = f" on a node with {_selector_text(slot.label_selector)}" if slot.label_selector else ""
    hint = (
        f"; did you mean {short.suggestion!r} for {short.resource!r}?" if short.suggestion else ""
    )
    if short.reason == "labels":
        hint = f"; the nodes now carry {_node_labels(view)}"
    who = (
        "the autoscaler may add nodes"
        if view.may_grow
        else "nodes may join (whether an autoscaler serves this cluster could not be told)"
    )
    return f"worker {names[short.slot]!r} ({needs}{labels}): {who}{hint}"


def _wait_for_room(
    slots: Sequence[SlotDemand],
    names: Sequence[str],
    view: ClusterView,
    *,
    timeout_s: float | None,
    strategy: str,
) -> None:
    """Wait, with progress lines, until a placement group of ``slots`` is placed (removed at
    once), or raise :class:`PlacementError` after ``timeout_s`` (``None``: no limit)."""
    from ray.util.placement_group import placement_group, remove_placement_group

    short = first_shortfall(slots, view.totals, RAY_RESOURCES)
    what = _waiting_for(short, names, slots, view)
    fix = (
        "correct the WorkerSpec's label_selector or add nodes with those labels"
        if short is not None and short.reason == "labels"
        else "add or free the resources, lower the WorkerSpecs' resources"
    )
    bundles = [{k: v for k, v in s.resources.items() if v > _EPSILON} for s in slots]
    selectors = [dict(s.label_selector) for s in slots]
    group = placement_group(
        bundles, strategy=strategy, bundle_label_selector=selectors if any(selectors) else None
    )
    started = time.monotonic()
    limit = math.inf if timeout_s is None else timeout_s
    if timeout_s is None:
        logger.warning("HeteroTrainer: waiting (in a Tune trial: no limit) for %s", what)
    else:
        logger.warning(
            "HeteroTrainer: waiting up to %.0f s (%s) for %s", timeout_s, TIMEOUT_SETTING, what
        )
    try:
        while True:
            left = limit - (time.monotonic() - started)
            if left <= 0:
                raise PlacementError(
                    f"HeteroTrainer: no room within {timeout_s:.0f} s ({TIMEOUT_SETTING}) for "
                    f"{what}. Fix: {fix}, or raise {TIMEOUT_SETTING}."
                )
            if group.wait(timeout_seconds=max(1, math.ceil(min(PROGRESS_EVERY_S, left)))):
                logger.info("HeteroTrainer: room found after %.0f s", time.monotonic() - started)
                return
            elapsed = time.monotonic() - started
            if timeout_s is None:
                logger.warning("HeteroTrainer: still waiting (%.0f s) for %s", elapsed, what)
            elif elapsed < timeout_s:
                logger.warning(
                    "HeteroTrainer: still waiting (%.0f s of %.0f s, %s) for %s",
                    elapsed,
                    timeout_s,
                    TIMEOUT_SETTING,
                    what,
                )
    finally:
        remove_placement_group(group)


def _warn_unplaceable_extras(
    slots: Sequence[SlotDemand], names: Sequence[str], first: int, view: ClusterView
) -> None:
    """Name each slot past ``first`` (an elastic group's optional workers) no node could
    ever hold: the group trains without it."""
    for index in range(first, len(slots)):
        short = first_shortfall([slots[index]], view.totals, RAY_RESOURCES)
        if short is not None and not _may_still_come(short, view):
            line = describe_shortfall(
                Shortfall(
                    index,
                    short.reason,
                    short.resource,
                    short.needed,
                    short.offered,
                    suggestion=short.suggestion,
                ),
                names,
                slots,
                view,
            )
            logger.warning("%s (the elastic group trains without it)", line)


def _warn_no_cpu_for_data(slots: Sequence[SlotDemand], view: ClusterView) -> None:
    total = sum(node.resources.get("CPU", 0.0) for node in view.totals.values())
    taken = sum(slot.resources.get("CPU", 0.0) for slot in slots)
    if view.may_grow is False and total - taken < 1 - _EPSILON:
        logger.warning(
            "HeteroTrainer: the workers take %g of the cluster's %g CPUs, leaving less than "
            "one for Ray Data's tasks (reads, map_batches): the pipeline may stall. Fix: give "
            "Ray %d CPUs (ray.init(num_cpus=%d)), or lower a worker's CPU.",
            taken,
            total,
            math.ceil(taken + 1 - _EPSILON),
            math.ceil(taken + 1 - _EPSILON),
        )


def ensure_room(
    specs: Sequence[WorkerSpec],
    *,
    min_workers: int,
    timeout_s: float | None,
    embedded: bool,
    datasets: bool = False,
    strategy: str = "PACK",
) -> None:
    """Return once the cluster can hold the group's first ``min_workers`` slots; fail at once
    when it never could; in between, wait (see the module docstring).

    Args:
        specs: The worker slots (expanded WorkerSpecs), in order.
        min_workers: Slots the group needs to start (all for a fixed group).
        timeout_s: The longest wait for room (``ElasticConfig.placement_timeout_s``, through
            :func:`placement_wait_limit`); ``None``: no limit.
        embedded: The cluster is the embedded local Ray ``fit()`` started.
        datasets: The run feeds Ray Data datasets (their tasks need a free CPU).
        strategy: The placement strategy of Ray Train's placement group.

    Raises:
        PlacementError: One line naming the worker, the resource or labels and the fix.
    """
    slots = [_slot(spec) for spec in specs]
    names = [s.name for s in specs]
    try:
        view = read_cluster_view(embedded=embedded)
    except Exception as exc:  # noqa: BLE001 - Ray Train then places the group as before
        logger.warning("HeteroTrainer: could not read the cluster's nodes (%s); not checking", exc)
        return
    needed = slots[:min_workers]
    short = first_shortfall(needed, view.totals, RAY_RESOURCES)
    if short is not None and short.proven and not _may_still_come(short, view):
        raise PlacementError(describe_shortfall(short, names, slots, view))
    _warn_unplaceable_extras(slots, names, min_workers, view)
    if datasets:
        _warn_no_cpu_for_data(slots, view)
    if short is None and view.free is not None and first_shortfall(needed, view.free) is None:
        return
    _wait_for_room(needed, names, view, timeout_s=timeout_s, strategy=strategy)
