"""The run's scheduler actor: measurements, live re-planning, slowdown injection, metrics.

One named actor per run, owned by the driver: ``HeteroTrainer.fit`` creates it
(:func:`create_scheduler`, not detached) and kills it when the run ends; workers only look it
up (:func:`lookup_scheduler`). A thin shell over the pure :mod:`raytrain_hetero.core.policy`:
workers push step records in batches (a seen key (group, rank, step) is dropped, so a resend
is harmless); memory stays bounded (per-rank windows, a buffer the driver drains by cursor); a
:class:`~raytrain_hetero.core.policy.Replan` becomes the *pending* plan, which rank 0 polls and
broadcasts, installed at the first step no rank has carved (exactly-once). It also takes
injected slowdowns and exports Ray metrics. If it dies, Ray restarts it empty; rank 0
re-registers the group at its next poll and training goes on with the last plan meanwhile.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import ray

from raytrain_hetero.config import SlowdownInjection
from raytrain_hetero.core.plan import Plan
from raytrain_hetero.core.policy import (
    PendingReplan,
    PolicyConfig,
    PolicyState,
    Replan,
    StepSample,
    decide,
)
from raytrain_hetero.core.records import StepRecord, as_step_record
from raytrain_hetero.worker.plan.scheduler_client import PollAnswer

logger = logging.getLogger(__name__)

SCHEDULER_NAMESPACE = "raytrain_hetero"
#: Policy samples kept per rank (the current plan's window).
MAX_SAMPLES_PER_RANK = 256
#: Latest records kept per rank for live summaries (Tune's throughput metrics).
RECENT_PER_RANK = 512
#: Records kept for the driver until it drains them; older ones are dropped (and counted).
MAX_UNDRAINED = 50_000
#: Record keys remembered to drop duplicates (a resend comes within a few pushes).
MAX_SEEN_KEYS = 100_000


def scheduler_actor_name(run_id: str) -> str:
    """Ray actor name of the scheduler of run ``run_id``."""
    return f"raytrain_hetero_scheduler:{run_id}"


@dataclass(frozen=True)
class ExportedMetric:
    """One Ray metric the scheduler exports (a ``"gauge"`` or ``"counter"``)."""

    name: str
    kind: str
    description: str
    tag_keys: tuple[str, ...]

    @property
    def prometheus_name(self) -> str:
        """The series name Prometheus scrapes (Ray prefixes application metrics)."""
        return f"ray_{self.name}"


_PER_RANK_TAGS = ("run", "rank", "worker")

#: Every metric exported; deploy/grafana's dashboard is checked against this list.
EXPORTED_METRICS: tuple[ExportedMetric, ...] = (
    ExportedMetric(
        "raytrain_hetero_samples_per_s", "gauge", "per-rank measured samples/s", _PER_RANK_TAGS
    ),
    ExportedMetric("raytrain_hetero_slice", "gauge", "per-rank samples per step", _PER_RANK_TAGS),
    ExportedMetric(
        "raytrain_hetero_weight", "gauge", "per-rank gradient weight n_i/N", _PER_RANK_TAGS
    ),
    ExportedMetric("raytrain_hetero_plan_version", "gauge", "current plan version", ("run",)),
    ExportedMetric("raytrain_hetero_replans_total", "counter", "live re-plans decided", ("run",)),
)


class _RayMetrics:
    """Gauges and a counter, tagged by run, rank and worker (no-ops if metrics are off)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self._made: dict[str, Any] = {}
        try:
            from ray.util.metrics import Counter, Gauge

            self._made = {
                m.name.removeprefix("raytrain_hetero_"): (Gauge if m.kind == "gauge" else Counter)(
                    m.name, m.description, tag_keys=m.tag_keys
                )
                for m in EXPORTED_METRICS
            }
        except Exception as exc:  # noqa: BLE001 - metrics are optional
            logger.warning("Ray metrics unavailable: %s", exc)

    def record(self, record: StepRecord) -> None:
        if not self._made:
            return
        tags = {"run": self.run_id, "rank": str(record.rank), "worker": record.worker}
        if record.has_speed:
            self._made["samples_per_s"].set(record.samples_per_s, tags=tags)
        self._made["slice"].set(record.slice, tags=tags)
        self._made["weight"].set(record.weight, tags=tags)

    def plan(self, version: int) -> None:
        if self._made:
            self._made["plan_version"].set(version, tags={"run": self.run_id})

    def replan(self) -> None:
        if self._made:
            self._made["replans_total"].inc(tags={"run": self.run_id})


