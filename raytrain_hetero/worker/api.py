"""Worker-side API, called inside the train loop that ``HeteroTrainer`` runs on every worker.

Typical loop::

    def train_loop(config):
        model = raytrain_hetero.prepare_model(build_model())
        loader = raytrain_hetero.prepare_data_loader(train_dataset, num_workers=2)
        optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
        for epoch in range(loader.epoch, config["epochs"]):
            for batch in loader:                      # this rank's slice of each global batch
                loss = loss_fn(model(batch["image"]), batch["label"])   # mean over the slice
                optimizer.zero_grad(); loss.backward(); optimizer.step()
                raytrain_hetero.log_step_metrics(loss=loss.item())
            raytrain_hetero.app.outputs({"epoch": epoch}, checkpoint=...)

``report`` stores the sampler cursor and the plan history inside the checkpoint, so a
restarted group resumes at exactly the next unseen step of the epoch.
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import ray
import torch
import torch.distributed as dist
from torch.utils.data import Dataset, default_collate

from raytrain_hetero.worker.batchnorm import set_batchnorm_sync
from raytrain_hetero.worker.context import WorkerContext, get_worker_context
from raytrain_hetero.core.carving import Cursor, EpochCarver
from raytrain_hetero.core.plan import Plan
from raytrain_hetero.errors import ConfigError, HeteroError
from raytrain_hetero.worker.probe import (
    ProbeResult,
    default_probe_batch_sizes,
    default_probe_loss,
    probe_step_costs,
)
from raytrain_hetero.worker.sampler import HeteroDataLoader, move_to_device

logger = logging.getLogger(__name__)

STATE_FILE = "raytrain_hetero_state.json"
STATE_FORMAT = 1


def get_device() -> torch.device:
    """The device this worker computes on (chosen per WorkerSpec by the backend)."""
    return torch.device(get_worker_context().device)


def get_rank_info() -> dict[str, Any]:
    """This worker's rank, world size, WorkerSpec name, device and worker-group id."""
    ctx = get_worker_context()
    return {
        "rank": ctx.rank,
        "world_size": ctx.world_size,
        "worker": ctx.spec.name,
        "device": ctx.device,
        "group": ctx.group_id,
    }


def prepare_model(
    model: torch.nn.Module,
    *,
    sync_batchnorm: bool = True,
    ddp_kwargs: dict[str, Any] | None = None,
) -> torch.nn.parallel.DistributedDataParallel:
    """Wrap ``model`` for exact heterogeneous data parallelism.

    Moves it to this worker's device, replaces BatchNorm layers by global-statistics
    :class:`~raytrain_hetero.worker.batchnorm.HeteroBatchNorm` (exact under uneven slices, on gloo
    too) and wraps it in DDP with the count-weighted gradient hook.

    Args:
        model: The model, built identically on every worker.
        sync_batchnorm: Keep True for exactness; False keeps per-slice statistics.
        ddp_kwargs: Extra DistributedDataParallel arguments.

    Returns:
        The DDP-wrapped model.
    """
    from raytrain_hetero.worker.ddp import wrap_model

    ctx = get_worker_context()
    wrapped = wrap_model(model, ctx, sync_batchnorm=sync_batchnorm, ddp_kwargs=ddp_kwargs)
    ctx.model = wrapped
    return wrapped


