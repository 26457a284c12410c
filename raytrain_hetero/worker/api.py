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
            raytrain_hetero.report({"epoch": epoch}, checkpoint=...)

``report`` stores the sampler cursor, the plan history and every rank's random-generator
state in the checkpoint, so a restarted group resumes at exactly the next unseen step with the
same Dropout masks. This module (and ``prepare_model_parallel``) alone reads the per-process
runtime (:func:`~raytrain_hetero.worker.runtime.registry.get_runtime`) and hands each part to the
modules that do the work.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import ray
import torch
import torch.distributed as dist
from torch.utils.data import Dataset, Sampler, default_collate

from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.carving import EpochCarver
from raytrain_hetero.core.plan import Plan
from raytrain_hetero.errors import ConfigError, HeteroError, ModelPreparationError
from raytrain_hetero.worker.data.dataset_agreement import (
    RankDataset,
    check_agreement,
    dataset_fingerprint,
)
from raytrain_hetero.worker.data.evaluation import (
    EvaluationLoader,
    evaluation_shares,
    sum_across_ranks,
)
from raytrain_hetero.worker.data.micro_batches import (
    MicroBatch,
    check_micro_batching,
    iterate_micro_batches,
)
from raytrain_hetero.worker.data.ray_data import CarvedShard
from raytrain_hetero.worker.data.sampler import HeteroDataLoader, LoaderState
from raytrain_hetero.worker.measure.probe import default_probe_loss
from raytrain_hetero.worker.plan.calibration import ProbeInputs
from raytrain_hetero.worker.plan.planning import build_plan, next_free_step
from raytrain_hetero.worker.runtime.handoff import checkpoint_due as _checkpoint_due
from raytrain_hetero.worker.runtime.handoff import note_report
from raytrain_hetero.worker.runtime.plan_flow import (
    install_first_plan,
    install_run_plan,
    on_step_end,
)
from raytrain_hetero.worker.runtime.registry import WorkerRuntime, get_runtime
from raytrain_hetero.worker.runtime.resume import (
    apply_pending_rng,
    restore_from_checkpoint,
    write_checkpoint_state,
)
from raytrain_hetero.worker.runtime.shards import open_carved_shard
from raytrain_hetero.worker.setup.faults import fault_point
from raytrain_hetero.worker.setup.identity import all_gather
from raytrain_hetero.worker.state.rng_state import RngState, capture_rng
from raytrain_hetero.worker.sync.guard import install_step_hooks, optimizer_gradients

logger = logging.getLogger(__name__)

__all__ = [
    "checkpoint_due",
    "current_plan",
    "current_step_number",
    "first_step_time",
    "get_dataset_shard",
    "get_device",
    "get_rank_info",
    "group_start_time",
    "log_step_metrics",
    "micro_batches",
    "newest_costs",
    "prepare_data_loader",
    "prepare_eval_data_loader",
    "prepare_model",
    "prepare_optimizer",
    "report",
    "sum_across_ranks",
    "update_plan",
]


def get_device() -> torch.device:
    """The device this worker computes on (chosen per WorkerSpec by the backend)."""
    return torch.device(get_runtime().identity.device)


def get_rank_info() -> dict[str, Any]:
    """This worker's rank, world size, WorkerSpec name, device and worker-group id."""
    identity = get_runtime().identity
    return {
        "rank": identity.rank,
        "world_size": identity.world_size,
        "worker": identity.spec.name,
        "device": identity.device,
        "group": identity.group_id,
    }


