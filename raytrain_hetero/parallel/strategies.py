"""The two model-parallel strategies behind :class:`~raytrain_hetero.parallel.ParallelModel`:
:class:`ConvSplitStrategy` (``conv_split``: conv kernels split by probed per-kernel cost,
re-split when it pays) and :class:`BranchStrategy` (``branches``: branches and head placed by
measured costs, pipelined, placed once). Costs are combined over the replicas (per position the
slowest replica's rank decides), so every replica splits or places the model alike without a
broadcast. What both share (replica weight, cross-replica all-reduce, timing) is
:class:`ParallelModel`'s.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

import ray
import torch
from torch import nn

from raytrain_hetero.core.allocation import CostModel
from raytrain_hetero.core.branch_placement import check_branch_group, place_branches
from raytrain_hetero.core.kernel_split import proposed_resplit
from raytrain_hetero.parallel import conv_state
from raytrain_hetero.parallel.branch_costs import measure_branch_costs
from raytrain_hetero.parallel.branch_model import branch_model_of
from raytrain_hetero.parallel.branches import BranchPipeline
from raytrain_hetero.parallel.conv_split import (
    CollectiveHooks,
    SplitConv2d,
    split_conv_layers,
    split_layers,
)
from raytrain_hetero.parallel.layout import ParallelGroups, ParallelLayout
from raytrain_hetero.parallel.optimizer_state import (
    copy_to_cpu,
    full_optimizer_state_of_share,
    share_of_full_optimizer_state,
)
from raytrain_hetero.worker.runtime.registry import WorkerRuntime
from raytrain_hetero.worker.setup.identity import all_gather
from raytrain_hetero.worker.state.checkpoint_state import require_state

__all__ = ["STRATEGIES", "BranchStrategy", "ConvSplitStrategy", "ParallelStrategy", "ring_bytes"]

logger = logging.getLogger(__name__)

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def ring_bytes(numel: int, element: int, ranks: int) -> int:
    """Bytes each rank sends (and receives) in a ring all-reduce of ``numel`` elements."""
    return 0 if ranks < 2 else int(2 * (ranks - 1) * numel * element // ranks)


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


def _per_position(rows: list[Any], groups: ParallelGroups) -> list[Any]:
    """Per position, the rows of the ranks at that position in every replica."""
    return [[rows[members[pos]] for members in groups.groups] for pos in range(groups.group_size)]


class ParallelStrategy(ABC):
    """What differs between the model-parallel modes, behind one :class:`ParallelModel`.

    Each method means what :class:`~raytrain_hetero.parallel.ParallelModel`'s method of the
    same name says (``forward_backward``: forward and backward on the replica's batch,
    returning the loss and this rank's bytes sent and received). ``module`` is the model as
    this rank holds it.
    """

    mode: ClassVar[str]
    module: nn.Module

    @classmethod
    @abstractmethod
    def prepare(
        cls,
        runtime: WorkerRuntime,
        model: nn.Module,
        template: nn.Module,
        groups: ParallelGroups,
        example: torch.Tensor,
    ) -> ParallelStrategy:
        """Probe, combine the costs over the replicas, split or place ``model`` (a collective)."""

    @abstractmethod
    def parameters(self) -> Iterator[nn.Parameter]: ...

    @abstractmethod
    def layout(self, groups: ParallelGroups) -> ParallelLayout: ...

    @abstractmethod
    def forward_backward(
        self, inputs: torch.Tensor, target: torch.Tensor, loss_fn: LossFn
    ) -> tuple[torch.Tensor, int, int]: ...

    @abstractmethod
    def forward(self, inputs: torch.Tensor) -> torch.Tensor | None: ...

    def maybe_resplit(self, optimizer: torch.optim.Optimizer | None) -> dict[str, Any] | None:
        return None  # a placement is fixed for the worker group's life

    @abstractmethod
    def full_state_dict(self) -> dict[str, torch.Tensor]: ...

    @abstractmethod
    def full_optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]: ...

    @abstractmethod
    def restore(
        self,
        model_state: Mapping[str, torch.Tensor],
        optimizer: torch.optim.Optimizer | None,
        optimizer_state: Mapping[str, Any] | None,
    ) -> None: ...


class ConvSplitStrategy(ParallelStrategy):
    """``conv_split``: each chosen conv layer's kernels in speed-sized blocks per rank."""

    mode = "conv_split"

    def __init__(
        self,
        runtime: WorkerRuntime,
        module: nn.Module,
        template: nn.Module,
        groups: ParallelGroups,
        layers: tuple[str, ...],
        example: torch.Tensor,
    ) -> None:
        self._runtime = runtime
        self.module = module
        self._template = template
        self._groups = groups
        self.layers = layers
        self._example = example
        self._traffic = [0, 0]  # bytes sent, received by the split layers in this step
        for _, layer in split_layers(module):
            layer.register_forward_pre_hook(self._count_layer_traffic, with_kwargs=False)

    @classmethod
    def prepare(
        cls,
        runtime: WorkerRuntime,
        model: nn.Module,
        template: nn.Module,
        groups: ParallelGroups,
        example: torch.Tensor,
    ) -> ConvSplitStrategy:
        layers = runtime.identity.setup.parallel.layers
        costs = _probe_split_costs(runtime, template, layers, groups, example)
        hooks = CollectiveHooks(
            before=runtime.timing.before_collective, after=runtime.timing.after_collective
        )
        split_conv_layers(model, list(layers), groups.split, costs=costs, hooks=hooks, check=False)
        return cls(runtime, model, template, groups, layers, example)

    def parameters(self) -> Iterator[nn.Parameter]:
        return self.module.parameters()

    def layout(self, groups: ParallelGroups) -> ParallelLayout:
        kernels = [(name, layer.kernels_per_rank) for name, layer in split_layers(self.module)]
        return ParallelLayout.build("conv_split", groups.groups, kernels=kernels)

    def _count_layer_traffic(self, layer: nn.Module, inputs: tuple[Any, ...]) -> None:
        assert isinstance(layer, SplitConv2d)
        x = inputs[0]
        element = x.element_size()
        sent, received = layer.gather_bytes(tuple(x.shape), element)  # exact-size broadcasts
        grad = 0
        if x.requires_grad and torch.is_grad_enabled():
            grad = ring_bytes(x.numel(), element, len(layer.kernels_per_rank))
        self._traffic[0] += sent + grad
        self._traffic[1] += received + grad

    def forward_backward(
        self, inputs: torch.Tensor, target: torch.Tensor, loss_fn: LossFn
    ) -> tuple[torch.Tensor, int, int]:
        self._traffic = [0, 0]
        loss = loss_fn(self.module(inputs), target)
        loss.backward()
        return loss, self._traffic[0], self._traffic[1]

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.module(inputs)

    def maybe_resplit(
        self, optimizer: torch.optim.Optimizer | None
    ) -> dict[str, tuple[int, ...]] | None:
        """Re-probe every split layer; move the kernels of each whose predicted gain beats
        the ``improvement_threshold`` (:func:`~raytrain_hetero.core.kernel_split.proposed_resplit`)."""
        min_gain = self._runtime.identity.setup.scheduler.policy.improvement_threshold
        costs = _probe_split_costs(
            self._runtime, self._template, self.layers, self._groups, self._example
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

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        state = conv_state.full_state_dict(self.module)
        return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}

    def full_optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return copy_to_cpu(conv_state.full_optimizer_state_dict(self.module, optimizer))

    def restore(
        self,
        model_state: Mapping[str, torch.Tensor],
        optimizer: torch.optim.Optimizer | None,
        optimizer_state: Mapping[str, Any] | None,
    ) -> None:
        conv_state.load_full_state_dict(self.module, model_state)
        if optimizer is not None and optimizer_state is not None:
            conv_state.load_full_optimizer_state_dict(self.module, optimizer, optimizer_state)


class BranchStrategy(ParallelStrategy):
    """``branches``: modality branches and the head on the replica's ranks, pipelined.

    Attributes:
        pipeline: The :class:`~raytrain_hetero.parallel.BranchPipeline` of this rank.
    """

    mode = "branches"

    def __init__(self, pipeline: BranchPipeline, split: Any) -> None:
        self.pipeline = pipeline
        self.module = pipeline.declared.model
        self._split = split
        self._full_index = {id(p): i for i, p in enumerate(self.module.parameters())}

    @classmethod
    def prepare(
        cls,
        runtime: WorkerRuntime,
        model: nn.Module,
        template: nn.Module,
        groups: ParallelGroups,
        example: torch.Tensor,
    ) -> BranchStrategy:
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
        rows = all_gather(costs)
        per_position = _per_position(rows, groups)
        placement = place_branches(
            names,
            [
                [max(row.branches[b][1] for row in pos) for b in range(len(names))]
                for pos in per_position
            ],
            [max(row.head for row in pos) for pos in per_position],
        )
        pipeline = BranchPipeline(
            declared,
            placement,
            rank=groups.position,
            group=groups.split,
            micro_batches=identity.setup.parallel.micro_batches,
            device=identity.device,
        )
        return cls(pipeline, groups.split)

    def parameters(self) -> Iterator[nn.Parameter]:
        return self.pipeline.parameters()

    def layout(self, groups: ParallelGroups) -> ParallelLayout:
        placement = self.pipeline.placement
        return ParallelLayout.build(
            "branches",
            groups.groups,
            branch_ranks=placement.branch_ranks,
            head_position=placement.head_rank,
        )

    def forward_backward(
        self, inputs: torch.Tensor, target: torch.Tensor, loss_fn: LossFn
    ) -> tuple[torch.Tensor, int, int]:
        step = self.pipeline.forward_backward(inputs, target, loss_fn)
        loss = torch.tensor(step.loss, dtype=torch.float64)
        return loss, step.bytes_sent, step.bytes_received

    def forward(self, inputs: torch.Tensor) -> torch.Tensor | None:
        return self.pipeline.predict(inputs)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        return self.pipeline.full_state_dict()

    def full_optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return full_optimizer_state_of_share(optimizer, self._full_index, self._split)

    def restore(
        self,
        model_state: Mapping[str, torch.Tensor],
        optimizer: torch.optim.Optimizer | None,
        optimizer_state: Mapping[str, Any] | None,
    ) -> None:
        self.pipeline.load_full_state_dict(model_state)
        if optimizer is not None and optimizer_state is not None:
            optimizer.load_state_dict(
                share_of_full_optimizer_state(optimizer, self._full_index, optimizer_state)
            )


#: The strategy serving each model-parallel ``ParallelConfig.mode``.
STRATEGIES: dict[str, type[ParallelStrategy]] = {
    s.mode: s for s in (ConvSplitStrategy, BranchStrategy)
}


def _probe_split_costs(
    runtime: WorkerRuntime,
    template: nn.Module,
    layers: tuple[str, ...],
    groups: ParallelGroups,
    example: torch.Tensor,
) -> dict[str, tuple[CostModel, ...]]:
    """Per-kernel cost of each layer per position: the slowest replica's (a collective)."""
    identity = runtime.identity
    setup = identity.setup
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
    rows = all_gather(mine)
    combined = {}
    for name in layers:
        combined[name] = tuple(
            CostModel(alpha=max(a for a, _ in pos), beta=max(b for _, b in pos))
            for pos in _per_position([row[name] for row in rows], groups)
        )
    return combined
