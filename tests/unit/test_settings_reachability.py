"""Every library setting is reachable from a YAML key, and every run-related YAML key is a
library setting: one definition per setting, nothing settable only from one side."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import typing
from pathlib import Path

import pytest
from ray.train import RunConfig

from raytrain_hetero.app.config import (
    JobConfig,
    TrainConfig,
    merge_overrides,
    parse_override,
    validate_config,
)
from raytrain_hetero.app.job import build_trainer
from raytrain_hetero.config import (
    BackendConfig,
    BatchConfig,
    ElasticConfig,
    EmulationConfig,
    GuardConfig,
    ParallelConfig,
    PolicyConfig,
    ProbeConfig,
    SchedulerConfig,
    SlowdownInjection,
    TrackingConfig,
    WorkerSpec,
)
from raytrain_hetero.config.tracking import MLflowConfig, TensorBoardConfig
from raytrain_hetero.driver.trainer import HeteroTrainer

BASE = {"data": {"root": "data/x"}, "workers": [{"name": "a"}, {"name": "b"}]}

#: Library group -> (YAML section, HeteroTrainer attribute holding it).
GROUPS: dict[type, tuple[str, str]] = {
    BatchConfig: ("train", "batch"),
    ProbeConfig: ("probe", "probe"),
    SchedulerConfig: ("scheduler", "scheduler"),
    ElasticConfig: ("elastic", "elastic"),
    EmulationConfig: ("emulation", "emulation"),
    BackendConfig: ("backend", "backend"),
    GuardConfig: ("guard", "guard"),
    ParallelConfig: ("parallel", "parallel"),
    TrackingConfig: ("tracking", "tracking"),
}

#: A non-default value for every library field (the test below proves the table complete).
VALUES: dict[tuple[type, str], typing.Any] = {
    (BatchConfig, "global_batch_size"): 64,
    (BatchConfig, "min_slice"): 2,
    (BatchConfig, "weighting"): "uniform",
    (BatchConfig, "batchnorm"): "local",
    (BatchConfig, "ghost_size"): 16,
    (BatchConfig, "max_memory_fraction"): 0.5,
    (BatchConfig, "memory_cap_mode"): "slice",
    (BatchConfig, "fixed_shares"): [1.0, 3.0],
    (BatchConfig, "seed"): 7,
    (BatchConfig, "step_workers"): 3,
    (ProbeConfig, "mode"): "probe",
    (ProbeConfig, "passive_steps"): 5,
    (ProbeConfig, "remember"): False,
    (ProbeConfig, "batch_sizes"): [4, 16],
    (ProbeConfig, "warmup"): 1,
    (ProbeConfig, "repeats"): 2,
    (ProbeConfig, "calibration_steps"): 1,
    (ProbeConfig, "calibration_rounds"): 1,
    (ProbeConfig, "reuse_on_restart"): False,
    (ProbeConfig, "group"): "train",
    (ProbeConfig, "admission"): "auto",
    (ProbeConfig, "roles"): "auto",
    (SchedulerConfig, "live"): False,
    (SchedulerConfig, "plan_sync_every"): 3,
    (SchedulerConfig, "flush_every"): 2,
    (PolicyConfig, "window_steps"): 4,
    (PolicyConfig, "improvement_threshold"): 0.2,
    (PolicyConfig, "confirm_windows"): 3,
    (PolicyConfig, "urgent_improvement"): 0.5,
    (PolicyConfig, "min_steps_between_replans"): 5,
    (PolicyConfig, "outlier_factor"): 2.5,
    (PolicyConfig, "straggler_timeout_s"): 30.0,
    (PolicyConfig, "straggler_penalty"): 4.0,
    (ElasticConfig, "min_workers"): 1,
    (ElasticConfig, "resize_monitor_interval_s"): 2.0,
    (ElasticConfig, "preemption_notice"): False,
    (ElasticConfig, "preemption_margin_s"): 7.5,
    (ElasticConfig, "placement_timeout_s"): 120.0,
    (BackendConfig, "torch_backend"): "gloo",
    (BackendConfig, "collective_timeout_s"): 60,
    (GuardConfig, "max_consecutive_nonfinite"): 5,
    (WorkerSpec, "name"): "c",
    (WorkerSpec, "count"): 2,
    (WorkerSpec, "resources"): {"CPU": 2.0},
    (WorkerSpec, "label_selector"): {"zone": "a"},
    (WorkerSpec, "device"): "cpu",
    (WorkerSpec, "max_batch"): 64,
    (WorkerSpec, "max_micro_batch"): 16,
    (WorkerSpec, "emulated_slowdown"): 2.0,
    (WorkerSpec, "emulated_collective_delay_s"): 0.25,
    (SlowdownInjection, "factor"): 3.0,
    (SlowdownInjection, "worker"): "b",
    (SlowdownInjection, "rank"): 1,
    (SlowdownInjection, "from_step"): 5,
    (EmulationConfig, "noise"): 0.05,
    (EmulationConfig, "node_slowdowns"): {"speed": {"slow": 4.0}},
    (ParallelConfig, "mode"): "conv_split",
    (ParallelConfig, "layers"): ["features.0", "features.4"],
    (ParallelConfig, "group_size"): 2,
    (ParallelConfig, "micro_batches"): 3,
    (TensorBoardConfig, "enabled"): True,
    (TensorBoardConfig, "log_dir"): "/tmp/tb",
    (MLflowConfig, "enabled"): True,
    (MLflowConfig, "tracking_uri"): "http://127.0.0.1:5000",
    (MLflowConfig, "experiment_name"): "exp",
    (MLflowConfig, "run_name"): "run",
    (MLflowConfig, "artifact_location"): "/tmp/artifacts",
}

#: Fields that hold another config class: walked into instead of set as a whole.
NESTED = {
    (SchedulerConfig, "policy"): PolicyConfig,
    (EmulationConfig, "slowdowns"): SlowdownInjection,
    (TrackingConfig, "tensorboard"): TensorBoardConfig,
    (TrackingConfig, "mlflow"): MLflowConfig,
}


def fields_of(cls: type) -> list[str]:
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    return list(cls.model_fields)


def library_fields() -> set[tuple[type, str]]:
    out: set[tuple[type, str]] = set()
    for cls in [*GROUPS, WorkerSpec]:
        for name in fields_of(cls):
            inner = NESTED.get((cls, name))
            out |= {(inner, n) for n in fields_of(inner)} if inner else {(cls, name)}
    return out


def loop(config):  # never runs
    raise AssertionError


def trainer_for(overrides: list[str]) -> HeteroTrainer:
    data = BASE
    for text in overrides:
        data = merge_overrides(data, parse_override(text))
    return build_trainer(validate_config(data), loop, RunConfig())


def yaml_key_and_reader(cls: type, name: str, value: typing.Any):
    """The ``--set`` override(s) for one library field and how to read it off the trainer."""
    if cls is PolicyConfig:
        return [f"scheduler.policy.{name}={json.dumps(value)}"], lambda t: getattr(
            t.scheduler.policy, name
        )
    if cls is SlowdownInjection:
        item = {"factor": 2.0, "worker": "a", name: value}
        if name == "rank":
            del item["worker"]
        return [f"emulation.slowdowns=[{json.dumps(item)}]"], lambda t: getattr(
            t.emulation.slowdowns[0], name
        )
    if cls is ParallelConfig:
        # A model-parallel section needs its mode (and conv_split its layers) beside the key.
        section = {"mode": "conv_split", "layers": ["features.0"], name: value}
        return [f"parallel={json.dumps(section)}"], lambda t: getattr(t.parallel, name)
    if cls in (TensorBoardConfig, MLflowConfig):
        sink = "tensorboard" if cls is TensorBoardConfig else "mlflow"
        return [f"tracking.{sink}.{name}={json.dumps(value)}"], lambda t: _plain(
            getattr(getattr(t.tracking, sink), name)
        )
    if cls is WorkerSpec:
        return [f"workers.0.{name}={json.dumps(value)}"], lambda t: getattr(t.workers[0], name)
    section, attribute = GROUPS[cls]
    return [f"{section}.{name}={json.dumps(value)}"], lambda t: getattr(getattr(t, attribute), name)


def _plain(value: typing.Any) -> typing.Any:
    return str(value) if isinstance(value, Path) else value


def test_the_value_table_covers_every_library_field():
    assert set(VALUES) == library_fields()


@pytest.mark.parametrize(
    ("cls", "name"),
    sorted(VALUES, key=lambda k: (k[0].__name__, k[1])),
    ids=lambda x: x if isinstance(x, str) else x.__name__,
)
def test_every_library_field_is_reachable_from_a_yaml_key(cls, name):
    value = VALUES[(cls, name)]
    overrides, read = yaml_key_and_reader(cls, name, value)
    default = trainer_for([])
    trainer = trainer_for(overrides)
    got = read(trainer)
    expected = tuple(value) if isinstance(got, tuple) else value
    assert got == expected
    with contextlib.suppress(IndexError):  # no slowdown in the base job
        assert read(default) != expected  # the value really came from the YAML key


def test_every_trainer_knob_is_a_yaml_section():
    params = set(inspect.signature(HeteroTrainer.__init__).parameters)
    knobs = params - {
        "self",
        "train_loop_per_worker",
        "train_loop_config",
        "run_config",
        # Ray objects, like run_config; the YAML's data.source: ray_data builds the datasets.
        "datasets",
        "dataset_config",
        "unknown",  # refused with a hint naming the group field
        "faults",  # FAULT INJECTION: test/ops tooling, deliberately not a YAML key
    }
    assert knobs == {"workers", *(attr for _, attr in GROUPS.values())}


def test_every_run_related_yaml_key_is_a_library_setting():
    sections = JobConfig.model_fields
    for cls, (section, _) in GROUPS.items():
        annotation = sections[section].annotation
        if section == "train":
            # train: = the library's BatchConfig plus the optimiser the job's loop reads and
            # max_failures, the job's Ray FailureConfig (HeteroTrainer takes Ray's RunConfig).
            assert annotation is TrainConfig and issubclass(TrainConfig, BatchConfig)
            extra = set(TrainConfig.model_fields) - set(BatchConfig.model_fields)
            assert extra == {"epochs", "lr", "momentum", "weight_decay", "max_failures"}
        else:
            assert annotation is cls, section  # the YAML section IS the library class
    assert sections["workers"].annotation == list[WorkerSpec]