def prepare_model(
    model: torch.nn.Module,
    *,
    sync_batchnorm: bool | None = None,
    ddp_kwargs: dict[str, Any] | None = None,
) -> torch.nn.parallel.DistributedDataParallel:
    """Wrap ``model`` for exact heterogeneous data parallelism.

    Moves it to this worker's device, replaces BatchNorm layers by global-statistics
    :class:`~raytrain_hetero.worker.sync.batchnorm.exact.HeteroBatchNorm` (exact under uneven slices, on gloo
    too), or under ``BatchConfig.batchnorm="ghost"`` by
    :class:`~raytrain_hetero.worker.sync.batchnorm.ghost.GhostBatchNorm` (groups of ``ghost_size``),
    and wraps it in DDP with the count-weighted gradient hook.

    Args:
        model: The model, built identically on every worker.
        sync_batchnorm: True: exact global-batch statistics; False: per-slice statistics
            (stock DDP's semantics, inexact under uneven slices); ``None``: the run's
            ``BatchConfig.batchnorm`` (``exact`` by default, YAML ``train.batchnorm``;
            ``ghost`` with ``train.ghost_size``).
        ddp_kwargs: Extra DistributedDataParallel arguments.

    Returns:
        The DDP-wrapped model.
    """
    from raytrain_hetero.worker.sync.ddp import wrap_model

    runtime = get_runtime()
    setup = runtime.identity.setup
    parallel = setup.parallel
    if parallel.model_parallel:
        raise ModelPreparationError(
            f"prepare_model wraps a model for data parallelism, but the run's parallel mode "
            f"is {parallel.mode!r}. Fix: call raytrain_hetero.prepare_model_parallel(model, "
            "example_input=...) instead, or set HeteroTrainer(parallel=...) mode: data."
        )
    ghost_size = None
    if sync_batchnorm is None:
        sync_batchnorm = setup.batch.batchnorm == "exact"
        if setup.batch.batchnorm == "ghost":
            ghost_size = setup.batch.ghost_size
    if setup.batch.memory_cap_mode == "accumulate" and (
        setup.batch.max_memory_fraction is not None
        or any(s.max_micro_batch is not None for s in setup.specs)
    ):
        check_micro_batching(model, exact_batchnorm=sync_batchnorm)
    wrapped = wrap_model(
        model,
        device=runtime.identity.device,
        timing=runtime.timing,
        weighting=setup.batch.weighting,
        sync_batchnorm=sync_batchnorm,
        ghost_size=ghost_size,
        ddp_kwargs=ddp_kwargs,
        collective_timeout_s=runtime.identity.setup.backend.collective_timeout_s,
        guard=runtime.guard,
        collective_delay_s=runtime.identity.spec.emulated_collective_delay_s,
    )
    runtime.model = wrapped
    if runtime.guard is not None:
        runtime.guard.watch(wrapped.parameters())
        install_step_hooks(_skip_step)
    return wrapped


