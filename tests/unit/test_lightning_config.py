"""The Lightning path's front door: task/datamodule names and arguments in YAML, the Trainer
checks of ``prepare_trainer``, and the driver's data check (no Ray)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from raytrain_hetero.app.config import validate_config
from raytrain_hetero.config import BatchConfig
from raytrain_hetero.errors import ConfigError, DataError

BASE: dict[str, Any] = {
    "name": "t",
    "data": {
        "dataset": "hyperspectral",
        "root": "/nonexistent/scene",
        "datamodule": "raytrain_hetero.SceneSegmentationDataModule",
        "datamodule_args": {"patch_size": 32},
    },
    "model": {
        "task": "torchgeo.SemanticSegmentationTask",
        "task_args": {"backbone": "resnet18", "in_channels": 8, "num_classes": 5},
    },
    "workers": [{"name": "a"}, {"name": "b"}],
}


def _with(section: str, key: str, value: Any) -> dict[str, Any]:
    raw = copy.deepcopy(BASE)
    raw[section][key] = value
    return raw


def test_a_task_job_validates():
    job = validate_config(BASE)
    assert job.model.task == "torchgeo.SemanticSegmentationTask"
    assert job.data.datamodule_args == {"patch_size": 32}


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("model", "task_args", {"backbone": "resnet18", "lrr": 0.1}, "'lrr'; did you mean 'lr'"),
        ("model", "task", "torchgeo.DetectionTask", "task"),
        ("data", "datamodule", "torchgeo.EuroSatDataModule", "torchgeo.EuroSATDataModule"),
        ("data", "datamodule", "mymodule.Thing", "must start with one of"),
        ("data", "datamodule_args", {"patch_sise": 32}, "did you mean 'patch_size'"),
    ],
)
def test_bad_names_and_arguments_are_refused_naming_them(section, key, value, message):
    with pytest.raises(ConfigError, match=message):
        validate_config(_with(section, key, value))


def test_torchgeo_datamodule_arguments_are_checked_against_its_dataset_too():
    raw = _with("data", "datamodule", "torchgeo.EuroSATDataModule")
    raw["data"]["datamodule_args"] = {"bands": ["B04"], "download": False}
    validate_config(raw)  # EuroSAT's own arguments pass through **kwargs
    raw["data"]["datamodule_args"] = {"bandz": ["B04"]}
    with pytest.raises(ConfigError, match="'bandz'; did you mean 'bands'"):
        validate_config(raw)


@pytest.mark.parametrize("section", ["model", "data"])
def test_arguments_without_a_class_are_refused(section):
    raw = copy.deepcopy(BASE)
    key = "task" if section == "model" else "datamodule"
    del raw[section][key]
    with pytest.raises(ConfigError, match=f"{key}_args without a {key}"):
        validate_config(raw)


def test_the_driver_check_names_a_class_count_the_task_cannot_predict(tmp_path: Path):
    from raytrain_hetero.app.lightning_job import prepare_lightning_data

    raw = copy.deepcopy(BASE)
    raw["data"]["root"] = str(tmp_path / "scene")
    raw["data"]["generate"] = {
        "height": 64,
        "width": 64,
        "spectral_bands": 8,
        "classes": 4,
        "file_format": "tif",
    }
    raw["model"]["task_args"] = {"backbone": "resnet18", "in_channels": 8, "num_classes": 3}
    with pytest.raises(DataError, match="num_classes >= 5"):
        prepare_lightning_data(validate_config(raw))
    raw["model"]["task_args"] = {"backbone": "resnet18", "in_channels": 8, "num_classes": 5}
    sizes = prepare_lightning_data(validate_config(raw))
    assert sizes == {"train": 2, "val": 2, "bands": 8}


def test_prepare_trainer_refuses_what_would_break_the_carving(monkeypatch):
    import lightning.pytorch as pl

    from raytrain_hetero import lightning as rhl
    from raytrain_hetero.config import WorkerSpec
    from raytrain_hetero.worker.runtime import registry as context
    from raytrain_hetero.worker.runtime.registry import WorkerRuntime, install_runtime

    monkeypatch.setattr(context, "_runtime", None)  # restored after the test
    from raytrain_hetero.worker.setup.identity import HeteroSetup, RankIdentity

    setup = HeteroSetup(
        run_id="t",
        specs=(WorkerSpec(name="a"),),
        batch=BatchConfig(global_batch_size=4),
    )
    install_runtime(WorkerRuntime.start(RankIdentity(setup=setup, slot=0, rank=0, world_size=1)))

    def trainer(**kwargs: Any) -> pl.Trainer:
        defaults: dict[str, Any] = {
            "accelerator": "cpu",
            "strategy": rhl.HeteroDDPStrategy(),
            "plugins": [rhl.HeteroLightningEnvironment()],
            "use_distributed_sampler": False,
            "logger": False,
            "enable_progress_bar": False,
        }
        return pl.Trainer(**{**defaults, **kwargs})

    with pytest.raises(ConfigError, match="use_distributed_sampler=False"):
        rhl.prepare_trainer(trainer(use_distributed_sampler=True))
    with pytest.raises(ConfigError, match="accumulate_grad_batches=2"):
        rhl.prepare_trainer(trainer(accumulate_grad_batches=2))
    with pytest.raises(ConfigError, match="limit_train_batches=0.5"):
        rhl.prepare_trainer(trainer(limit_train_batches=0.5))
    with pytest.raises(ConfigError, match="HeteroDDPStrategy"):
        rhl.prepare_trainer(trainer(strategy="auto", plugins=None))
    with pytest.raises(ConfigError, match="ddp_comm_hook"):
        rhl.HeteroDDPStrategy(ddp_comm_hook=lambda *a: None)
    prepared = rhl.prepare_trainer(trainer())
    steps = [c for c in prepared.callbacks if isinstance(c, rhl.HeteroStepCallback)]
    assert len(steps) == 1
    assert len([c for c in rhl.prepare_trainer(prepared).callbacks if c in steps]) == 1


def test_probe_refuses_a_task_job_naming_the_way():
    from raytrain_hetero.app.probe_job import run_probe

    with pytest.raises(ConfigError, match="without train.fixed_shares"):
        run_probe(validate_config(BASE))
