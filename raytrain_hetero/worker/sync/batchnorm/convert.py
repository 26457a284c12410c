"""Binding the layers into a model: converting its BatchNorm layers to one mode, once.

:func:`convert_batchnorm` (exact, :mod:`.exact`) and :func:`convert_ghost_batchnorm` (ghost,
:mod:`.ghost`) replace a model's BatchNorm layers in place, carrying parameters and running
statistics over and refusing by name the layers no conversion can make split-invariant;
:func:`set_batchnorm_sync` switches their synchronisation off for probes.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm, _LazyNormBase
from torch.nn.modules.instancenorm import _InstanceNorm

from raytrain_hetero.errors import ModelPreparationError
from raytrain_hetero.worker.sync.batchnorm.binding import UNBOUND, BatchNormBinding
from raytrain_hetero.worker.sync.batchnorm.exact import HeteroBatchNorm
from raytrain_hetero.worker.sync.batchnorm.ghost import GhostBatchNorm, GhostStatistics

__all__ = ["convert_batchnorm", "convert_ghost_batchnorm", "set_batchnorm_sync"]


def convert_batchnorm(
    module: nn.Module, process_group: Any, binding: BatchNormBinding = UNBOUND
) -> nn.Module:
    """Replace every BatchNorm layer of ``module`` by a :class:`HeteroBatchNorm` (in place).

    Parameters and running statistics are carried over. Layers whose training statistics
    depend on how the batch is split and that cannot be made exact are refused by name.

    Args:
        module: The model.
        process_group: Group over which statistics are reduced.
        binding: What the layers need from the training step (default: weights 1/world,
            nothing around the exchanges).

    Returns:
        The module, or its replacement if it is itself a BatchNorm layer.

    Raises:
        ModelPreparationError: For lazy BatchNorm layers and InstanceNorm layers that track
            running statistics (both named in the message).
    """
    return _convert(module, process_group, binding, "model")


def _convert(
    module: nn.Module, process_group: Any, binding: BatchNormBinding, path: str
) -> nn.Module:
    _refuse_unconvertible(module, path)
    if isinstance(module, GhostBatchNorm):
        raise ModelPreparationError(
            f"Layer '{path}' is already a GhostBatchNorm: convert the model's plain BatchNorm "
            "layers once, to one mode (batch.batchnorm)."
        )
    if isinstance(module, _BatchNorm) and not isinstance(module, HeteroBatchNorm):
        converted = _carry_over(module, HeteroBatchNorm(module.num_features, **_arguments(module)))
        assert isinstance(converted, HeteroBatchNorm)
        converted.process_group = process_group
        converted.binding = binding
        return converted
    if isinstance(module, HeteroBatchNorm):
        module.process_group = process_group
        module.binding = binding
        return module
    for name, child in module.named_children():
        replaced = _convert(child, process_group, binding, f"{path}.{name}")
        if replaced is not child:
            module.add_module(name, replaced)
    return module


def set_batchnorm_sync(module: nn.Module, enabled: bool) -> None:
    """Switch global-statistics synchronisation of every HeteroBatchNorm on or off, and the
    running-statistics accumulation of every GhostBatchNorm (off: probes, whose forwards are
    not steps)."""
    for layer in module.modules():
        if isinstance(layer, (HeteroBatchNorm, GhostBatchNorm)):
            layer.sync_enabled = enabled


def _refuse_unconvertible(module: nn.Module, path: str) -> None:
    """The layers no conversion can make split-invariant, refused by name."""
    if isinstance(module, _LazyNormBase) and module.has_uninitialized_params():
        raise ModelPreparationError(
            f"Layer '{path}' ({type(module).__name__}) is lazy and not yet initialised: run one "
            "forward pass (or use an explicit BatchNorm) before prepare_model."
        )
    if isinstance(module, _InstanceNorm) and module.track_running_stats:
        raise ModelPreparationError(
            f"Layer '{path}' ({type(module).__name__}) tracks running statistics averaged over "
            "per-rank batches, which uneven slices make inexact: set track_running_stats=False."
        )


def _carry_over(source: _BatchNorm, converted: _BatchNorm) -> _BatchNorm:
    """Give ``converted`` the parameters, running statistics and mode of ``source``."""
    if source.affine:
        with torch.no_grad():
            converted.weight = source.weight
            converted.bias = source.bias
    if source.track_running_stats:
        converted.running_mean = source.running_mean
        converted.running_var = source.running_var
        converted.num_batches_tracked = source.num_batches_tracked
    converted.train(source.training)
    return converted


def _arguments(module: _BatchNorm) -> dict[str, Any]:
    return {
        "eps": module.eps,
        "momentum": module.momentum,
        "affine": module.affine,
        "track_running_stats": module.track_running_stats,
    }


def convert_ghost_batchnorm(
    module: nn.Module, ghost_size: int, statistics: GhostStatistics | None = None
) -> nn.Module:
    """Replace every BatchNorm layer of ``module`` by a :class:`GhostBatchNorm` (in place).

    Parameters and running statistics are carried over; the refusals are
    :func:`convert_batchnorm`'s (lazy layers, InstanceNorm tracking running statistics), and
    a model already converted to exact :class:`HeteroBatchNorm` is refused too.

    Args:
        module: The model.
        ghost_size: Samples per group.
        statistics: The accumulator of the step's running statistics (None: every training
            forward updates them at once, the one-device rule).

    Returns:
        The module, or its replacement if it is itself a BatchNorm layer.

    Raises:
        ModelPreparationError: For the refused layers (named in the message).
    """
    return _convert_ghost(module, ghost_size, statistics, "model")


def _convert_ghost(
    module: nn.Module, ghost_size: int, statistics: GhostStatistics | None, path: str
) -> nn.Module:
    _refuse_unconvertible(module, path)
    if isinstance(module, HeteroBatchNorm):
        raise ModelPreparationError(
            f"Layer '{path}' is already an exact HeteroBatchNorm: convert the model's plain "
            "BatchNorm layers once, to one mode (batch.batchnorm)."
        )
    if isinstance(module, GhostBatchNorm):
        if module.ghost_size != ghost_size:
            raise ModelPreparationError(
                f"Layer '{path}' is a GhostBatchNorm of ghost_size {module.ghost_size}, but "
                f"the run's ghost_size is {ghost_size}: use one group size."
            )
        module.statistics = statistics
        if statistics is not None:
            statistics.register(module)
        return module
    if isinstance(module, _BatchNorm):
        converted = _carry_over(
            module, GhostBatchNorm(module.num_features, ghost_size, **_arguments(module))
        )
        assert isinstance(converted, GhostBatchNorm)
        converted.statistics = statistics
        if statistics is not None:
            statistics.register(converted)
        return converted
    for name, child in module.named_children():
        replaced = _convert_ghost(child, ghost_size, statistics, f"{path}.{name}")
        if replaced is not child:
            module.add_module(name, replaced)
    return module
