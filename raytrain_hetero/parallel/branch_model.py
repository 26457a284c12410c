"""A multimodal model seen as modality branches plus a fusion head, for branch placement.

A model opts in with three plain-torch members (:class:`DeclaresBranches`, no import of this
package needed): ``branch_modules()`` (its ``(name, module)`` branches in fusion order),
``fusion_head()`` (taking the branch outputs concatenated along dimension 1) and
``split_inputs(x)``. :func:`branch_model_of` builds the :class:`BranchModel` view, whose
modules are the model's own, so ``head(cat([branch(part) for ...]))`` is exactly ``model(x)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from raytrain_hetero.errors import ModelParallelError

__all__ = ["BranchModel", "DeclaresBranches", "branch_model_of"]


@runtime_checkable
class DeclaresBranches(Protocol):
    """What a model provides to be placed branch by branch."""

    def branch_modules(self) -> Sequence[tuple[str, nn.Module]]:
        """``(name, module)`` of each branch in fusion order; submodules of the model."""
        ...

    def fusion_head(self) -> nn.Module:
        """The fusion head, a submodule of the model."""
        ...

    def split_inputs(self, x: torch.Tensor) -> Sequence[torch.Tensor]:
        """The model's input cut into one tensor per branch, in fusion order."""
        ...


@dataclass(frozen=True, eq=False)
class BranchModel:
    """A model seen as named modality branches and a fusion head.

    ``branches`` (``(name, module)`` in fusion order) and ``head`` (taking their outputs
    concatenated along dimension 1) are submodules of ``model``, which owns every parameter;
    ``split_inputs`` cuts the model's input into one tensor per branch.
    """

    model: nn.Module
    branches: tuple[tuple[str, nn.Module], ...]
    head: nn.Module
    split_inputs: Callable[[torch.Tensor], Sequence[torch.Tensor]]

    @property
    def branch_names(self) -> tuple[str, ...]:
        """Branch names in fusion order."""
        return tuple(name for name, _ in self.branches)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The model's output computed through the declared parts (equals ``model(x)``)."""
        parts = self.split_inputs(x)
        embeddings = [module(part) for (_, module), part in zip(self.branches, parts, strict=True)]
        return self.head(torch.cat(embeddings, dim=1))


def branch_model_of(model: nn.Module | BranchModel) -> BranchModel:
    """The :class:`BranchModel` view of ``model`` (itself if it is one).

    Raises:
        ModelParallelError: The model does not declare its branches, or declares parts that
            are not modules.
    """
    if isinstance(model, BranchModel):
        return model
    kind = type(model).__name__
    if not isinstance(model, DeclaresBranches):
        raise ModelParallelError(
            f"{kind} does not declare its branches, so it cannot be placed branch by branch. "
            "Fix: give the model branch_modules(), fusion_head() and split_inputs(x) (the "
            "raytrain_hetero.parallel.DeclaresBranches protocol; see TwoBranchFusionCNN), "
            "pass a raytrain_hetero.parallel.BranchModel, or use data parallelism."
        )
    branches = tuple((str(name), module) for name, module in model.branch_modules())
    head = model.fusion_head()
    parts = [*(module for _, module in branches), head]
    if not branches or not all(isinstance(part, nn.Module) for part in parts):
        raise ModelParallelError(
            f"{kind}.branch_modules() must give (name, nn.Module) pairs (>= 1) and "
            f"{kind}.fusion_head() an nn.Module; got {[type(p).__name__ for p in parts]}"
        )
    return BranchModel(model=model, branches=branches, head=head, split_inputs=model.split_inputs)