def prepare_data_loader(
    dataset: Dataset,
    *,
    move_to_device: bool = True,
    probe_loss: Callable[[torch.nn.Module, Any], torch.Tensor] | None = None,
    **dataloader_kwargs: Any,
) -> HeteroDataLoader:
    """Loader over this rank's slices of every global batch; each iteration is one epoch.

    Restores the cursor and plan history from ``ray.train.get_checkpoint()`` when resuming.
    The first iteration probes this worker (unless fixed shares were given) and agrees a plan
    with all ranks.

    Args:
        dataset: Map-style dataset with ``len()``; identical on every worker.
        move_to_device: Move each batch to :func:`get_device`.
        probe_loss: ``fn(model, batch) -> scalar`` used to time probes; by default the mean
            model output on the batch's input (tensor, first element, or ``"image"``).
        **dataloader_kwargs: Passed to ``torch.utils.data.DataLoader`` (``num_workers``,
            ``pin_memory``, ``collate_fn``...), except batch_size/shuffle/sampler/drop_last.

    Returns:
        The loader.
    """
    ctx = get_worker_context()
    try:
        size = len(dataset)  # type: ignore[arg-type]
    except TypeError as exc:
        raise ConfigError(
            "prepare_data_loader needs a map-style dataset with len(); iterable datasets "
            "cannot be carved exactly."
        ) from exc
    setup = ctx.setup
    ctx.carver = EpochCarver(
        dataset_size=size,
        global_batch_size=setup.global_batch_size,
        seed=setup.seed,
        min_step_size=setup.max_world_size * setup.min_slice,
    )
    ctx.cursor = Cursor(0, 0)
    _restore_from_checkpoint(ctx)
    collate_fn = dataloader_kwargs.get("collate_fn") or default_collate
    loss_fn = probe_loss or default_probe_loss

    # Without DataLoader processes, reading and decoding is part of every step's cost.
    time_loading = int(dataloader_kwargs.get("num_workers", 0) or 0) == 0

    def ensure_plan() -> None:
        if ctx.schedule.current is None:
            _install_first_plan(ctx, dataset, collate_fn, loss_fn, time_loading)

    return HeteroDataLoader(
        dataset,
        ctx,
        ensure_plan=ensure_plan,
        on_step_end=lambda record: _on_step_end(ctx, record),
        move_to_device=move_to_device,
        **dataloader_kwargs,
    )


def log_step_metrics(**metrics: float) -> None:
    """Attach scalar metrics (e.g. ``loss=``) to the current step's record."""
    ctx = get_worker_context()
    ctx.step_metrics.update({k: float(v) for k, v in metrics.items()})


def current_step_number() -> int:
    """Global step number (optimizer steps since the run began) of the step in progress."""
    step = get_worker_context().current_step
    if step is None:
        raise HeteroError("No step in progress: call this inside the loop over the prepared loader.")
    return step.global_step


def current_plan() -> Plan | None:
    """The newest plan of this worker group."""
    return get_worker_context().schedule.current


def update_plan(
    *,
    shares: list[float] | None = None,
    costs: list[Any] | None = None,
    reason: str = "manual",
) -> Plan:
    """Switch to a new plan; a collective, call it on every rank at the same point of the loop.

    Rank 0's ``shares`` or ``costs`` (one per rank) win; the plan is versioned and takes effect
    at the first step no rank has carved yet (beyond any DataLoader prefetch), so every rank
    switches at the same step and the carving stays exactly-once.

    Returns:
        The installed plan.
    """
    ctx = get_worker_context()
    if (shares is None) == (costs is None):
        raise ConfigError("update_plan needs exactly one of shares= or costs=.")
    carved = torch.tensor([ctx.schedule.carved_through], dtype=torch.int64)
    dist.all_reduce(carved, op=dist.ReduceOp.MAX)
    payload = [(shares, costs)]
    dist.broadcast_object_list(payload, src=0)
    shares, costs = payload[0]
    plan = _build_plan(ctx, shares=shares, costs=costs, effective_step=int(carved.item()) + 1,
                       reason=reason)
    _install_plan(ctx, plan)
    return plan


def report(
    metrics: dict[str, Any],
    checkpoint: ray.train.Checkpoint | None = None,
    **kwargs: Any,
) -> None:
    """``ray.train.report`` that also carries the cursor and plans for an exact resume.

    Call it on every rank, after the step's optimizer update. The current plan version,
    global step and epoch are added to ``metrics`` (``hetero/...`` keys); the sampler state is
    written into the checkpoint directory as ``raytrain_hetero_state.json``.
    """
    ctx = get_worker_context()
    enriched = dict(metrics)
    plan = ctx.schedule.current
    if ctx.carver is not None and ctx.cursor is not None:
        enriched["hetero/global_step"] = ctx.carver.global_step(ctx.cursor)
        enriched["hetero/epoch"] = ctx.cursor.epoch
    if plan is not None:
        enriched["hetero/plan_version"] = plan.version
        enriched["hetero/slices"] = list(plan.slices)
    if dist.is_initialized():
        # Every rank reports: share each rank's latest figures so rank 0's metrics carry all.
        mine = None
        if ctx.last_record is not None:
            mine = {k: ctx.last_record[k] for k in ("worker", "samples_per_s", "slice", "weight")}
        gathered: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(gathered, mine)
        for rank, figures in enumerate(gathered):
            if figures is not None:
                for key in ("samples_per_s", "slice", "weight"):
                    enriched[f"hetero/rank{rank}/{key}"] = figures[key]
    if checkpoint is not None:
        write_state(ctx, Path(checkpoint.path))
    _flush_records(ctx, wait=True)
    ray.train.report(enriched, checkpoint=checkpoint, **kwargs)


