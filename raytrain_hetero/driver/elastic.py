"""Elastic sizing per worker slot: Ray Train's elastic policy, counting what each slot needs.

:class:`HeteroElasticScalingPolicy` sizes a worker group slot by slot, with each slot's full
resources and label selector, from the live per-node view (a joining node is used at the next
monitor check instead of the autoscaling coordinator's 20 s tick).
:class:`HeteroRayTorchTrainer` is the ``TorchTrainer`` that hands the controller this policy.
Both reach Ray's internals only through :mod:`raytrain_hetero.driver._ray_compat`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer

from raytrain_hetero.core.placement import (
    NodeCapacity,
    SlotDemand,
    count_placeable_prefix,
)
from raytrain_hetero.driver._ray_compat import (
    ElasticScalingPolicy,
    available_resources_per_node,
    draining_node_ids,
    run_controller_with_scaling_policy,
    without_idle_dataset_manager,
)
from raytrain_hetero.driver.scheduler import lookup_scheduler

logger = logging.getLogger(__name__)

__all__ = [
    "HeteroElasticScalingPolicy",
    "HeteroRayTorchTrainer",
    "HeteroScalingConfig",
    "kept_slot_order",
    "slot_of_bundle",
]


class HeteroElasticScalingPolicy(ElasticScalingPolicy):
    """Ray Train's elastic policy, sized by what each worker slot really needs and where.

    Ray's own policy counts workers from the autoscaling coordinator's reservations, which
    use one ``resources_per_worker`` for all, ignore label selectors and refresh on a 20 s
    tick. This one keeps Ray's behaviour otherwise and answers "how many workers fit" from
    the live per-node view (available resources plus what this run's group holds there,
    draining nodes left out), slot by slot with :func:`count_placeable_prefix`.

    With ``admission: auto`` (``run_id`` given), the run's admission decision caps the group
    at the slots it keeps, hosted in the decision's order (:func:`kept_slot_order`): a group
    holding more is re-sized at once, and left-out slots are never added back.
    """

    NODE_VIEW_INTERVAL_S = 1.0
    ADMISSION_POLL_INTERVAL_S = 0.5
    #: Seconds between reads of a known decision (a re-take replaces it).
    ADMISSION_REPOLL_INTERVAL_S = 5.0

    def __init__(
        self,
        scaling_config: ScalingConfig,
        slots: Sequence[SlotDemand],
        run_id: str | None = None,
    ) -> None:
        super().__init__(scaling_config)
        self._slots = tuple(slots)
        self._run_id = run_id
        self._admitted: tuple[int, ...] | None = None
        self._admission_poll_time = float("-inf")
        self._held: dict[str, dict[str, float]] = {}
        self._held_placement_group: Any = None
        self._view_time = float("-inf")
        self._view: dict[str, NodeCapacity] | None = None
        # Whether the view is for a running group (its draining nodes still count, see
        # _get_reserved_resources) or for sizing a new one.
        self._view_running = False

    def make_decision_for_running_worker_group(
        self, worker_group_state: Any, worker_group_status: Any
    ) -> Any:
        self._use_view(running=True)
        self._held = self._holdings(worker_group_state)
        handle = worker_group_state.placement_group_handle
        self._held_placement_group = getattr(handle, "placement_group", None)
        admitted = self._admitted_slots()
        if admitted is not None and worker_group_state.num_workers > len(admitted):
            logger.info(
                "admission: re-sizing the worker group from %d workers to slots %s",
                worker_group_state.num_workers,
                list(admitted),
            )
            return self._get_resize_decision(len(admitted))
        return super().make_decision_for_running_worker_group(
            worker_group_state, worker_group_status
        )

    def make_decision_for_non_running_worker_group(self) -> Any:
        # After a failure Ray Train decides the new size *before* it tears the old group down,
        # so the old group's resources still count as ours until its placement group is gone.
        self._use_view(running=False)
        if self._held and not self._old_group_still_holds():
            self._held = {}
            self._held_placement_group = None
            self._view = None
        return super().make_decision_for_non_running_worker_group()

    def _use_view(self, *, running: bool) -> None:
        if running != self._view_running:
            self._view, self._view_running = None, running

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
            slot = self._slots[slot_of_bundle(index if index is not None else rank, self._admitted)]
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
            available = available_resources_per_node()
            # Ray places nothing on a draining node (a preemption notice): no room for a new
            # group. A running group keeps counting the draining nodes it holds: shrinking it
            # now would restart it from an older checkpoint; its workers hand off at the step
            # they agree on (worker/runtime/handoff.py), then the new group is sized without them.
            draining = draining_node_ids()
            if self._view_running:
                draining -= set(self._held)
            labels = {
                n["NodeID"]: dict(n.get("Labels") or {})
                for n in ray.nodes()
                if n["Alive"] and n["NodeID"] not in draining
            }
        except Exception:
            logger.warning(
                "Could not read per-node resources; keeping the group size.", exc_info=True
            )
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
        limit = self.scaling_config.max_workers
        slots = self._slots
        admitted = self._admitted_slots()
        if admitted is not None:
            limit = min(limit, len(admitted))
            slots = tuple(slots[s] for s in admitted)
        return count_placeable_prefix(slots, reserved_resources, limit)

    def _admitted_slots(self) -> tuple[int, ...] | None:
        """Slots the run's group decision keeps (None: none yet, or not auto); polled at most
        every ``ADMISSION_POLL_INTERVAL_S`` until known, then every
        ``ADMISSION_REPOLL_INTERVAL_S`` (a re-take may change them); an unreadable actor
        leaves the last known slots."""
        if self._run_id is None:
            return None
        now = time.monotonic()
        every = (
            self.ADMISSION_POLL_INTERVAL_S
            if self._admitted is None
            else self.ADMISSION_REPOLL_INTERVAL_S
        )
        if now - self._admission_poll_time < every:
            return self._admitted
        self._admission_poll_time = now
        latest = kept_slot_order(self._run_id)
        if latest is not None:
            self._admitted = latest
        return self._admitted


def kept_slot_order(run_id: str) -> tuple[int, ...] | None:
    """The worker slots run ``run_id`` keeps after admission, in Ray Train's worker order
    (None: not decided, no admission, or its scheduler actor not readable now)."""
    try:
        scheduler = lookup_scheduler(run_id)
        if scheduler is not None:
            return ray.get(scheduler.admitted_slots.remote(), timeout=2.0)
    except Exception:  # asked again at the next poll
        logger.debug("admission decision not readable yet", exc_info=True)
    return None


def slot_of_bundle(index: int, kept: tuple[int, ...] | None) -> int:
    """The worker slot that Ray Train's worker in placement bundle ``index`` hosts."""
    return index if kept is None else kept[index]


