"""raytrain_hetero: elastic, heterogeneity-aware data-parallel training on Ray Train V2.

Every global batch is carved into per-worker slices sized by measured worker speed, and each
worker's gradient is weighted by the samples it processed, so the synchronised update is
exactly the single-device update for that global batch.

Driver side: :class:`HeteroTrainer`, :class:`WorkerSpec`. Inside the train loop:
:func:`prepare_model`, :func:`prepare_data_loader`, :func:`report`, :func:`get_device`.
Ray and torch are imported lazily, so ``raytrain_hetero.core`` and the config stay light.
"""

from __future__ import annotations

import importlib
from typing import Any

from raytrain_hetero.config import JobConfig, ProbeConfig, WorkerSpec, load_config
from raytrain_hetero.errors import (
    AllocationError,
    ConfigError,
    DataError,
    HeteroError,
    ModelPreparationError,
    PlacementError,
    ProbeError,
)

__version__ = "0.1.0"

_LAZY = {
    "HeteroTrainer": "raytrain_hetero.trainer",
    "prepare_model": "raytrain_hetero.train_loop",
    "prepare_data_loader": "raytrain_hetero.train_loop",
    "report": "raytrain_hetero.train_loop",
    "get_device": "raytrain_hetero.train_loop",
    "get_rank_info": "raytrain_hetero.train_loop",
    "log_step_metrics": "raytrain_hetero.train_loop",
    "update_plan": "raytrain_hetero.train_loop",
    "current_plan": "raytrain_hetero.train_loop",
    "current_step_number": "raytrain_hetero.train_loop",
    "HeteroBatchNorm": "raytrain_hetero.batchnorm",
}

__all__ = [
    "AllocationError",
    "ConfigError",
    "DataError",
    "HeteroError",
    "JobConfig",
    "ModelPreparationError",
    "PlacementError",
    "ProbeConfig",
    "ProbeError",
    "WorkerSpec",
    "load_config",
    "__version__",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'raytrain_hetero' has no attribute {name!r}")
