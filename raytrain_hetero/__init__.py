"""raytrain_hetero: elastic, heterogeneity-aware data-parallel training on Ray Train V2.

Every global batch is carved into per-worker slices sized by measured worker speed, and each
worker's gradient is weighted by the samples it processed, so the synchronised update is
exactly the single-device update for that global batch. Driver side: :class:`HeteroTrainer`
and the config objects (:mod:`raytrain_hetero.config`); in the train loop the ``prepare_*``
functions, :func:`report`, :func:`get_device`; Lightning: ``raytrain_hetero.lightning``. Every
public name is imported lazily: ``import raytrain_hetero`` loads no config library, no Ray and
no torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from raytrain_hetero.errors import (
    AllocationError,
    ConfigError,
    DataError,
    HeteroError,
    ModelParallelError,
    ModelPreparationError,
    NonFiniteStepError,
    PlacementError,
    ProbeError,
)

__version__ = "0.1.0"

_LAZY = {
    "JobConfig": "raytrain_hetero.app.config",
    "BackendConfig": "raytrain_hetero.config",
    "BatchConfig": "raytrain_hetero.config",
    "ElasticConfig": "raytrain_hetero.config",
    "EmulationConfig": "raytrain_hetero.config",
    "GuardConfig": "raytrain_hetero.config",
    "PolicyConfig": "raytrain_hetero.config",
    "ProbeConfig": "raytrain_hetero.config",
    "SchedulerConfig": "raytrain_hetero.config",
    "SlowdownInjection": "raytrain_hetero.config",
    "TrackingConfig": "raytrain_hetero.config",
    "WorkerSpec": "raytrain_hetero.config",
    "load_config": "raytrain_hetero.app.config",
    "HeteroTrainer": "raytrain_hetero.driver.trainer",
    "HeteroDataConfig": "raytrain_hetero.driver.data_config",
    "get_dataset_shard": "raytrain_hetero.worker.api",
    "prepare_model": "raytrain_hetero.worker.api",
    "prepare_data_loader": "raytrain_hetero.worker.api",
    "prepare_optimizer": "raytrain_hetero.worker.api",
    "prepare_eval_data_loader": "raytrain_hetero.worker.api",
    "sum_across_ranks": "raytrain_hetero.worker.api",
    "report": "raytrain_hetero.worker.api",
    "get_device": "raytrain_hetero.worker.api",
    "get_rank_info": "raytrain_hetero.worker.api",
    "log_step_metrics": "raytrain_hetero.worker.api",
    "update_plan": "raytrain_hetero.worker.api",
    "current_plan": "raytrain_hetero.worker.api",
    "current_step_number": "raytrain_hetero.worker.api",
    "first_step_time": "raytrain_hetero.worker.api",
    "group_start_time": "raytrain_hetero.worker.api",
    "newest_costs": "raytrain_hetero.worker.api",
    "checkpoint_due": "raytrain_hetero.worker.api",
    "micro_batches": "raytrain_hetero.worker.api",
    "HeteroBatchNorm": "raytrain_hetero.worker.sync.batchnorm.exact",
    "GhostBatchNorm": "raytrain_hetero.worker.sync.batchnorm.ghost",
    "ParallelConfig": "raytrain_hetero.config",
    "prepare_model_parallel": "raytrain_hetero.parallel.training",
    "ParallelModel": "raytrain_hetero.parallel.training",
    "ParallelStep": "raytrain_hetero.parallel.training",
    "ParallelLayout": "raytrain_hetero.parallel.layout",
}

#: Submodules reachable as attributes (``raytrain_hetero.lightning.HeteroDDPStrategy``).
_LAZY_MODULES = {"lightning": "raytrain_hetero.worker.lightning"}

__all__ = [
    "AllocationError",
    "ConfigError",
    "DataError",
    "HeteroError",
    "ModelParallelError",
    "ModelPreparationError",
    "NonFiniteStepError",
    "PlacementError",
    "ProbeError",
    "__version__",
    *_LAZY,
    *_LAZY_MODULES,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _LAZY_MODULES:
        return importlib.import_module(_LAZY_MODULES[name])
    raise AttributeError(f"module 'raytrain_hetero' has no attribute {name!r}")