# ----------------------------------------------------------------------------- internals


def write_state(ctx: WorkerContext, directory: Path) -> Path:
    """Write the cursor and plan history into a checkpoint directory (atomically)."""
    if ctx.carver is None or ctx.cursor is None:
        raise HeteroError("report(checkpoint=...) before prepare_data_loader: nothing to resume.")
    state = {
        "format": STATE_FORMAT,
        "cursor": {"epoch": ctx.cursor.epoch, "step_in_epoch": ctx.cursor.step_in_epoch},
        "global_step": ctx.carver.global_step(ctx.cursor),
        "dataset_size": ctx.carver.dataset_size,
        "global_batch_size": ctx.carver.global_batch_size,
        "seed": ctx.carver.seed,
        "min_step_size": ctx.carver.min_step_size,
        "world_size": ctx.world_size,
        "plans": [p.to_dict() for p in ctx.plan_history],
        # Which slot each rank filled: lets a restarted group reuse their cost models.
        "rank_slots": ctx.rank_spec_indices,
    }
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".state", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(state, f, indent=2)
    target = directory / STATE_FILE
    os.replace(tmp, target)
    return target


def _restore_from_checkpoint(ctx: WorkerContext) -> None:
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return
    with checkpoint.as_directory() as directory:
        path = Path(directory) / STATE_FILE
        if not path.exists():
            logger.warning("checkpoint %s has no %s: starting the epoch over", directory, STATE_FILE)
            return
        state = json.loads(path.read_text())
    carver = ctx.carver
    expected = {
        "dataset_size": carver.dataset_size,
        "global_batch_size": carver.global_batch_size,
        "seed": carver.seed,
        "min_step_size": carver.min_step_size,
    }
    mismatched = {k: (state.get(k), v) for k, v in expected.items() if state.get(k) != v}
    if mismatched:
        detail = ", ".join(f"{k}: checkpoint {a} vs now {b}" for k, (a, b) in mismatched.items())
        raise ConfigError(
            f"Cannot resume exactly: the checkpoint was carved differently ({detail}). "
            "Resume with the same dataset, global batch, seed and maximum worker count, or "
            "start a new run (new RunConfig name)."
        )
    ctx.cursor = Cursor(state["cursor"]["epoch"], state["cursor"]["step_in_epoch"])
    ctx.plan_history = [Plan.from_dict(p) for p in state.get("plans", [])]
    ctx.restored_slot_costs = _slot_costs(ctx.plan_history, state.get("rank_slots"))
    logger.info(
        "resuming at epoch %d step %d (global step %d)",
        ctx.cursor.epoch,
        ctx.cursor.step_in_epoch,
        state["global_step"],
    )


def _slot_costs(plans: list[Plan], rank_slots: list[int] | None) -> dict[int, Any]:
    """Cost model per worker slot from the newest plan of the group that wrote a checkpoint."""
    if not plans or not rank_slots:
        return {}
    newest = max(plans, key=lambda p: p.version)
    if newest.costs is None or newest.world_size != len(rank_slots):
        return {}
    return {int(slot): cost for slot, cost in zip(rank_slots, newest.costs)}


def _next_version(ctx: WorkerContext) -> int:
    return max((p.version for p in ctx.plan_history), default=0) + 1


def _rank_spec_indices(ctx: WorkerContext) -> list[int]:
    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, ctx.spec_index)
    return [int(i) for i in gathered]


def _build_plan(
    ctx: WorkerContext,
    *,
    shares: list[float] | None,
    costs: list[Any] | None,
    effective_step: int,
    reason: str,
) -> Plan:
    spec_indices = ctx.rank_spec_indices or _rank_spec_indices(ctx)
    ctx.rank_spec_indices = spec_indices
    caps = [ctx.setup.specs[i].max_batch for i in spec_indices]
    common = {
        "version": _next_version(ctx),
        "effective_step": effective_step,
        "caps": caps,
        "min_slice": ctx.setup.min_slice,
        "reason": reason,
    }
    if shares is not None:
        return Plan.from_shares(ctx.setup.global_batch_size, shares, **common)
    return Plan.from_costs(ctx.setup.global_batch_size, costs, **common)


