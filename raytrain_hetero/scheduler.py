"""The run's scheduler actor: collects per-rank step measurements and the plan history.

One named actor per run, created by the driver (``HeteroTrainer.fit``) on its own node and
looked up (or recreated) by the backend on every worker-group start, so it outlives
worker-group restarts. Workers push finished-step records in batches (every few steps, not
every step); the driver polls :meth:`HeteroScheduler.snapshot` for live progress and pulls
everything at the end for ``metrics.csv``.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import ray

logger = logging.getLogger(__name__)

SCHEDULER_NAMESPACE = "raytrain_hetero"


def scheduler_actor_name(run_id: str) -> str:
    """Ray actor name of the scheduler of run ``run_id``."""
    return f"raytrain_hetero_scheduler:{run_id}"


class HeteroScheduler:
    """State of one run: step records from every rank and the plan history."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._records: list[dict[str, Any]] = []
        self._plans: list[dict[str, Any]] = []
        self._rejected = 0

    def record_steps(self, records: list[dict[str, Any]]) -> int:
        """Store finished-step records; absurd timings are dropped with a log line.

        Returns:
            Number of records kept.
        """
        kept = 0
        for record in records:
            compute = record.get("compute_s")
            if not isinstance(compute, (int, float)) or not math.isfinite(compute) or compute <= 0:
                self._rejected += 1
                logger.warning(
                    "rejected step record from rank %s at step %s: compute_s=%r",
                    record.get("rank"),
                    record.get("step"),
                    compute,
                )
                continue
            self._records.append(dict(record))
            kept += 1
        return kept

    def record_plan(self, plan: dict[str, Any], world_size: int) -> None:
        """Append a plan (as ``Plan.to_dict``) to the history, once per version and group."""
        entry = dict(plan, world_size=world_size)
        if entry not in self._plans:
            self._plans.append(entry)

    def snapshot(self, since: int = 0) -> dict[str, Any]:
        """Records from index ``since`` on, all plans, and the total record count."""
        return {
            "records": self._records[since:],
            "plans": list(self._plans),
            "num_records": len(self._records),
            "rejected": self._rejected,
        }


HeteroSchedulerActor = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)(
    HeteroScheduler
)


def get_or_create_scheduler(run_id: str, node_id: str | None = None) -> ray.actor.ActorHandle:
    """The scheduler actor of ``run_id``, created (pinned to ``node_id``) if absent."""
    options: dict[str, Any] = {
        "name": scheduler_actor_name(run_id),
        "namespace": SCHEDULER_NAMESPACE,
        "get_if_exists": True,
    }
    if node_id is not None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=True)
    return HeteroSchedulerActor.options(**options).remote(run_id)
