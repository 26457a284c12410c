"""Declaring a multimodal model as modality branches plus a fusion head.

A model that can be trained with branch placement (``raytrain_hetero.parallel.branches``)
declares its parts as a :class:`BranchModel`: named branch modules, each consuming one
modality tensor cut from the model's input, and a fusion head taking the branch outputs
concatenated along dimension 1 in the declared order. The declaration is a *view* of the
model: its modules are the model's own submodules (same parameters, same state_dict keys),
and ``head(cat([branch(part) for ...]))`` computes exactly ``model(x)``.

Models opt in with a ``declared_branches()`` method returning the view
(:meth:`~raytrain_hetero.workloads.models.TwoBranchFusionCNN.declared_branches`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["BranchModel"]


@dataclass(frozen=True, eq=False)
class BranchModel:
    """A model seen as named modality branches and a fusion head.

    Attributes:
        model: The whole single-device model; owns every parameter and buffer.
        branches: ``(name, module)`` pairs in fusion order; submodules of ``model``.
        head: The fusion head, a submodule of ``model``; its input is the branch outputs
            concatenated along dimension 1 in ``branches`` order.
        split_inputs: Cuts the model's input into one tensor per branch, in ``branches``
            order (e.g. SAR channels, then multispectral channels).
    """

    model: nn.Module
    branches: tuple[tuple[str, nn.Module], ...]
    head: nn.Module
    split_inputs: Callable[[torch.Tensor], Sequence[torch.Tensor]]

    @property
    def branch_names(self) -> tuple[str, ...]:
        """Branch names in fusion order."""
        return tuple(name for name, _ in self.branches)

    def branch(self, name: str) -> nn.Module:
        """The branch module called ``name`` (KeyError if the model has no such branch)."""
        for branch_name, module in self.branches:
            if branch_name == name:
                return module
        raise KeyError(name)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The model's output computed through the declared parts (equals ``model(x)``)."""
        parts = self.split_inputs(x)
        embeddings = [module(part) for (_, module), part in zip(self.branches, parts, strict=True)]
        return self.head(torch.cat(embeddings, dim=1))