def _install_plan(ctx: WorkerContext, plan: Plan) -> None:
    ctx.schedule.add(plan)
    ctx.plan_history.append(plan)
    logger.info(
        "plan v%d from step %d: slices %s (%s)",
        plan.version,
        plan.effective_step,
        list(plan.slices),
        plan.reason,
    )
    actor = _scheduler_handle(ctx)
    if actor is not None and ctx.rank == 0:
        actor.record_plan.remote(plan.to_dict(), ctx.world_size, ctx.group_id)


def _install_first_plan(
    ctx: WorkerContext,
    dataset: Dataset,
    collate_fn: Callable[[list[Any]], Any],
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
    time_loading: bool,
) -> None:
    setup = ctx.setup
    spec_indices = _rank_spec_indices(ctx)
    ctx.rank_spec_indices = spec_indices
    start = ctx.carver.global_step(ctx.cursor)
    if setup.fixed_shares is not None:
        shares = [setup.fixed_shares[i] for i in spec_indices]
        plan = _build_plan(ctx, shares=shares, costs=None, effective_step=start,
                           reason="fixed shares")
    else:
        # After a restart, slots the previous group measured keep their cost models (the
        # calibration below refits them under the new group's contention); only new slots
        # are probed, which shortens the time until a joining node is used.
        known = ctx.restored_slot_costs if setup.probe.reuse_on_restart else {}
        probing = spec_indices[ctx.rank] not in known
        result = _probe_in_node_rounds(ctx, dataset, collate_fn, loss_fn, time_loading, probing)
        gathered: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(
            gathered, (result.batch_sizes, result.seconds) if result is not None else None
        )
        costs = [
            ProbeResult(tuple(g[0]), tuple(g[1])).cost_model() if g is not None else known[slot]
            for g, slot in zip(gathered, spec_indices)
        ]
        reused = sum(g is None for g in gathered)
        how = "probe" if not reused else f"probe of {ctx.world_size - reused} new slot(s)"
        if setup.probe.calibration_steps > 0 and setup.probe.calibration_rounds > 0:
            costs = _calibrate(ctx, costs, dataset, collate_fn, loss_fn, time_loading)
            how += " + calibration"
        speeds = ", ".join(
            f"r{r}:{1.0 / c.beta:.0f}/s+{c.alpha * 1e3:.1f}ms" for r, c in enumerate(costs)
        )
        plan = _build_plan(ctx, shares=None, costs=costs, effective_step=start,
                           reason=f"{how} ({speeds})")
    _install_plan(ctx, plan)


def _calibrate(
    ctx: WorkerContext,
    costs: list[Any],
    dataset: Dataset,
    collate_fn: Callable[[list[Any]], Any],
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
    time_loading: bool,
) -> list[Any]:
    """Refit per-rank costs from a few real synchronous steps at the planned slices.

    Every rank runs forward+backward through the DDP model (BatchNorm and gradient exchange
    included) on random samples at its slice; gradients are discarded and parameters and
    buffers restored, so training and the epoch's carving are untouched. Each rank's
    wall-clock busy time (collective waits excluded) replaces its per-sample cost; the
    probe's fixed cost alpha is kept.
    """
    from raytrain_hetero.worker.context import StepInfo
    from raytrain_hetero.core.allocation import CostModel, allocate
    from raytrain_hetero.worker.probe import restart_accounting

    setup = ctx.setup
    model = ctx.model
    module = getattr(model, "module", model)
    clock = ctx.compute_clock
    saved = {k: v.detach().clone() for k, v in module.state_dict().items()}
    caps = [setup.specs[i].max_batch for i in ctx.rank_spec_indices]
    make_batch = _batch_maker(ctx, dataset, collate_fn, salt=104729)
    try:
        for _ in range(setup.probe.calibration_rounds):
            slices = allocate(setup.global_batch_size, costs, caps=caps, min_slice=setup.min_slice)
            busy: list[float] = []
            for k in range(setup.probe.calibration_steps + 1):
                loaded_at = time.perf_counter()
                batch = make_batch(slices[ctx.rank])
                load_wall = time.perf_counter() - loaded_at if time_loading else 0.0
                ctx.current_step = StepInfo(-1, -1, -1, tuple(slices), ctx.rank, 0)
                restart_accounting(ctx, clock)
                loss = loss_fn(model, batch)
                loss.backward()
                if k > 0:  # the first step sets DDP's buckets up: not timed
                    busy.append(ctx.busy_s + load_wall)
                model.zero_grad(set_to_none=True)
                ctx.current_step = None
            measured: list[Any] = [None] * ctx.world_size
            dist.all_gather_object(measured, statistics.median(busy))
            costs = [
                CostModel(alpha=c.alpha, beta=max(m - c.alpha, 1e-9 * m) / b)
                for c, m, b in zip(costs, measured, slices)
            ]
            logger.info(
                "calibration at slices %s: busy %s s", slices, [round(m, 4) for m in measured]
            )
    finally:
        ctx.current_step = None
        module.load_state_dict(saved)
        model.zero_grad(set_to_none=True)
    return costs


