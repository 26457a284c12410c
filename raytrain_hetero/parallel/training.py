"""Training in a model-parallel mode through ``HeteroTrainer``: :func:`prepare_model_parallel`.

With ``parallel=ParallelConfig(mode="conv_split" | "branches", ...)``::

    pm = rh.prepare_model_parallel(model, example_input=x)
    optimizer = rh.prepare_optimizer(torch.optim.SGD(pm.parameters(), lr=0.1))
    loader = rh.prepare_data_loader(dataset)            # every rank reads its replica's slice
    pm.restore(model_state, optimizer, optimizer_state)  # optional: a full (unsplit) checkpoint
    for epoch in range(loader.epoch, epochs):
        pm.maybe_resplit(optimizer)                      # conv_split: re-probe, hysteresis
        for batch in loader:
            step = pm.train_step(batch["image"], batch["label"], F.cross_entropy, optimizer)
        state = pm.full_state_dict()                     # the single-device state_dict

The split or placement is agreed from per-position costs combined over the replicas (the
slowest replica's rank decides), so it is the same in every replica and the ranks holding the
same parameters all-reduce across replicas. What differs between the modes is a
:class:`~raytrain_hetero.parallel.strategies.ParallelStrategy`.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from raytrain_hetero.errors import ModelParallelError
from raytrain_hetero.parallel.conv_split import check_replicas_identical
from raytrain_hetero.parallel.layout import (
    ParallelGroups,
    ParallelLayout,
    build_groups,
    reduce_across_replicas,
)
from raytrain_hetero.parallel.strategies import STRATEGIES, ParallelStrategy, ring_bytes
from raytrain_hetero.worker.runtime.registry import WorkerRuntime, get_runtime

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


class ParallelModel:
    """A model split (``conv_split``) or placed (``branches``) over its replica's ranks.

    Built by :func:`prepare_model_parallel`; not constructed directly.

    Attributes:
        mode: ``"conv_split"`` or ``"branches"``.
        groups: This rank's process groups and place in the layout.
        strategy: What the mode does
            (:class:`~raytrain_hetero.parallel.strategies.ConvSplitStrategy` or
            :class:`~raytrain_hetero.parallel.strategies.BranchStrategy`, whose ``pipeline``
            is the :class:`~raytrain_hetero.parallel.BranchPipeline`).
        module: ``conv_split``: the split model (callable on every rank of the group, a
            collective). ``branches``: the model, its parts placed elsewhere on ``meta``.
    """

    def __init__(
        self,
        runtime: WorkerRuntime,
        strategy: ParallelStrategy,
        template: nn.Module,
        groups: ParallelGroups,
    ) -> None:
        self._runtime = runtime
        self.strategy = strategy
        self.mode = strategy.mode
        self.module = strategy.module
        self._template = template
        self.groups = groups

    def parameters(self) -> Iterator[nn.Parameter]:
        """This rank's parameters (its kernels and the replicated layers, or its branches and
        the head), in the single-device model's order: build the optimizer over them."""
        return self.strategy.parameters()

    def train(self, mode: bool = True) -> ParallelModel:
        """Training mode (BatchNorm batch statistics, dropout) on the whole model."""
        self.module.train(mode)
        return self

    def eval(self) -> ParallelModel:
        """Evaluation mode."""
        return self.train(False)

    def layout(self) -> ParallelLayout:
        """The split or placement of every world rank (the same in every replica)."""
        return self.strategy.layout(self.groups)

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
        loss, sent, received = self.strategy.forward_backward(inputs, target, loss_fn)
        weight = self._replica_weight(int(inputs.shape[0]))
        params = list(self.parameters())
        timing.before_collective()  # the step's compute since the last exchange, stretched
        value = reduce_across_replicas(params, loss, weight, self.groups.peers)
        timing.after_collective()
        if self.groups.peers is not None:
            numel = sum(p.grad.numel() for p in params if p.grad is not None) + 1
            element = params[0].element_size() if params else 8
            ring = ring_bytes(numel, element, self.groups.replicas)
            sent, received = sent + ring, received + ring
        optimizer.step()
        return ParallelStep(loss=value, bytes_sent=int(sent), bytes_received=int(received))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor | None:
        """The model's output: ``conv_split`` on every rank of the group (a collective);
        ``branches`` on the head rank only (None elsewhere)."""
        return self.strategy.forward(inputs)

    __call__ = forward

    def maybe_resplit(
        self, optimizer: torch.optim.Optimizer | None
    ) -> dict[str, tuple[int, ...]] | None:
        """``conv_split``: re-probe every split layer and move kernels when it pays.

        A collective between steps (e.g. at each epoch start), with the scheduler's
        ``improvement_threshold`` as hysteresis; changed layers move their weights and
        optimizer state. Returns the new split of each changed layer, or None (always in
        ``branches`` mode: the placement is fixed for the worker group's life).
        """
        return self.strategy.maybe_resplit(optimizer)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The single-device model's state_dict (a collective over the replica's group).

        Loadable by the plain model, ``prepare_model`` (data mode) or any other layout.
        BatchNorm running statistics are this replica's.
        """
        return self.strategy.full_state_dict()

    def full_optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer's state_dict as torch.optim over the single-device model's
        ``parameters()`` holds it; a collective over the group. A snapshot of CPU copies
        (``optimizer.state_dict()`` itself returns the live tensors)."""
        return self.strategy.full_optimizer_state_dict(optimizer)

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
        self.strategy.restore(model_state, optimizer, optimizer_state)

    def unsplit_model(self) -> nn.Module:
        """A plain single-device copy of the current model (a collective over the group),
        for validation or prediction on any rank."""
        plain = copy.deepcopy(self._template)
        plain.load_state_dict(self.full_state_dict())
        return plain


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
    strategy = STRATEGIES[config.mode].prepare(runtime, model, template, groups, example_input)
    pm = ParallelModel(runtime, strategy, template, groups)
    logger.info(
        "model-parallel layout (%s, %d replica(s) x %d): rank %d holds %s",
        config.mode,
        groups.replicas,
        groups.group_size,
        identity.rank,
        pm.layout().text(identity.rank),
    )
    return pm