@dataclass
class HeteroScalingConfig(ScalingConfig):
    """Ray Train's ScalingConfig whose per-worker label selectors follow admission's order:
    worker j hosts slot ``kept[j]`` of run ``admission_run_id``'s decision (None: never)."""

    admission_run_id: str | None = None

    def _label_selector_per_worker(self, num_workers: int) -> Any:
        selectors = super()._label_selector_per_worker(num_workers)
        kept = None if self.admission_run_id is None else kept_slot_order(self.admission_run_id)
        if not selectors or kept is None or not isinstance(self.label_selector, list):
            return selectors
        return [dict(self.label_selector[slot]) for slot in kept[:num_workers]]


class HeteroRayTorchTrainer(TorchTrainer):
    """Ray Train V2 ``TorchTrainer`` whose elastic sizing is :class:`HeteroElasticScalingPolicy`
    (fixed-size groups keep Ray's)."""

    def __init__(
        self,
        *args: Any,
        slots: Sequence[SlotDemand],
        admission_run_id: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self._hetero_slots = tuple(slots)
        self._admission_run_id = admission_run_id

    def _create_default_callbacks(self) -> list[Any]:
        callbacks = super()._create_default_callbacks()  # type: ignore[misc]
        return without_idle_dataset_manager(callbacks, self)

    def fit(self) -> Any:
        if self.running_in_local_mode or not self.scaling_config.elasticity_enabled:
            return super().fit()
        return run_controller_with_scaling_policy(
            self,
            HeteroElasticScalingPolicy(
                self.scaling_config, self._hetero_slots, run_id=self._admission_run_id
            ),
        )