def _batch_maker(
    ctx: WorkerContext,
    dataset: Dataset,
    collate_fn: Callable[[list[Any]], Any],
    salt: int,
) -> Callable[[int], Any]:
    """Random batches of this rank's choosing, on its device (probing never uses the carving)."""
    device = torch.device(ctx.device)
    size = len(dataset)  # type: ignore[arg-type]
    rng = np.random.default_rng([ctx.setup.seed, salt, ctx.rank])

    def make_batch(batch_size: int) -> Any:
        indices = rng.integers(0, size, size=batch_size)
        return move_to_device(collate_fn([dataset[int(i)] for i in indices]), device)

    return make_batch


def _probe_in_node_rounds(
    ctx: WorkerContext,
    dataset: Dataset,
    collate_fn: Callable[[list[Any]], Any],
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
    time_loading: bool,
    probing: bool = True,
) -> ProbeResult | None:
    """Probe the workers that need it; those sharing a node take turns so they do not contend.

    Workers on different nodes probe at the same time (round r runs the r-th probing worker
    of every node), so a large cluster spends only (max probing workers per node) probe
    durations. Returns ``None`` on a rank that does not probe.
    """
    nodes: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(nodes, (ray.get_runtime_context().get_node_id(), probing))
    probing_nodes = [node for node, wants in nodes if wants]
    my_node = nodes[ctx.rank][0]
    my_round = [node for node, wants in nodes[: ctx.rank] if wants].count(my_node)
    rounds = max((probing_nodes.count(n) for n in set(probing_nodes)), default=0)
    result: ProbeResult | None = None
    for round_index in range(rounds):
        if probing and round_index == my_round:
            result = _probe_this_worker(ctx, dataset, collate_fn, loss_fn, time_loading)
        dist.barrier()
    return result


def _probe_this_worker(
    ctx: WorkerContext,
    dataset: Dataset,
    collate_fn: Callable[[list[Any]], Any],
    loss_fn: Callable[[torch.nn.Module, Any], torch.Tensor],
    time_loading: bool,
) -> ProbeResult:
    if ctx.model is None:
        raise HeteroError(
            "Probing needs the model: call prepare_model(model) before iterating the loader "
            "returned by prepare_data_loader (or pass fixed_shares to HeteroTrainer)."
        )
    probe_cfg = ctx.setup.probe
    sizes = probe_cfg.batch_sizes or default_probe_batch_sizes(
        ctx.setup.global_batch_size, ctx.world_size, ctx.spec.max_batch
    )
    if ctx.spec.max_batch is not None:
        sizes = sorted({min(b, ctx.spec.max_batch) for b in sizes})
    device = torch.device(ctx.device)
    make_batch = _batch_maker(ctx, dataset, collate_fn, salt=7919)
    module = getattr(ctx.model, "module", ctx.model)
    ctx.bn_sync_enabled = False  # probes are local: no statistics exchange
    set_batchnorm_sync(module, False)
    try:
        return probe_step_costs(
            module,
            make_batch,
            sizes,
            device=device,
            loss_fn=loss_fn,
            warmup=probe_cfg.warmup,
            repeats=probe_cfg.repeats,
            slowdown=ctx.slowdown,
            time_loading=time_loading,
        )
    finally:
        set_batchnorm_sync(module, True)
        ctx.bn_sync_enabled = True


def _on_step_end(ctx: WorkerContext, record: dict[str, Any]) -> None:
    ctx.last_record = record
    ctx.step_records.append(record)
    if len(ctx.step_records) >= ctx.setup.flush_every:
        _flush_records(ctx)
    every = ctx.setup.plan_sync_every
    if ctx.setup.scheduler_name is not None and every > 0 and (record["step"] + 1) % every == 0:
        _sync_with_scheduler(ctx)


