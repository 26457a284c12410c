"""What BatchNorm layers need from the training step, injected when a model is converted.

The layers read nothing global: this rank's gradient weight in the current step and the hooks
around each statistics exchange (account and emulate compute) come in a
:class:`BatchNormBinding`, made by the DDP wrapper (:mod:`raytrain_hetero.worker.sync.ddp`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["UNBOUND", "BatchNormBinding"]


def _nothing() -> None:
    return None


def _no_weight() -> float | None:
    return None


@dataclass(frozen=True)
class BatchNormBinding:
    """What HeteroBatchNorm layers need from the training step, injected at conversion.

    Attributes:
        rank_weight: This rank's gradient weight w_r in the current step, or None outside a
            step (then 1/world, the weight of plain averaging).
        before_exchange: Called right before each statistics all-reduce (the rank's compute
            up to here is accounted, and stretched under EMULATION).
        after_exchange: Called right after it (the wait is not compute).
    """

    rank_weight: Callable[[], float | None] = _no_weight
    before_exchange: Callable[[], None] = _nothing
    after_exchange: Callable[[], None] = _nothing


UNBOUND = BatchNormBinding()
