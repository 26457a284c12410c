"""Branch placement: a multimodal model's branches on different workers, exact.

Each rank of a group runs the branches a
:class:`~raytrain_hetero.core.branch_placement.BranchPlacement` gives it; the head rank also
runs the fusion head and the loss. Branch ranks send micro-batch chunks of their outputs while
computing the next (transfer overlaps compute); the head rank concatenates them, runs head and
loss on the whole batch, and sends each chunk's gradient back.

Exactness: the loss is computed once on the whole batch, so the gradients reaching the branch
outputs are the single-device ones and a branch's backward over its chunks accumulates exactly
the full-batch gradient; the head (dropout, batch statistics) always sees the whole batch. A
branch with BatchNorm in training mode cannot be micro-batched exactly, so it runs forward on
the whole batch and only its output is chunked.

Modules placed elsewhere live on the ``meta`` device, so the optimizer sees only this rank's
share; :meth:`BranchPipeline.full_state_dict` gathers the single-device state_dict, keeping
checkpoints mode-agnostic.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from raytrain_hetero.core.branch_placement import BranchPlacement
from raytrain_hetero.errors import ModelParallelError
from raytrain_hetero.parallel.branch_model import BranchModel, branch_model_of
from raytrain_hetero.parallel.p2p import HEADER_BYTES, Traffic, recv_tensor, send_tensor
from raytrain_hetero.worker.setup.identity import all_gather

__all__ = [
    "BranchPipeline",
    "BranchStep",
    "data_parallel_bytes_per_step",
    "micro_batch_sizes",
    "predicted_branch_bytes_per_step",
]

logger = logging.getLogger(__name__)

# Tags: forward activations of branch i use _FORWARD_TAG + i, their gradients _BACKWARD_TAG + i.
_FORWARD_TAG = 100
_BACKWARD_TAG = 10_000
_LOSS_BYTES = 8  # the float64 loss broadcast from the head rank


@dataclass(frozen=True)
class BranchStep:
    """What one training step of a :class:`BranchPipeline` produced on this rank.

    Attributes:
        loss: The full-batch loss (broadcast from the head rank to every rank).
        output: The head's output on the head rank (detached); None on other ranks.
        bytes_sent: Bytes this rank sent during the step (activations or gradients,
            headers and the loss broadcast included).
        bytes_received: Bytes this rank received during the step.
    """

    loss: float
    output: torch.Tensor | None
    bytes_sent: int
    bytes_received: int


def micro_batch_sizes(batch_size: int, micro_batches: int | Sequence[int]) -> tuple[int, ...]:
    """Sizes of the micro-batches of a batch: ``m`` nearly equal parts, or given sizes.

    An integer ``m`` larger than the batch gives one sample per micro-batch.

    Raises:
        ModelParallelError: m < 1, or given sizes that are not positive or do not sum to the
            batch size.
    """
    if isinstance(micro_batches, int):
        if micro_batches < 1:
            raise ModelParallelError(f"micro_batches must be >= 1, got {micro_batches}")
        m = min(micro_batches, batch_size)
        return tuple(batch_size // m + (1 if k < batch_size % m else 0) for k in range(m))
    sizes = tuple(int(s) for s in micro_batches)
    if not sizes or any(s < 1 for s in sizes) or sum(sizes) != batch_size:
        raise ModelParallelError(
            f"micro-batch sizes {list(sizes)} must be positive and sum to the batch size "
            f"{batch_size}"
        )
    return sizes


def _has_batch_statistics(module: nn.Module) -> bool:
    """Whether ``module`` normalises with statistics of its current batch (BN in training)."""
    return any(
        isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training for m in module.modules()
    )


def _param_bytes(module: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)


def data_parallel_bytes_per_step(model: nn.Module, world_size: int) -> int:
    """Bytes all ranks together send per step when ``model`` trains data-parallel.

    A ring all-reduce of P gradient bytes sends 2 (N - 1) / N * P bytes from each of the N
    ranks (reduce-scatter then all-gather), 2 (N - 1) P in all: the number to set beside
    :attr:`BranchStep.bytes_sent` summed over the ranks of a branch-placed group.
    """
    if world_size < 2:
        return 0
    return 2 * (world_size - 1) * _param_bytes(model)


def predicted_branch_bytes_per_step(
    model: nn.Module | BranchModel,
    placement: BranchPlacement,
    example_input: torch.Tensor,
    micro_batches: int | Sequence[int] = 1,
    *,
    training: bool = True,
) -> int:
    """Bytes all ranks together send per step of branch placement on ``example_input``.

    Activations of every branch placed off the head rank travel once forward (with a header
    per micro-batch chunk) and, when training, their gradients once backward; plus the loss
    broadcast. Equals the sum over ranks of :attr:`BranchStep.bytes_sent`.
    """
    declared = branch_model_of(model)
    parts = declared.split_inputs(example_input)
    sizes = micro_batch_sizes(int(example_input.shape[0]), micro_batches)
    total = 0
    with torch.no_grad():
        for (name, module), part in zip(declared.branches, parts, strict=True):
            if placement.rank_of(name) == placement.head_rank:
                continue
            was_training = module.training
            module.eval()
            out = module(part[:1])
            module.train(was_training)
            per_sample = out[0].numel() * out.element_size()
            # One header per chunk, also for a branch computed whole (BatchNorm): it is still
            # sent chunk by chunk.
            forward = per_sample * sum(sizes) + HEADER_BYTES * len(sizes)
            total += forward + (per_sample * sum(sizes) if training else 0)
    if training:
        total += _LOSS_BYTES * (placement.world_size - 1)
    return total


class BranchPipeline:
    """A branch-placed model on one rank of a torch.distributed group.

    Args:
        model: The single-device model (declaring its branches) or its
            :class:`~raytrain_hetero.parallel.BranchModel`; every rank builds the same model
            (same seed) and passes it here. Its modules not placed on this rank are moved to
            the ``meta`` device.
        placement: Where each branch and the head run (group ranks); see
            :func:`~raytrain_hetero.core.branch_placement.place_branches`.
        rank: This process's rank in ``group`` (injected, not read from globals).
        group: Process group of the placement (default: the world).
        micro_batches: Number of micro-batches per step, or explicit sizes.
        device: Device of the received tensors (CPU with gloo).

    Raises:
        ModelParallelError: No declared branches, a placement naming branches the model does
            not declare (or missing some), a group size different from the placement's, or
            parameters outside every branch and the head.
    """

    def __init__(
        self,
        model: nn.Module | BranchModel,
        placement: BranchPlacement,
        *,
        rank: int,
        group: Any = None,
        micro_batches: int | Sequence[int] = 1,
        device: torch.device | str = "cpu",
    ) -> None:
        self.declared = branch_model_of(model)
        names = self.declared.branch_names
        if set(placement.branch_names) != set(names):
            raise ModelParallelError(
                f"the placement places {sorted(placement.branch_names)} but the model "
                f"declares branches {list(names)}; unknown: "
                f"{sorted(set(placement.branch_names) - set(names))}, unplaced: "
                f"{sorted(set(names) - set(placement.branch_names))}"
            )
        group_size = dist.get_world_size(group)
        if group_size != placement.world_size:
            raise ModelParallelError(
                f"the placement is for {placement.world_size} rank(s), the process group has "
                f"{group_size}"
            )
        self.placement = placement
        self.rank = rank
        self.group = group
        self.micro_batches = micro_batches
        self.device = torch.device(device)
        self.is_head = placement.head_rank == rank
        self._prefixes = self._part_prefixes()
        self._local = {n for n in names if placement.rank_of(n) == rank}
        for name, module in self.declared.branches:
            if name not in self._local:
                module.to("meta")
        if not self.is_head:
            self.declared.head.to("meta")

    def _part_prefixes(self) -> dict[str, str]:
        """state_dict key prefix of each part ("head" and branch names) in the full model."""
        module_names = {id(m): n for n, m in self.declared.model.named_modules()}
        parts = {**dict(self.declared.branches), "head": self.declared.head}
        prefixes = {}
        for part, module in parts.items():
            if id(module) not in module_names:
                raise ModelParallelError(
                    f"declared part {part!r} is not a submodule of the model; a "
                    "raytrain_hetero.parallel.BranchModel must be a view of the model's own "
                    "modules"
                )
            name = module_names[id(module)]
            prefixes[part] = f"{name}." if name else ""
        outside = [
            key
            for key in self.declared.model.state_dict()
            if not any(key.startswith(p) for p in prefixes.values())
        ]
        if outside:
            raise ModelParallelError(
                f"parameters/buffers {outside[:5]} belong to no declared branch nor the head, "
                "so no rank would own them. Fix: declare them as part of a branch or the head."
            )
        return prefixes

    def _local_parts(self) -> dict[str, nn.Module]:
        parts = {n: m for n, m in self.declared.branches if n in self._local}
        if self.is_head:
            parts["head"] = self.declared.head
        return parts

    def parameters(self) -> Iterator[nn.Parameter]:
        """Parameters this rank owns and updates (its branches, and the head on the head rank)."""
        for module in self._local_parts().values():
            yield from module.parameters()

    def train(self, mode: bool = True) -> BranchPipeline:
        """Set training mode (BatchNorm, dropout) on the whole model."""
        self.declared.model.train(mode)
        return self

    def eval(self) -> BranchPipeline:
        """Set evaluation mode on the whole model."""
        return self.train(False)

    def _global(self, group_rank: int) -> int:
        if self.group is None:
            return group_rank
        return dist.get_global_rank(self.group, group_rank)

    def _forward(
        self, x: torch.Tensor, sizes: tuple[int, ...], traffic: Traffic
    ) -> tuple[torch.Tensor | None, dict[str, list[torch.Tensor]], dict[str, torch.Tensor]]:
        """Branch forwards (sending remote chunks) and, on the head rank, the head forward.

        Returns the head output (head rank only), the chunks each local branch produced
        (graph attached) and, on the head rank, the head's inputs per branch as cut leaves.
        """
        parts = self.declared.split_inputs(x)
        head_dst = self._global(self.placement.head_rank)
        produced: dict[str, list[torch.Tensor]] = {}
        for index, ((name, module), part) in enumerate(
            zip(self.declared.branches, parts, strict=True)
        ):
            if name not in self._local:
                continue
            if _has_batch_statistics(module):  # whole batch: exact BatchNorm statistics
                chunks = list(module(part).split(list(sizes)))
                if not self.is_head:
                    for chunk in chunks:
                        send_tensor(
                            chunk, head_dst, _FORWARD_TAG + index, traffic, group=self.group
                        )
            else:
                chunks = []
                for piece in part.split(list(sizes)):
                    chunks.append(module(piece))
                    if not self.is_head:  # send at once: transfer overlaps the next chunk
                        send_tensor(
                            chunks[-1], head_dst, _FORWARD_TAG + index, traffic, group=self.group
                        )
            produced[name] = chunks
        if not self.is_head:
            return None, produced, {}
        leaves: dict[str, torch.Tensor] = {}
        for index, (name, _) in enumerate(self.declared.branches):
            if name in produced:
                whole = torch.cat([c.detach() for c in produced[name]])
            else:
                src = self._global(self.placement.rank_of(name))
                whole = torch.cat(
                    [
                        recv_tensor(
                            src, _FORWARD_TAG + index, traffic, group=self.group,
                            device=self.device,
                        )
                        for _ in sizes
                    ]
                )  # fmt: skip
            leaves[name] = whole.requires_grad_(torch.is_grad_enabled())
        output = self.declared.head(torch.cat([leaves[n] for n in leaves], dim=1))
        return output, produced, leaves

    def forward_backward(
        self,
        x: torch.Tensor,
        target: torch.Tensor | None,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    ) -> BranchStep:
        """Forward and backward of one batch; gradients accumulate in this rank's parameters.

        Every rank passes the same input batch ``x`` (each cuts its modalities from it);
        ``target`` is needed on the head rank only. ``loss_fn`` must reduce by the mean over
        the batch (or any reduction: it is applied once to the whole batch, as on one device).
        """
        traffic = Traffic()
        sizes = micro_batch_sizes(int(x.shape[0]), self.micro_batches)
        output, produced, leaves = self._forward(x, sizes, traffic)
        loss_value = torch.zeros(1, dtype=torch.float64, device=self.device)
        if self.is_head:
            if target is None:
                raise ModelParallelError("the head rank needs the batch's target for the loss")
            assert output is not None
            loss = loss_fn(output, target)
            loss.backward()
            loss_value[0] = loss.detach().to(torch.float64)
            for index, (name, _) in enumerate(self.declared.branches):
                if name in produced:
                    continue
                src = self._global(self.placement.rank_of(name))
                grad = leaves[name].grad
                assert grad is not None
                for chunk in grad.split(list(sizes)):
                    send_tensor(
                        chunk, src, _BACKWARD_TAG + index, traffic, group=self.group,
                        with_header=False,
                    )  # fmt: skip
            for name, chunks in produced.items():  # own branches, while remote ones run
                grad = leaves[name].grad
                assert grad is not None
                torch.autograd.backward(chunks, list(grad.split(list(sizes))))
        else:
            head_src = self._global(self.placement.head_rank)
            for index, (name, _) in enumerate(self.declared.branches):
                if name not in produced:
                    continue
                chunks = produced[name]
                grads = [
                    recv_tensor(
                        head_src, _BACKWARD_TAG + index, traffic, group=self.group, like=chunk
                    )
                    for chunk in chunks
                ]
                torch.autograd.backward(chunks, grads)
        traffic.wait_all()
        root = self._global(self.placement.head_rank)
        dist.broadcast(loss_value, src=root, group=self.group)
        if self.is_head:
            traffic.bytes_sent += _LOSS_BYTES * (self.placement.world_size - 1)
        else:
            traffic.bytes_received += _LOSS_BYTES
        return BranchStep(
            loss=float(loss_value.item()),
            output=output.detach() if output is not None else None,
            bytes_sent=traffic.bytes_sent,
            bytes_received=traffic.bytes_received,
        )

    def train_step(
        self,
        x: torch.Tensor,
        target: torch.Tensor | None,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        optimizer: torch.optim.Optimizer,
    ) -> BranchStep:
        """``optimizer.zero_grad()``, :meth:`forward_backward`, ``optimizer.step()``.

        The optimizer must be built over :meth:`parameters` (this rank's share).
        """
        optimizer.zero_grad(set_to_none=True)
        step = self.forward_backward(x, target, loss_fn)
        optimizer.step()
        return step

    @torch.no_grad()
    def predict(self, x: torch.Tensor) -> torch.Tensor | None:
        """Forward only (micro-batched, no gradients): the head's output on the head rank.

        Call :meth:`eval` first for inference (running BatchNorm statistics, no dropout).
        """
        traffic = Traffic()
        sizes = micro_batch_sizes(int(x.shape[0]), self.micro_batches)
        output, _, _ = self._forward(x, sizes, traffic)
        traffic.wait_all()
        return output

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The unsplit model's state_dict (CPU tensors), gathered on every rank.

        Keys and values are those of the single-device model, so a checkpoint made from it
        resumes in any parallel mode or world size. Collective: every rank of the group calls it.
        """
        full_keys = self.declared.model.state_dict(keep_vars=False)
        local: dict[str, torch.Tensor] = {}
        for part, module in self._local_parts().items():
            prefix = self._prefixes[part]
            for key, value in module.state_dict().items():
                local[prefix + key] = value.detach().to("cpu", copy=True)
        gathered = all_gather(local, self.group)
        merged: dict[str, torch.Tensor] = {}
        for piece in gathered:
            merged.update(piece)
        missing = [k for k in full_keys if k not in merged]
        if missing:  # pragma: no cover - every key belongs to a part (checked at construction)
            raise ModelParallelError(f"full_state_dict misses {missing[:5]}")
        return {k: merged[k] for k in full_keys}

    def load_full_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load an unsplit model's state_dict: each rank takes the entries of its own parts.

        Raises:
            ModelParallelError: Keys missing for this rank's parts (names them).
        """
        for part, module in self._local_parts().items():
            prefix = self._prefixes[part]
            own = {k[len(prefix) :]: v for k, v in state_dict.items() if k.startswith(prefix)}
            missing = sorted(set(module.state_dict()) - set(own))
            if missing:
                raise ModelParallelError(
                    f"the state_dict lacks {[prefix + k for k in missing][:5]} of part {part!r}; "
                    "it is not a checkpoint of this model"
                )
            module.load_state_dict(own)
