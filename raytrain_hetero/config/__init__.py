"""Library configuration objects: frozen, validated once, shared by every layer.

:class:`~raytrain_hetero.driver.trainer.HeteroTrainer` takes them, the workers read them and
the YAML job (:mod:`raytrain_hetero.app.config`) uses them as its sections, so each setting,
its default and its check are written once, here. Built from Python with bad values a model
raises one :class:`~raytrain_hetero.errors.ConfigError` naming each field and its fix.
"""

from __future__ import annotations

from raytrain_hetero.config.base import HeteroModel
from raytrain_hetero.config.checks import (
    SettingPaths,
    check_run_settings,
    check_slowdown,
    run_setting_problems,
)
from raytrain_hetero.config.faults import FaultInjectionConfig, FaultSpec, check_fault_targets
from raytrain_hetero.config.groups import (
    BackendConfig,
    BatchConfig,
    ElasticConfig,
    EmulationConfig,
    GuardConfig,
    PolicyConfig,
    SchedulerConfig,
)
from raytrain_hetero.config.parallel import ParallelConfig, ParallelMode
from raytrain_hetero.config.problems import ConfigProblem
from raytrain_hetero.config.specs import (
    ProbeConfig,
    SlowdownInjection,
    WorkerSpec,
    expand_worker_specs,
    worker_groups,
)
from raytrain_hetero.config.tracking import MLflowConfig, TensorBoardConfig, TrackingConfig

__all__ = [
    "BackendConfig",
    "BatchConfig",
    "ConfigProblem",
    "ElasticConfig",
    "EmulationConfig",
    "FaultInjectionConfig",
    "FaultSpec",
    "GuardConfig",
    "HeteroModel",
    "MLflowConfig",
    "ParallelConfig",
    "ParallelMode",
    "PolicyConfig",
    "ProbeConfig",
    "SchedulerConfig",
    "SettingPaths",
    "SlowdownInjection",
    "TensorBoardConfig",
    "TrackingConfig",
    "WorkerSpec",
    "check_fault_targets",
    "check_run_settings",
    "check_slowdown",
    "expand_worker_specs",
    "run_setting_problems",
    "worker_groups",
]
