"""The run's scheduler actor: measurements, live re-planning, slowdown injection, metrics.

One named actor per run, created by the driver (``HeteroTrainer.fit``) on its node and looked
up (or recreated) by the backend on every worker-group start, so it outlives worker-group
restarts. It is a thin shell over the pure :mod:`raytrain_hetero.core.policy`:

* workers push finished-step records in batches (every few steps, not every step);
* each batch may complete a policy window; a :class:`~raytrain_hetero.core.policy.Replan`
  becomes the *pending* plan, logged as one structured line (old -> new slices, measured
  speeds, reason);
* rank 0 polls every few steps and broadcasts the pending plan to all ranks, which install it
  at the first step none of them has carved, so the switch is agreed and exactly-once;
* emulated slowdowns can be injected (config schedule or ``HeteroTrainer.inject_slowdown``);
* Ray metrics (``ray.util.metrics``) expose per-rank samples/s, slice, weight and the plan
  version to the Ray Dashboard / Prometheus.

If the actor dies, rank 0 recreates it and re-registers the group; training continues on the
last plan meanwhile.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from dataclasses import asdict
from typing import Any

import ray

from raytrain_hetero.config import SlowdownInjection
from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.policy import PolicyConfig, PolicyState, Replan, StepSample, decide
from raytrain_hetero.core.records import StepRecord

logger = logging.getLogger(__name__)

SCHEDULER_NAMESPACE = "raytrain_hetero"
MAX_SAMPLES_PER_RANK = 256


def scheduler_actor_name(run_id: str) -> str:
    """Ray actor name of the scheduler of run ``run_id``."""
    return f"raytrain_hetero_scheduler:{run_id}"


class _RayMetrics:
    """Gauges and a counter, tagged by run, rank and worker (no-ops if metrics are off)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        try:
            from ray.util.metrics import Counter, Gauge

            tags = ("run", "rank", "worker")
            self.samples_per_s = Gauge(
                "raytrain_hetero_samples_per_s", "per-rank measured samples/s", tag_keys=tags
            )
            self.slice = Gauge("raytrain_hetero_slice", "per-rank samples per step", tag_keys=tags)
            self.weight = Gauge(
                "raytrain_hetero_weight", "per-rank gradient weight n_i/N", tag_keys=tags
            )
            self.plan_version = Gauge(
                "raytrain_hetero_plan_version", "current plan version", tag_keys=("run",)
            )
            self.replans = Counter(
                "raytrain_hetero_replans_total", "live re-plans decided", tag_keys=("run",)
            )
        except Exception as exc:  # noqa: BLE001 - metrics are optional
            logger.warning("Ray metrics unavailable: %s", exc)
            self.samples_per_s = None

    def record(self, record: dict[str, Any]) -> None:
        if self.samples_per_s is None:
            return
        tags = {"run": self.run_id, "rank": str(record["rank"]), "worker": str(record["worker"])}
        rate = record.get("samples_per_s")
        if isinstance(rate, (int, float)) and math.isfinite(rate):
            self.samples_per_s.set(rate, tags=tags)
        self.slice.set(record["slice"], tags=tags)
        self.weight.set(record["weight"], tags=tags)

    def plan(self, version: int) -> None:
        if self.samples_per_s is not None:
            self.plan_version.set(version, tags={"run": self.run_id})

    def replan(self) -> None:
        if self.samples_per_s is not None:
            self.replans.inc(tags={"run": self.run_id})


