"""Model parallelism on heterogeneous workers: conv layers split by device speed.

* ``conv_split``: :class:`SplitConv2d` (a Conv2d whose output channels are split in uneven,
  speed-proportional blocks over a process group), :func:`split_conv_layers`,
  :func:`check_replicas_identical`.
* ``conv_state``: full (unsplit) checkpoints of a split model, :func:`resplit` (weights and
  optimizer state move between ranks), :func:`probe_kernel_cost`.

Imports core, config, errors, atomic and worker (and torch), never the driver or the app layer;
the worker layer never imports this package. Names are imported lazily so ``import
raytrain_hetero.parallel`` loads no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "CollectiveHooks": "raytrain_hetero.parallel.conv_split",
    "SplitConv2d": "raytrain_hetero.parallel.conv_split",
    "check_replicas_identical": "raytrain_hetero.parallel.conv_split",
    "split_conv_layers": "raytrain_hetero.parallel.conv_split",
    "split_layers": "raytrain_hetero.parallel.conv_split",
    "full_optimizer_state_dict": "raytrain_hetero.parallel.conv_state",
    "full_state_dict": "raytrain_hetero.parallel.conv_state",
    "gather_kernel_costs": "raytrain_hetero.parallel.conv_state",
    "load_full_optimizer_state_dict": "raytrain_hetero.parallel.conv_state",
    "load_full_state_dict": "raytrain_hetero.parallel.conv_state",
    "probe_kernel_cost": "raytrain_hetero.parallel.conv_state",
    "resplit": "raytrain_hetero.parallel.conv_state",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
