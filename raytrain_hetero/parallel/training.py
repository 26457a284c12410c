"""Training in a model-parallel mode through ``HeteroTrainer``: :func:`prepare_model_parallel`.

Inside the train loop that :class:`~raytrain_hetero.driver.trainer.HeteroTrainer` runs, with
``parallel=ParallelConfig(mode="conv_split" | "branches", ...)``::

    pm = rh.prepare_model_parallel(model, example_input=x)
    optimizer = rh.prepare_optimizer(torch.optim.SGD(pm.parameters(), lr=0.1))
    loader = rh.prepare_data_loader(dataset)            # every rank reads its replica's slice
    pm.restore(model_state, optimizer, optimizer_state)  # optional: a full (unsplit) checkpoint
    for epoch in range(loader.epoch, epochs):
        pm.maybe_resplit(optimizer)                      # conv_split: re-probe, hysteresis
        for batch in loader:
            step = pm.train_step(batch["image"], batch["label"], F.cross_entropy, optimizer)
        state = pm.full_state_dict()                     # the single-device state_dict

The data plan stays per rank (see :mod:`raytrain_hetero.worker.sampler`); the split of each
layer, or the branch placement, is agreed from per-position costs combined over the replicas
(the slowest replica's rank at each position decides), so it is the same in every replica and
the ranks holding the same parameters all-reduce their gradients across replicas
(:mod:`raytrain_hetero.parallel.layout`).

This module reads the per-process worker runtime (the one other reader besides
:mod:`raytrain_hetero.worker.api`): it is the model-parallel counterpart of ``prepare_model``.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray
import torch
import torch.distributed as dist
from torch import nn

from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.branch_placement import (
    BranchPlacement,
    check_branch_group,
    place_branches,
)
from raytrain_hetero.core.kernel_split import proposed_resplit
from raytrain_hetero.errors import ModelParallelError
from raytrain_hetero.parallel import conv_state
from raytrain_hetero.parallel.branch_costs import measure_branch_costs
from raytrain_hetero.parallel.branches import BranchPipeline, branch_model_of
from raytrain_hetero.parallel.conv_split import (
    CollectiveHooks,
    SplitConv2d,
    check_replicas_identical,
    split_conv_layers,
    split_layers,
)
from raytrain_hetero.parallel.layout import (
    ParallelGroups,
    ParallelLayout,
    build_groups,
    reduce_across_replicas,
)
from raytrain_hetero.parallel.optimizer_state import (
    copy_to_cpu,
    full_optimizer_state_of_share,
    share_of_full_optimizer_state,
)
from raytrain_hetero.worker.checkpoint_state import require_state
from raytrain_hetero.worker.context import WorkerRuntime, get_runtime

__all__ = ["ParallelModel", "ParallelStep", "prepare_model_parallel"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ParallelStep:
    """What one :meth:`ParallelModel.train_step` did on this rank.

    Attributes:
        loss: Mean loss over the whole global batch (every replica's, sample-weighted).
        bytes_sent: Bytes this rank sent during the step (split-layer gathers and input
            gradient all-reduces, or branch activations and gradients; plus the cross-replica
            gradient all-reduce), ring-collective volumes.
        bytes_received: Bytes this rank received during the step.
    """

    loss: float
    bytes_sent: int
    bytes_received: int


def _upcoming_step(runtime: WorkerRuntime) -> int:
    """Global step the next batch belongs to (for the EMULATION factor of a probe)."""
    if runtime.loader is not None:
        return runtime.loader.carver.global_step(runtime.loader.cursor)
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return 0
    with checkpoint.as_directory() as directory:
        return require_state(Path(directory), checkpoint.path).global_step


def _batch_of(example: torch.Tensor, size: int) -> torch.Tensor:
    """``example`` repeated or cut along dimension 0 to ``size`` samples."""
    reps = -(-size // int(example.shape[0]))
    return example.repeat(reps, *([1] * (example.dim() - 1)))[:size]


def _ring_bytes(numel: int, element: int, ranks: int) -> int:
    """Bytes each rank sends (and receives) in a ring all-reduce of ``numel`` elements."""
    return 0 if ranks < 2 else int(2 * (ranks - 1) * numel * element // ranks)


class ParallelModel:
    """A model split (``conv_split``) or placed (``branches``) over its replica's ranks.

    Built by :func:`prepare_model_parallel`; not constructed directly.

    Attributes:
        mode: ``"conv_split"`` or ``"branches"``.
        groups: This rank's process groups and place in the layout.
        module: ``conv_split``: the split model (callable on every rank of the group, a
            collective). ``branches``: the model, its parts placed elsewhere on ``meta``.
        pipeline: ``branches``: the :class:`~raytrain_hetero.parallel.BranchPipeline`.
    """

    def __init__(
        self,
        runtime: WorkerRuntime,
        module: nn.Module,
        template: nn.Module,
        groups: ParallelGroups,
        *,
        layers: tuple[str, ...] = (),
        pipeline: BranchPipeline | None = None,
        example_input: torch.Tensor | None = None,
    ) -> None:
        self._runtime = runtime
        self.mode = runtime.identity.setup.parallel.mode
        self.module = module
        self._template = template
        self.groups = groups
        self.layers = layers
        self.pipeline = pipeline
        self._example = example_input
        self._traffic = [0, 0]  # bytes sent, received by the split layers in this step
        self._full_index = {
            id(p): i
            for i, p in enumerate((pipeline.declared.model if pipeline else module).parameters())
        }
        for _, layer in split_layers(module):
            layer.register_forward_pre_hook(self._count_layer_traffic, with_kwargs=False)

    # ------------------------------------------------------------------ parameters, modes

    def parameters(self) -> Iterator[nn.Parameter]:
        """This rank's parameters (its kernels and the replicated layers, or its branches and
        the head), in the single-device model's order: build the optimizer over them."""
        if self.pipeline is not None:
            return self.pipeline.parameters()
        return self.module.parameters()

    def train(self, mode: bool = True) -> ParallelModel:
        """Training mode (BatchNorm batch statistics, dropout) on the whole model."""
        (self.pipeline or self.module).train(mode)
        return self

    def eval(self) -> ParallelModel:
        """Evaluation mode."""
        return self.train(False)

    def layout(self) -> ParallelLayout:
        """The split or placement of every world rank (the same in every replica)."""
        if self.pipeline is not None:
            placement = self.pipeline.placement
            return ParallelLayout.build(
                "branches",
                self.groups.groups,
                branch_ranks=placement.branch_ranks,
                head_position=placement.head_rank,
            )
        kernels = [(name, layer.kernels_per_rank) for name, layer in split_layers(self.module)]
        return ParallelLayout.build("conv_split", self.groups.groups, kernels=kernels)

    # ------------------------------------------------------------------ training

    def _count_layer_traffic(self, layer: nn.Module, inputs: tuple[Any, ...]) -> None:
        assert isinstance(layer, SplitConv2d)
        x = inputs[0]
        ranks = len(layer.kernels_per_rank)
        element = x.element_size()
        sent, received = layer.gather_bytes(tuple(x.shape), element)  # exact-size broadcasts
        grad = (
            _ring_bytes(x.numel(), element, ranks)
            if x.requires_grad and torch.is_grad_enabled()
            else 0
        )
        self._traffic[0] += sent + grad
        self._traffic[1] += received + grad

    def _replica_weight(self, batch: int) -> float:
        """``n_i / N`` of this rank's replica in the step in progress."""
        step = self._runtime.timing.current
        members = self.groups.members()
        if step is not None:
            total = sum(step.counts)
            mine = sum(step.counts[r] for r in members)
            if mine != batch:
                raise ModelParallelError(
                    f"train_step got {batch} samples but this replica's slice of step "
                    f"{step.global_step} is {mine}; pass the whole batch of the prepared loader"
                )
            return mine / total
        if self.groups.peers is None:
            return 1.0
        counts = torch.tensor([float(batch)], dtype=torch.float64)
        dist.all_reduce(counts, group=self.groups.peers)
        return batch / float(counts[0])

    def train_step(
        self,
        inputs: torch.Tensor,
        target: torch.Tensor,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        optimizer: torch.optim.Optimizer,
    ) -> ParallelStep:
        """One optimizer step on this replica's batch (a collective over the whole world).

        ``optimizer.zero_grad``, forward and backward (split layers or branch pipeline), the
        cross-replica gradient all-reduce weighted by replica sample counts (exact), then
        ``optimizer.step()``. ``loss_fn`` must return the mean loss over the batch.
        """
        timing = self._runtime.timing
        optimizer.zero_grad(set_to_none=True)
        self._traffic = [0, 0]
        if self.pipeline is not None:
            branch = self.pipeline.forward_backward(inputs, target, loss_fn)
            loss = torch.tensor(branch.loss, dtype=torch.float64)
            sent, received = branch.bytes_sent, branch.bytes_received
        else:
            loss = loss_fn(self.module(inputs), target)
            loss.backward()
            sent, received = self._traffic
        weight = self._replica_weight(int(inputs.shape[0]))
        params = list(self.parameters())
        timing.before_collective()  # the step's compute since the last exchange, stretched
        value = reduce_across_replicas(params, loss, weight, self.groups.peers)
        timing.after_collective()
        if self.groups.peers is not None:
            numel = sum(p.grad.numel() for p in params if p.grad is not None) + 1
            element = params[0].element_size() if params else 8
            ring = _ring_bytes(numel, element, self.groups.replicas)
            sent, received = sent + ring, received + ring
        optimizer.step()
        return ParallelStep(loss=value, bytes_sent=int(sent), bytes_received=int(received))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor | None:
        """The model's output: ``conv_split`` on every rank of the group (a collective);
        ``branches`` on the head rank only (None elsewhere)."""
        if self.pipeline is not None:
            return self.pipeline.predict(inputs)
        return self.module(inputs)

    __call__ = forward

    # ------------------------------------------------------------------ re-split

    def maybe_resplit(
        self, optimizer: torch.optim.Optimizer | None
    ) -> dict[str, tuple[int, ...]] | None:
        """``conv_split``: re-probe every split layer and move kernels when it pays.

        A collective; call it on every rank between steps (e.g. at each epoch start). Each
        layer's fresh per-kernel costs (combined over the replicas) go through
        :func:`~raytrain_hetero.core.kernel_split.proposed_resplit` with the scheduler's
        ``improvement_threshold`` as hysteresis; the layers that change move their weights
        and optimizer state (:func:`~raytrain_hetero.parallel.resplit`).

        Returns:
            The new split of each changed layer, or None when nothing changed (and always
            None in ``branches`` mode: the placement is fixed for the worker group's life).
        """
        if self.pipeline is not None:
            return None
        min_gain = self._runtime.identity.setup.scheduler.policy.improvement_threshold
        costs = _probe_split_costs(
            self._runtime, self._template, self.layers, self.groups, self._example
        )
        moves = {}
        for name, layer in split_layers(self.module):
            proposal = proposed_resplit(
                layer.kernels_per_rank,
                [c.beta for c in costs[name]],
                fixed_costs=[c.alpha for c in costs[name]],
                min_gain=min_gain,
            )
            if proposal is not None:
                moves[name] = proposal
        if not moves:
            return None
        conv_state.resplit(self.module, optimizer, moves)
        logger.info("re-split %s", moves)
        return moves

    # ------------------------------------------------------------------ state

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The single-device model's state_dict (a collective over the replica's group).

        Loadable by the plain model, ``prepare_model`` (data mode) or any other layout.
        BatchNorm running statistics are this replica's.
        """
        if self.pipeline is not None:
            return self.pipeline.full_state_dict()
        state = conv_state.full_state_dict(self.module)
        return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}

    def full_optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer's state_dict as torch.optim over the single-device model's
        ``parameters()`` holds it (index-keyed, same order); a collective over the group.

        A snapshot: CPU copies, which later steps do not change (``optimizer.state_dict()``
        itself returns the live tensors)."""
        if self.pipeline is not None:
            return full_optimizer_state_of_share(optimizer, self._full_index, self.groups.split)
        return copy_to_cpu(conv_state.full_optimizer_state_dict(self.module, optimizer))

    def restore(
        self,
        model_state: Mapping[str, torch.Tensor],
        optimizer: torch.optim.Optimizer | None = None,
        optimizer_state: Mapping[str, Any] | None = None,
    ) -> None:
        """Load a full (unsplit) model state and optionally the optimizer's full state.

        The states may come from any mode or world size (``full_state_dict`` /
        ``full_optimizer_state_dict`` here, or data mode's ``model.module.state_dict()`` and
        ``optimizer.state_dict()``). Not a collective.
        """
        if self.pipeline is not None:
            self.pipeline.load_full_state_dict(model_state)
        else:
            conv_state.load_full_state_dict(self.module, model_state)
        if optimizer is None or optimizer_state is None:
            return
        if self.pipeline is not None:
            optimizer.load_state_dict(
                share_of_full_optimizer_state(optimizer, self._full_index, optimizer_state)
            )
        else:
            conv_state.load_full_optimizer_state_dict(self.module, optimizer, optimizer_state)

    def unsplit_model(self) -> nn.Module:
        """A plain single-device copy of the current model (a collective over the group),
        for validation or prediction on any rank."""
        plain = copy.deepcopy(self._template)
        plain.load_state_dict(self.full_state_dict())
        return plain