class HeteroScheduler:
    """State of one run: step records, plan history, the live policy and injections.

    Args:
        run_id: The run.
        policy: PolicyConfig fields (dict), or None for defaults.
        live: Whether to re-plan from measurements at all.
        clock: Time source (seconds); injected for tests.
    """

    def __init__(
        self,
        run_id: str,
        policy: dict[str, Any] | None = None,
        live: bool = True,
        clock: Any = time.time,
    ) -> None:
        self.run_id = run_id
        self.incarnation = uuid.uuid4().hex[:8]
        self.policy = PolicyConfig(**(policy or {}))
        self.live = live
        self._clock = clock
        self._records: list[dict[str, Any]] = []
        self._plans: list[dict[str, Any]] = []
        self._rejected = 0
        self._group_id: str | None = None
        self._world_size = 0
        self._current: dict[str, Any] | None = None
        self._samples: dict[int, list[StepSample]] = {}
        self._state = PolicyState()
        self._pending: dict[str, Any] | None = None
        self._injections: list[SlowdownInjection] = []
        self._decisions: list[dict[str, Any]] = []
        self._metrics = _RayMetrics(run_id)

    # ------------------------------------------------------------------ groups and plans

    def register_group(self, group_id: str, world_size: int, plan: dict[str, Any] | None = None) -> None:
        """A worker group (re)started, or rank 0 re-registers after the actor was recreated."""
        if group_id != self._group_id:
            self._group_id = group_id
            self._world_size = world_size
            self._samples = {r: [] for r in range(world_size)}
            self._state = PolicyState()
            self._pending = None
            self._current = None
            logger.info("worker group %s registered with %d ranks", group_id, world_size)
        if plan is not None:
            self._set_current(plan)

    def record_plan(self, plan: dict[str, Any], world_size: int, group_id: str | None = None) -> None:
        """A plan was installed by the workers (append to history; it becomes current)."""
        entry = dict(plan, world_size=world_size)
        if entry not in self._plans:
            self._plans.append(entry)
        if group_id is not None and group_id != self._group_id:
            self.register_group(group_id, world_size)
        self._set_current(plan)

    def _set_current(self, plan: dict[str, Any]) -> None:
        self._current = dict(plan)
        self._metrics.plan(int(plan["version"]))
        if self._pending is not None and self._pending["based_on_version"] < plan["version"]:
            self._pending = None
        # The new plan's first window starts now.
        self._state = PolicyState(
            last_replan_step=int(plan["effective_step"]),
            last_decision_step=int(plan["effective_step"]) - 1,
        )
        for samples in self._samples.values():
            samples.clear()

    # ------------------------------------------------------------------ measurements

    def record_steps(self, records: list[StepRecord | dict[str, Any]]) -> int:
        """Store finished-step records; absurd timings are rejected with a log line.

        Returns:
            Number of records kept.
        """
        kept = 0
        for record in records:
            if isinstance(record, StepRecord):  # workers push typed records
                record = record.to_dict()
            busy = record.get("busy_s", record.get("compute_s"))
            if not isinstance(busy, (int, float)) or not math.isfinite(busy) or busy <= 0:
                self._rejected += 1
                logger.warning(
                    "rejected step record from rank %s at step %s: busy_s=%r",
                    record.get("rank"),
                    record.get("step"),
                    busy,
                )
                continue
            self._records.append(dict(record))
            self._metrics.record(record)
            kept += 1
            if record.get("group") == self._group_id and self._current is not None:
                if record.get("plan_version") != self._current["version"]:
                    continue  # measured under an older plan
                rank = int(record["rank"])
                samples = self._samples.setdefault(rank, [])
                samples.append(
                    StepSample(
                        rank=rank,
                        step=int(record["step"]),
                        samples=int(record["slice"]),
                        busy_s=float(busy),
                        time_s=float(record.get("time", self._clock())),
                    )
                )
                del samples[:-MAX_SAMPLES_PER_RANK]
        if self.live:
            self._evaluate()
        return kept

    def _evaluate(self) -> None:
        current = self._current
        if current is None or self._world_size == 0:
            return
        if any(not self._samples.get(r) for r in range(self._world_size)):
            return
        # The newest step every rank has reported.
        step = min(max(s.step for s in self._samples[r]) for r in range(self._world_size))
        costs = current.get("costs")
        prior = [CostModel(a, b) for a, b in costs] if costs else None
        flat = [s for r in range(self._world_size) for s in self._samples[r]]
        decision, self._state = decide(
            tuple(current["slices"]),
            flat,
            self._state,
            self.policy,
            self._clock(),
            step=step,
            prior=prior,
            caps=current.get("caps"),
            min_slice=int(current.get("min_slice", 1)),
        )
        if isinstance(decision, Replan):
            self._pending = {
                "based_on_version": int(current["version"]),
                "slices": list(decision.slices),
                "costs": [[c.alpha, c.beta] for c in decision.costs],
                "reason": decision.reason,
                "decided_at_step": step,
            }
            self._decisions.append(dict(self._pending))
            self._metrics.replan()
            logger.info(
                "replan %s",
                json.dumps(
                    {
                        "event": "replan",
                        "run": self.run_id,
                        "step": step,
                        "old_slices": list(current["slices"]),
                        "new_slices": list(decision.slices),
                        "speeds": [round(1.0 / c.beta, 1) for c in decision.costs],
                        "predicted_step_s": round(decision.predicted_step_s, 5),
                        "current_step_s": round(decision.current_step_s, 5),
                        "reason": decision.reason,
                    }
                ),
            )

    # ------------------------------------------------------------------ polling

    def poll(self, group_id: str, plan_version: int) -> dict[str, Any]:
        """What rank 0 should broadcast: a pending plan (if newer) and the injections."""
        known = group_id == self._group_id
        plan = None
        if known and self._pending is not None and self._pending["based_on_version"] >= plan_version:
            plan = dict(self._pending)
        return {"known_group": known, "plan": plan, "injections": list(self._injections)}

    def inject_slowdown(self, injection: SlowdownInjection) -> SlowdownInjection:
        """EMULATION: make a worker (by name) or rank slower from a step on (validated by the caller)."""
        self._injections.append(injection)
        logger.info("injected slowdown %s", injection)
        return injection

    def snapshot(self, since: int = 0) -> dict[str, Any]:
        """Records from index ``since`` on, all plans, decisions and the record count."""
        return {
            "incarnation": self.incarnation,
            "records": self._records[since:],
            "plans": list(self._plans),
            "decisions": list(self._decisions),
            "num_records": len(self._records),
            "rejected": self._rejected,
            "policy": asdict(self.policy),
        }


HeteroSchedulerActor = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1)(
    HeteroScheduler
)


def get_or_create_scheduler(
    run_id: str,
    node_id: str | None = None,
    *,
    policy: dict[str, Any] | None = None,
    live: bool = True,
    detached: bool = False,
) -> ray.actor.ActorHandle:
    """The scheduler actor of ``run_id``, created (pinned to ``node_id``) if absent.

    The driver creates it (owned by the driver). A replacement created from inside the run
    (a worker or the controller, after the original died) is ``detached`` so that it outlives
    its creator; ``HeteroTrainer.fit`` kills it by name when the run ends.
    """
    options: dict[str, Any] = {
        "name": scheduler_actor_name(run_id),
        "namespace": SCHEDULER_NAMESPACE,
        "get_if_exists": True,
    }
    if detached:
        options["lifetime"] = "detached"
    if node_id is not None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=True)
    return HeteroSchedulerActor.options(**options).remote(run_id, policy, live)