def prepare_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Guard ``optimizer.step``: a step with non-finite gradients on any rank is skipped.

    Optional for an optimizer over a :func:`prepare_model` model's parameters (the guard
    covers those already); needed for one over other parameters, e.g. a
    :func:`prepare_model_parallel` model's. The decision is identical on every rank. A skipped
    step is logged with the rank(s) that produced it and counted
    (``StepRecord.skipped_nonfinite``, ``hetero/nonfinite_steps_skipped``);
    ``GuardConfig.max_consecutive_nonfinite`` in a row stop the run with
    :class:`~raytrain_hetero.errors.NonFiniteStepError`. Steps ``torch.amp.GradScaler`` finds
    non-finite are the scaler's to skip and do not count.

    Returns:
        The same optimizer object, its steps guarded.
    """
    runtime = get_runtime()
    if runtime.guard is not None:
        runtime.guard.mark(optimizer)
    install_step_hooks(_skip_step)
    return optimizer


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
    with all ranks. In a model-parallel mode (``HeteroTrainer(parallel=...)``) every rank of a
    group reads its replica's slice, the union of the group's plan slices
    (:class:`~raytrain_hetero.worker.data.sampler.CarvingBatchSampler`); the probe then times the
    plain model that :func:`~raytrain_hetero.parallel.training.prepare_model_parallel` kept.

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
    runtime = get_runtime()
    try:
        size = len(dataset)  # type: ignore[arg-type]
    except TypeError as exc:
        raise ConfigError(
            "prepare_data_loader needs a map-style dataset with len(); iterable datasets "
            "cannot be carved exactly (a Ray Data pipeline: HeteroTrainer(datasets=...))."
        ) from exc
    carver = _carver(runtime, size, shuffle=True)
    _check_same_dataset(runtime, dataset_fingerprint(dataset, size))
    runtime.loader = LoaderState(carver, restore_from_checkpoint(runtime, carver))
    inputs = ProbeInputs(
        dataset=dataset,
        collate_fn=dataloader_kwargs.get("collate_fn") or default_collate,
        loss_fn=probe_loss or default_probe_loss,
        # The loader-bound price: loading counts in full, or what the processes cannot hide.
        loader_processes=int(dataloader_kwargs.get("num_workers", 0) or 0),
    )

    def ensure_plan() -> None:
        if runtime.plans.current is None:
            install_first_plan(runtime, inputs)

    return HeteroDataLoader(
        dataset,
        **_loader_parts(runtime, ensure_plan),
        move_to_device=move_to_device,
        **dataloader_kwargs,
    )


def prepare_eval_data_loader(
    dataset: Dataset, *, batch_size: int = 256, sampler: Sampler | None = None, **kwargs: Any
) -> EvaluationLoader:
    """This rank's share of an evaluation or prediction set, split by the current plan's
    speeds, every item once over all ranks (:mod:`~raytrain_hetero.worker.data.evaluation`). Build
    and iterate it on every rank; aggregate with :func:`sum_across_ranks` (counts) or a
    torchmetrics metric's ``compute()`` (synchronised, exact for uneven shards).

    Args:
        dataset: The evaluation set, identical on every rank.
        batch_size: Items per step over all ranks (each rank takes its share of each step).
        sampler: Items to shard, in order (e.g. torchgeo's ``GridGeoSampler``); by default
            ``range(len(dataset))``.
        **kwargs: Passed to ``DataLoader`` (``collate_fn``, ``num_workers``...).
    """
    runtime = get_runtime()
    world = runtime.identity.world_size
    return EvaluationLoader(
        dataset,
        source=len(dataset) if sampler is None else sampler,  # type: ignore[arg-type]
        batch_size=batch_size,
        rank=runtime.identity.rank,
        shares=lambda: evaluation_shares(runtime.plans.current, world),
        clock=runtime.timing.clock,
        slowdown=runtime.timing.slowdown,  # EMULATION: the base factor (between steps)
        **kwargs,
    )


def get_dataset_shard(name: str = "train") -> Any:
    """``ray.train.get_dataset_shard``; the carved dataset comes as a
    :class:`~raytrain_hetero.worker.data.ray_data.RayDataShard` (this rank's slice of every global
    batch: ``shard.iter_torch_batches(...)``), any other as Ray's own ``DataIterator``."""
    shard = ray.train.get_dataset_shard(name)
    if not isinstance(shard, CarvedShard):
        return shard
    runtime = get_runtime()
    return open_carved_shard(
        runtime,
        shard,
        _carver(runtime, shard.rows, shuffle=False),  # Ray Data orders the rows
        parts=lambda ensure_plan: _loader_parts(runtime, ensure_plan),
        install=lambda plan: install_run_plan(runtime, plan),
    )


def log_step_metrics(**metrics: float) -> None:
    """Attach scalar metrics (e.g. ``loss=``) to the current step's record."""
    get_runtime().telemetry.log(metrics)


def current_step_number() -> int:
    """Global step number (optimizer steps since the run began) of the step in progress."""
    step = get_runtime().timing.current
    if step is None:
        raise HeteroError(
            "No step in progress: call this inside the loop over the prepared loader."
        )
    return step.global_step


def micro_batches(batch: Any) -> Iterator[MicroBatch]:
    """This step's slice in parts that fit the worker's memory cap; a gradient-accumulation loop.

    Under ``BatchConfig.memory_cap_mode="accumulate"`` a slice larger than the worker's cap
    in samples per pass (``WorkerSpec.max_micro_batch``, or the probe's cap from
    ``max_memory_fraction``) comes in parts of at most the cap; otherwise (no cap, a slice
    within it, or ``"slice"`` mode) the batch comes whole with weight 1 and the step is
    exactly the plain loop's. Scale each part's mean loss by its weight::

        for batch in loader:
            optimizer.zero_grad()
            for part in raytrain_hetero.micro_batches(batch):
                loss = loss_fn(model(part.data["image"]), part.data["label"])
                (loss * part.weight).backward()
            optimizer.step()

    The gradients are synchronised once, after the last part, so the update is the
    single-device update for the global batch (models with exact BatchNorm are refused by
    :func:`prepare_model`; with ``batchnorm: local`` each part normalises by its own
    statistics). ``batch`` is what the prepared loader yielded for the step in progress.
    """
    runtime = get_runtime()
    step = runtime.timing.current
    if step is None:
        raise HeteroError(
            "micro_batches(batch) needs a step in progress: call it inside the loop over the "
            "loader returned by prepare_data_loader."
        )
    setup, caps = runtime.identity.setup, runtime.plans.pass_caps
    cap = None
    if setup.batch.memory_cap_mode == "accumulate" and caps is not None:
        cap = caps[runtime.identity.rank]
    yield from iterate_micro_batches(
        batch, step.local_count, cap, runtime.model, setup.batch.slice_quantum
    )


def checkpoint_due() -> bool:
    """Whether to write a checkpoint after this step's update: the step the group agreed on
    after a preemption notice (the last that fits before the node's deadline).

    Local and cheap (no collective): call it every step, on every rank, and when it is true
    write a checkpoint and :func:`report` it as at any other step (every rank calls
    ``report``; the writer passes the checkpoint). The group then ends at this step's end and
    the run continues at once on the nodes that stay, from exactly this step::

        for batch in loader:
            ...  # the step's update
            if raytrain_hetero.checkpoint_due():
                raytrain_hetero.report(metrics, checkpoint=save_checkpoint())

    Always false when ``ElasticConfig.preemption_notice`` is off.
    """
    return _checkpoint_due(get_runtime())


def first_step_time() -> float | None:
    """When this worker group's first step began (``time.time()``), None before it: with the
    moment its fit was called, the group's whole start (Ray Train's controller, placement
    group, worker processes, the library's own start-up, the restore)."""
    return get_runtime().plans.first_step_at


def group_start_time() -> float:
    """When this worker group started on this worker (``time.time()`` at the backend's
    set-up, after Ray Train's controller, placement group and worker processes): with
    :func:`first_step_time`, the library's own part of the group's start."""
    return get_runtime().plans.started_at


def newest_costs() -> tuple[CostModel, ...] | None:
    """Every rank's newest cost model (``t(b) = alpha + beta * b``, rank order): the current
    plan's, or what the first measured steps gave when the plan they measured stayed (one
    worker, or a gain under the threshold); None before any."""
    return get_runtime().plans.newest_costs()


def current_plan() -> Plan | None:
    """The newest plan of this worker group."""
    return get_runtime().plans.current


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
    runtime = get_runtime()
    if (shares is None) == (costs is None):
        raise ConfigError("update_plan needs exactly one of shares= or costs=.")
    effective_step = next_free_step(runtime.plans)
    payload = [(shares, costs)]
    dist.broadcast_object_list(payload, src=0)
    shares, costs = payload[0]
    plan = build_plan(
        runtime.identity,
        runtime.plans,
        shares=shares,
        costs=costs,
        effective_step=effective_step,
        reason=reason,
    )
    fault_point(runtime.identity, "plan_switch", step=plan.effective_step - 1)
    return install_run_plan(runtime, plan)


def admission_report() -> dict[str, Any]:
    """Which workers would train, and which stand by; a collective, call it on every rank.

    :func:`~raytrain_hetero.worker.plan.admission.group_report` on this worker's runtime
    (after the first plan). Only says; ``ProbeConfig.group`` decides whether the trainer acts
    on it. Used by ``raytrain-hetero probe``.
    """
    from raytrain_hetero.worker.plan.admission import group_report

    return group_report(get_runtime())


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
    runtime = get_runtime()
    enriched = dict(metrics)
    plan = runtime.plans.current
    if runtime.loader is not None:
        enriched["hetero/global_step"] = runtime.loader.carver.global_step(runtime.loader.cursor)
        enriched["hetero/epoch"] = runtime.loader.cursor.epoch
    if runtime.plans.first_step_at is not None:  # this group's start to its first step
        enriched["hetero/startup_s"] = runtime.plans.first_step_at - runtime.plans.started_at
    if plan is not None:
        enriched["hetero/plan_version"] = plan.version
        enriched["hetero/slices"] = list(plan.slices)
    if runtime.guard is not None:
        enriched["hetero/nonfinite_steps_skipped"] = runtime.guard.skipped_total
    # Every rank's generators go into the checkpoint, whichever rank writes it.
    rng: list[RngState] = [capture_rng(runtime.identity.device)]
    if dist.is_initialized():
        # Every rank reports: share each rank's latest figures so rank 0's metrics carry all.
        last = runtime.telemetry.last_record
        figures = None
        if last is not None:
            figures = {
                "samples_per_s": last.samples_per_s,
                "slice": last.slice,
                "weight": last.weight,
            }
        gathered = all_gather((figures, rng[0].to_dict()))
        for rank, (theirs, _) in enumerate(gathered):
            if theirs is not None:
                for key in ("samples_per_s", "slice", "weight"):
                    enriched[f"hetero/rank{rank}/{key}"] = theirs[key]
        rng = [RngState.from_dict(state) for _, state in gathered]
    state_file = None
    if checkpoint is not None:
        state_file = write_checkpoint_state(runtime, Path(checkpoint.path), rng)
    fault_point(
        runtime.identity,
        "checkpoint_commit",
        step=enriched.get("hetero/global_step", 0) - 1,
        state_file=state_file,
    )
    if runtime.scheduler is not None:
        runtime.scheduler.flush(wait=True)
    started = time.perf_counter()
    ray.train.report(enriched, checkpoint=checkpoint, **kwargs)
    note_report(runtime, checkpoint, time.perf_counter() - started)


def _carver(runtime: WorkerRuntime, size: int, *, shuffle: bool) -> EpochCarver:
    """The run's carving of ``size`` samples (Ray Data: unshuffled stream positions).

    Data smaller than one global batch is named once (rank 0), and plans then split the
    ``size`` samples a step really holds (``PlanState.largest_step``)."""
    setup = runtime.identity.setup
    batch = setup.batch.global_batch_size
    if size < batch:
        runtime.plans.largest_step = size
        if runtime.identity.rank == 0:
            logger.warning(
                "the carved data has %d samples, fewer than one global batch (%d): every "
                "step carves all %d over %d workers. Fix: set global_batch_size to at most %d, "
                "or give the loader more data.",
                size,
                batch,
                size,
                runtime.identity.world_size,
                size,
            )
    return EpochCarver(
        dataset_size=size,
        global_batch_size=setup.batch.global_batch_size,
        seed=setup.batch.seed,
        min_step_size=setup.max_world_size * setup.batch.min_slice_samples,
        shuffle=shuffle,
    )


def _loader_parts(runtime: WorkerRuntime, ensure_plan: Callable[[], None]) -> dict[str, Any]:
    """The step-accounting arguments of a carved loader (map-style or Ray Data)."""
    return {
        "state": runtime.loader,
        "schedule": runtime.plans.schedule,
        "identity": runtime.identity,
        "timing": runtime.timing,
        "telemetry": runtime.telemetry,
        "ensure_plan": ensure_plan,
        "on_step_end": lambda record: on_step_end(runtime, record),
        "before_epoch": lambda: apply_pending_rng(runtime),
    }


def _check_same_dataset(runtime: WorkerRuntime, fingerprint: Any) -> None:
    """All ranks gather their dataset fingerprints; raise naming the ranks that differ."""
    if not dist.is_initialized() or runtime.identity.world_size < 2:
        return
    node = f"{ray.get_runtime_context().get_node_id()[:12]} ({socket.gethostname()})"
    gathered = all_gather((node, fingerprint))
    check_agreement([RankDataset(rank, node, fp) for rank, (node, fp) in enumerate(gathered)])


def _skip_step(optimizer: torch.optim.Optimizer) -> bool:
    """The step hooks' question (any optimizer.step): must the step in progress be skipped?"""
    runtime = get_runtime()
    step = runtime.timing.current
    guard = runtime.guard
    if step is None or guard is None or not guard.covers(optimizer):
        return False  # outside the prepared loader's steps, or not a guarded optimizer
    verdict = guard.verdict(step.global_step, lambda: optimizer_gradients(optimizer))
    if not verdict.skip:
        return False
    runtime.telemetry.skipped_nonfinite = True
    rank = runtime.identity.rank
    if rank == 0 or rank in verdict.ranks:
        logger.warning(
            "step %d skipped on every rank: non-finite gradients from rank(s) %s "
            "(%d in a row, at most %d)",
            verdict.step,
            list(verdict.ranks),
            verdict.consecutive,
            guard.max_consecutive,
        )
    return True