def _sync_with_scheduler(ctx: WorkerContext) -> None:
    """A collective at the same step on every rank: adopt the scheduler's pending plan.

    Rank 0 asks the scheduler and broadcasts its answer; a new plan takes effect at the first
    step no rank has carved yet. If the scheduler is unreachable, rank 0 recreates it and
    training goes on with the current plan.
    """
    payload: Any = None
    if ctx.rank == 0:
        current = ctx.schedule.current
        version = current.version if current is not None else 0
        try:
            actor = _scheduler_handle(ctx)
            payload = ray.get(actor.poll.remote(ctx.group_id, version), timeout=10)
            if not payload["known_group"]:
                # A recreated scheduler: tell it who we are and what we run.
                actor.register_group.remote(
                    ctx.group_id, ctx.world_size, current.to_dict() if current else None
                )
        except Exception as exc:  # noqa: BLE001 - training must not stop for the scheduler
            logger.warning("scheduler unreachable (%s); continuing on plan v%s", exc, version)
            ctx.scheduler = None
            payload = None
            try:
                from raytrain_hetero.driver.scheduler import get_or_create_scheduler

                actor = get_or_create_scheduler(
                    ctx.setup.run_id, policy=ctx.setup.policy, live=ctx.setup.live, detached=True
                )
                actor.register_group.remote(
                    ctx.group_id, ctx.world_size, current.to_dict() if current else None
                )
                ctx.scheduler = actor
            except Exception as again:  # noqa: BLE001
                logger.warning("could not recreate the scheduler: %s", again)
    box = [payload]
    dist.broadcast_object_list(box, src=0)
    payload = box[0]
    if not payload:
        return
    ctx.injections = list(payload.get("injections") or [])
    proposal = payload.get("plan")
    if not proposal:
        return
    carved = torch.tensor([ctx.schedule.carved_through], dtype=torch.int64)
    dist.all_reduce(carved, op=dist.ReduceOp.MAX)
    from raytrain_hetero.core.allocation import CostModel

    current = ctx.schedule.current
    plan = Plan(
        version=_next_version(ctx),
        effective_step=int(carved.item()) + 1,
        slices=tuple(int(b) for b in proposal["slices"]),
        costs=tuple(CostModel(float(a), float(b)) for a, b in proposal["costs"]),
        caps=current.caps if current is not None else None,
        min_slice=ctx.setup.min_slice,
        reason=f"live: {proposal['reason']}",
    )
    _install_plan(ctx, plan)


def _flush_records(ctx: WorkerContext, wait: bool = False) -> None:
    _check_pushes(ctx, timeout=30 if wait else 0)
    if ctx.step_records:
        actor = _scheduler_handle(ctx)
        if actor is not None:
            batch = list(ctx.step_records)
            ctx.pending_pushes.append((actor.record_steps.remote(batch), batch))
            ctx.step_records.clear()
        elif len(ctx.step_records) > 10_000:
            del ctx.step_records[:-10_000]  # bounded while no scheduler is reachable
    if wait:
        _check_pushes(ctx, timeout=30)


def _check_pushes(ctx: WorkerContext, timeout: float) -> None:
    """Collect finished pushes; a push to a dead scheduler is re-queued for its successor."""
    if not ctx.pending_pushes:
        return
    refs = [ref for ref, _ in ctx.pending_pushes]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout)
    ready_set = set(ready)
    still: list[Any] = []
    for ref, batch in ctx.pending_pushes:
        if ref not in ready_set:
            still.append((ref, batch))
            continue
        try:
            ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - the scheduler died; look it up again later
            logger.warning("step records not delivered (%s); will resend", type(exc).__name__)
            ctx.scheduler = None
            ctx.step_records[:0] = batch
    ctx.pending_pushes = still


def _scheduler_handle(ctx: WorkerContext) -> Any:
    name = ctx.setup.scheduler_name
    if name is None:
        return None
    if ctx.scheduler is None:
        try:
            ctx.scheduler = ray.get_actor(name, namespace=ctx.setup.scheduler_namespace)
        except ValueError:
            logger.warning("scheduler actor %s not found; measurements stay local", name)
            return None
    return ctx.scheduler
