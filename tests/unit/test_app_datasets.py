"""app/datasets.py: the YAML data section -> the library DataSource."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from raytrain_hetero.app.config import load_config, validate_config
from raytrain_hetero.app.datasets import data_source
from raytrain_hetero.app.job import prepare_dataset
from raytrain_hetero.app.sections import DataConfig
from raytrain_hetero.errors import ConfigError
from raytrain_hetero.workloads import registry
from raytrain_hetero.workloads.registry import (
    GenerateOptions,
    SceneOptions,
    dataset_adapter,
    register_dataset,
)

WORKERS = {"workers": [{"name": "a"}, {"name": "b"}]}


def test_every_section_field_reaches_the_library_options() -> None:
    data = DataConfig.model_validate(
        {
            "dataset": "hyperspectral",
            "root": "/tmp/scene",
            "hyperspectral": {
                "image": "a.mat",
                "labels": "b.mat",
                "image_key": "cube",
                "label_key": "gt",
                "patch_size": 7,
                "split": "random",
                "block_size": 8,
                "guard": False,
                "fractions": [0.5, 0.25, 0.25],
            },
            "generate": {
                "seed": 3,
                "height": 20,
                "width": 24,
                "spectral_bands": 10,
                "classes": 4,
                "file_format": "tif",
            },
        }
    )
    source = data_source(data)
    assert source.root == Path("/tmp/scene")
    assert source.scene == SceneOptions(
        image="a.mat",
        labels="b.mat",
        image_key="cube",
        label_key="gt",
        patch_size=7,
        split="random",
        block_size=8,
        guard=False,
        fractions=(0.5, 0.25, 0.25),
    )
    assert source.generate == GenerateOptions(
        seed=3, height=20, width=24, spectral_bands=10, classes=4, file_format="tif"
    )


def test_absent_sections_stay_none_and_generate_fields_carry() -> None:
    plain = data_source(DataConfig.model_validate({"dataset": "eurosat", "root": "/tmp/e"}))
    assert plain.scene is None and plain.generate is None
    gen = data_source(
        DataConfig.model_validate(
            {"dataset": "multimodal", "root": "/tmp/m", "generate": {"cloud_fraction": 0.3}}
        )
    ).generate
    assert gen == GenerateOptions(cloud_fraction=0.3)


@pytest.fixture
def clean_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Registrations made by a test stay in that test."""
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_REGISTERED_BY", dict(registry._REGISTERED_BY))
    monkeypatch.setattr(registry, "_MODELS", dict(registry._MODELS))
    monkeypatch.setattr(registry, "_MODELS_REGISTERED_BY", dict(registry._MODELS_REGISTERED_BY))


def test_unknown_dataset_is_one_config_error_listing_names_and_how_to_register() -> None:
    with pytest.raises(ConfigError) as info:
        validate_config({"data": {"dataset": "eurosta", "root": "/tmp/x"}, **WORKERS})
    message = str(info.value)
    assert message.count("data.dataset") == 1 and "'eurosta'" in message
    listed = message.split("registered datasets: ")[1].split(". Fix")[0].split(", ")
    assert {"eurosat", "hyperspectral", "multimodal", "uc_merced"} <= set(listed)
    assert "use dataset: eurosat" in message and "registry.register_dataset(" in message


def test_a_dataset_registered_before_loading_is_prepared_from_yaml(
    tmp_path: Path, clean_registry: None
) -> None:
    pytest.importorskip("torchgeo")
    # A third-party dataset: here EuroSAT's generator and reader under another name.
    register_dataset(dataclasses.replace(dataset_adapter("eurosat"), name="my_eurosat"))
    config = tmp_path / "job.yaml"
    config.write_text(
        "data:\n"
        "  dataset: my_eurosat\n"
        f"  root: {tmp_path / 'data'}\n"
        "  bands: rgb\n"
        "  generate: {samples_per_class: 5, size: 16}\n"
        "model: {name: small_cnn, width: 4}\n"
        "workers: [{name: a}, {name: b}]\n"
    )
    job = load_config(config)
    # The registering module travels with the config, so Ray workers register it too.
    assert job.data.dataset == "my_eurosat" and job.data.modules == [__name__]
    again = validate_config(job.model_dump(mode="json"), source="as a worker sees it")
    assert again.data == job.data
    sizes = prepare_dataset(job)
    assert sizes["bands"] == 3 and sizes["train"] == 10 * 3
    assert (tmp_path / "data" / "eurosat-train.txt").is_file()


def test_dataset_modules_are_imported_first_and_a_missing_one_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clean_registry: None
) -> None:
    # What a Ray worker does: a fresh process imports data.modules, which registers the name.
    (tmp_path / "plugin_for_test_app_datasets.py").write_text(
        "import dataclasses\n"
        "from raytrain_hetero.workloads.registry import dataset_adapter, register_dataset\n"
        "register_dataset(dataclasses.replace(dataset_adapter('eurosat'), name='plugin_ds'))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    data = {"dataset": "plugin_ds", "root": "/tmp/x", "modules": ["plugin_for_test_app_datasets"]}
    assert validate_config({"data": data, **WORKERS}).data.dataset == "plugin_ds"
    with pytest.raises(ConfigError, match=r"data.modules\[0\]: cannot import module 'no_such_mod"):
        validate_config({"data": {"root": "/tmp/x", "modules": ["no_such_mod"]}, **WORKERS})


def test_a_model_registered_before_loading_is_built_from_yaml(clean_registry: None) -> None:
    import torch

    from raytrain_hetero.workloads.models import build_model

    def linear(in_channels: int, num_classes: int, width: int) -> torch.nn.Module:
        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.LazyLinear(num_classes))

    with pytest.raises(ConfigError) as info:
        validate_config({"data": {"root": "/tmp/x"}, "model": {"name": "linear"}, **WORKERS})
    message = str(info.value)
    assert "model.name: unknown model 'linear'" in message and "small_cnn" in message
    assert "register_model" in message
    registry.register_model("linear", linear)
    job = validate_config({"data": {"root": "/tmp/x"}, "model": {"name": "linear"}, **WORKERS})
    assert job.model.modules == [__name__]
    model = build_model(job.model.name, in_channels=3, num_classes=4, width=job.model.width)
    assert model(torch.zeros(2, 3, 8, 8)).shape == (2, 4)
    with pytest.raises(ConfigError, match="built in"):
        registry.register_model("small_cnn", linear)
