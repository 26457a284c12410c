"""The job configuration's public module: schema, loading, overrides and checks in one place.

Callers import from here; the code lives in :mod:`~raytrain_hetero.app.schema` (the job and
its YAML-only ``train``, ``ray``, ``tune`` sections; the run sections are the library's
objects, :mod:`raytrain_hetero.config`), :mod:`~raytrain_hetero.app.sections` (``data``,
``model``), :mod:`~raytrain_hetero.app.loading` (the strict YAML loader),
:mod:`~raytrain_hetero.app.overrides` (``--set KEY.PATH=VALUE``) and
:mod:`~raytrain_hetero.app.fs_checks`.
"""

from __future__ import annotations

from raytrain_hetero.app.fs_checks import check_data_root
from raytrain_hetero.app.loading import dump_config, load_config, validate_config
from raytrain_hetero.app.overrides import (
    dotted_to_nested,
    merge_overrides,
    parse_override,
    parse_overrides,
)
from raytrain_hetero.app.schema import JobConfig, RayConfig, TrainConfig, TuneConfig
from raytrain_hetero.app.sections import DataConfig, ModelConfig

__all__ = [
    "DataConfig",
    "JobConfig",
    "ModelConfig",
    "RayConfig",
    "TrainConfig",
    "TuneConfig",
    "check_data_root",
    "dotted_to_nested",
    "dump_config",
    "load_config",
    "merge_overrides",
    "parse_override",
    "parse_overrides",
    "validate_config",
]
