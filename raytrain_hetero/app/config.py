"""The job configuration's public module: schema, loading, overrides and checks in one place.

Callers import from here; the code lives in focused modules:

- :mod:`raytrain_hetero.app.schema`: :class:`JobConfig` and the YAML-only ``train``, ``ray``
  and ``tune`` sections; the run sections are the library's objects
  (:mod:`raytrain_hetero.config`), re-exported here.
- :mod:`raytrain_hetero.app.sections`: the ``data`` and ``model`` sections.
- :mod:`raytrain_hetero.app.loading`: the strict YAML loader, :func:`load_config`,
  :func:`validate_config`, :func:`dump_config`.
- :mod:`raytrain_hetero.app.overrides`: ``--set KEY.PATH=VALUE`` parsing and merging (OmegaConf).
- :mod:`raytrain_hetero.app.fs_checks`: :func:`check_data_root`.
- :mod:`raytrain_hetero.config.problems`: pydantic errors -> one ConfigError with fixes
  (:class:`ConfigProblem`), shared with the library's config objects.
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
from raytrain_hetero.app.schema import (
    TUNABLE_SECTIONS,
    JobConfig,
    RayConfig,
    SearchDistribution,
    TrainConfig,
    TuneConfig,
)
from raytrain_hetero.app.sections import (
    EUROSAT_BAND_NAMES,
    DataConfig,
    GenerateConfig,
    HyperspectralConfig,
    ModelConfig,
)
from raytrain_hetero.config import (
    BackendConfig,
    BatchConfig,
    ElasticConfig,
    EmulationConfig,
    PolicyConfig,
    ProbeConfig,
    SchedulerConfig,
    SlowdownInjection,
    WorkerSpec,
)
from raytrain_hetero.config.problems import ConfigProblem

__all__ = [
    "EUROSAT_BAND_NAMES",
    "TUNABLE_SECTIONS",
    "BackendConfig",
    "BatchConfig",
    "ConfigProblem",
    "DataConfig",
    "ElasticConfig",
    "EmulationConfig",
    "GenerateConfig",
    "HyperspectralConfig",
    "JobConfig",
    "ModelConfig",
    "PolicyConfig",
    "ProbeConfig",
    "RayConfig",
    "SchedulerConfig",
    "SearchDistribution",
    "SlowdownInjection",
    "TrainConfig",
    "TuneConfig",
    "WorkerSpec",
    "check_data_root",
    "dotted_to_nested",
    "dump_config",
    "load_config",
    "merge_overrides",
    "parse_override",
    "parse_overrides",
    "validate_config",
]
