"""Measuring a worker group before its first plan: node-round probes and calibration.

Collectives, run on every rank at the same point (the first iteration of the loader):

1. :func:`probe_in_node_rounds`: the ranks that need it probe alone; those sharing a node take
   turns so they do not contend, ranks on different nodes probe at the same time.
2. :func:`calibrate`: a few real synchronous steps at the planned slices refit each rank's
   per-sample cost under the group's real contention and communication.

:func:`measure_costs` runs both and returns one cost model per rank.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray
import torch
import torch.distributed as dist
from torch.utils.data import Dataset

from raytrain_hetero.core.allocation import CostModel, allocate
from raytrain_hetero.core.memory import micro_batch_sizes
from raytrain_hetero.core.plan import Plan
from raytrain_hetero.core.policy import Replan, StepSample, decide_first_measured, prior_costs
from raytrain_hetero.core.records import StepRecord
from raytrain_hetero.errors import HeteroError
from raytrain_hetero.worker.data.micro_batches import pass_caps_note
from raytrain_hetero.worker.data.sampler import move_to_device
from raytrain_hetero.worker.measure.memory_probe import memory_probe_batch_sizes, probe_memory
from raytrain_hetero.worker.measure.probe import (
    ProbeResult,
    cost_key,
    default_probe_batch_sizes,
    probe_step_costs,
)
from raytrain_hetero.worker.measure.timing import StepInfo, StepTiming, loader_bound_s
from raytrain_hetero.worker.plan.planning import (
    PassiveWindow,
    PlanState,
    allocation_caps,
    build_plan,
    next_free_step,
)
from raytrain_hetero.worker.setup.faults import fault_point
from raytrain_hetero.worker.setup.identity import RankIdentity, all_gather
from raytrain_hetero.worker.sync.batchnorm.convert import set_batchnorm_sync

logger = logging.getLogger(__name__)

__all__ = [
    "ProbeInputs",
    "calibrate",
    "known_costs",
    "measure_costs",
    "measure_pass_caps",
    "passive_step",
    "prior_plan",
    "probe_in_node_rounds",
    "remember_cost",
    "starts_passive",
]

PROBE_SALT = 7919
MEMORY_SALT = 15485863
CALIBRATION_SALT = 104729


@dataclass(frozen=True)
class ProbeInputs:
    """What probing and calibration run on.

    Attributes:
        dataset: The training dataset (random samples of it; the carving is untouched).
        collate_fn: Collates a list of items into a batch.
        loss_fn: ``fn(model, batch) -> scalar`` to back-propagate.
        time_loading: Price building a batch into the step (the loader-bound price, what the
            step really costs); False prices compute alone.
        loader_processes: DataLoader processes the training loader reads with: 0, the step
            loads its slice itself and pays it in full; k, the step waits only for what k
            processes reading in parallel cannot keep up with
            (:func:`~raytrain_hetero.worker.measure.timing.loader_bound_s`).
    """

    dataset: Dataset
    collate_fn: Callable[[list[Any]], Any]
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor]
    time_loading: bool = True
    loader_processes: int = 0


def measure_costs(
    identity: RankIdentity,
    model: Any,
    timing: StepTiming,
    inputs: ProbeInputs,
    *,
    rank_slots: tuple[int, ...],
    known: dict[int, CostModel],
    pass_caps: tuple[int | None, ...] | None = None,
) -> tuple[list[CostModel], str, tuple[tuple[float, ...], ...]]:
    """One cost model per rank: probed (or reused) and then calibrated; a collective.

    Slots in ``known`` (measured by a previous group) skip the probe; the probe stays within
    ``pass_caps`` (memory) and calibration micro-batches a slice above them. Returns the costs,
    how they were obtained (for the plan's reason) and, per rank, its last calibration round's
    step times (empty without calibration: the group decision's noise estimate).
    """
    probe_cfg = identity.setup.probe
    probing = rank_slots[identity.rank] not in known
    pass_cap = pass_caps[identity.rank] if pass_caps is not None else None
    result = probe_in_node_rounds(
        identity, model, timing, inputs, probing=probing, pass_cap=pass_cap
    )
    gathered = all_gather((result.batch_sizes, result.seconds) if result is not None else None)
    costs = [
        ProbeResult(tuple(g[0]), tuple(g[1])).cost_model() if g is not None else known[slot]
        for g, slot in zip(gathered, rank_slots)
    ]
    reused = sum(g is None for g in gathered)
    how = "probe" if not reused else f"probe of {identity.world_size - reused} new slot(s)"
    # Calibration times real DDP steps of the prepared model; in a model-parallel mode the
    # kept plain model has no DDP hooks (no emulated stretch, no exchange) and a rank's step
    # is its group's, so the probe's per-rank speeds are the share of the data plan.
    model_parallel = identity.setup.parallel.model_parallel
    step_seconds: tuple[tuple[float, ...], ...] = ()
    if probe_cfg.calibration_steps > 0 and probe_cfg.calibration_rounds > 0 and not model_parallel:
        costs, step_seconds = calibrate(
            identity, model, timing, inputs, costs, rank_slots=rank_slots, pass_caps=pass_caps
        )
        how += " + calibration"
    return costs, how, step_seconds


def measure_pass_caps(
    identity: RankIdentity, model: Any, inputs: ProbeInputs
) -> tuple[int | None, ...]:
    """Every rank's cap in samples per forward+backward pass; a collective.

    A rank's cap is the smaller of ``WorkerSpec.max_micro_batch`` and, with
    ``BatchConfig.max_memory_fraction`` set, the cap its memory probe derives
    (:func:`~raytrain_hetero.worker.measure.memory_probe.probe_memory`); ``None`` where neither binds.
    Without either setting on any slot nothing is measured and no collective runs.
    """
    setup, spec = identity.setup, identity.spec
    if setup.batch.max_memory_fraction is None and all(
        s.max_micro_batch is None for s in setup.specs
    ):
        return (None,) * identity.world_size
    cap = spec.max_micro_batch
    if setup.batch.max_memory_fraction is not None:
        if model is None:
            raise HeteroError(
                "The memory probe needs the model: call prepare_model(model) before iterating "
                "the loader returned by prepare_data_loader."
            )
        nodes = all_gather(ray.get_runtime_context().get_node_id())
        even = -(-setup.batch.global_batch_size // identity.world_size)
        module = getattr(model, "module", model)
        set_batchnorm_sync(module, False)  # probes are local: no statistics exchange
        try:
            probed = probe_memory(
                module,
                _batch_maker(identity, inputs, salt=MEMORY_SALT),
                memory_probe_batch_sizes(even, cap),
                device=torch.device(identity.device),
                loss_fn=inputs.loss_fn,
                fraction=setup.batch.max_memory_fraction,
                ray_memory_bytes=spec.resources.get("memory"),
                ranks_on_node=nodes.count(nodes[identity.rank]),
            )
        finally:
            set_batchnorm_sync(module, True)
        if probed is not None and probed.cap is not None:
            cap = probed.cap if cap is None else min(cap, probed.cap)
    gathered = all_gather(cap)
    logger.info("samples per pass (memory caps) by rank: %s", gathered)
    return tuple(gathered)


def probe_in_node_rounds(
    identity: RankIdentity,
    model: Any,
    timing: StepTiming,
    inputs: ProbeInputs,
    *,
    probing: bool = True,
    pass_cap: int | None = None,
) -> ProbeResult | None:
    """Probe the workers that need it; those sharing a node take turns so they do not contend.

    Workers on different nodes probe at the same time (round r runs the r-th probing worker
    of every node), so a large cluster spends only (max probing workers per node) probe
    durations. Returns ``None`` on a rank that does not probe.
    """
    nodes = all_gather((ray.get_runtime_context().get_node_id(), probing))
    probing_nodes = [node for node, wants in nodes if wants]
    my_node = nodes[identity.rank][0]
    my_round = [node for node, wants in nodes[: identity.rank] if wants].count(my_node)
    rounds = max((probing_nodes.count(n) for n in set(probing_nodes)), default=0)
    result: ProbeResult | None = None
    for round_index in range(rounds):
        if probing and round_index == my_round:
            result = _probe_this_worker(identity, model, timing, inputs, pass_cap)
        dist.barrier()
    return result


def _probe_this_worker(
    identity: RankIdentity,
    model: Any,
    timing: StepTiming,
    inputs: ProbeInputs,
    pass_cap: int | None = None,
) -> ProbeResult:
    if model is None:
        raise HeteroError(
            "Probing needs the model: call prepare_model(model) before iterating the loader "
            "returned by prepare_data_loader (or pass fixed_shares to HeteroTrainer)."
        )
    fault_point(identity, "probe")  # FAULT INJECTION hook (off unless configured)
    setup, spec = identity.setup, identity.spec
    sizes = setup.probe.batch_sizes or default_probe_batch_sizes(
        setup.batch.global_batch_size, identity.world_size, spec.max_batch
    )
    for cap in (spec.max_batch, pass_cap):  # a probe pass must fit the memory caps too
        if cap is not None:
            sizes = sorted({min(b, cap) for b in sizes})
    module = getattr(model, "module", model)
    set_batchnorm_sync(module, False)  # probes are local: no statistics exchange
    try:
        return probe_step_costs(
            module,
            _batch_maker(identity, inputs, salt=PROBE_SALT),
            sizes,
            device=torch.device(identity.device),
            loss_fn=inputs.loss_fn,
            warmup=setup.probe.warmup,
            repeats=setup.probe.repeats,
            slowdown=timing.slowdown(),
            time_loading=inputs.time_loading,
            loader_processes=inputs.loader_processes,
        )
    finally:
        set_batchnorm_sync(module, True)


def calibrate(
    identity: RankIdentity,
    model: Any,
    timing: StepTiming,
    inputs: ProbeInputs,
    costs: list[CostModel],
    *,
    rank_slots: tuple[int, ...],
    pass_caps: tuple[int | None, ...] | None = None,
) -> tuple[list[CostModel], tuple[tuple[float, ...], ...]]:
    """Refit per-rank costs from a few real synchronous steps at the planned slices.

    Every rank runs forward+backward through the DDP model (BatchNorm and gradient exchange
    included) on random samples at its slice; gradients are discarded and parameters and
    buffers restored, so training and the epoch's carving are untouched. Each rank's
    wall-clock busy time (collective waits excluded), with the wait for its batch priced as
    the training loader reads (``ProbeInputs.loader_processes``), replaces its per-sample
    cost; the probe's fixed cost alpha is kept. Under ``memory_cap_mode="accumulate"`` a slice above
    the rank's per-pass cap runs in micro-batches, as training does. Returns the costs and,
    per rank, the last round's timed step seconds.
    """
    fault_point(identity, "calibration")  # FAULT INJECTION hook (off unless configured)
    setup = identity.setup
    module = getattr(model, "module", model)
    saved = {k: v.detach().clone() for k, v in module.state_dict().items()}
    caps = allocation_caps(setup, rank_slots, pass_caps)
    pass_cap = None
    if setup.batch.memory_cap_mode == "accumulate" and pass_caps is not None:
        pass_cap = pass_caps[identity.rank]
    make_batch = _batch_maker(identity, inputs, salt=CALIBRATION_SALT)
    step_seconds: tuple[tuple[float, ...], ...] = ()
    try:
        for _ in range(setup.probe.calibration_rounds):
            slices = allocate(
                setup.batch.global_batch_size,
                costs,
                caps=caps,
                min_slice=setup.batch.min_slice,
                quantum=setup.batch.slice_quantum,
            )
            busy: list[float] = []
            for k in range(setup.probe.calibration_steps + 1):
                parts = micro_batch_sizes(
                    slices[identity.rank], pass_cap, setup.batch.slice_quantum
                )
                loaded_at = time.perf_counter()
                batches = [make_batch(size) for size in parts]
                load_wall = time.perf_counter() - loaded_at
                timing.begin(StepInfo(-1, -1, -1, tuple(slices), identity.rank, 0))
                if len(parts) == 1:
                    inputs.loss_fn(model, batches[0]).backward()
                else:  # count-weighted micro-batches, synchronised once (as in training)
                    for index, (size, batch) in enumerate(zip(parts, batches)):
                        last = index == len(parts) - 1
                        with contextlib.nullcontext() if last else model.no_sync():
                            weight = size / slices[identity.rank]
                            (inputs.loss_fn(model, batch) * weight).backward()
                times = timing.end()
                if k > 0:  # the first step sets DDP's buckets up: not timed
                    load = load_wall if inputs.time_loading else 0.0
                    busy.append(loader_bound_s(times.busy_s, load, inputs.loader_processes))
                model.zero_grad(set_to_none=True)
            step_seconds = tuple(tuple(b) for b in all_gather(tuple(busy)))
            measured = [statistics.median(b) for b in step_seconds]
            costs = [
                CostModel(alpha=c.alpha, beta=max(m - c.alpha, 1e-9 * m) / b)
                for c, m, b in zip(costs, measured, slices)
            ]
            logger.info(
                "calibration at slices %s: busy %s s", slices, [round(m, 4) for m in measured]
            )
    finally:
        timing.abandon()
        module.load_state_dict(saved)
        model.zero_grad(set_to_none=True)
    return costs, step_seconds


def _batch_maker(identity: RankIdentity, inputs: ProbeInputs, salt: int) -> Callable[[int], Any]:
    """Random batches of this rank's choosing, on its device (probing never uses the carving)."""
    device = torch.device(identity.device)
    dataset = inputs.dataset
    size = len(dataset)  # type: ignore[arg-type]
    rng = np.random.default_rng([identity.setup.batch.seed, salt, identity.rank])

    def make_batch(batch_size: int) -> Any:
        indices = rng.integers(0, size, size=batch_size)
        return move_to_device(inputs.collate_fn([dataset[int(i)] for i in indices]), device)

    return make_batch


def starts_passive(identity: RankIdentity) -> bool:
    """Whether the first plan is measured passively (``ProbeConfig.mode``); the
    model-parallel modes probe, as their splits need costs at step 0. ``group`` ``train`` /
    ``auto`` decide at the passive window's end (see ``plan_flow.decide_group_after_window``)."""
    setup = identity.setup
    return setup.probe.mode == "passive" and not setup.parallel.model_parallel


def known_costs(
    identity: RankIdentity, plans: PlanState, model: Any, inputs: ProbeInputs, *, stored: bool
) -> list[CostModel | None]:
    """Every rank's known cost model (a collective): its slot's from the checkpoint's group
    (``reuse_on_restart``), else with ``stored`` the store's for its key (``remember``; the
    key is found either way, to remember what is measured), else None."""
    setup = identity.setup
    if setup.probe.remember and setup.storage is not None and model is not None:
        try:  # the input's shape is part of the key
            sample = inputs.collate_fn([inputs.dataset[0]])
        except Exception as exc:  # noqa: BLE001 - a dataset without int indexing: not remembered
            logger.info("cost models not remembered: no sample to key them by (%s)", exc)
        else:
            plans.cost_key = cost_key(
                model,
                sample,
                identity.spec,
                identity.device,
                setup={
                    "batchnorm": setup.batch.batchnorm,
                    "price": "loader-bound" if inputs.time_loading else "compute",
                    "loader_processes": inputs.loader_processes,
                },
            )
    mine = plans.restored_slot_costs.get(identity.slot) if setup.probe.reuse_on_restart else None
    if mine is None and stored and plans.cost_key is not None:
        found = setup.storage.cost_models().read(plans.cost_key.digest)  # type: ignore[union-attr]
        mine = None if found is None else CostModel(found.alpha, found.beta)
    gathered = all_gather(mine)
    return gathered


def remember_cost(identity: RankIdentity, plans: PlanState, cost: CostModel) -> None:
    """Store this rank's measured cost model under its key (when remembering)."""
    key, storage = plans.cost_key, identity.setup.storage
    if key is not None and storage is not None:
        storage.cost_models().write(key.digest, cost.alpha, cost.beta, key.about)


def prior_plan(
    identity: RankIdentity, plans: PlanState, known: list[CostModel | None], start: int
) -> Plan:
    """The cheap start's first plan: remembered cost models (a rank without one guessed at
    the others' median), else equal slices; its steps ``start + 1 ..`` are timed."""
    costs = prior_costs(known)
    last = start + identity.setup.probe.passive_steps
    how = (
        "equal slices"
        if costs is None
        else f"remembered cost models of ranks {[r for r, c in enumerate(known) if c]}"
    )
    reason = f"prior: {how}; steps {start + 1}-{last} timed for the measured plan"
    reason += pass_caps_note(plans.pass_caps)
    if costs is None:
        shares = [1.0] * identity.world_size
        plan = build_plan(identity, plans, shares=shares, effective_step=start, reason=reason)
    else:
        plan = build_plan(identity, plans, costs=costs, effective_step=start, reason=reason)
    plans.passive = PassiveWindow(plan.version, start + 1, last)
    return plan


def passive_step(identity: RankIdentity, plans: PlanState, record: StepRecord) -> Plan | None:
    """Time a step of the prior plan; after the last, agree on the measured plan.

    At the window's last step every rank gathers its timings (a collective), rank 0 decides
    (:func:`~raytrain_hetero.core.policy.decide_first_measured`) and broadcasts; a switch
    takes effect at the first step no rank has carved, as every live re-plan, so the carving
    stays exactly-once. Returns the measured plan, or None (not yet, or the prior stays).
    """
    window = plans.passive
    if window is None or record.step < window.first:
        return None
    if record.plan_version == window.version:
        window.samples.append(
            StepSample(
                identity.rank,
                record.step,
                record.slice,
                record.busy_s,
                record.time,
                compute_s=record.compute_s,
            )
        )
    if record.step < window.last:
        return None
    plans.passive = None
    gathered = all_gather(window.samples)
    box: list[Any] = [None]
    current = plans.current
    if identity.rank == 0 and current is not None and current.version == window.version:
        box[0] = decide_first_measured(
            current.slices,
            [s for samples in gathered for s in samples],
            identity.setup.scheduler.policy,
            prior=current.costs,
            caps=current.caps,
            min_slice=current.min_slice,
            quantum=current.quantum,
        )
    dist.broadcast_object_list(box, src=0)
    if box[0] is None:
        return None
    estimates, decision = box[0]
    if estimates is not None:
        plans.measured_costs = tuple(estimates.costs)
        remember_cost(identity, plans, estimates.costs[identity.rank])
    if not isinstance(decision, Replan):
        logger.info("measured plan: the prior stays (%s)", decision.reason)
        return None
    return build_plan(
        identity,
        plans,
        costs=decision.costs,
        slices=decision.slices,
        effective_step=next_free_step(plans),
        reason=f"measured: {decision.reason}",
    )