@dataclass(frozen=True)
class SchedulerCounters:
    """What the scheduler saw, counted: records received, kept, rejected (absurd timing),
    duplicates (resends) and dropped from the driver's buffer before it drained them."""

    received: int = 0
    kept: int = 0
    rejected: int = 0
    duplicates: int = 0
    dropped: int = 0


@dataclass(frozen=True)
class Drain:
    """One answer to :meth:`HeteroScheduler.drain`.

    Attributes:
        incarnation: Id of the actor's incarnation (a restarted actor has a new one).
        records: Records after the caller's cursor, oldest first.
        cursor: Pass this as ``after`` to the next drain (acknowledges ``records``).
        admission: ``AdmissionDecision.to_dict`` plus ``summary`` and ``keep_slots``, or None.
    """

    incarnation: str
    records: tuple[StepRecord, ...]
    cursor: int
    plans: tuple[Plan, ...]
    decisions: tuple[PendingReplan, ...]
    counters: SchedulerCounters
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    admission: dict[str, Any] | None = None
    reports: tuple[dict[str, Any], ...] = ()


class HeteroScheduler:
    """State of one run: recent step records, plan history, the live policy and injections.

    ``live`` False never re-plans from measurements; ``clock`` is injected for tests; the
    ``max_*``/``recent_per_rank`` bounds default to the module's constants.
    """

    def __init__(
        self,
        run_id: str,
        policy: PolicyConfig | None = None,
        live: bool = True,
        clock: Any = time.time,
        *,
        max_undrained: int = MAX_UNDRAINED,
        recent_per_rank: int = RECENT_PER_RANK,
        max_seen_keys: int = MAX_SEEN_KEYS,
    ) -> None:
        self.run_id = run_id
        self.incarnation = uuid.uuid4().hex[:8]
        self.policy = policy or PolicyConfig()
        self.live = live
        self._clock = clock
        self._undrained: deque[tuple[int, StepRecord]] = deque()
        self._max_undrained = max_undrained
        self._next_seq = 1
        self._recent: dict[int, deque[StepRecord]] = {}
        self._recent_per_rank = recent_per_rank
        self._seen: OrderedDict[tuple[str, int, int], None] = OrderedDict()
        self._max_seen_keys = max_seen_keys
        self._counters = SchedulerCounters()
        self._plans: list[Plan] = []
        self._group_id: str | None = None
        self._world_size = 0
        self._current: Plan | None = None
        self._samples: dict[int, list[StepSample]] = {}
        self._state = PolicyState()
        self._pending: PendingReplan | None = None
        self._injections: list[SlowdownInjection] = []
        self._decisions: list[PendingReplan] = []
        self._admission: dict[str, Any] | None = None
        self._reports: list[dict[str, Any]] = []
        self._metrics = _RayMetrics(run_id)

    def register_group(
        self,
        group_id: str,
        world_size: int,
        plan: Plan | None = None,
        history: Sequence[Plan] = (),
    ) -> None:
        """A worker group (re)started, or rank 0 re-registers after the actor was recreated.

        ``history`` is the run's plans as rank 0 holds them: a restarted actor starts empty,
        and plans installed since the driver's last drain would otherwise be lost to it.
        """
        self._merge_plans(history)
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

    def record_plan(
        self, plan: Plan, group_id: str | None = None, history: Sequence[Plan] = ()
    ) -> None:
        """A plan was installed by the workers (append to history; it becomes current).

        ``history`` is the run's plans as rank 0 holds them (merged, as in
        :meth:`register_group`: a restarted actor may hear of a plan before rank 0 polls).
        """
        self._merge_plans((*history, plan))
        if group_id is not None and group_id != self._group_id:
            self.register_group(group_id, plan.world_size)
        self._set_current(plan)

    def _merge_plans(self, plans: Iterable[Plan]) -> None:
        """Add the plans the history lacks (each once), kept in version order."""
        for plan in plans:
            if plan not in self._plans:
                self._plans.append(plan)
        self._plans.sort(key=lambda p: p.version)

    def _set_current(self, plan: Plan) -> None:
        self._current = plan
        self._metrics.plan(plan.version)
        if self._pending is not None and self._pending.based_on_version < plan.version:
            self._pending = None
        # The new plan's first window starts now.
        self._state = PolicyState(
            last_replan_step=plan.effective_step,
            last_decision_step=plan.effective_step - 1,
        )
        for samples in self._samples.values():
            samples.clear()

    def record_admission(self, decision: dict[str, Any]) -> None:
        """The run's group decision: the first one wins (decided once per run), unless it
        carries a ``retake`` reason (the deciding group measured it wrong and decided again:
        it replaces the recorded one)."""
        if self._admission is None or decision.get("retake"):
            self._admission = dict(decision)
            logger.info("%s", decision.get("summary", "admission decided"))

    def record_report(self, metrics: dict[str, Any]) -> None:
        """Rank 0's metrics of one ``ray.train.report`` (for the driver's experiment tracker;
        forwarded by :class:`~raytrain_hetero.driver.tracking.ReportForwarder`)."""
        self._reports.append(dict(metrics))

    def admission(self) -> dict[str, Any] | None:
        """The run's admission decision, or None before one is made."""
        return self._admission

    def admitted_slots(self) -> tuple[int, ...] | None:
        """Worker slots the run keeps after admission, in Ray Train's worker order (None: not
        decided yet)."""
        return None if self._admission is None else tuple(self._admission["keep_slots"])

    def record_steps(self, records: Sequence[StepRecord | Mapping[str, Any]]) -> int:
        """Take finished-step records and return how many were kept; duplicates (by key) and
        absurd timings are dropped."""
        kept = 0
        counts = asdict(self._counters)
        for item in records:
            record = as_step_record(item)
            counts["received"] += 1
            if record.key in self._seen:
                counts["duplicates"] += 1
                continue
            busy = record.busy_s
            if not math.isfinite(busy) or busy <= 0:
                counts["rejected"] += 1
                logger.warning(
                    "rejected step record from rank %s at step %s: busy_s=%r",
                    record.rank,
                    record.step,
                    busy,
                )
                continue
            self._remember(record)
            counts["kept"] += 1
            counts["dropped"] += self._buffer(record)
            kept += 1
            self._metrics.record(record)
            if record.group == self._group_id and self._current is not None:
                if record.plan_version != self._current.version:
                    continue  # measured under an older plan
                samples = self._samples.setdefault(record.rank, [])
                samples.append(
                    StepSample(
                        rank=record.rank,
                        step=record.step,
                        samples=record.slice,
                        busy_s=busy,
                        time_s=record.time,
                    )
                )
                del samples[:-MAX_SAMPLES_PER_RANK]
        self._counters = SchedulerCounters(**counts)
        if self.live:
            self._evaluate()
        return kept

    def _remember(self, record: StepRecord) -> None:
        self._seen[record.key] = None
        while len(self._seen) > self._max_seen_keys:
            self._seen.popitem(last=False)
        recent = self._recent.setdefault(record.rank, deque(maxlen=self._recent_per_rank))
        recent.append(record)

    def _buffer(self, record: StepRecord) -> int:
        """Queue ``record`` for the driver; returns how many old ones had to be dropped."""
        self._undrained.append((self._next_seq, record))
        self._next_seq += 1
        dropped = 0
        while len(self._undrained) > self._max_undrained:
            self._undrained.popleft()
            dropped += 1
        if dropped:
            logger.warning(
                "driver has not drained step records: dropped %d (buffer %d)",
                dropped,
                self._max_undrained,
            )
        return dropped

    def _evaluate(self) -> None:
        current = self._current
        if current is None or self._world_size == 0:
            return
        if any(not self._samples.get(r) for r in range(self._world_size)):
            return
        # The newest step every rank has reported.
        step = min(max(s.step for s in self._samples[r]) for r in range(self._world_size))
        flat = [s for r in range(self._world_size) for s in self._samples[r]]
        decision, self._state = decide(
            current.slices,
            flat,
            self._state,
            self.policy,
            self._clock(),
            step=step,
            prior=current.costs,
            caps=current.caps,
            min_slice=current.min_slice,
            quantum=current.quantum,
        )
        if isinstance(decision, Replan):
            self._pending = PendingReplan(current.version, step, decision)
            self._decisions.append(self._pending)
            self._metrics.replan()
            logger.info(
                "replan %s",
                json.dumps(
                    {
                        "event": "replan",
                        "run": self.run_id,
                        "step": step,
                        "old_slices": list(current.slices),
                        "new_slices": list(decision.slices),
                        "speeds": [round(1.0 / c.beta, 1) for c in decision.costs],
                        "predicted_step_s": round(decision.predicted_step_s, 5),
                        "current_step_s": round(decision.current_step_s, 5),
                        "reason": decision.reason,
                    }
                ),
            )

    def poll(self, group_id: str, plan_version: int) -> PollAnswer:
        """What rank 0 should broadcast: a pending re-plan (if newer) and the injections."""
        known = group_id == self._group_id
        pending = self._pending
        if not known or (pending is not None and pending.based_on_version < plan_version):
            pending = None
        return PollAnswer(known, pending, tuple(self._injections))

    def inject_slowdown(self, injection: SlowdownInjection) -> SlowdownInjection:
        """EMULATION: make a worker (by name) or rank slower from a step on (validated by the caller)."""
        self._injections.append(injection)
        logger.info("injected slowdown %s", injection)
        return injection

    def drain(self, after: int = 0, incarnation: str | None = None) -> Drain:
        """Records after cursor ``after`` (dropping those up to it), plans and counters; a
        cursor from another ``incarnation`` (before a restart) acknowledges nothing."""
        if incarnation == self.incarnation:
            while self._undrained and self._undrained[0][0] <= after:
                self._undrained.popleft()
        return Drain(
            incarnation=self.incarnation,
            records=tuple(r for _, r in self._undrained),
            cursor=self._next_seq - 1,
            plans=tuple(self._plans),
            decisions=tuple(self._decisions),
            counters=self._counters,
            policy=self.policy,
            admission=self._admission,
            reports=tuple(self._reports),
        )

    def recent_records(self) -> list[StepRecord]:
        """The latest records of every rank (at most ``recent_per_rank`` each), oldest first."""
        return sorted(
            (r for recent in self._recent.values() for r in recent),
            key=lambda r: (r.time, r.rank),
        )

    def memory_footprint(self) -> dict[str, int]:
        """Sizes of what the actor holds (to check its memory is bounded)."""
        return {
            "undrained": len(self._undrained),
            "recent": sum(len(r) for r in self._recent.values()),
            "seen_keys": len(self._seen),
            "policy_samples": sum(len(s) for s in self._samples.values()),
        }