# ---------------------------------------------------------------------------- preparation


def _combine_over_replicas(rows: list[Any], groups: ParallelGroups) -> list[Any]:
    """Per position, the rows of the ranks at that position in every replica."""
    return [[rows[members[pos]] for members in groups.groups] for pos in range(groups.group_size)]


def _probe_split_costs(
    runtime: WorkerRuntime,
    template: nn.Module,
    layers: tuple[str, ...],
    groups: ParallelGroups,
    example: torch.Tensor | None,
) -> dict[str, tuple[CostModel, ...]]:
    """Per-kernel cost of each layer per position: the slowest replica's (a collective)."""
    identity = runtime.identity
    setup = identity.setup
    if example is None:
        raise ModelParallelError("conv_split needs example_input to probe its layers")
    replica_batch = max(1, setup.batch.global_batch_size // groups.replicas)
    shapes: dict[str, tuple[int, ...]] = {}
    modules = dict(template.named_modules())
    handles = [
        modules[name].register_forward_pre_hook(
            lambda _m, args, name=name: shapes.__setitem__(name, tuple(args[0].shape))
        )
        for name in layers
    ]
    was_training = template.training
    try:
        template.eval()
        with torch.no_grad():
            template(_batch_of(example, 1).to(identity.device))
    finally:
        template.train(was_training)
        for handle in handles:
            handle.remove()
    slowdown = runtime.slowdowns.factor_at(_upcoming_step(runtime))
    mine = {}
    with torch.random.fork_rng(devices=[]):  # probes must not shift training's random draws
        for name in layers:
            conv = modules[name]
            assert isinstance(conv, nn.Conv2d)
            cost = conv_state.probe_kernel_cost(
                conv,
                (replica_batch, *shapes[name][1:]),
                device=identity.device,
                slowdown=slowdown,
                warmup=max(1, setup.probe.warmup),
                repeats=max(3, setup.probe.repeats),
            )
            mine[name] = (cost.alpha, cost.beta)
    rows: list[Any] = [None] * identity.world_size
    dist.all_gather_object(rows, mine)
    combined = {}
    for name in layers:
        per_position = _combine_over_replicas([row[name] for row in rows], groups)
        combined[name] = tuple(
            CostModel(alpha=max(a for a, _ in pos), beta=max(b for _, b in pos))
            for pos in per_position
        )
    return combined


def _place_branches(
    runtime: WorkerRuntime, model: nn.Module, groups: ParallelGroups, example: torch.Tensor
) -> BranchPlacement:
    """Branch placement per position from branch costs, the slowest replica's (collective)."""
    identity = runtime.identity
    declared = branch_model_of(model)
    names = declared.branch_names
    check_branch_group(names, groups.group_size)
    replica_batch = max(1, identity.setup.batch.global_batch_size // groups.replicas)
    with torch.random.fork_rng(devices=[]):
        costs = measure_branch_costs(
            model,
            _batch_of(example, replica_batch).to(identity.device),
            slowdown=runtime.slowdowns.factor_at(_upcoming_step(runtime)),
            device=identity.device,
        )
    rows: list[Any] = [None] * identity.world_size
    dist.all_gather_object(rows, costs)
    per_position = _combine_over_replicas(rows, groups)
    branch_costs = [
        [max(row.branches[b][1] for row in pos) for b in range(len(names))] for pos in per_position
    ]
    head_costs = [max(row.head for row in pos) for pos in per_position]
    return place_branches(names, branch_costs, head_costs)


def prepare_model_parallel(model: nn.Module, *, example_input: torch.Tensor) -> ParallelModel:
    """Split (``conv_split``) or place (``branches``) ``model`` over this rank's group.

    Reads ``HeteroSetup.parallel`` (``HeteroTrainer(parallel=...)``). A collective: every
    rank calls it with the same model (same seed). Steps: move the model to this worker's
    device; create the split and peer process groups (the run's collective timeout); check
    the model is identical on every rank; probe (per-kernel costs of each split layer at the
    replica's batch size, or each branch's cost; EMULATION factor of the upcoming step through
    the one slowdown emulator), combine the costs over the replicas (per position the
    slowest) and split or place. The plain model is also kept (as a copy) for the data
    plan's speed probe and for :meth:`ParallelModel.unsplit_model`.

    Args:
        model: The single-device model, built identically on every rank.
        example_input: One batch of inputs (any batch size; used for shapes and probes).

    Returns:
        The :class:`ParallelModel`.

    Raises:
        ModelParallelError: Mode ``data`` (call ``prepare_model``), a layer that cannot be
            split, a model without declared branches, a group size that does not fit the
            branches, or a model that differs between ranks.
    """
    runtime = get_runtime()
    identity = runtime.identity
    config = identity.setup.parallel
    if not config.model_parallel:
        raise ModelParallelError(
            "prepare_model_parallel needs HeteroTrainer(parallel=ParallelConfig(mode="
            "'conv_split' or 'branches')); the run's parallel mode is 'data'. Fix: call "
            "raytrain_hetero.prepare_model(model) for data parallelism, or set the mode."
        )
    model = model.to(identity.device)
    example_input = example_input.detach().to(identity.device)
    groups = build_groups(
        config, identity.rank, identity.world_size, identity.setup.backend.collective_timeout_s
    )
    check_replicas_identical(model)  # the whole model, every rank of the world
    template = copy.deepcopy(model)
    runtime.model = template  # the data plan's speed probe times the plain model
    hooks = CollectiveHooks(
        before=runtime.timing.before_collective, after=runtime.timing.after_collective
    )
    if config.mode == "conv_split":
        costs = _probe_split_costs(runtime, template, config.layers, groups, example_input)
        split_conv_layers(
            model, list(config.layers), groups.split, costs=costs, hooks=hooks, check=False
        )
        pm = ParallelModel(
            runtime, model, template, groups, layers=config.layers, example_input=example_input
        )
    else:
        placement = _place_branches(runtime, model, groups, example_input)
        pipeline = BranchPipeline(
            model,
            placement,
            rank=groups.position,
            group=groups.split,
            micro_batches=config.micro_batches,
            device=identity.device,
        )
        pm = ParallelModel(runtime, model, template, groups, pipeline=pipeline)
    layout = pm.layout()
    logger.info(
        "model-parallel layout (%s, %d replica(s) x %d): rank %d holds %s",
        config.mode,
        groups.replicas,
        groups.group_size,
        identity.rank,
        layout.text(identity.rank),
    )
    return pm
