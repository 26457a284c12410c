"""``raytrain-hetero rent --apply``: rent the chosen mix through Ray's autoscaler and train on it.

1. The plan becomes worker slots (:func:`worker_specs`): per option of the mix, one slot per
   worker, selecting its node type by two node labels (``RentConfig.instance_label`` and
   ``market_label``; the cluster's node types must carry them), on-demand slots first, and
   ``elastic.min_workers`` = the on-demand workers (the group survives every spot loss).
2. The autoscaler is asked for exactly those slots at once
   (``ray.autoscaler.sdk.request_resources(bundles=..., bundle_label_selectors=...)``, one
   selector per bundle; autoscaler v2 only, v1 ignores selectors), then the job trains
   (:func:`raytrain_hetero.app.job.run_job`) on the slots.
3. A :class:`RentWatcher` follows the nodes while it trains: their node-seconds (the cost
   incurred at catalog prices), a drain (a preemption notice) or loss of a spot node. After
   one it re-plans (:func:`replan`): the work left (from the time trained at the planned
   speed), the deadline or budget left, the nodes still held; over the job's slots, the
   cheapest way to keep the deadline (or the soonest within the budget), or it says at once
   that the deadline can no longer be kept. The work done is the step of the job's newest
   checkpoint (Ray Train's ``checkpoint_manager_snapshot.json``; before the first one, the
   time trained at the planned speed). Every few polls the same re-plan over the nodes held
   checks the deadline (or budget) after the planned start-up and says once, as early as the model sees it, that it can
   no longer be kept. Replacement nodes are asked for the same way.

How this coexists with Ray's own requests (Ray 2.60, read in its source): the request is one
GCS-side constraint, and each ``request_resources`` call *replaces* it (``commands.py``:
v2 ``request_cluster_resources`` "will overwrite the previous requests"; v1 writes one KV
key with ``overwrite=True``). Ray Data's ``_AutoscalingCoordinatorActor`` (a detached actor,
created by Ray Data's autoscaler and by Ray Train V2's elastic policy) merges its
requesters' bundles and re-sends them every ``TICK_INTERVAL_S = 20`` s, an empty list
included, so a direct request lives at most until its next tick. Here that is by design: the
direct request is a head start (nodes start before the trainer asks), and the lasting
request is Ray Train's own: its elastic policy registers ``max_workers`` bundles with the job's
per-slot label selectors with the coordinator (``build_train_resource_request``, re-sent
every 20 s, expiring after 180 s), which are the same slots. What a direct caller cannot do
is *withhold* a node Train's slots ask for (a re-plan that would not replace a lost spot
node): the autoscaler replaces it anyway. See ``docs/how-to/rent.md``.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from raytrain_hetero.app.rent_inputs import RentInputs, decision_dict
from raytrain_hetero.app.rent_schema import RentFile
from raytrain_hetero.atomic import atomic_write_text
from raytrain_hetero.core.rent import RentDecision, decide_rent, format_cost, format_duration
from raytrain_hetero.core.rent_model import RentJob, RentPlan

__all__ = [
    "NodeSpan",
    "RentEvent",
    "RentReport",
    "RentWatcher",
    "apply_rent",
    "incurred_cost",
    "replan",
    "resource_request",
    "steps_done",
    "worker_specs",
]

logger = logging.getLogger(__name__)


@dataclass
class NodeSpan:
    """One rented node as the watcher saw it: alive from ``start_s`` to ``end_s``
    (seconds since the apply started; None while alive)."""

    node_id: str
    instance_type: str
    market: str
    start_s: float
    end_s: float | None = None
    how: str = "running"  # running, lost, stopped


@dataclass(frozen=True)
class RentEvent:
    """Something the watcher saw or did, at ``at_s`` seconds since the apply started."""

    at_s: float
    kind: str  # joined, notice, lost, replan, request, limit
    text: str


@dataclass(frozen=True)
class RentReport:
    """The outcome of ``rent --apply`` (also written as ``rent_report.json``).

    Attributes:
        path: The report's file.
        wall_s: Seconds from the request to the end of training.
        predicted_s: The chosen plan's expected time.
        incurred_cost: Node-seconds x catalog price of every node seen, from when it joined
            the cluster (a provider's boot time before that is not seen) to its loss or the end.
        events: What happened.
        spans: Every node seen.
        summary: The training run's summary.
    """

    path: Path
    wall_s: float
    predicted_s: float
    incurred_cost: float
    events: tuple[RentEvent, ...]
    spans: tuple[NodeSpan, ...]
    summary: dict[str, Any] = field(default_factory=dict)


def _slot_name(instance_type: str, market: str) -> str:
    return f"{instance_type}.{'spot' if market == 'spot' else 'on-demand'}"


def worker_specs(plan: RentPlan, inputs: RentInputs, rf: RentFile) -> list[dict[str, Any]]:
    """The plan's worker slots (``workers:`` entries of a job), on-demand first."""
    cfg = inputs.config
    specs = []
    for n in sorted(plan.nodes, key=lambda n: (n.market == "spot", n.instance_type)):
        offer = inputs.offers[n.instance_type]
        shape = rf.worker_shapes.get(n.instance_type)
        resources = shape.resources if shape is not None and shape.resources else None
        if resources is None:
            resources = (
                {"CPU": 1.0, "GPU": 1.0} if offer.accelerator_count > 0 else {"CPU": offer.vcpus}
            )
        spec: dict[str, Any] = {
            "name": _slot_name(n.instance_type, n.market),
            "count": n.workers,
            "resources": dict(resources),
            "label_selector": {
                cfg.instance_label: n.instance_type,
                cfg.market_label: cfg.market_value(n.market),
            },
        }
        if shape is not None:
            spec["device"] = shape.device
            spec["emulated_slowdown"] = shape.emulated_slowdown
        specs.append(spec)
    return specs


def resource_request(
    specs: list[dict[str, Any]],
) -> tuple[list[dict[str, float]], list[dict[str, str]]]:
    """``request_resources`` arguments for worker slots: one bundle and selector per worker."""
    bundles, selectors = [], []
    for spec in specs:
        for _ in range(spec["count"]):
            bundles.append({k: float(v) for k, v in spec["resources"].items()})
            selectors.append(dict(spec["label_selector"]))
    return bundles, selectors


def request_nodes(specs: list[dict[str, Any]]) -> None:
    """Ask the autoscaler for the slots' nodes (replaces any earlier direct request)."""
    from ray.autoscaler.sdk import request_resources

    bundles, selectors = resource_request(specs)
    request_resources(bundles=bundles, bundle_label_selectors=selectors)


def steps_done(storage: Any, since: float) -> int | None:
    """The global step of the newest checkpoint Ray Train recorded under ``storage`` (a
    :class:`~raytrain_hetero.storage.StorageLocation` of the runs) in a run written after
    ``since`` (UNIX seconds): ``hetero/global_step`` of its ``checkpoint_manager_snapshot.json``.
    None before the first checkpoint."""
    found = [
        (m, p) for p, m in storage.find_files("checkpoint_manager_snapshot.json") if m >= since
    ]
    if not found:
        return None
    try:
        data = json.loads(storage.join(max(found)[1]).read_bytes())
        step = (
            (data.get("latest_checkpoint_result") or {})
            .get("metrics", {})
            .get("hetero/global_step")
        )
    except (OSError, ValueError, AttributeError):
        return None
    return int(step) if isinstance(step, (int, float)) else None


def incurred_cost(spans: list[NodeSpan], inputs: RentInputs, now_s: float) -> float:
    """Node-seconds x catalog price of every node seen (a live node up to ``now_s``)."""
    price = {(o.instance_type, o.market): o.price_per_h for o in inputs.options}
    total = 0.0
    for s in spans:
        end = now_s if s.end_s is None else s.end_s
        total += max(0.0, end - s.start_s) * price.get((s.instance_type, s.market), 0.0) / 3600.0
    return total


def replan(
    inputs: RentInputs,
    decision: RentDecision,
    held: Mapping[str, int],
    elapsed_s: float,
    spent: float,
    done: float | None = None,
) -> RentDecision:
    """The decision after a spot loss or notice, over the job's slots (the chosen mix's
    options, at most the planned nodes of each): the work left (``done``, the fraction of
    the steps the job's last checkpoint reported; None: the time trained so far at the
    planned speed), the deadline (or budget) left, the nodes ``held`` (option key -> nodes)
    need no start-up."""
    chosen = {(n.instance_type, n.market): n.nodes for n in decision.chosen.nodes}
    options = tuple(
        replace(o, max_nodes=chosen[(o.instance_type, o.market)])
        for o in inputs.options
        if (o.instance_type, o.market) in chosen
    )
    plan = decision.chosen
    if done is None:
        trained = max(0.0, elapsed_s - plan.startup_s)
        done = trained / plan.expected_time_s if plan.expected_time_s > 0 else 0.0
    done = min(0.99, max(0.0, done))
    job = RentJob(inputs.job.samples * (1.0 - done), inputs.job.global_batch)
    settings = replace(inputs.settings, max_types=max(inputs.settings.max_types, len(options)))
    limit = decision.limit - (elapsed_s if decision.objective == "deadline" else spent)
    limit = max(limit, 1e-6)
    return decide_rent(
        options,
        job,
        inputs.exchange,
        settings,
        deadline_s=limit if decision.objective == "deadline" else None,
        budget=limit if decision.objective == "budget" else None,
        held=dict(held),
    )


class RentWatcher(threading.Thread):
    """Follows the rented nodes (every ``RentConfig.watch_interval_s``): node-seconds,
    drains and losses; calls ``on_loss(held, node)`` after a spot node's drain or loss."""

    #: Polls between two calls of ``on_check`` (the deadline check).
    CHECK_EVERY = 10

    def __init__(
        self,
        inputs: RentInputs,
        on_loss: Callable[[dict[str, int], NodeSpan, str], None],
        started: float,
        on_check: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(name="rent-watcher", daemon=True)
        self.inputs, self.on_loss, self.started = inputs, on_loss, started
        self.on_check = on_check
        self.spans: dict[str, NodeSpan] = {}
        self.events: list[RentEvent] = []
        self.stop_event = threading.Event()
        self._noticed: set[str] = set()
        self.lock = threading.Lock()

    def now(self) -> float:
        return time.monotonic() - self.started

    def event(self, kind: str, text: str) -> None:
        with self.lock:
            self.events.append(RentEvent(round(self.now(), 2), kind, text))
        logger.warning("rent: %s: %s", kind, text)

    def held(self, without: str | None = None) -> dict[str, int]:
        """Option key -> nodes alive and not draining (``without`` left out)."""
        counts: dict[str, int] = {}
        for s in self.spans.values():
            if s.end_s is None and s.node_id != without and s.node_id not in self._noticed:
                key = f"{s.instance_type}:{s.market}"
                counts[key] = counts.get(key, 0) + 1
        return counts

    def poll(self) -> None:
        import ray

        from raytrain_hetero.driver._ray_compat import draining_node_ids

        cfg = self.inputs.config
        markets = {cfg.market_value(m): m for m in ("spot", "on_demand")}
        seen_alive = set()
        for node in ray.nodes():
            labels = node.get("Labels") or {}
            kind = labels.get(cfg.instance_label)
            if kind is None:
                continue
            node_id = node["NodeID"]
            if node.get("Alive"):
                seen_alive.add(node_id)
                if node_id not in self.spans:
                    market = markets.get(labels.get(cfg.market_label, ""), "on_demand")
                    self.spans[node_id] = NodeSpan(node_id, kind, market, self.now())
                    self.event("joined", f"{_slot_name(kind, market)} node …{node_id[-6:]}")
        for node_id in draining_node_ids() & set(self.spans) - self._noticed:
            span = self.spans[node_id]
            self._noticed.add(node_id)
            self.event(
                "notice", f"{_slot_name(span.instance_type, span.market)} …{node_id[-6:]} drains"
            )
            if span.market == "spot":
                self.on_loss(self.held(), span, "notice")
        for node_id, span in self.spans.items():
            if span.end_s is None and node_id not in seen_alive:
                span.end_s, span.how = self.now(), "lost"
                self.event("lost", f"{_slot_name(span.instance_type, span.market)} …{node_id[-6:]}")
                if span.market == "spot" and node_id not in self._noticed:
                    self.on_loss(self.held(), span, "lost")

    def run(self) -> None:
        polls = 0
        while not self.stop_event.wait(self.inputs.config.watch_interval_s):
            polls += 1
            try:
                self.poll()
                if self.on_check is not None and polls % self.CHECK_EVERY == 0:
                    self.on_check()
            except Exception as exc:  # noqa: BLE001 - a watcher must not end the run
                logger.warning("rent watcher: %s", exc)

    def finish(self) -> None:
        self.stop_event.set()
        self.join(timeout=10)
        now = self.now()
        for span in self.spans.values():
            if span.end_s is None:
                span.end_s, span.how = now, "stopped"


def apply_rent(
    rf: RentFile,
    inputs: RentInputs,
    decision: RentDecision,
    train_job: Any,
    *,
    output_dir: Path | None = None,
    overwrite: bool = False,
) -> RentReport:
    """Rent ``decision.chosen`` and train ``train_job`` on it (see the module)."""
    from raytrain_hetero.app.config import validate_config
    from raytrain_hetero.app.job import init_ray, run_job

    plan = decision.chosen
    specs = worker_specs(plan, inputs, rf)
    on_demand = sum(s["count"] for s in specs if s["name"].endswith(".on-demand"))
    data = train_job.model_dump(mode="json")
    data["workers"] = specs
    data["elastic"] = {**data.get("elastic", {}), "min_workers": max(1, on_demand)}
    if output_dir is not None:
        data["output_dir"] = str(output_dir)
    job = validate_config(data, source=f"{rf.train_job} (workers from the rent plan)")
    started, started_wall = time.monotonic(), time.time()
    watcher_box: list[RentWatcher] = []
    runs = job.ray.storage(job.ray.location(job.output_dir))
    total_steps = max(1.0, inputs.job.samples / inputs.job.global_batch)
    warned: list[str] = []

    def done() -> float | None:
        step = steps_done(runs, started_wall)
        return None if step is None else step / total_steps

    planned = {f"{n.instance_type}:{n.market}": n.nodes for n in plan.nodes}

    def on_check() -> None:
        """Say as early as the model sees it when the limit can no longer be kept: after the
        planned start-up, the planned nodes (requested, replaced after a loss) and the work
        left at the measured progress."""
        watcher = watcher_box[0]
        if watcher.now() < plan.startup_s:
            return
        spent = incurred_cost(list(watcher.spans.values()), inputs, watcher.now())
        new = replan(inputs, decision, planned, watcher.now(), spent, done())
        if not new.feasible and not warned:
            warned.append(new.reason)
            watcher.event("limit", f"the {decision.objective} can no longer be kept: {new.reason}")

    def on_loss(held: dict[str, int], span: NodeSpan, how: str) -> None:
        watcher = watcher_box[0]
        spent = incurred_cost(list(watcher.spans.values()), inputs, watcher.now())
        new = replan(inputs, decision, held, watcher.now(), spent, done())
        what = "preemption notice" if how == "notice" else "loss"
        text = f"after the {what} of {_slot_name(span.instance_type, span.market)}: {new.reason}"
        watcher.event("replan", text)
        wanted = {(n.instance_type, n.market): n.nodes for n in new.chosen.nodes}
        have = {tuple(k.split(":")): v for k, v in held.items()}
        if any(n > have.get(key, 0) for key, n in wanted.items()):
            request_nodes(worker_specs(new.chosen, inputs, rf))
            watcher.event("request", f"asked for {new.chosen.describe()}")

    init_ray(job)
    request_nodes(specs)
    watcher = RentWatcher(inputs, on_loss, started, on_check)
    watcher_box.append(watcher)
    watcher.event(
        "request", f"asked for {plan.describe()} ({len(resource_request(specs)[0])} slots)"
    )
    watcher.start()
    try:
        summary = run_job(job, progress=False, overwrite=overwrite)
    finally:
        watcher.finish()
    wall = time.monotonic() - started
    spans = list(watcher.spans.values())
    cost = incurred_cost(spans, inputs, wall)
    out = Path(str(job.output_dir))
    report = RentReport(
        out / "rent_report.json", wall, plan.expected_time_s, cost, tuple(watcher.events),
        tuple(spans), summary,
    )  # fmt: skip
    atomic_write_text(
        report.path,
        json.dumps(
            {
                "decision": decision_dict(decision),
                "wall_s": wall,
                "predicted_s": plan.expected_time_s,
                "incurred_cost": cost,
                "incurred": format_cost(cost),
                "predicted": format_duration(plan.expected_time_s),
                "events": [asdict(e) for e in watcher.events],
                "nodes": [asdict(s) for s in spans],
                "steps": summary.get("steps"),
            },
            indent=1,
            default=str,
        )
        + "\n",
    )
    return report