# Ray restarts the actor if it dies (max_restarts=-1) but never re-runs a call
# (max_task_retries=0): a call in flight when it dies fails, and the caller decides.
HeteroSchedulerActor = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0)(HeteroScheduler)


def create_scheduler(
    run_id: str,
    node_id: str | None = None,
    *,
    policy: PolicyConfig | None = None,
    live: bool = True,
) -> ray.actor.ActorHandle:
    """Create the scheduler actor of ``run_id``, pinned (softly) to ``node_id``.

    Only the driver calls this (``HeteroTrainer.fit``), and it kills the actor at the end.

    Raises:
        ConfigError: An actor of that name exists already (a run id used twice).
    """
    from raytrain_hetero.errors import ConfigError

    options: dict[str, Any] = {
        "name": scheduler_actor_name(run_id),
        "namespace": SCHEDULER_NAMESPACE,
    }
    if node_id is not None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=True)
    try:
        return HeteroSchedulerActor.options(**options).remote(run_id, policy, live)
    except ValueError as exc:  # Ray: the name is taken
        raise ConfigError(
            f"A scheduler actor for run {run_id!r} exists already ({exc}); each "
            "HeteroTrainer.fit() needs its own run (build a new HeteroTrainer)."
        ) from exc


def lookup_scheduler(run_id: str) -> ray.actor.ActorHandle | None:
    """The scheduler actor of ``run_id`` if it exists (never creates one)."""
    try:
        return ray.get_actor(scheduler_actor_name(run_id), namespace=SCHEDULER_NAMESPACE)
    except ValueError:
        return None


def kill_scheduler(handle: ray.actor.ActorHandle, run_id: str, timeout_s: float = 10.0) -> None:
    """Kill the run's scheduler for good (no restart) and wait until its name is free."""
    try:
        ray.kill(handle, no_restart=True)
    except Exception as exc:  # noqa: BLE001 - already gone
        logger.debug("scheduler actor already gone: %s", exc)
    deadline = time.monotonic() + timeout_s
    while lookup_scheduler(run_id) is not None and time.monotonic() < deadline:
        time.sleep(0.05)
